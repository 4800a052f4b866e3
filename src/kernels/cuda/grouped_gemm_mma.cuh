// Fast bf16 tensor-core grouped expert GEMM (grouped_gemm_mma.cu), called by grouped_matmul.cu
// when shapes allow (grouped_gemm_mma_supported); the simple tiled kernels remain the fallback.
// Raw device pointers; offsets [E+1] i32 on the device, read there only (no host sync).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "core/context.h"

namespace moetrain::cuda {

// K and M multiples of 8, 16-byte aligned pointers, and a tile bound that fits the grid.
bool grouped_gemm_mma_supported(int64_t N, int64_t K, int64_t M, int64_t E, const void* x, const void* w,
                                const void* out);
// y[N, M] = x[N, K] W[e][M, K]^T per expert's rows; rows past offsets[E] are zeroed.
void grouped_gemm_mma_forward(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* off,
                              int E, int64_t N, int64_t K, int64_t M, __nv_bfloat16* y);
// dx[N, K] = dy[N, M] W[e][M, K]; rows past offsets[E] are zeroed.
void grouped_gemm_mma_dx(Context& ctx, const __nv_bfloat16* dy, const __nv_bfloat16* w, const int32_t* off, int E,
                         int64_t N, int64_t K, int64_t M, __nv_bfloat16* dx);
// dw[e][M, K] (+)= dy_e^T x_e, dw f32 or (dw_bf16) bf16. accumulate: old value + fp32 sum, rounded
// once (bf16, nearest even); else overwritten (experts without rows get zeros, dw is not read).
// One CTA per output tile, rows summed in order (deterministic).
void grouped_gemm_mma_dw(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* off, int E,
                         int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate = true);

}  // namespace moetrain::cuda
