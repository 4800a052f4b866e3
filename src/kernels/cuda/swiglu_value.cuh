// SwiGLU of one element, silu(g) * u = g / (1 + exp(-g)) * u, with every rounding explicit (no
// contraction), so that the SwiGLU kernels (elementwise.cu) and the fused gate_up epilogue
// (grouped_gemm_ws.cu) give the same bits.
#pragma once

namespace moetrain::cuda {

__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  return __fmul_rn(__fmul_rn(g, sg), u);
}

}  // namespace moetrain::cuda
