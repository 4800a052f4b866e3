// The SwiGLU activation of one element, shared by the SwiGLU kernels (elementwise.cu) and the
// expert GEMM that applies it in its epilogue (grouped_gemm_ws.cu), so both give the same bits:
// silu(g) u = g sigmoid(g) u from bf16-rounded g and u, in this order of operations.
#pragma once
#include <cuda_runtime.h>

namespace moetrain::cuda {

__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float sg = 1.0f / (1.0f + expf(-g));
  return g * sg * u;
}

}  // namespace moetrain::cuda
