// Tokenizer::load (picks the implementation; byte-level BPE is the only one) and encode_batch,
// which hands documents to worker threads through an atomic counter so that long and short
// documents balance out.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "core/env.h"
#include "tokenizer/bpe_tokenizer.h"

namespace moetrain {

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  return load_bpe_tokenizer(path);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(
    const std::vector<std::string_view>& texts, int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = env_num_threads();
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), texts.size()));
  if (threads <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i]);
    return out;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&]() {
    constexpr size_t kChunk = 16;
    try {
      while (!failed.load(std::memory_order_relaxed)) {
        size_t b = next.fetch_add(kChunk);
        if (b >= texts.size()) break;
        size_t e = std::min(texts.size(), b + kChunk);
        for (size_t i = b; i < e; ++i) out[i] = encode(texts[i]);
      }
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace moetrain
