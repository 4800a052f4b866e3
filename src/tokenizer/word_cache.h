// Thread-safe cache word -> token ids for byte-level BPE: 64 shards, each a hash map behind a
// shared_mutex (lookups take the shared lock, so readers on many threads rarely contend). A
// shard stops growing at its capacity; words longer than kMaxWordBytes are never cached.
#pragma once
#include <array>
#include <deque>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moetrain {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 48;
  explicit WordCache(size_t capacity = 1 << 18) : shard_capacity_(capacity / kShards + 1) {}

  // Appends the cached ids of `word` to `out` and returns true on a hit.
  bool lookup(std::string_view word, size_t hash, std::vector<int32_t>& out) const {
    const Shard& s = shards_[hash % kShards];
    std::shared_lock lock(s.mu);
    auto it = s.map.find(Key{word, hash});
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view word, size_t hash, const int32_t* ids, size_t n) {
    Shard& s = shards_[hash % kShards];
    std::unique_lock lock(s.mu);
    if (s.map.size() >= shard_capacity_ || s.map.count(Key{word, hash})) return;
    s.owned.emplace_back(word);  // keys point into `owned`
    s.map.try_emplace(Key{s.owned.back(), hash}, ids, ids + n);
  }
  static size_t hash_of(std::string_view word) { return std::hash<std::string_view>{}(word); }

 private:
  static constexpr size_t kShards = 64;
  struct Key {
    std::string_view text;
    size_t hash;
    bool operator==(const Key& o) const { return text == o.text; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.hash / kShards; }
  };
  struct Shard {
    mutable std::shared_mutex mu;
    std::unordered_map<Key, std::vector<int32_t>, KeyHash> map;
    std::deque<std::string> owned;  // stable addresses for the keys
  };
  size_t shard_capacity_;
  std::array<Shard, kShards> shards_;
};

}  // namespace moetrain
