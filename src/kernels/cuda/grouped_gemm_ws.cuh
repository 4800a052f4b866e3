// Hopper (sm_90a) warp-specialized bf16 grouped expert GEMM (grouped_gemm_ws.cu): y = x W[e]^T and
// dx = dy W[e] with TMA loads into an mbarrier ring, one producer warp and two consumer warpgroups
// on wgmma, a persistent tile scheduler that reads the offsets [E+1] (int32) on the device, and
// 2-CTA clusters that multicast the weight tile. Same contract as grouped_gemm_wgmma_forward / _dx.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "core/context.h"

namespace moetrain::cuda {

// cc 9.0, K and M multiples of 8 and > 0, 1 <= E <= 1024, N < 2^31, 16-byte aligned pointers.
bool grouped_gemm_ws_supported(const Context& ctx, int64_t N, int64_t K, int64_t M, int64_t E, const void* x,
                               const void* w, const void* out);
// y[N, M] = x[N, K] W[e][M, K]^T over each expert's rows (fp32 accumulation); rows past offsets[E]
// are zeroed. variant (benchmark knob): 0 = default: 8 for dx, 7 for y; 1 = cooperative 128x256
// tiles; 2 = with 2-CTA clusters multicasting W; 3 = pingpong, 64x256 per warpgroup; 4 = pingpong with
// clusters; 5 = 1 with the units of an expert ordered (row block, column tile); 6 = tall 256x192
// tiles, 128x192 per warpgroup; 7 and 8 = 1 and 6 with a dynamic schedule (units from an atomic
// counter); above 512 experts 6 and 8 run as 1 and 7; 9 = 8 for a dx whose reduction M is at least
// twice K, else 1.
void grouped_gemm_ws_forward(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* off,
                             int E, int64_t N, int64_t K, int64_t M, __nv_bfloat16* y, int variant = 0);
// dx[N, K] = dy[N, M] W[e][M, K]; rows past offsets[E] are zeroed. variant as above.
void grouped_gemm_ws_dx(Context& ctx, const __nv_bfloat16* dy, const __nv_bfloat16* w, const int32_t* off, int E,
                        int64_t N, int64_t K, int64_t M, __nv_bfloat16* dx, int variant = 0);

// dw[e][M, K] (+)= dy_e^T x_e: same meaning as grouped_gemm_wgmma_dw (f32 or bf16 dw, = or +=,
// zeros for experts without rows in = mode, deterministic, bit-identical to it), fed by TMA
// (grouped_gemm_ws_dw.cuh). sum_squares: null, or a device f64 to which the sum of squares of the
// final dw is added (per-tile partials, summed in tile order).
void grouped_gemm_ws_dw(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* off, int E,
                        int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate, double* sum_squares);

}  // namespace moetrain::cuda
