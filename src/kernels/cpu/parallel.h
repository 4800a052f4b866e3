// parallel_for: split [0, n) into contiguous chunks run on up to ctx.num_threads() std::threads.
// Determinism: callers only parallelize over independent outputs (rows, columns, experts); every
// reduction that produces an output runs inside one chunk in a fixed order, so results never
// depend on the thread count. An exception in a worker is rethrown in the caller.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/context.h"

namespace moetrain::cpu {

// fn(begin, end) runs for disjoint ranges covering [0, n). `grain` is the smallest range worth a
// thread; small problems run inline on the caller's thread.
template <typename Fn>
void parallel_for(const Context& ctx, int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int64_t workers = std::min<int64_t>(std::max(ctx.num_threads(), 1), max_chunks);
  if (workers <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  std::exception_ptr error;
  std::mutex error_mutex;
  auto run = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int64_t w = 1; w < workers; ++w) {
    const int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b < e) threads.emplace_back(run, b, e);
  }
  run(0, std::min(n, chunk));
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace moetrain::cpu
