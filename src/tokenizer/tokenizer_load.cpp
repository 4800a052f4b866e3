// Reads a Hugging Face tokenizer.json (+ tokenizer_config.json) into a BpeTokenizer. Every
// malformed or unsupported field fails with one sentence naming the file and the key path
// (e.g. "pre_tokenizer.pretokenizers[0].type"), and what was expected.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"
#include "tokenizer/bpe_tokenizer.h"

namespace moetrain {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* type_name(const json& j) { return j.type_name(); }

// Field access that knows the file it reads and the key path it is at.
class JsonReader {
 public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    MT_FAIL("[tokenizer] {}: key '{}' {}", file_, key, what);
  }
  const json& need(const json& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) MT_FAIL("[tokenizer] {}: missing key '{}'", file_, join(path, key));
    return *it;
  }
  const json& need_object(const json& j, const std::string& key) const {
    if (!j.is_object()) fail(key, fmt::format("must be an object, got {}", type_name(j)));
    return j;
  }
  std::string need_string(const json& obj, const std::string& path, const char* key) const {
    const json& v = need(obj, path, key);
    if (!v.is_string())
      fail(join(path, key), fmt::format("must be a string, got {}", type_name(v)));
    return v.get<std::string>();
  }
  bool opt_bool(const json& obj, const std::string& path, const char* key, bool dflt) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean())
      fail(join(path, key), fmt::format("must be true or false, got {}", type_name(*it)));
    return it->get<bool>();
  }
  int32_t need_id(const json& v, const std::string& key) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail(key, fmt::format("must be a token id (a non-negative integer), got {}", v.dump()));
    return static_cast<int32_t>(v.get<int64_t>());
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::string file_;
};

json read_json(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  MT_CHECK(in.good(), "[tokenizer] cannot open {}", file);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    MT_FAIL("[tokenizer] {}: malformed JSON ({})", file, e.what());
  }
}

NormalForm parse_normal_form(const JsonReader& r, const std::string& type, const std::string& key) {
  if (type == "NFC") return NormalForm::kNFC;
  if (type == "NFD") return NormalForm::kNFD;
  if (type == "NFKC") return NormalForm::kNFKC;
  if (type == "NFKD") return NormalForm::kNFKD;
  r.fail(key, fmt::format("is '{}'; supported normalizers: NFC, NFD, NFKC, NFKD, Sequence, null",
                          type));
}

void parse_normalizer(const JsonReader& r, const json& j, const std::string& path,
                      Normalizer& out) {
  if (j.is_null()) return;
  r.need_object(j, path);
  std::string type = r.need_string(j, path, "type");
  if (type == "Sequence") {
    const json& list = r.need(j, path, "normalizers");
    if (!list.is_array()) r.fail(path + ".normalizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizer(r, list[i], fmt::format("{}.normalizers[{}]", path, i), out);
    return;
  }
  out.add(parse_normal_form(r, type, path + ".type"));
}

SplitBehavior parse_behavior(const JsonReader& r, const std::string& b, const std::string& key) {
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  r.fail(key, fmt::format("is '{}'; expected Isolated, Removed, MergedWithPrevious, "
                          "MergedWithNext or Contiguous", b));
}

}  // namespace

