// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (Qwen2/Qwen3, Llama-3,
// GPT-2 family): NFC normalization, added/special tokens matched first (lstrip/rstrip/
// single_word honored), the Split pre-tokenizer regex, the GPT-2 byte-to-unicode map, merges
// by rank, and decoding back to text. encode() adds no BOS/EOS (like add_special_tokens=False);
// callers add them from bos_id()/eos_id().
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moetrain {

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one (and maybe tokenizer_config.json).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  virtual ~Tokenizer() = default;

  // Thread-safe: many threads may encode with one Tokenizer.
  // Invalid UTF-8 in `text` is read as U+FFFD per maximal invalid subpart (as Rust's
  // String::from_utf8_lossy does), since the reference tokenizers only accept valid strings.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Encodes many documents on `threads` worker threads (<= 0: MT_NUM_THREADS or the hardware's
  // count); result i is encode(texts[i]).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                 int threads = 0) const;
  // Ids outside [0, vocab_size()) or unused ids throw moetrain::Error; byte sequences that are
  // not valid UTF-8 come out as U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual int32_t vocab_size() const = 0;  // largest id + 1, added tokens included

  // From tokenizer_config.json when present: eos_token, pad_token, bos_token (ids or -1), and
  // the raw chat_template string ("" when absent).
  virtual int32_t eos_id() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual const std::string& chat_template() const = 0;
  virtual const std::string& directory() const = 0;  // where it was loaded from
};

}  // namespace moetrain
