// Seqlock-guarded flat word cache (see word_cache.h). Slot payload layout (bytes after the tag):
// [0] word length, [1] id count, then the word's bytes, then the ids as little-endian int32.
#include "tokenizer/word_cache.h"

namespace moetrain {

WordCache::WordCache() : shards_(new Shard[kShards]) {
  for (size_t s = 0; s < kShards; ++s) {
    shards_[s].slots.reset(new Slot[kSlotsPerShard]);
    for (size_t i = 0; i < kSlotsPerShard; ++i)
      for (auto& w : shards_[s].slots[i].w) w.store(0, std::memory_order_relaxed);
  }
}

bool WordCache::lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  const uint64_t tag = hash | 1;
  const Shard& sh = shards_[hash % kShards];
  const size_t base = static_cast<size_t>(hash >> 8);
  uint64_t buf[kWords - 1];
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint64_t s1 = sh.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    bool retry = false;
    for (size_t p = 0; p < kProbe; ++p) {
      const Slot& sl = sh.slots[(base + p) % kSlotsPerShard];
      uint64_t t = sl.w[0].load(std::memory_order_relaxed);
      if (t == 0) break;
      if (t != tag) continue;
      // Load only the words the entry occupies: the first holds the lengths.
      buf[0] = sl.w[1].load(std::memory_order_relaxed);
      const auto* head = reinterpret_cast<const unsigned char*>(buf);
      size_t used = (2 + head[0] + 4 * size_t{head[1]} + 7) / 8;
      if (used > kWords - 1) used = kWords - 1;  // torn read; the check below retries
      for (size_t k = 2; k <= used; ++k) buf[k - 1] = sl.w[k].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (sh.seq.load(std::memory_order_relaxed) != s1) {
        retry = true;
        break;
      }
      const auto* bytes = reinterpret_cast<const unsigned char*>(buf);
      size_t len = bytes[0], n = bytes[1];
      if (len != word.size() || std::memcmp(bytes + 2, word.data(), len) != 0) continue;
      size_t at = out.size();
      out.resize(at + n);
      std::memcpy(out.data() + at, bytes + 2 + len, 4 * n);
      return true;
    }
    if (!retry) return false;
  }
  return false;
}

void WordCache::insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n) {
  if (!fits(word.size(), n)) return;
  const uint64_t tag = hash | 1;
  Shard& sh = shards_[hash % kShards];
  const size_t base = static_cast<size_t>(hash >> 8);
  uint64_t buf[kWords - 1] = {};
  auto* bytes = reinterpret_cast<unsigned char*>(buf);
  bytes[0] = static_cast<unsigned char>(word.size());
  bytes[1] = static_cast<unsigned char>(n);
  std::memcpy(bytes + 2, word.data(), word.size());
  std::memcpy(bytes + 2 + word.size(), ids, 4 * n);

  std::lock_guard<std::mutex> lock(sh.mu);
  Slot* target = &sh.slots[base % kSlotsPerShard];  // evicted when the window is full
  for (size_t p = 0; p < kProbe; ++p) {
    Slot& sl = sh.slots[(base + p) % kSlotsPerShard];
    uint64_t t = sl.w[0].load(std::memory_order_relaxed);
    if (t == 0) {
      target = &sl;
      break;
    }
    if (t == tag) {
      const auto* b = reinterpret_cast<const unsigned char*>(buf);
      uint64_t cur[kWords - 1];
      for (size_t k = 1; k < kWords; ++k) cur[k - 1] = sl.w[k].load(std::memory_order_relaxed);
      if (std::memcmp(cur, b, 2 + word.size()) == 0) return;  // already cached
    }
  }
  uint64_t s = sh.seq.load(std::memory_order_relaxed);
  sh.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  target->w[0].store(tag, std::memory_order_relaxed);
  for (size_t k = 1; k < kWords; ++k) target->w[k].store(buf[k - 1], std::memory_order_relaxed);
  sh.seq.store(s + 2, std::memory_order_release);
}

}  // namespace moetrain
