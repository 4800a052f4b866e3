// Host, pinned and CUDA caching allocators.
// The CUDA allocator caches freed blocks by exact rounded size (512-byte granularity for small
// blocks, 2 MiB for large) and returns them on the next request of that size; on an
// out-of-memory it frees the cache and retries once, then reports usage by category.
#include "core/allocator.h"

#include <cstdlib>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/check.h"

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {

std::string Device::str() const { return is_cpu() ? "cpu" : fmt::format("cuda:{}", index); }

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::kWeights: return "weights";
    case MemCategory::kGradients: return "gradients";
    case MemCategory::kMaster: return "master";
    case MemCategory::kOptimizer: return "optimizer";
    case MemCategory::kActivations: return "activations";
    case MemCategory::kWorkspace: return "workspace";
    case MemCategory::kOther: return "other";
    case MemCategory::kCount: break;
  }
  return "?";
}

std::string format_bytes(size_t b) {
  double x = static_cast<double>(b);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", x / (1024.0 * 1024));
  if (x >= 1024.0) return fmt::format("{:.1f} KiB", x / 1024.0);
  return fmt::format("{} B", b);
}

std::string MemStats::summary() const {
  std::string s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    if (peak[i] == 0) continue;
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {} (peak {})", mem_category_name(static_cast<MemCategory>(i)),
                     format_bytes(current[i]), format_bytes(peak[i]));
  }
  s += fmt::format("; total {} (peak {})", format_bytes(total_current), format_bytes(total_peak));
  return s;
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> l(stats_mutex_);
  return stats_;
}

void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> l(stats_mutex_);
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
  stats_.reserved_peak = stats_.reserved;
}

void Allocator::account_alloc(size_t bytes, MemCategory cat) {
  std::lock_guard<std::mutex> l(stats_mutex_);
  size_t i = static_cast<size_t>(cat);
  stats_.current[i] += bytes;
  if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
  stats_.total_current += bytes;
  if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
}

void Allocator::account_free(size_t bytes, MemCategory cat) {
  std::lock_guard<std::mutex> l(stats_mutex_);
  size_t i = static_cast<size_t>(cat);
  stats_.current[i] -= bytes;
  stats_.total_current -= bytes;
}

void Allocator::account_reserved(int64_t delta) {
  std::lock_guard<std::mutex> l(stats_mutex_);
  stats_.reserved = static_cast<size_t>(static_cast<int64_t>(stats_.reserved) + delta);
  if (stats_.reserved > stats_.reserved_peak) stats_.reserved_peak = stats_.reserved;
}

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override {
    size_t rounded = ((bytes ? bytes : 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    MT_CHECK(p, "[alloc] host allocation of {} failed; in use: {}", format_bytes(bytes), stats().summary());
    account_alloc(bytes, cat);
    account_reserved(static_cast<int64_t>(bytes));
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    std::free(p);
    account_free(bytes, cat);
    account_reserved(-static_cast<int64_t>(bytes));
  }
  Device device() const override { return Device::cpu(); }
};

#ifdef MT_WITH_CUDA
class PinnedAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemCategory cat) override {
    void* p = nullptr;
    MT_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    account_alloc(bytes, cat);
    account_reserved(static_cast<int64_t>(bytes));
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    cudaFreeHost(p);
    account_free(bytes, cat);
    account_reserved(-static_cast<int64_t>(bytes));
  }
  Device device() const override { return Device::cpu(); }
};

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int dev) : dev_(dev) {}
  static size_t round(size_t b) {
    if (b == 0) b = 1;
    if (b < (1u << 20)) return (b + 511) / 512 * 512;
    return (b + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  }
  void* allocate(size_t bytes, MemCategory cat) override {
    size_t r = round(bytes);
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = free_.find(r);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        account_alloc(bytes, cat);
        return p;
      }
    }
    int prev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != dev_) MT_CUDA_CHECK(cudaSetDevice(dev_));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, r);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      empty_cache();
      e = cudaMalloc(&p, r);
    }
    if (prev != dev_) cudaSetDevice(prev);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      MT_FAIL("[alloc] out of GPU memory on cuda:{}: asked for {} ({}); device has {} free of {}; "
              "moetrain holds {}",
              dev_, format_bytes(bytes), mem_category_name(cat), format_bytes(free_b),
              format_bytes(total_b), stats().summary());
    }
    account_reserved(static_cast<int64_t>(r));
    account_alloc(bytes, cat);
    return p;
  }
  void deallocate(void* p, size_t bytes, MemCategory cat) override {
    std::lock_guard<std::mutex> l(mu_);
    free_[round(bytes)].push_back(p);
    account_free(bytes, cat);
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> l(mu_);
    cudaDeviceSynchronize();
    for (auto& [sz, v] : free_) {
      for (void* p : v) {
        cudaFree(p);
        account_reserved(-static_cast<int64_t>(sz));
      }
      v.clear();
    }
  }
  Device device() const override { return Device::cuda(dev_); }

 private:
  int dev_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
};
#endif

}  // namespace

Allocator& allocator_for(Device d) {
  static HostAllocator host;
  if (d.is_cpu()) return host;
#ifdef MT_WITH_CUDA
  static std::mutex mu;
  static std::unordered_map<int, std::unique_ptr<CudaCachingAllocator>> cuda;
  std::lock_guard<std::mutex> l(mu);
  auto& slot = cuda[d.index];
  if (!slot) slot = std::make_unique<CudaCachingAllocator>(d.index);
  return *slot;
#else
  MT_FAIL("[alloc] {} requested, but this build of moetrain has no CUDA backend "
          "(rebuild with nvcc available and MT_CUDA=ON)", d.str());
#endif
}

Allocator& pinned_host_allocator() {
#ifdef MT_WITH_CUDA
  static PinnedAllocator pinned;
  return pinned;
#else
  return allocator_for(Device::cpu());
#endif
}

}  // namespace moetrain
