// Encoding and decoding of the byte-level BPE tokenizer (see bpe_tokenizer.h). Hot path per
// word: cache lookup; on a miss, bytes -> one-character token ids -> bpe_merge in thread-local
// scratch, then the result is cached.
#include "tokenizer/bpe_tokenizer.h"

#include "core/check.h"

namespace moetrain {

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  if (raw_added_.empty()) {
    encode_normalizable(text, out);
  } else {
    raw_added_.split(text, [&](std::string_view piece, int32_t id) {
      if (id >= 0) out.push_back(id);
      else encode_normalizable(piece, out);
    });
  }
  return out;
}

void BpeTokenizer::encode_normalizable(std::string_view piece, std::vector<int32_t>& out) const {
  std::string buf;
  std::string_view norm = normalizer_.empty() ? piece : normalizer_.apply(piece, buf);
  if (normalized_added_.empty()) {
    run_stages(0, norm, out);
    return;
  }
  normalized_added_.split(norm, [&](std::string_view p, int32_t id) {
    if (id >= 0) out.push_back(id);
    else run_stages(0, p, out);
  });
}

void BpeTokenizer::run_stages(size_t stage, std::string_view piece,
                              std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (stage == stages_.size()) {
    encode_word(piece, out);
    return;
  }
  const Stage& s = stages_[stage];
  std::string prefixed;
  if (s.prefix_space && piece[0] != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!s.splitter) {
    run_stages(stage + 1, piece, out);
    return;
  }
  s.splitter->split(piece, [&](std::string_view w) { run_stages(stage + 1, w, out); });
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = WordCache::fits(word.size(), 1);
  uint64_t hash = 0;
  if (cacheable) {
    hash = WordCache::hash_of(word);
    if (cache_.lookup(word, hash, out)) return;
  }
  const size_t before = out.size();
  thread_local std::string mapped;
  thread_local std::vector<int32_t> syms;
  thread_local BpeScratch scratch;
  bool whole = false;
  if (ignore_merges_) {
    mapped.clear();
    bytes_.map(word, mapped);
    auto it = vocab_.find(std::string_view(mapped));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      whole = true;
    }
  }
  if (!whole) {
    syms.clear();
    for (unsigned char b : word) {
      int32_t id = byte_id_[b];
      if (id >= 0) {
        syms.push_back(id);
      } else if (unk_id_ >= 0 && !(fuse_unk_ && !syms.empty() && syms.back() == unk_id_)) {
        syms.push_back(unk_id_);  // HF drops a character missing from the vocabulary without unk
      }
    }
    bpe_merge(merges_, syms, scratch);
    out.insert(out.end(), syms.begin(), syms.end());
  }
  if (cacheable) cache_.insert(word, hash, out.data() + before, out.size() - before);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    MT_CHECK(id >= 0 && id < vocab_size() && id_used_[static_cast<size_t>(id)],
             "[tokenizer] decode: id {} is not in the vocabulary (size {})", id, vocab_size());
    bytes += id_bytes_[static_cast<size_t>(id)];
  }
  return is_valid_utf8(bytes) ? bytes : repair_utf8(bytes);
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::string BpeTokenizer::id_to_token(int32_t id) const {
  MT_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] id_to_token: id {} outside [0, {})", id,
           vocab_size());
  return id_to_token_[static_cast<size_t>(id)];
}

}  // namespace moetrain
