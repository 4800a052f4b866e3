// The byte-level BPE Tokenizer: pipeline raw added tokens -> normalizer -> normalized added
// tokens -> pre-tokenizer stages (Split regexes, then ByteLevel) -> per-word BPE through a
// shared cache. Built by load_bpe_tokenizer() from tokenizer.json (tokenizer_load.cpp).
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_merge.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"
#include "tokenizer/word_cache.h"

namespace moetrain {

// `path`: tokenizer.json or its directory. Throws moetrain::Error naming the file and key of
// anything malformed or unsupported.
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);

class BpeTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  int32_t eos_id() const override { return eos_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t bos_id() const override { return bos_id_; }
  const std::string& chat_template() const override { return chat_template_; }
  const std::string& directory() const override { return directory_; }

 private:
  friend std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  // One pre-tokenizer step: an optional prefix space (ByteLevel add_prefix_space), then an
  // optional regex split of each piece.
  struct Stage {
    bool prefix_space = false;
    std::unique_ptr<RegexSplitter> splitter;
  };

  void encode_normalizable(std::string_view piece, std::vector<int32_t>& out) const;
  void run_stages(size_t stage, std::string_view piece, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  ByteLevelMap bytes_;
  StringMap vocab_;        // model vocabulary
  StringMap added_ids_;    // added token content -> id
  std::vector<std::string> id_to_token_;  // [vocab_size]; "" for unused ids
  std::vector<std::string> id_bytes_;     // [vocab_size] what each id decodes to (raw bytes)
  std::vector<uint8_t> id_used_;          // [vocab_size]
  std::array<int32_t, 256> byte_id_{};    // id of each byte's one-character token, or -1
  MergeTable merges_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;  // a word found whole in the vocabulary skips the merges
  Normalizer normalizer_;
  AddedTokenMatcher raw_added_;         // tokens with normalized=false, matched on raw text
  AddedTokenMatcher normalized_added_;  // normalized=true, matched after normalization
  std::vector<Stage> stages_;
  mutable WordCache cache_;
  int32_t eos_id_ = -1, pad_id_ = -1, bos_id_ = -1;
  std::string chat_template_;
  std::string directory_;
};

}  // namespace moetrain
