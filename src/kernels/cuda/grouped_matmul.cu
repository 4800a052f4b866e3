// CUDA grouped expert GEMM with offsets read on the device (no host synchronization):
// y[r] = x[r] W[e]^T for rows r in [offsets[e], offsets[e+1]); dx = dy W[e]; dw[e] += dy_e^T x_e
// (grouped_matmul_backward_ex: or dw[e] = dy_e^T x_e).
// A simple shared-memory tiled kernel (64x64 tiles, 4x4 outputs per thread, fp32 accumulation);
// x, w, y, dy, dx share one dtype (bf16 or f32); dw is f32 or bf16 (fp32 sum, then old + sum rounded
// once to nearest even). bf16 with K, M multiples of 8 goes to the tensor-core kernels: on compute
// capability 9.0, the warp-specialized TMA kernels (grouped_gemm_ws.cu: y, dx and dW), or with
// MT_GEMM_KERNEL=wgmma the cp.async wgmma ones they replaced (grouped_gemm_wgmma.cu, same bits);
// mma.sync (grouped_gemm_mma.cu) elsewhere; these simple kernels are the fallback.
// A row tile that straddles experts is computed once per expert, each pass writing only its
// rows. Rows at or past offsets[E] get zeros in y and dx, like the CPU twin. dw blocks own one
// (expert, tile) each and sum that expert's rows in order: deterministic, no atomics.
#include "core/env.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/grouped_gemm_mma.cuh"
#include "kernels/cuda/grouped_gemm_wgmma.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"

namespace moetrain::cuda {

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;

// acc[u][v] += sum over kk in [k0, k1) of A(ty*4+u, kk) * B(kk, tx*4+v); la/lb return 0 outside.
// Must be called by every thread of the block (it synchronizes).
template <typename LA, typename LB>
__device__ void tile_mma(LA la, LB lb, int64_t k0, int64_t k1, float (&acc)[4][4]) {
  __shared__ float As[kBK][kBM + 4];
  __shared__ float Bs[kBK][kBN + 4];
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  for (int64_t kb = k0; kb < k1; kb += kBK) {
    for (int q = tid; q < kBM * kBK; q += kThreads) {
      const int i = q / kBK, kk = q % kBK;
      As[kk][i] = kb + kk < k1 ? la(i, kb + kk) : 0.0f;
    }
    for (int q = tid; q < kBN * kBK; q += kThreads) {
      const int j = q / kBK, kk = q % kBK;
      Bs[kk][j] = kb + kk < k1 ? lb(kb + kk, j) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) a[u] = As[kk][ty * 4 + u];
#pragma unroll
      for (int v = 0; v < 4; ++v) b[v] = Bs[kk][tx * 4 + v];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[u][v] += a[u] * b[v];
    }
    __syncthreads();
  }
}

