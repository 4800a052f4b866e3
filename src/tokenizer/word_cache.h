// Thread-safe cache word -> token ids for byte-level BPE. Flat and lock-free for readers: 64
// shards of 64-byte slots (one hash tag + the word's bytes + its ids inline, so a hit touches
// one cache line), each shard guarded by a seqlock: readers copy a slot with relaxed atomic
// loads and retry if the shard's sequence moved; writers serialize on the shard's mutex. Words
// whose bytes and ids do not fit a slot are not cached; a full probe window evicts a slot.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace moetrain {

class WordCache {
 public:
  WordCache();
  // Appends the cached ids of `word` to `out` and returns true on a hit.
  bool lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t n);
  static bool fits(size_t word_bytes, size_t n_ids) {
    return 2 + word_bytes + 4 * n_ids <= kPayload;
  }
  static uint64_t hash_of(std::string_view s) {
    const char* p = s.data();
    size_t n = s.size();
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    uint64_t v = 0;
    for (; n >= 8; n -= 8, p += 8) {
      std::memcpy(&v, p, 8);
      h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31;
    }
    v = 0;
    std::memcpy(&v, p, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
  }

 private:
  static constexpr size_t kWords = 8;                   // 64-byte slots
  static constexpr size_t kPayload = 8 * (kWords - 1);  // bytes after the tag
  static constexpr size_t kShards = 64;
  static constexpr size_t kSlotsPerShard = 2048;
  static constexpr size_t kProbe = 4;
  struct alignas(64) Slot {
    std::atomic<uint64_t> w[kWords];  // w[0]: tag (hash | 1, 0 = empty); then len, n, bytes, ids
  };
  struct alignas(64) Shard {
    std::atomic<uint64_t> seq{0};  // odd while a writer is changing the shard
    std::mutex mu;
    std::unique_ptr<Slot[]> slots;
  };
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace moetrain
