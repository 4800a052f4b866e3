// Dataset preparation: JSONL records (text, chat or preference) -> tokens + per-token loss masks
// in Megatron indexed datasets PREFIX_train[_mask] and PREFIX_valid[_mask]. Layout and naming:
// docs/data.md. Tokenization goes through a RecordEncoder so tests can use a stand-in tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace moetrain {

class Tokenizer;

enum class RecordFormat { kAuto, kText, kChat, kPreference };
enum class OverflowPolicy { kTruncate, kDrop };
enum class ErrorPolicy { kStop, kSkip };
const char* record_format_name(RecordFormat f);  // "auto" | "text" | "chat" | "preference"
RecordFormat parse_record_format(const std::string& s);

// Turns text and conversations into token ids. Implementations must be thread-safe.
class RecordEncoder {
 public:
  virtual ~RecordEncoder() = default;
  virtual std::vector<int32_t> encode_text(std::string_view text) const = 0;
  // ids + mask (1 on assistant-generated tokens); throws moetrain::Error on a template error.
  virtual MaskedTokens encode_chat(const nlohmann::json& messages) const = 0;
  virtual bool has_chat_template() const = 0;
  virtual int32_t eos_id() const = 0;  // -1 when the tokenizer has none
  virtual int64_t vocab_size() const = 0;
};

// The real encoder: the tokenizer plus its chat template rendered with `template_args` (e.g.
// {"enable_thinking": false}); bos_token/eos_token are filled from the tokenizer.
std::unique_ptr<RecordEncoder> make_tokenizer_encoder(const Tokenizer& tok,
                                                      const nlohmann::json& template_args = nlohmann::json::object());

struct PrepareOptions {
  std::string input;          // JSONL file
  std::string output_prefix;  // writes PREFIX_train(.bin/.idx, _mask.bin/.idx), PREFIX_valid..., PREFIX_info.json
  RecordFormat format = RecordFormat::kAuto;
  bool append_eod = false;    // text records only: append the tokenizer's eos id (mask 1)
  int64_t max_length = 0;     // 0: no limit; else per sequence, after --append-eod
  OverflowPolicy overflow = OverflowPolicy::kTruncate;
  int workers = 1;
  double valid_fraction = 0.0;  // each record goes to valid with this probability (seeded hash)
  uint64_t seed = 1234;
  ErrorPolicy on_error = ErrorPolicy::kStop;
  int64_t chunk_lines = 4096;   // lines tokenized per parallel batch (tests make it small)
};

struct PrepareStats {
  RecordFormat format = RecordFormat::kAuto;  // as resolved
  int64_t lines = 0;           // lines read (blank lines included)
  int64_t records = 0;         // records written (train + valid)
  int64_t train_records = 0, valid_records = 0;
  int64_t tokens = 0;          // tokens written, all sequences
  int64_t train_tokens = 0, valid_tokens = 0;
  int64_t trained_tokens = 0;  // tokens with mask 1
  int64_t truncated = 0;       // records cut to max_length
  int64_t dropped = 0;         // records dropped: too long under --overflow drop, or nothing left to train
  int64_t skipped = 0;         // bad lines skipped under --on-error skip
  std::vector<std::string> first_errors;  // up to 10 skipped-line messages, for the report
  nlohmann::json to_json() const;
};

// Runs the whole preparation. On any fatal error throws moetrain::Error (naming file, line and
// field) and leaves no output files behind; outputs appear only when everything succeeded.
PrepareStats prepare_dataset(const PrepareOptions& opt, const RecordEncoder& enc);

// One record turned into sequences (1 for text/chat, 2 for a preference pair: chosen, rejected).
// Exposed for tests. Throws moetrain::Error with "field '...': ..." messages (no file/line).
struct EncodedRecord {
  std::vector<MaskedTokens> seqs;
  bool truncated = false;
  bool dropped = false;
};
RecordFormat detect_record_format(const nlohmann::json& record);  // kAuto when unrecognized
EncodedRecord encode_record(const nlohmann::json& record, RecordFormat format, const PrepareOptions& opt,
                            const RecordEncoder& enc);

// Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is valid UTF-8.
int64_t find_invalid_utf8(std::string_view s);

}  // namespace moetrain