// The expert whose rows contain r: the largest e in [0, E) with off[e] <= r.
__device__ __forceinline__ int expert_of(const int32_t* __restrict__ off, int E, int64_t r) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (off[mid] <= r) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Row-tiled product over experts: out[r, c] = sum_kk A(r, kk) * B_e(kk, c) for r in expert e,
// with A = a[N, KD] and B_e(kk, c) = w[e] read through `b_at`. Used for y (KD = K) and dx (KD = M).
template <typename A, typename W, typename O, bool kWTransposed>
__global__ void gmm_rows_kernel(const A* __restrict__ a, const W* __restrict__ w, const int32_t* __restrict__ off,
                                int E, int64_t N, int64_t KD, int64_t NC, O* __restrict__ out) {
  pdl_wait();
  const int64_t r0 = blockIdx.y * (int64_t)kBM, c0 = blockIdx.x * (int64_t)kBN;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t tile_end = min(r0 + kBM, N);
  const int64_t total = off[E];
  // w[e] is [M, K]; y uses B(kk, c) = w[e][c, kk] (transposed), dx uses B(m, c) = w[e][m, c].
  const int64_t wsize = KD * NC;
  for (int e = expert_of(off, E, r0); e < E && off[e] < min(tile_end, total); ++e) {
    const int64_t lo = max(r0, static_cast<int64_t>(off[e])), hi = min(tile_end, static_cast<int64_t>(off[e + 1]));
    if (lo >= hi) continue;
    const W* we = w + e * wsize;
    float acc[4][4] = {};
    tile_mma(
        [&](int i, int64_t kk) {
          const int64_t r = r0 + i;
          return r >= lo && r < hi ? to_f(a[r * KD + kk]) : 0.0f;
        },
        [&](int64_t kk, int j) {
          const int64_t c = c0 + j;
          if (c >= NC) return 0.0f;
          return kWTransposed ? to_f(we[c * KD + kk]) : to_f(we[kk * NC + c]);
        },
        0, KD, acc);
    for (int u = 0; u < 4; ++u) {
      const int64_t r = r0 + ty * 4 + u;
      if (r < lo || r >= hi) continue;
      for (int v = 0; v < 4; ++v) {
        const int64_t c = c0 + tx * 4 + v;
        if (c < NC) out[r * NC + c] = from_f<O>(acc[u][v]);
      }
    }
  }
  // Rows past the last expert's end are unused capacity: zeros.
  for (int64_t q = tid; q < kBM * kBN; q += kThreads) {
    const int64_t r = r0 + q / kBN, c = c0 + q % kBN;
    if (r < N && r >= total && c < NC) out[r * NC + c] = from_f<O>(0.0f);
  }
}

// dw[e][m, kk] (+)= sum over rows r of expert e of dy[r, m] * x[r, kk]; grid (K tiles, M tiles, E).
// D = float or bf16 (old value + fp32 sum, rounded once).
// accumulate 0: dw = sum (an expert without rows gets zeros; dw is not read).
template <typename X, typename G, typename D>
__global__ void gmm_dw_kernel(const X* __restrict__ x, const G* __restrict__ dy, const int32_t* __restrict__ off,
                              int64_t M, int64_t K, D* __restrict__ dw, int accumulate) {
  pdl_wait();
  const int e = blockIdx.z;
  const int64_t lo = off[e], hi = off[e + 1];
  if (lo >= hi && accumulate) return;  // uniform over the block: no thread reaches tile_mma's barriers
  const int64_t m0 = blockIdx.y * (int64_t)kBM, c0 = blockIdx.x * (int64_t)kBN;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  float acc[4][4] = {};
  tile_mma([&](int i, int64_t r) { return m0 + i < M ? to_f(dy[r * M + m0 + i]) : 0.0f; },
           [&](int64_t r, int j) { return c0 + j < K ? to_f(x[r * K + c0 + j]) : 0.0f; }, lo, hi, acc);
  D* de = dw + static_cast<int64_t>(e) * M * K;
  for (int u = 0; u < 4; ++u) {
    const int64_t m = m0 + ty * 4 + u;
    if (m >= M) continue;
    for (int v = 0; v < 4; ++v) {
      const int64_t c = c0 + tx * 4 + v;
      if (c < K) de[m * K + c] = from_f<D>((accumulate ? to_f(de[m * K + c]) : 0.0f) + acc[u][v]);
    }
  }
}

struct GmmDims {
  int64_t N, K, E, M;
};

GmmDims check_gmm(const Tensor& x, const Tensor& w, const Tensor& offsets, const char* op) {
  need_cuda(x, op, "x");
  need_cuda(w, op, "w");
  need_cuda(offsets, op, "offsets");
  need_dtype(offsets, DType::kI32, op, "offsets");
  MT_CHECK(x.dim() == 2 && w.dim() == 3, "[{}] x must be [N, K] and w [E, M, K]; got {} and {}", op, x.desc(),
           w.desc());
  GmmDims d{x.size(0), x.size(1), w.size(0), w.size(1)};
  MT_CHECK(w.size(2) == d.K, "[{}] w is {} but x has {} columns", op, w.desc(), d.K);
  need_numel(offsets, d.E + 1, op, "offsets");
  MT_CHECK(d.E >= 1 && d.E <= 65535, "[{}] {} experts not supported (1..65535)", op, d.E);
  return d;
}

}  // namespace

