// Allocators with per-category byte accounting: aligned host, pinned host, and a CUDA caching
// allocator. Every allocation names a MemCategory; current and peak bytes are kept per category
// and in total. The memory planner's predictions are checked against these numbers.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace moetrain {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && (is_cpu() || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

enum class MemCategory : uint8_t {
  kWeights, kGradients, kMaster, kOptimizer, kActivations, kWorkspace, kOther, kCount
};
constexpr size_t kNumMemCategories = static_cast<size_t>(MemCategory::kCount);
const char* mem_category_name(MemCategory c);

struct MemStats {
  std::array<size_t, kNumMemCategories> current{};  // bytes handed out now, by category
  std::array<size_t, kNumMemCategories> peak{};     // high-water mark, by category
  size_t total_current = 0;
  size_t total_peak = 0;       // high-water mark of the sum (not the sum of peaks)
  size_t reserved = 0;         // bytes held from the system (caching allocators hold more)
  size_t reserved_peak = 0;
  std::string summary() const;  // "weights 1.2 GiB, activations ... (peak ...)"
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, MemCategory cat) = 0;
  virtual void deallocate(void* p, size_t bytes, MemCategory cat) = 0;
  virtual Device device() const = 0;
  virtual void empty_cache() {}
  MemStats stats() const;
  void reset_peaks();

 protected:
  void account_alloc(size_t bytes, MemCategory cat);
  void account_free(size_t bytes, MemCategory cat);
  void account_reserved(int64_t delta);
  mutable std::mutex stats_mutex_;
  MemStats stats_;
};

// The process-wide allocator of a device (like a framework's caching allocator, it outlives any
// one Context so tensors can move between them). CPU: 64-byte aligned host memory.
Allocator& allocator_for(Device d);
// Page-locked host memory for fast transfers (plain aligned memory in a build without CUDA).
Allocator& pinned_host_allocator();

std::string format_bytes(size_t bytes);

}  // namespace moetrain
