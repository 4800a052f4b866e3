// JSONL -> indexed datasets. Lines are read in chunks, tokenized in parallel by `workers`
// threads, then written in line order, so the output does not depend on the worker count. The
// train/valid split is a seeded hash of the line number. All outputs go to *.tmp files that are
// renamed only after the last line succeeded.
#include "data/prepare.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "core/check.h"
#include "core/philox.h"
#include "data/indexed_dataset.h"

namespace moetrain {
namespace {

using json = nlohmann::json;

// First line of an Error's text (the user's sentence, without the developer location).
std::string first_line(const char* what) {
  std::string s(what);
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

const char* json_type(const json& j) { return j.type_name(); }

// messages must be a non-empty array of {role: string, content: string} (content may be null
// when the message carries tool_calls).
void validate_messages(const json& m, const std::string& field) {
  if (!m.is_array()) MT_FAIL("field '{}' must be an array of messages, got {}", field, json_type(m));
  if (m.empty()) MT_FAIL("field '{}' is an empty conversation", field);
  for (size_t i = 0; i < m.size(); ++i) {
    const json& msg = m[i];
    if (!msg.is_object()) MT_FAIL("field '{}[{}]' must be an object, got {}", field, i, json_type(msg));
    auto r = msg.find("role");
    if (r == msg.end()) MT_FAIL("field '{}[{}].role' is missing", field, i);
    if (!r->is_string()) MT_FAIL("field '{}[{}].role' must be a string, got {}", field, i, json_type(*r));
    auto c = msg.find("content");
    const bool tool_call = msg.contains("tool_calls");
    if (c == msg.end() || c->is_null()) {
      if (!tool_call) MT_FAIL("field '{}[{}].content' is missing", field, i);
    } else if (!c->is_string()) {
      MT_FAIL("field '{}[{}].content' must be a string, got {}", field, i, json_type(*c));
    }
  }
}

const json& require(const json& rec, const char* field) {
  auto it = rec.find(field);
  if (it == rec.end()) MT_FAIL("field '{}' is missing", field);
  return *it;
}

bool any_mask(const MaskedTokens& t) {
  return std::any_of(t.mask.begin(), t.mask.end(), [](uint8_t m) { return m != 0; });
}

MaskedTokens chat_tokens(const json& messages, const std::string& field, const RecordEncoder& enc) {
  try {
    MaskedTokens t = enc.encode_chat(messages);
    MT_CHECK(t.ids.size() == t.mask.size(), "[prepare] encoder returned {} ids but {} mask values", t.ids.size(),
             t.mask.size());
    return t;
  } catch (const Error& e) {
    MT_FAIL("field '{}': chat template error: {}", field, first_line(e.what()));
  }
}

// A preference side (chosen or rejected) as a list of messages appended after the prompt.
json response_messages(const json& r, const char* field) {
  if (r.is_string()) return json::array({{{"role", "assistant"}, {"content", r}}});
  if (r.is_object()) {
    json a = json::array({r});
    validate_messages(a, field);
    return a;
  }
  if (r.is_array()) {
    validate_messages(r, field);
    return r;
  }
  MT_FAIL("field '{}' must be a string, a message or an array of messages, got {}", field, json_type(r));
}

MaskedTokens preference_side(const json& rec, const json& prompt, const char* field, const RecordEncoder& enc) {
  const json& resp = require(rec, field);
  if (!enc.has_chat_template()) {
    // Raw mode: prompt text then response text and eos; mask 1 on the response (and eos).
    if (!prompt.is_string())
      MT_FAIL("field 'prompt' holds messages but the tokenizer has no chat template");
    if (!resp.is_string())
      MT_FAIL("field '{}' must be a string when the tokenizer has no chat template, got {}", field, json_type(resp));
    MaskedTokens t;
    t.ids = enc.encode_text(prompt.get<std::string>());
    t.mask.assign(t.ids.size(), 0);
    std::vector<int32_t> r = enc.encode_text(resp.get<std::string>());
    if (enc.eos_id() >= 0) r.push_back(enc.eos_id());
    t.ids.insert(t.ids.end(), r.begin(), r.end());
    t.mask.resize(t.ids.size(), 1);
    if (r.empty()) MT_FAIL("field '{}' is empty", field);
    return t;
  }
  json conv = prompt.is_string() ? json::array({{{"role", "user"}, {"content", prompt}}}) : prompt;
  size_t prompt_assistant_turns = 0;
  for (const json& m : conv) prompt_assistant_turns += m["role"] == "assistant";
  for (const json& m : response_messages(resp, field)) conv.push_back(m);
  MaskedTokens t = chat_tokens(conv, field, enc);
  // Train only on the response: clear the mask runs that belong to assistant turns of the prompt.
  size_t runs = 0;
  for (size_t i = 0; i < t.mask.size() && runs < prompt_assistant_turns; ++i) {
    if (!t.mask[i]) continue;
    while (i < t.mask.size() && t.mask[i]) t.mask[i++] = 0;
    ++runs;
  }
  if (!any_mask(t)) MT_FAIL("field '{}' has no response tokens to train on (expected an assistant reply)", field);
  return t;
}

// Counter-based hash of (seed, line) to [0, 1): the split is stable under any worker count.
double split_uniform(uint64_t seed, int64_t line) {
  Philox4 r = philox4x32(seed, 0x5eed5711ull, static_cast<uint64_t>(line));
  const uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 21) ^ (r.v[1] >> 11);
  return static_cast<double>(bits & ((uint64_t(1) << 53) - 1)) / static_cast<double>(uint64_t(1) << 53);
}

struct LineResult {
  enum class Kind { kBlank, kError, kRecord } kind = Kind::kBlank;
  std::string error;
  EncodedRecord rec;
};

LineResult process_line(const std::string& line, RecordFormat format, const PrepareOptions& opt,
                        const RecordEncoder& enc) {
  LineResult out;
  if (line.find_first_not_of(" \t\r\n") == std::string::npos) return out;
  out.kind = LineResult::Kind::kError;
  const int64_t bad = find_invalid_utf8(line);
  if (bad >= 0) {
    out.error = fmt::format("invalid UTF-8 at byte {}", bad);
    return out;
  }
  json rec;
  try {
    rec = json::parse(line);
  } catch (const json::parse_error& e) {
    out.error = fmt::format("malformed JSON: {}", e.what());
    return out;
  }
  if (!rec.is_object()) {
    out.error = fmt::format("expected a JSON object, got {}", json_type(rec));
    return out;
  }
  try {
    out.rec = encode_record(rec, format, opt, enc);
    out.kind = LineResult::Kind::kRecord;
  } catch (const Error& e) {
    out.error = first_line(e.what());
  }
  return out;
}

// Writes text content to path.tmp, then renames it over path.
void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  MT_CHECK(f != nullptr, "[prepare] cannot create {}", tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    MT_FAIL("[prepare] cannot write {}", path);
  }
}

// Token and mask writers of one split.
struct SplitWriter {
  IndexedDatasetWriter tokens, mask;
  SplitWriter(const std::string& prefix, IdxDType dt) : tokens(prefix, dt), mask(mask_prefix(prefix), IdxDType::kU8) {}
  void add(const EncodedRecord& r) {
    for (const MaskedTokens& s : r.seqs) {
      tokens.add_sequence(std::span<const int32_t>(s.ids));
      mask.add_sequence(std::span<const uint8_t>(s.mask));
    }
    tokens.end_document();
    mask.end_document();
  }
  void finish() { tokens.finish(); mask.finish(); }
  void commit() { tokens.commit(); mask.commit(); }
};

}  // namespace