// y and dx on Hopper: the warp-specialized TMA kernel (grouped_gemm_ws.cu), unless
// MT_GEMM_KERNEL=wgmma asks for the cp.async wgmma kernel it replaced (for comparisons).
static bool use_ws_kernel() {
  static const bool ws = env_string("MT_GEMM_KERNEL", "ws") != "wgmma";
  return ws;
}
// The ws kernel's variant (grouped_gemm_ws.cuh; 0: its default, 8 for dx and 7 for y), for benchmarks:
// MT_GEMM_WS_VARIANT for y, MT_GEMM_WS_DX_VARIANT for dx. Every variant gives the same bits.
static int ws_variant(bool dx) {
  auto read = [](const char* name) {
    const long v = env_int(name, 0);
    MT_CHECK(v >= 0 && v <= 9, "[grouped_matmul] {}={}: expected a variant from 0 to 9", name, v);
    return static_cast<int>(v);
  };
  static const int fwd = read("MT_GEMM_WS_VARIANT"), bwd = read("MT_GEMM_WS_DX_VARIANT");
  return dx ? bwd : fwd;
}

// offsets are trusted (first 0, non-decreasing, last <= N): read on the device, never on the host.
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y) {
  const char* op = "grouped_matmul";
  const GmmDims d = check_gmm(x, w, offsets, op);
  need_cuda(y, op, "y");
  need_numel(y, d.N * d.M, op, "y");
  if (!d.N || !d.M) return;
  const dim3 grid(static_cast<unsigned>((d.M + kBN - 1) / kBN), static_cast<unsigned>((d.N + kBM - 1) / kBM));
  need_dtype(w, x.dtype(), op, "w");
  need_dtype(y, x.dtype(), op, "y");
  if (x.dtype() == DType::kBF16 && use_ws_kernel() &&
      grouped_gemm_ws_supported(ctx, d.N, d.K, d.M, d.E, x.data_ptr(), w.data_ptr(), y.data_ptr())) {
    grouped_gemm_ws_forward(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                            static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                            static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(y.data_ptr()),
                            ws_variant(false));
    return;
  }
  if (x.dtype() == DType::kBF16 &&
      grouped_gemm_wgmma_supported(ctx, d.N, d.K, d.M, d.E, x.data_ptr(), w.data_ptr(), y.data_ptr())) {
    grouped_gemm_wgmma_forward(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                               static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                               static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(y.data_ptr()));
    return;
  }
  if (x.dtype() == DType::kBF16 && grouped_gemm_mma_supported(d.N, d.K, d.M, d.E, x.data_ptr(), w.data_ptr(),
                                                               y.data_ptr())) {
    grouped_gemm_mma_forward(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                             static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                             static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(y.data_ptr()));
    return;
  }
  MT_CUDA_DISPATCH(x.dtype(), T, op,
    launch_pdl(gmm_rows_kernel<T, T, T, true>, grid, kThreads, 0, stream_of(ctx),
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), offsets.data<int32_t>(),
        static_cast<int>(d.E), d.N, d.K, d.M, static_cast<T*>(y.data_ptr())));
  check_launch(op);
}

