// Hopper (sm_90a) bf16 grouped expert GEMM on warpgroup MMA (grouped_gemm_wgmma.cu): y = x W[e]^T,
// dx = dy W[e], dw[e] (+)= dy_e^T x_e (dw f32 or bf16). grouped_matmul.cu calls it when the device
// is compute capability 9.0 and grouped_gemm_wgmma_supported() holds; the mma.sync kernels of
// grouped_gemm_mma.cu remain the path for other GPUs. Offsets [E+1] i32 stay on the device.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "core/context.h"

namespace moetrain::cuda {

// cc 9.0, K and M multiples of 8 and > 0, E <= 1024, 16-byte aligned pointers.
bool grouped_gemm_wgmma_supported(const Context& ctx, int64_t N, int64_t K, int64_t M, int64_t E, const void* x,
                                  const void* w, const void* out);
// y[N, M] = x[N, K] W[e][M, K]^T over each expert's rows; rows past offsets[E] are zeroed.
// tile_n: output tile width, 0 = default (256); 128 is also accepted (benchmarks).
void grouped_gemm_wgmma_forward(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* off,
                                int E, int64_t N, int64_t K, int64_t M, __nv_bfloat16* y, int tile_n = 0);
// dx[N, K] = dy[N, M] W[e][M, K]; rows past offsets[E] are zeroed.
void grouped_gemm_wgmma_dx(Context& ctx, const __nv_bfloat16* dy, const __nv_bfloat16* w, const int32_t* off, int E,
                           int64_t N, int64_t K, int64_t M, __nv_bfloat16* dx, int tile_n = 0);
// dw[e][M, K] (+)= dy_e^T x_e, summed in fp32 over the expert's rows in order; accumulate: added to
// the old dw (f32, or bf16 rounded once to nearest even), else written (experts without rows get
// zeros, dw is not read). One CTA owns each output tile: deterministic. Benchmark knobs: tile_n,
// the bf16 output tile width, 0 = default (256) or 128 (f32 always uses 128); tile_k, the rows per
// pipeline stage, 0 = default (32 for 256-wide tiles, 64 for 128) or 32 / 64. sum_squares: null,
// or a device f64 to which the sum of squares of the final dw (as stored) is added, computed in
// the epilogue from the values it writes (no second read of dw; deterministic).
void grouped_gemm_wgmma_dw(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* off, int E,
                           int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate = true,
                           int tile_n = 0, int tile_k = 0, double* sum_squares = nullptr);

}  // namespace moetrain::cuda
