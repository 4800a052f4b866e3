// Context: everything an op needs besides its tensors. The device, its stream and library
// handles, facts read from the device at start, the RNG seed and rank, and the CPU thread count.
// Passed explicitly; there are no global streams or handles.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/allocator.h"

namespace moetrain {

struct DeviceFacts {
  std::string name = "cpu";
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory = 0;
  size_t smem_per_block_optin = 0;
  size_t l2_bytes = 0;
};

// Counter-based RNG streams: a (seed, rank, purpose, step) tuple names a stream; draws within a
// stream are addressed by element index, so results don't depend on thread or block counts.
struct RngStream {
  uint64_t key = 0;      // derived from seed and rank
  uint64_t counter = 0;  // derived from purpose and step
};

class Context {
 public:
  explicit Context(Device device = Device::cpu(), uint64_t seed = 1234, int rank = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  const DeviceFacts& facts() const { return facts_; }
  int rank() const { return rank_; }
  uint64_t seed() const { return seed_; }
  int num_threads() const { return num_threads_; }
  void set_num_threads(int n) { num_threads_ = n > 0 ? n : 1; }

  // A stream for one purpose ("init", "dropout", "sample", ...) at one step.
  RngStream rng(uint64_t purpose, uint64_t step = 0) const;

  // CUDA handles as opaque pointers so headers stay CUDA-free (null on the CPU).
  void* stream() const { return stream_; }
  void* cublas_handle() const { return cublas_; }
  void* cublaslt_handle() const { return cublaslt_; }
  // cuBLASLt's scratch for this stream's GEMMs (kCublasLtWorkspaceBytes; allocated with the handles,
  // outside the allocator, as cuBLAS's own workspace is): ops::matmul takes only algorithms that
  // fit. 16 more bytes after it hold the GEMM tuner's checksum of an output.
  static constexpr size_t kCublasLtWorkspaceBytes = 4096;
  void* cublaslt_workspace() const { return cublaslt_ws_; }
  void* gemm_check_scratch() const { return cublaslt_ws_ ? static_cast<char*>(cublaslt_ws_) + kCublasLtWorkspaceBytes : nullptr; }
  // 8 bytes after those: the expert GEMMs' dynamic tile schedule, a pair of ints that is zero
  // between launches on this stream (zeroed once here; every launch leaves it zero).
  int* schedule_counter() const {
    return cublaslt_ws_ ? reinterpret_cast<int*>(static_cast<char*>(cublaslt_ws_) + kCublasLtWorkspaceBytes + 16)
                        : nullptr;
  }
  // A reusable device workspace of at least `bytes` (grown on demand, never shrunk).
  void* workspace(size_t bytes);
  size_t workspace_bytes() const { return workspace_bytes_; }

  void synchronize() const;
  // After each op when MT_SYNC_DEBUG=1: synchronize and check for a pending device error.
  void debug_sync(const char* op) const;

 private:
  Device device_;
  DeviceFacts facts_;
  uint64_t seed_;
  int rank_;
  int num_threads_;
  bool sync_debug_ = false;
  void* stream_ = nullptr;
  void* cublas_ = nullptr;
  void* cublaslt_ = nullptr;
  void* cublaslt_ws_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Number of CUDA devices visible (0 in a CPU-only build or with no driver).
int cuda_device_count();

}  // namespace moetrain
