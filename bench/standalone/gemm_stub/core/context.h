// Stand-in for src/core/context.h in the standalone GEMM harness (bench/standalone/gemm_bench.cu):
// just the stream and device facts the grouped GEMM kernels read. Not part of the project build.
#pragma once
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
  void* stream_ = nullptr;
  DeviceFacts facts_;
};

}  // namespace moetrain
