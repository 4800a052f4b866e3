// Stand-in for src/core/context.h in the standalone GEMM harness (bench/standalone/gemm_bench.cu):
// just the stream, the device facts and the schedule counter the grouped GEMM kernels read. Not part of
// the project build.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moetrain {

struct DeviceFacts {
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};

class Context {
 public:
  void* stream() const { return stream_; }
  const DeviceFacts& facts() const { return facts_; }
  // The expert GEMMs' dynamic schedule counter, a pair of ints that every launch leaves zero (the real
  // Context keeps it in its cuBLASLt buffer): here allocated and zeroed on first use, kept until exit.
  int* schedule_counter() const {
    if (!counter_) {
      cudaMalloc(&counter_, 2 * sizeof(int));
      cudaMemset(counter_, 0, 2 * sizeof(int));
      cudaDeviceSynchronize();
    }
    return counter_;
  }
  void* stream_ = nullptr;
  DeviceFacts facts_;
  mutable int* counter_ = nullptr;
};

}  // namespace moetrain
