// BPE merge table and merge loop (see bpe_merge.h). Ties between equal ranks go to the leftmost
// pair; ranks are unique per pair, so a heap entry is still valid exactly when its pair's rank
// is unchanged.
#include "tokenizer/bpe_merge.h"

#include <algorithm>
#include <functional>

namespace moetrain {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 16) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  count_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((count_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old;
    old.swap(slots_);
    reserve(old.size());
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key),
                                  s.rank, s.merged);
  }
  uint64_t key = pack(left, right);
  for (size_t h = hash(key) & mask_;; h = (h + 1) & mask_) {
    Slot& s = slots_[h];
    if (s.key == key) {
      s.rank = rank;
      s.merged = merged;
      return;
    }
    if (s.key == kEmpty) {
      s = Slot{key, rank, merged};
      ++count_;
      return;
    }
  }
}

namespace {

void merge_linear(const MergeTable& t, std::vector<int32_t>& syms, BpeScratch& sc) {
  size_t n = syms.size();
  std::vector<int32_t>& rank = sc.rank;    // rank[i]: pair (syms[i], syms[i+1])
  std::vector<int32_t>& merged = sc.merged;
  rank.resize(n - 1);
  merged.resize(n - 1);
  for (size_t i = 0; i + 1 < n; ++i) rank[i] = t.find(syms[i], syms[i + 1], &merged[i]);
  while (n > 1) {
    int32_t best = MergeTable::kNone;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank[i] < best) {
        best = rank[i];
        bi = i;
      }
    if (best == MergeTable::kNone) break;
    syms[bi] = merged[bi];
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(bi) + 1);
    rank.erase(rank.begin() + static_cast<ptrdiff_t>(bi));
    merged.erase(merged.begin() + static_cast<ptrdiff_t>(bi));
    --n;
    if (bi > 0) rank[bi - 1] = t.find(syms[bi - 1], syms[bi], &merged[bi - 1]);
    if (bi + 1 < n) rank[bi] = t.find(syms[bi], syms[bi + 1], &merged[bi]);
  }
}

void merge_heap(const MergeTable& t, std::vector<int32_t>& syms, BpeScratch& sc) {
  const size_t n = syms.size();
  auto& prev = sc.prev;
  auto& next = sc.next;
  auto& heap = sc.heap;  // (rank << 32 | left position), a min-heap
  prev.resize(n);
  next.resize(n);
  heap.clear();
  int32_t m = 0;
  auto push = [&](size_t pos, int32_t r) {
    heap.push_back((static_cast<uint64_t>(r) << 32) | pos);
    std::push_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
  };
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    if (i + 1 < n) {
      int32_t r = t.find(syms[i], syms[i + 1], &m);
      if (r != MergeTable::kNone) heap.push_back((static_cast<uint64_t>(r) << 32) | i);
    }
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<uint64_t>());
    uint64_t top = heap.back();
    heap.pop_back();
    auto r = static_cast<int32_t>(top >> 32);
    auto i = static_cast<size_t>(top & 0xffffffffu);
    if (syms[i] < 0 || next[i] < 0) continue;
    auto j = static_cast<size_t>(next[i]);
    if (t.find(syms[i], syms[j], &m) != r) continue;  // stale: a neighbour changed
    syms[i] = m;
    syms[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[static_cast<size_t>(next[j])] = static_cast<int32_t>(i);
    if (prev[i] >= 0) {
      auto p = static_cast<size_t>(prev[i]);
      int32_t rp = t.find(syms[p], syms[i], &m);
      if (rp != MergeTable::kNone) push(p, rp);
    }
    if (next[i] >= 0) {
      int32_t rn = t.find(syms[i], syms[static_cast<size_t>(next[i])], &m);
      if (rn != MergeTable::kNone) push(i, rn);
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (syms[i] >= 0) syms[w++] = syms[i];
  syms.resize(w);
}

}  // namespace

void bpe_merge(const MergeTable& table, std::vector<int32_t>& syms, BpeScratch& scratch,
               size_t linear_max) {
  if (syms.size() < 2) return;
  if (syms.size() <= linear_max) merge_linear(table, syms, scratch);
  else merge_heap(table, syms, scratch);
}

}  // namespace moetrain
