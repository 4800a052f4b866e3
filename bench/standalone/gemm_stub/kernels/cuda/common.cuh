// Stand-in for src/kernels/cuda/common.cuh in the standalone GEMM harness: stream_of, check_launch,
// MT_CUDA_CHECK, MT_CHECK and a never-freed device scratch buffer, without fmt or the project libraries
// (plus src's pdl.cuh, which the kernels call first).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/context.h"
#include "kernels/cuda/pdl.cuh"  // the real one (no project dependencies): pdl_wait, pdl_attribute

#define MT_CUDA_CHECK(call)                                                                       \
  do {                                                                                            \
    cudaError_t mt_e_ = (call);                                                                   \
    if (mt_e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(mt_e_), __FILE__, __LINE__); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// MT_CHECK(cond, "[op] message {}", values...): prints the unformatted message and exits.
#define MT_CHECK(cond, msg, ...)                                                   \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "check failed: %s: %s (%s:%d)\n", #cond, msg, __FILE__, __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace moetrain {
struct ScratchStub {
  void* p;
  void* data_ptr() const { return p; }
};
using Tensor = ScratchStub;
}  // namespace moetrain

namespace moetrain::cuda {

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

inline void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "[%s] kernel launch failed: %s\n", op, cudaGetErrorString(e));
    std::exit(1);
  }
}

inline Tensor device_scratch(const Context&, int64_t bytes) {
  static void* p = nullptr;
  static int64_t cap = 0;
  if (bytes > cap) {
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    if (p) MT_CUDA_CHECK(cudaFree(p));
    MT_CUDA_CHECK(cudaMalloc(&p, bytes));
    cap = bytes;
  }
  return Tensor{p};
}

}  // namespace moetrain::cuda

namespace moetrain::cuda {
// acc[0] += partial[0] + ... + partial[n-1] (one thread, in order: slow, fine for checks).
static __global__ void stub_add_partials(const double* p, int64_t n, double* acc) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  acc[0] += s;
}
inline void add_partials_into(Context& ctx, const double* partial, int64_t n, double* acc) {
  stub_add_partials<<<1, 1, 0, stream_of(ctx)>>>(partial, n, acc);
}
}  // namespace moetrain::cuda