// dx = dy W[e] over each expert's rows (the dx half of grouped_matmul_backward; dims checked there).
void grouped_matmul_dx(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy,
                       Tensor& dx) {
  const char* op = "grouped_matmul_backward";
  const GmmDims d = check_gmm(x, w, offsets, op);
  cudaStream_t s = stream_of(ctx);
  if (d.N && d.K) {
    need_cuda(dx, op, "dx");
    need_numel(dx, d.N * d.K, op, "dx");
    const dim3 grid(static_cast<unsigned>((d.K + kBN - 1) / kBN), static_cast<unsigned>((d.N + kBM - 1) / kBM));
    need_dtype(dx, x.dtype(), op, "dx");
    if (x.dtype() == DType::kBF16 && use_ws_kernel() &&
        grouped_gemm_ws_supported(ctx, d.N, d.K, d.M, d.E, dy.data_ptr(), w.data_ptr(), dx.data_ptr())) {
      grouped_gemm_ws_dx(ctx, static_cast<const __nv_bfloat16*>(dy.data_ptr()),
                         static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                         static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(dx.data_ptr()),
                         ws_variant(true));
    } else if (x.dtype() == DType::kBF16 &&
        grouped_gemm_wgmma_supported(ctx, d.N, d.K, d.M, d.E, dy.data_ptr(), w.data_ptr(), dx.data_ptr())) {
      grouped_gemm_wgmma_dx(ctx, static_cast<const __nv_bfloat16*>(dy.data_ptr()),
                            static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                            static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(dx.data_ptr()));
    } else if (x.dtype() == DType::kBF16 && grouped_gemm_mma_supported(d.N, d.K, d.M, d.E, dy.data_ptr(), w.data_ptr(),
                                                                 dx.data_ptr())) {
      grouped_gemm_mma_dx(ctx, static_cast<const __nv_bfloat16*>(dy.data_ptr()),
                          static_cast<const __nv_bfloat16*>(w.data_ptr()), offsets.data<int32_t>(),
                          static_cast<int>(d.E), d.N, d.K, d.M, static_cast<__nv_bfloat16*>(dx.data_ptr()));
    } else {
      MT_CUDA_DISPATCH(x.dtype(), T, op,
        launch_pdl(gmm_rows_kernel<T, T, T, false>, grid, kThreads, 0, s,
            static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(w.data_ptr()), offsets.data<int32_t>(),
            static_cast<int>(d.E), d.N, d.M, d.K, static_cast<T*>(dx.data_ptr())));
      check_launch(op);
    }
  }
}

bool grouped_matmul_backward_ex(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                const Tensor& dy, Tensor& dx, Tensor& dw, bool dw_accumulate, double* sum_squares);

void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dw, Tensor* dw_sum_squares) {
  double* ss = nullptr;
  if (dw_sum_squares) {
    need_cuda(*dw_sum_squares, "grouped_matmul_backward", "dw_sum_squares");
    need_dtype(*dw_sum_squares, DType::kF64, "grouped_matmul_backward", "dw_sum_squares");
    ss = static_cast<double*>(dw_sum_squares->data_ptr());
  }
  // The Hopper dW kernel sums the squares in its epilogue; every other path reads dw once more.
  if (!grouped_matmul_backward_ex(ctx, x, w, offsets, dy, dx, dw, accumulate_dw, ss) && dw_sum_squares)
    sum_squares_accumulate(ctx, dw, *dw_sum_squares);
}

