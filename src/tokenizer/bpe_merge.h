// BPE merges over token ids: an open-addressing table (left id, right id) -> (rank, merged id)
// and the merge loop that repeatedly applies the lowest-rank adjacent pair, leftmost first (the
// order of HF tokenizers' priority queue). Short words use a linear scan over cached pair
// ranks; long words (runs of CJK, symbols or spaces) use a binary heap over a linked list, so
// the cost stays O(n log n). Scratch buffers are reused by the caller: no allocation per merge.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moetrain {

class MergeTable {
 public:
  // Sized for `n` merges; insert() overwrites an earlier entry of the same pair (the later
  // line wins, as when HF builds its map).
  void reserve(size_t n);
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  size_t size() const { return count_; }
  // Rank of the pair, or kNone; *merged receives the merged token id.
  static constexpr int32_t kNone = INT32_MAX;
  int32_t find(int32_t left, int32_t right, int32_t* merged) const {
    if (mask_ == 0) return kNone;
    uint64_t key = pack(left, right);
    for (size_t h = hash(key) & mask_;; h = (h + 1) & mask_) {
      const Slot& s = slots_[h];
      if (s.key == key) {
        *merged = s.merged;
        return s.rank;
      }
      if (s.key == kEmpty) return kNone;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 32;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

// Reusable per-thread working memory for bpe_merge.
struct BpeScratch {
  std::vector<int32_t> rank, merged, prev, next;
  std::vector<uint64_t> heap;
};

// Merges `syms` (token ids, in order) in place. `linear_max`: words up to this many symbols use
// the linear scan (both strategies give identical results; the unit test checks).
void bpe_merge(const MergeTable& table, std::vector<int32_t>& syms, BpeScratch& scratch,
               size_t linear_max = 64);

}  // namespace moetrain