const char* record_format_name(RecordFormat f) {
  switch (f) {
    case RecordFormat::kAuto: return "auto";
    case RecordFormat::kText: return "text";
    case RecordFormat::kChat: return "chat";
    case RecordFormat::kPreference: return "preference";
  }
  return "?";
}

RecordFormat parse_record_format(const std::string& s) {
  for (RecordFormat f : {RecordFormat::kAuto, RecordFormat::kText, RecordFormat::kChat, RecordFormat::kPreference})
    if (s == record_format_name(f)) return f;
  MT_FAIL("[prepare] unknown --format '{}' (expected auto, text, chat or preference)", s);
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are invalid.
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

RecordFormat detect_record_format(const json& rec) {
  if (!rec.is_object()) return RecordFormat::kAuto;
  if (rec.contains("chosen") || rec.contains("rejected")) return RecordFormat::kPreference;
  if (rec.contains("messages")) return RecordFormat::kChat;
  if (rec.contains("text")) return RecordFormat::kText;
  return RecordFormat::kAuto;
}

EncodedRecord encode_record(const json& rec, RecordFormat format, const PrepareOptions& opt, const RecordEncoder& enc) {
  EncodedRecord out;
  switch (format) {
    case RecordFormat::kAuto:
      MT_FAIL("record has none of the fields 'text', 'messages' or 'prompt'/'chosen'/'rejected'");
    case RecordFormat::kText: {
      const json& t = require(rec, "text");
      if (!t.is_string()) MT_FAIL("field 'text' must be a string, got {}", json_type(t));
      const std::string& s = t.get_ref<const std::string&>();
      if (s.empty()) MT_FAIL("field 'text' is empty");
      MaskedTokens m;
      m.ids = enc.encode_text(s);
      if (opt.append_eod) m.ids.push_back(enc.eos_id());
      if (m.ids.empty()) MT_FAIL("field 'text' produced no tokens");
      m.mask.assign(m.ids.size(), 1);
      out.seqs.push_back(std::move(m));
      break;
    }
    case RecordFormat::kChat: {
      const json& msgs = require(rec, "messages");
      validate_messages(msgs, "messages");
      MaskedTokens m = chat_tokens(msgs, "messages", enc);
      if (!any_mask(m)) MT_FAIL("field 'messages' has no assistant tokens to train on");
      out.seqs.push_back(std::move(m));
      break;
    }
    case RecordFormat::kPreference: {
      const json& prompt = require(rec, "prompt");
      if (prompt.is_string()) {
        if (prompt.get_ref<const std::string&>().empty()) MT_FAIL("field 'prompt' is empty");
      } else if (prompt.is_array()) {
        validate_messages(prompt, "prompt");
      } else {
        MT_FAIL("field 'prompt' must be a string or an array of messages, got {}", json_type(prompt));
      }
      out.seqs.push_back(preference_side(rec, prompt, "chosen", enc));
      out.seqs.push_back(preference_side(rec, prompt, "rejected", enc));
      break;
    }
  }
  if (opt.max_length > 0) {
    for (MaskedTokens& s : out.seqs) {
      if (static_cast<int64_t>(s.ids.size()) <= opt.max_length) continue;
      if (opt.overflow == OverflowPolicy::kDrop) {
        out.dropped = true;
        break;
      }
      s.ids.resize(static_cast<size_t>(opt.max_length));
      s.mask.resize(static_cast<size_t>(opt.max_length));
      out.truncated = true;
    }
    // A truncated chat or preference sequence may have lost every trained token.
    if (!out.dropped)
      for (const MaskedTokens& s : out.seqs)
        if (!any_mask(s)) out.dropped = true;
  }
  return out;
}

json PrepareStats::to_json() const {
  return json{{"format", record_format_name(format)}, {"lines", lines}, {"records", records},
              {"train_records", train_records}, {"valid_records", valid_records}, {"tokens", tokens},
              {"train_tokens", train_tokens}, {"valid_tokens", valid_tokens}, {"trained_tokens", trained_tokens},
              {"truncated", truncated}, {"dropped", dropped}, {"skipped", skipped}};
}

PrepareStats prepare_dataset(const PrepareOptions& opt, const RecordEncoder& enc) {
  MT_CHECK(!opt.output_prefix.empty(), "[prepare] --output PREFIX is required");
  MT_CHECK(opt.valid_fraction >= 0.0 && opt.valid_fraction < 1.0,
           "[prepare] --valid-fraction {} must be in [0, 1)", opt.valid_fraction);
  MT_CHECK(opt.max_length >= 0, "[prepare] --max-length {} must be positive", opt.max_length);
  MT_CHECK(!opt.append_eod || enc.eos_id() >= 0, "[prepare] --append-eod needs a tokenizer with an eos token");
  std::ifstream in(opt.input, std::ios::binary);
  MT_CHECK(in.good(), "[prepare] cannot open input file {}", opt.input);
  {
    const size_t slash = opt.output_prefix.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : opt.output_prefix.substr(0, std::max<size_t>(slash, 1));
    struct stat st;
    MT_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "[prepare] output directory {} does not exist", dir);
  }
  PrepareStats stats;
  stats.format = opt.format;
  const IdxDType dt = idx_dtype_for_vocab(enc.vocab_size());
  SplitWriter train(opt.output_prefix + "_train", dt);
  std::unique_ptr<SplitWriter> valid;
  if (opt.valid_fraction > 0) valid = std::make_unique<SplitWriter>(opt.output_prefix + "_valid", dt);

  const int workers = std::max(1, opt.workers);
  const int64_t chunk = std::max<int64_t>(1, opt.chunk_lines);
  std::vector<std::string> lines;
  std::vector<LineResult> results;
  int64_t line_no = 0;  // lines consumed before this chunk
  bool checked_template = false;
  while (true) {
    lines.clear();
    std::string l;
    while (static_cast<int64_t>(lines.size()) < chunk && std::getline(in, l)) lines.push_back(std::move(l));
    if (lines.empty()) break;
    if (stats.format == RecordFormat::kAuto) {
      for (const std::string& s : lines) {
        if (find_invalid_utf8(s) >= 0) continue;
        json rec = json::parse(s, nullptr, false);
        if (!rec.is_discarded() && (stats.format = detect_record_format(rec)) != RecordFormat::kAuto) break;
      }
    }
    if (!checked_template && stats.format == RecordFormat::kChat) {
      MT_CHECK(enc.has_chat_template(), "[prepare] {}: chat records need a tokenizer with a chat_template "
               "(tokenizer_config.json)", opt.input);
      checked_template = true;
    }
    results.assign(lines.size(), LineResult{});
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < lines.size();)
        results[i] = process_line(lines[i], stats.format, opt, enc);
    };
    if (workers == 1 || lines.size() == 1) {
      work();
    } else {
      std::vector<std::thread> pool;
      for (int w = 0; w < workers; ++w) pool.emplace_back(work);
      for (auto& t : pool) t.join();
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const int64_t ln = line_no + static_cast<int64_t>(i) + 1;
      LineResult& r = results[i];
      if (r.kind == LineResult::Kind::kBlank) continue;
      if (r.kind == LineResult::Kind::kError) {
        if (opt.on_error == ErrorPolicy::kStop)
          MT_FAIL("[prepare] {}:{}: {} (use --on-error skip to skip bad lines)", opt.input, ln, r.error);
        ++stats.skipped;
        if (stats.first_errors.size() < 10) stats.first_errors.push_back(fmt::format("{}:{}: {}", opt.input, ln, r.error));
        continue;
      }
      if (r.rec.dropped) {
        ++stats.dropped;
        continue;
      }
      stats.truncated += r.rec.truncated;
      int64_t toks = 0;
      for (const MaskedTokens& s : r.rec.seqs) {
        toks += static_cast<int64_t>(s.ids.size());
        stats.trained_tokens += std::count_if(s.mask.begin(), s.mask.end(), [](uint8_t m) { return m != 0; });
      }
      const bool to_valid = valid && split_uniform(opt.seed, ln) < opt.valid_fraction;
      (to_valid ? *valid : train).add(r.rec);
      (to_valid ? stats.valid_records : stats.train_records)++;
      (to_valid ? stats.valid_tokens : stats.train_tokens) += toks;
    }
    line_no += static_cast<int64_t>(lines.size());
  }
  MT_CHECK(!in.bad(), "[prepare] read error in {}", opt.input);
  stats.lines = line_no;
  stats.records = stats.train_records + stats.valid_records;
  stats.tokens = stats.train_tokens + stats.valid_tokens;
  MT_CHECK(stats.records > 0, "[prepare] {}: no records were written ({} lines, {} skipped, {} dropped)", opt.input,
           stats.lines, stats.skipped, stats.dropped);
  if (stats.format == RecordFormat::kAuto) stats.format = RecordFormat::kText;

  // Everything is written; make it visible. Data files first, the info file last.
  train.finish();
  if (valid) valid->finish();
  train.commit();
  if (valid) {
    valid->commit();
  } else {
    // A previous run's validation split under this prefix would no longer match: remove it.
    const std::string vp = opt.output_prefix + "_valid";
    for (const std::string& p : {idx_path(vp), bin_path(vp), idx_path(mask_prefix(vp)), bin_path(mask_prefix(vp))})
      std::remove(p.c_str());
  }
  json info = stats.to_json();
  info["layout"] = stats.format == RecordFormat::kPreference ? "pairs" : "documents";
  info["token_dtype"] = idx_dtype_name(dt);
  info["valid_fraction"] = opt.valid_fraction;
  info["seed"] = opt.seed;
  info["max_length"] = opt.max_length;
  info["append_eod"] = opt.append_eod;
  info["input"] = opt.input;
  write_text_atomically(opt.output_prefix + "_info.json", info.dump(2) + "\n");
  return stats;
}

}  // namespace moetrain