// grouped_matmul_backward with the dW mode explicit: dw_accumulate false writes dw = dy_e^T x_e
// (dw is not read; experts without rows get zeros). Returns true when the wgmma kernel added the
// sum of squares of dw to sum_squares (when given); false when the caller must.
bool grouped_matmul_backward_ex(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                const Tensor& dy, Tensor& dx, Tensor& dw, bool dw_accumulate, double* sum_squares) {
  const char* op = "grouped_matmul_backward";
  const GmmDims d = check_gmm(x, w, offsets, op);
  need_cuda(dy, op, "dy");
  need_cuda(dw, op, "dw");
  MT_CHECK(dw.dtype() == DType::kF32 || dw.dtype() == DType::kBF16, "[{}] dw is {}, expected f32 or bf16", op,
           dtype_name(dw.dtype()));
  const bool dw_bf16 = dw.dtype() == DType::kBF16;
  need_dtype(w, x.dtype(), op, "w");
  need_dtype(dy, x.dtype(), op, "dy");
  need_numel(dy, d.N * d.M, op, "dy");
  need_numel(dw, d.E * d.M * d.K, op, "dw");
  cudaStream_t s = stream_of(ctx);
  if (dx.defined()) grouped_matmul_dx(ctx, x, w, offsets, dy, dx);
  if (!d.M || !d.K) return true;  // dw is empty: its sum of squares is 0
  if (!d.N) {  // no rows: dw += 0, or dw = 0
    if (!dw_accumulate) MT_CUDA_CHECK(cudaMemsetAsync(dw.data_ptr(), 0, dw.nbytes(), s));
    return !dw_accumulate;
  }
  // dW on cc 9.0: the TMA-fed kernel (grouped_gemm_ws_dw.cuh; same bits), or with
  // MT_GEMM_KERNEL=wgmma the cp.async one; both stage the epilogue in smem for bulk copies.
  // mma.sync elsewhere.
  if (x.dtype() == DType::kBF16 && use_ws_kernel() &&
      grouped_gemm_ws_supported(ctx, d.N, d.K, d.M, d.E, x.data_ptr(), dy.data_ptr(), dw.data_ptr())) {
    grouped_gemm_ws_dw(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                       static_cast<const __nv_bfloat16*>(dy.data_ptr()), offsets.data<int32_t>(), static_cast<int>(d.E),
                       d.N, d.K, d.M, dw.data_ptr(), dw_bf16, dw_accumulate, sum_squares);
    return true;
  }
  if (x.dtype() == DType::kBF16 &&
      grouped_gemm_wgmma_supported(ctx, d.N, d.K, d.M, d.E, x.data_ptr(), dy.data_ptr(), dw.data_ptr())) {
    grouped_gemm_wgmma_dw(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                          static_cast<const __nv_bfloat16*>(dy.data_ptr()), offsets.data<int32_t>(),
                          static_cast<int>(d.E), d.N, d.K, d.M, dw.data_ptr(), dw_bf16, dw_accumulate, 0, 0,
                          sum_squares);
    return true;
  }
  if (x.dtype() == DType::kBF16 && grouped_gemm_mma_supported(d.N, d.K, d.M, d.E, x.data_ptr(), dy.data_ptr(),
                                                               dw.data_ptr())) {
    grouped_gemm_mma_dw(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                        static_cast<const __nv_bfloat16*>(dy.data_ptr()), offsets.data<int32_t>(),
                        static_cast<int>(d.E), d.N, d.K, d.M, dw.data_ptr(), dw_bf16, dw_accumulate);
    return false;
  }
  const dim3 grid(static_cast<unsigned>((d.K + kBN - 1) / kBN), static_cast<unsigned>((d.M + kBM - 1) / kBM),
                  static_cast<unsigned>(d.E));
  if (dw_bf16) {
    MT_CUDA_DISPATCH(x.dtype(), T, op,
      launch_pdl(gmm_dw_kernel<T, T, __nv_bfloat16>, grid, kThreads, 0, s,
          static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dy.data_ptr()), offsets.data<int32_t>(), d.M,
          d.K, static_cast<__nv_bfloat16*>(dw.data_ptr()), dw_accumulate ? 1 : 0));
  } else {
    MT_CUDA_DISPATCH(x.dtype(), T, op,
      launch_pdl(gmm_dw_kernel<T, T, float>, grid, kThreads, 0, s,
          static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dy.data_ptr()), offsets.data<int32_t>(), d.M,
          d.K, dw.data<float>(), dw_accumulate ? 1 : 0));
  }
  check_launch(op);
  return false;
}

}  // namespace moetrain::cuda