// Parses pre_tokenizer into stages; returns whether a ByteLevel step was seen.
static bool parse_pre_tokenizer(const JsonReader& r, const json& j, const std::string& path,
                                std::vector<std::unique_ptr<RegexSplitter>>& splits,
                                std::vector<bool>& prefix, bool& seen_byte_level) {
  r.need_object(j, path);
  std::string type = r.need_string(j, path, "type");
  if (type == "Sequence") {
    const json& list = r.need(j, path, "pretokenizers");
    if (!list.is_array()) r.fail(path + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(r, list[i], fmt::format("{}.pretokenizers[{}]", path, i), splits,
                          prefix, seen_byte_level);
    return seen_byte_level;
  }
  if (seen_byte_level)
    r.fail(path + ".type", fmt::format("is '{}' after ByteLevel; ByteLevel must come last", type));
  if (type == "Split") {
    const json& pat = r.need_object(r.need(j, path, "pattern"), path + ".pattern");
    bool literal = pat.contains("String");
    const char* k = literal ? "String" : "Regex";
    std::string where = fmt::format("{}: key '{}.pattern.{}'", r.file(), path, k);
    std::string p = r.need_string(pat, path + ".pattern", k);
    SplitBehavior b = parse_behavior(r, r.need_string(j, path, "behavior"), path + ".behavior");
    bool invert = r.opt_bool(j, path, "invert", false);
    splits.push_back(std::make_unique<RegexSplitter>(p, literal, b, invert, where));
    prefix.push_back(false);
    return seen_byte_level;
  }
  if (type == "ByteLevel") {
    seen_byte_level = true;
    bool add_prefix = r.opt_bool(j, path, "add_prefix_space", false);
    bool use_regex = r.opt_bool(j, path, "use_regex", true);
    std::string where = fmt::format("{}: GPT-2 regex of '{}'", r.file(), path);
    splits.push_back(use_regex ? std::make_unique<RegexSplitter>(
                                     kGpt2SplitRegex, false, SplitBehavior::kIsolated, false, where)
                               : nullptr);
    prefix.push_back(add_prefix);
    return true;
  }
  r.fail(path + ".type", fmt::format("is '{}'; supported pre-tokenizers: Split, ByteLevel, "
                                     "Sequence", type));
}

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) {
  fs::path p(path);
  MT_CHECK(fs::exists(p), "[tokenizer] {} does not exist (expected tokenizer.json or a "
           "directory holding it)", path);
  fs::path file = fs::is_directory(p) ? p / "tokenizer.json" : p;
  MT_CHECK(fs::is_regular_file(file), "[tokenizer] {} not found", file.string());
  auto tok = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  tok->directory_ = file.parent_path().string();
  JsonReader r(file.string());
  json root = read_json(file.string());
  r.need_object(root, "<root>");

  // ---- model ----
  const json& model = r.need_object(r.need(root, "", "model"), "model");
  std::string mtype = model.contains("type") ? r.need_string(model, "model", "type") : "BPE";
  if (mtype != "BPE")
    r.fail("model.type", fmt::format("is '{}'; only BPE (byte-level) is supported", mtype));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    r.fail("model.dropout", "must be null: BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model[k].is_null() &&
        !(model[k].is_string() && model[k].get<std::string>().empty()))
      r.fail(std::string("model.") + k, "must be null or \"\" for byte-level BPE");
  }
  if (r.opt_bool(model, "model", "byte_fallback", false))
    r.fail("model.byte_fallback", "must be false: byte fallback is not supported");
  tok->fuse_unk_ = r.opt_bool(model, "model", "fuse_unk", false);
  tok->ignore_merges_ = r.opt_bool(model, "model", "ignore_merges", false);

  const json& vocab = r.need(model, "model", "vocab");
  if (!vocab.is_object()) r.fail("model.vocab", "must be an object {token: id}");
  int32_t max_id = -1;
  tok->vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = r.need_id(it.value(), "model.vocab." + it.key());
    tok->vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  const json& added = root.contains("added_tokens") ? root["added_tokens"] : json::array();
  if (!added.is_array()) r.fail("added_tokens", "must be an array");
  std::vector<AddedToken> added_tokens;
  for (size_t i = 0; i < added.size(); ++i) {
    std::string path = fmt::format("added_tokens[{}]", i);
    const json& a = r.need_object(added[i], path);
    AddedToken t;
    t.id = r.need_id(r.need(a, path, "id"), path + ".id");
    t.content = r.need_string(a, path, "content");
    if (t.content.empty()) r.fail(path + ".content", "must not be empty");
    if (!is_valid_utf8(t.content)) r.fail(path + ".content", "is not valid UTF-8");
    t.single_word = r.opt_bool(a, path, "single_word", false);
    t.lstrip = r.opt_bool(a, path, "lstrip", false);
    t.rstrip = r.opt_bool(a, path, "rstrip", false);
    t.special = r.opt_bool(a, path, "special", false);
    t.normalized = r.opt_bool(a, path, "normalized", !t.special);
    // HF gives an added token that is also in the model vocabulary the vocabulary's id.
    if (auto it = tok->vocab_.find(t.content); it != tok->vocab_.end() && it->second != t.id) {
      MT_LOG_WARN("[tokenizer] {}: {} '{}' has id {} but model.vocab gives it {}; using {}",
                  r.file(), path, t.content, t.id, it->second, it->second);
      t.id = it->second;
    }
    max_id = std::max(max_id, t.id);
    added_tokens.push_back(t);
  }
  MT_CHECK(max_id >= 0, "[tokenizer] {}: key 'model.vocab' is empty", r.file());

  const auto n = static_cast<size_t>(max_id) + 1;
  tok->id_to_token_.assign(n, std::string());
  tok->id_bytes_.assign(n, std::string());
  tok->id_used_.assign(n, 0);
  // ByteLevel decoding of one token: each character back to its byte, or, when some character
  // is outside the byte alphabet, the token's own UTF-8 (HF's decoder does the same).
  auto decoded_bytes = [&](const std::string& s) {
    std::string outb;
    size_t i = 0;
    while (i < s.size()) {
      int b = tok->bytes_.to_byte(next_code_point(s, i));
      if (b < 0) return s;
      outb += static_cast<char>(b);
    }
    return outb;
  };
  for (const auto& [text, id] : tok->vocab_) {
    MT_CHECK(is_valid_utf8(text), "[tokenizer] {}: key 'model.vocab' has a token that is not "
             "valid UTF-8 (id {})", r.file(), id);
    auto u = static_cast<size_t>(id);
    tok->id_to_token_[u] = text;
    tok->id_bytes_[u] = decoded_bytes(text);
    tok->id_used_[u] = 1;
  }
  for (const AddedToken& t : added_tokens) {
    auto u = static_cast<size_t>(t.id);
    tok->id_to_token_[u] = t.content;
    tok->id_bytes_[u] = decoded_bytes(t.content);
    tok->id_used_[u] = 1;
    tok->added_ids_[t.content] = t.id;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = tok->vocab_.find(tok->bytes_.utf8(static_cast<uint8_t>(b)));
    tok->byte_id_[static_cast<size_t>(b)] = it == tok->vocab_.end() ? -1 : it->second;
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    std::string unk = r.need_string(model, "model", "unk_token");
    auto it = tok->vocab_.find(unk);
    if (it == tok->vocab_.end())
      r.fail("model.unk_token", fmt::format("is '{}', which is not in model.vocab", unk));
    tok->unk_id_ = it->second;
  }

  const json& merges = r.need(model, "model", "merges");
  if (!merges.is_array()) r.fail("model.merges", "must be an array");
  tok->merges_.reserve(merges.size());
  auto lookup = [&](const std::string& s, size_t i) {
    auto it = tok->vocab_.find(s);
    if (it == tok->vocab_.end())
      r.fail(fmt::format("model.merges[{}]", i), fmt::format("uses '{}', which is not in "
                                                             "model.vocab", s));
    return it->second;
  };
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        r.fail(fmt::format("model.merges[{}]", i),
               fmt::format("is \"{}\"; expected two tokens separated by one space", s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      r.fail(fmt::format("model.merges[{}]", i),
             fmt::format("is {}; expected \"a b\" or [\"a\", \"b\"]", m.dump()));
    }
    tok->merges_.insert(lookup(a, i), lookup(b, i), static_cast<int32_t>(i), lookup(a + b, i));
  }

  // ---- normalizer, added-token matchers ----
  if (root.contains("normalizer")) parse_normalizer(r, root["normalizer"], "normalizer",
                                                    tok->normalizer_);
  for (const AddedToken& t : added_tokens) {
    if (!t.normalized) {
      tok->raw_added_.add(t.content, t);
    } else {
      std::string buf;
      std::string norm(tok->normalizer_.apply(t.content, buf));
      tok->normalized_added_.add(norm, t);
    }
  }

  // ---- pre-tokenizer ----
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
    r.fail("pre_tokenizer", "is missing; byte-level BPE needs a ByteLevel pre-tokenizer");
  std::vector<std::unique_ptr<RegexSplitter>> splits;
  std::vector<bool> prefix;
  bool seen_byte_level = false;
  parse_pre_tokenizer(r, root["pre_tokenizer"], "pre_tokenizer", splits, prefix, seen_byte_level);
  if (!seen_byte_level)
    r.fail("pre_tokenizer", "has no ByteLevel step; only byte-level BPE is supported");
  for (size_t i = 0; i < splits.size(); ++i) {
    BpeTokenizer::Stage s;
    s.prefix_space = prefix[i];
    s.splitter = std::move(splits[i]);
    tok->stages_.push_back(std::move(s));
  }

  // ---- decoder ----
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    const json& d = r.need_object(root["decoder"], "decoder");
    std::string type = r.need_string(d, "decoder", "type");
    bool ok = type == "ByteLevel";
    if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
      ok = true;
      for (const json& x : d["decoders"])
        ok = ok && x.is_object() && x.value("type", "") == "ByteLevel";
    }
    if (!ok) r.fail("decoder.type", fmt::format("is '{}'; only the ByteLevel decoder is "
                                                "supported", type));
  }

  // ---- tokenizer_config.json (optional) ----
  fs::path cfg_file = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(cfg_file)) {
    JsonReader c(cfg_file.string());
    json cfg = read_json(cfg_file.string());
    c.need_object(cfg, "<root>");
    auto token_id = [&](const char* key) -> int32_t {
      auto it = cfg.find(key);
      if (it == cfg.end() || it->is_null()) return -1;
      std::string s;
      if (it->is_string()) s = it->get<std::string>();
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        s = (*it)["content"].get<std::string>();
      else c.fail(key, "must be a token string, {\"content\": ...} or null");
      auto id = tok->token_to_id(s);
      if (!id) c.fail(key, fmt::format("is '{}', which is not a token of {}", s, r.file()));
      return *id;
    };
    tok->eos_id_ = token_id("eos_token");
    tok->pad_id_ = token_id("pad_token");
    tok->bos_id_ = token_id("bos_token");
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      if (it->is_string()) {
        tok->chat_template_ = it->get<std::string>();
      } else if (it->is_array() && !it->empty()) {
        // Named templates: take "default", else the first.
        const json* pick = &(*it)[0];
        for (const json& x : *it)
          if (x.is_object() && x.value("name", "") == "default") pick = &x;
        if (!pick->is_object() || !pick->contains("template") || !(*pick)["template"].is_string())
          c.fail("chat_template", "must be a string or a list of {name, template}");
        tok->chat_template_ = (*pick)["template"].get<std::string>();
      } else {
        c.fail("chat_template", "must be a string or a list of {name, template}");
      }
    }
  }
  return tok;
}

}  // namespace moetrain
