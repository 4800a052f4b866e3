// FlashAttention-2 style bf16 attention kernels on mma.sync m16n8k16 (sm_80 and later): forward,
// D = rowsum(dO*O), dQ (per query tile) and dK/dV (per key tile, f32 partials per head split, then
// an ordered reduction): deterministic, no atomics. Device code only (no project dependencies), so
// that bench/standalone/attn_bench.cu can include it; attention_flash_launch.cuh launches it.
#pragma once
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moetrain::cuda::flash {

using bf16 = __nv_bfloat16;
using mma::ldmatrix_x4;
using mma::ldmatrix_x4_trans;
using mma::mma_bf16;
using mma::pack_bf16;
using mma::swz;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kFwdWarps = 8, kFwdBM = 16 * kFwdWarps, kBN = 64;  // forward and dQ: 128 queries x 64 keys
constexpr int kKvWarps = 4, kKvBN = 16 * kKvWarps, kKvBM = 64;   // dK/dV: 64 keys x 64 queries

struct FlashArgs {
  const bf16 *q, *k, *v, *o, *dout;
  const float *lse, *dsum;
  const int32_t* cu;
  bf16 *out, *dq;
  float *lse_out, *part_k, *part_v;
  float* dq_acc;     // sm90 fused backward: f32 dQ accumulator [nh][T][d]
  int* sems;         // sm90 fused backward: per (head, 64-query tile) count of key blocks added
  int* ticket;       // sm90 fused backward: CTA work counter (zeroed by the prep kernel)
  const int* jb_lo;  // sm90 fused backward: per 64-query tile, the first key block (128) adding to it
  int64_t T, nh, nkv, group;
  int ndocs, heads_per_cta;
  int deterministic;  // sm90 fused backward: 1 adds dQ partials in key-block order, 0 in any order
  float scale;
  int64_t dq_row, dk_row, dv_row;  // sm90 finish kernel: token strides of dq, dk, dv (elements)
};

// Kernels over (query tile, head) launch on query_grid: heads vary fastest in launch order and query
// tiles go from last to first, so every head's long causal rows start in the first waves and the
// last wave holds short ones (head-major order started the last heads' longest tiles in the final
// wave: 7-8% of the forward at T 4096). Same work per CTA, so the same bits.
struct QueryTile {
  int64_t h, t0;
};
template <int kBM>
__device__ __forceinline__ QueryTile query_tile() {
  return {static_cast<int64_t>(blockIdx.x), static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kBM};
}
inline dim3 query_grid(int64_t T, int64_t nh, int bm) {
  return dim3(static_cast<unsigned>(nh), static_cast<unsigned>((T + bm - 1) / bm));
}
inline bool query_grid_ok(int64_t T, int bm) { return (T + bm - 1) / bm <= 65535; }  // gridDim.y

__device__ __forceinline__ int doc_of(const int32_t* __restrict__ cu, int ndocs, int64_t t) {
  int lo = 0, hi = ndocs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Rows t0 .. t0+kRows-1 (zero past lim) of one head of x ([T, heads, kD], x pre-offset to the
// head, row stride `rs` elements) into a swizzled [kRows][kD] smem tile, with cp.async.
template <int kD, int kRows, int kThreads>
__device__ __forceinline__ void load_rows(uint32_t s, const bf16* x, int64_t rs, int64_t t0, int64_t lim) {
  constexpr int kCh = kD / 8;
#pragma unroll
  for (int it = 0; it < kRows * kCh / kThreads; ++it) {
    const int q = static_cast<int>(threadIdx.x) + it * kThreads, r = q / kCh, c = q % kCh;
    const int64_t t = t0 + r;
    const bool ok = t < lim;
    mma::cp_async16(s + swz<kCh>(r, c), ok ? x + t * rs + c * 8 : x, ok);
  }
}

// A fragments (16 rows x 16 k) of a K-major swizzled tile: rows row0.., k step ks.
template <int kD>
__device__ __forceinline__ void ld_a(uint32_t (&r)[4], uint32_t s, int row0, int ks) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(r, s + swz<kD / 8>(row0 + (lane & 15), ks * 2 + (lane >> 4)));
}
// B fragments for two n8 tiles (n0 .. n0+15) where B(k, n) = tile[n][k] (K-major, e.g. K in Q K^T).
template <int kD>
__device__ __forceinline__ void ld_b_kmaj(uint32_t (&r)[4], uint32_t s, int n0, int ks) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4(r, s + swz<kD / 8>(n0 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
}
// B fragments for two n8 tiles (d columns dp*16 ..) where B(k, n) = tile[k][n] (e.g. V in P V).
template <int kD>
__device__ __forceinline__ void ld_b_nmaj(uint32_t (&r)[4], uint32_t s, int k0, int dp) {
  const int lane = threadIdx.x & 31;
  ldmatrix_x4_trans(r, s + swz<kD / 8>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
}

// acc[16 x 64] = A (16 x kD, fragments from smem tile sa at row0) * B^T with B = tile sb [64][kD].
template <int kD>
__device__ __forceinline__ void gemm_abt(float (&acc)[8][4], uint32_t sa, int row0, uint32_t sb) {
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    uint32_t a[4];
    ld_a<kD>(a, sa, row0, ks);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      ld_b_kmaj<kD>(b, sb, np * 16, ks);
      mma_bf16(acc[2 * np], a, b[0], b[1]);
      mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// A fragment (16 x 16, mma.sync layout; also wgmma's register A) from columns 16kk.. of an
// accumulator tile: P or dS packed to bf16 without leaving registers.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&p)[N][4], int kk) {
  a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// out[16 x kD] += P (16 x 64, from accumulator fragments) * tile sb [64][kD].
template <int kD>
__device__ __forceinline__ void gemm_pv(float (&out)[kD / 8][4], const float (&p)[8][4], uint32_t sb) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    acc_to_a(a, p, kk);
#pragma unroll
    for (int dp = 0; dp < kD / 16; ++dp) {
      uint32_t b[4];
      ld_b_nmaj<kD>(b, sb, kk * 16, dp);
      mma_bf16(out[2 * dp], a, b[0], b[1]);
      mma_bf16(out[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Query-side tile facts shared by the forward and dQ kernels for one warp's 16 rows.
struct QRows {
  int64_t r[2], beg[2];  // this thread's two rows (g, g+8) and their documents' first keys
  int64_t lo, hi;        // the warp's first and last valid row (hi < lo when none)
  int64_t beg_lo, beg_hi;  // first keys of lo's and hi's documents (smallest and largest begins)
};

__device__ __forceinline__ QRows q_rows(const FlashArgs& a, int64_t t0, int warp) {
  const int lane = threadIdx.x & 31;
  QRows q;
  for (int h = 0; h < 2; ++h) {
    q.r[h] = t0 + warp * 16 + (lane >> 2) + 8 * h;
    q.beg[h] = q.r[h] < a.T ? a.cu[doc_of(a.cu, a.ndocs, q.r[h])] : INT64_MAX;
  }
  q.lo = t0 + warp * 16;
  q.hi = min(q.lo + 15, a.T - 1);
  q.beg_lo = q.hi >= q.lo ? a.cu[doc_of(a.cu, a.ndocs, q.lo)] : 0;
  q.beg_hi = q.hi >= q.lo ? a.cu[doc_of(a.cu, a.ndocs, q.hi)] : 0;
  return q;
}

// ---- pieces shared with the sm90 kernels (attention_flash_sm90_ws.cuh) ------------------------
// A thread's fragment of a 16-row (mma.sync) or 64-row (wgmma) block: s[n][e] is row g + 8 (e >> 1)
// of the warp's 16 (g = lane / 4), column 8n + 2 (lane & 3) + (e & 1).

// Sets masked scores (key outside [beg, row]) of an N x 8-column score block to -inf; keys start at kt.
template <int N>
__device__ __forceinline__ void mask_scores(float (&s)[N][4], const QRows& q, int64_t kt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t key = kt + n * 8 + 2 * (lane & 3) + (e & 1);
      const int h = e >> 1;
      if (key < q.beg[h] || key > q.r[h]) s[n][e] = -INFINITY;
    }
}

// Online softmax step over an N x 8-column score block in the scaled exp2 domain: p replaces s, the
// running max m and sum l are updated, corr[hh] is the factor by which the output rows of half hh
// (row g + 8 hh) still have to be scaled; after_half(hh, corr[hh]) runs last (sm80 scales there).
template <int N, typename AfterHalf>
__device__ __forceinline__ void softmax_step(float (&s)[N][4], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             float sl2, AfterHalf&& after_half) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < N; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hh], s[n][2 * hh + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m[hh], mx * sl2);
    const float base = mn == -INFINITY ? 0.0f : mn;  // a row that saw no key yet: p = 0
    const float c = exp2f(m[hh] - base);
    corr[hh] = c;
    m[hh] = mn;
    float rs = 0.0f;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(fmaf(s[n][2 * hh + e], sl2, -base));
        s[n][2 * hh + e] = p;
        rs += p;
      }
    l[hh] = l[hh] * c + rs;
    after_half(hh, c);
  }
}
// Scales the output rows of an accumulator tile: half hh by corr, or both halves by corr[0], corr[1].
template <int N>
__device__ __forceinline__ void scale_rows(float (&o)[N][4], int hh, float corr) {
#pragma unroll
  for (int dt = 0; dt < N; ++dt) {
    o[dt][2 * hh] *= corr;
    o[dt][2 * hh + 1] *= corr;
  }
}
template <int N>
__device__ __forceinline__ void scale_rows(float (&o)[N][4], const float (&corr)[2]) {
#pragma unroll
  for (int dt = 0; dt < N; ++dt) {
    o[dt][0] *= corr[0];
    o[dt][1] *= corr[0];
    o[dt][2] *= corr[1];
    o[dt][3] *= corr[1];
  }
}

// Forward epilogue: out rows r (bf16, normalized by the quad's summed l) and lse = ln(sum exp).
template <int kD>
__device__ __forceinline__ void store_out_lse(const FlashArgs& a, const float (&o)[kD / 8][4], const float (&m)[2],
                                              const float (&l)[2], const int64_t (&r)[2], int64_t h) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float lt = l[hh];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    if (r[hh] >= a.T) continue;
    const float inv = 1.0f / lt;
    bf16* orow = a.out + (r[hh] * a.nh + h) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8) = pack_bf16(o[dt][2 * hh] * inv, o[dt][2 * hh + 1] * inv);
    if ((lane & 3) == 0) a.lse_out[h * a.T + r[hh]] = (m[hh] + log2f(lt)) * kLn2;
  }
}

// dK/dV epilogue: this thread's key rows (I: int or int64_t) as f32 partials [split][T][nkv][kD],
// dK times scale.
template <int kD, typename I>
__device__ __forceinline__ void store_kv_partials(const FlashArgs& a, const float (&dk)[kD / 8][4],
                                                  const float (&dv)[kD / 8][4], const I (&key)[2], int64_t g,
                                                  int64_t split) {
  const int lane = threadIdx.x & 31;
  float* pk = a.part_k + split * a.T * a.nkv * kD;
  float* pv = a.part_v + split * a.T * a.nkv * kD;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (key[hh] >= a.T) continue;
    const int64_t base = (static_cast<int64_t>(key[hh]) * a.nkv + g) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<float2*>(pk + base + dt * 8) =
          make_float2(dk[dt][2 * hh] * a.scale, dk[dt][2 * hh + 1] * a.scale);
      *reinterpret_cast<float2*>(pv + base + dt * 8) = make_float2(dv[dt][2 * hh], dv[dt][2 * hh + 1]);
    }
  }
}

// D = dO . O of row w = t * nh + h ([T, nh, kD] bf16), by one warp (lane) with 16-byte loads.
template <int kD>
__device__ __forceinline__ float row_dot(const FlashArgs& a, int64_t w, int lane) {
  float s = 0.0f;
  for (int c = lane * 8; c < kD; c += 256) {
    const uint4 ov = *reinterpret_cast<const uint4*>(a.o + w * kD + c);
    const uint4 gv = *reinterpret_cast<const uint4*>(a.dout + w * kD + c);
    const bf16* op = reinterpret_cast<const bf16*>(&ov);
    const bf16* gp = reinterpret_cast<const bf16*>(&gv);
#pragma unroll
    for (int i = 0; i < 8; ++i) s += __bfloat162float(op[i]) * __bfloat162float(gp[i]);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
// ---- sm80 kernels ------------------------------------------------------------------------------
// Forward / dQ key loop: waits for key tile jt (at kt) in buffer jt & 1, then starts the cp.async
// loads of tile jt + 1 into the other buffer.
template <int kD>
__device__ __forceinline__ void next_kv_tiles(uint32_t sK, uint32_t sV, const bf16* k, const bf16* v, int64_t ks,
                                              int64_t kt, int64_t kend, int jt, int ntiles) {
  constexpr int kTile = kBN * kD * 2;
  mma::cp_async_wait<0>();
  __syncthreads();
  if (jt + 1 < ntiles) {
    const int nb = (jt + 1) & 1;
    load_rows<kD, kBN, 32 * kFwdWarps>(sK + nb * kTile, k, ks, kt + kBN, kend);
    load_rows<kD, kBN, 32 * kFwdWarps>(sV + nb * kTile, v, ks, kt + kBN, kend);
  }
  mma::cp_async_commit();
}


template <int kD>
__global__ void __launch_bounds__(32 * kFwdWarps, 1) attn_fwd_mma_kernel(FlashArgs a) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTile = kBN * kD * 2;
  const uint32_t sQ = mma::smem_addr(smem), sK = sQ + kFwdBM * kD * 2, sV = sK + 2 * kTile;
  const QueryTile qt = query_tile<kFwdBM>();
  const int64_t h = qt.h, g = h / a.group, t0 = qt.t0;
  const int warp = threadIdx.x >> 5;
  const bf16* q = a.q + h * kD;
  const bf16* k = a.k + g * kD;
  const bf16* v = a.v + g * kD;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const QRows qr = q_rows(a, t0, warp);
  const int64_t kmin = a.cu[doc_of(a.cu, a.ndocs, t0)], kend = min(t0 + kFwdBM, a.T);
  const int ntiles = static_cast<int>((kend - kmin + kBN - 1) / kBN);
  load_rows<kD, kFwdBM, 32 * kFwdWarps>(sQ, q, qs, t0, a.T);
  load_rows<kD, kBN, 32 * kFwdWarps>(sK, k, ks, kmin, kend);
  load_rows<kD, kBN, 32 * kFwdWarps>(sV, v, ks, kmin, kend);
  mma::cp_async_commit();

  const float sl2 = a.scale * kLog2e;
  float o[kD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int jt = 0; jt < ntiles; ++jt) {
    const int64_t kt = kmin + static_cast<int64_t>(jt) * kBN;
    next_kv_tiles<kD>(sK, sV, k, v, ks, kt, kend, jt, ntiles);
    // Warp-uniform skip: every key of the tile is after every row, or before every row's document.
    if (qr.hi < qr.lo || kt > qr.hi || kt + kBN <= qr.beg_lo) continue;
    const uint32_t bK = sK + (jt & 1) * kTile, bV = sV + (jt & 1) * kTile;
    float s[8][4];
    gemm_abt<kD>(s, sQ, warp * 16, bK);
    if (!(kt + kBN - 1 <= qr.lo && kt >= qr.beg_hi)) mask_scores(s, qr, kt);
    float corr[2];
    softmax_step(s, m, l, corr, sl2, [&](int hh, float c) { scale_rows(o, hh, c); });
    gemm_pv<kD>(o, s, bV);
  }
  store_out_lse<kD>(a, o, m, l, qr.r, h);
}

// D[h, t] = dO[t, h] . O[t, h]; one warp per (t, h), 16-byte loads.
template <int kD>
__global__ void attn_dot_kernel(FlashArgs a, float* __restrict__ dsum) {
  pdl_wait();
  const int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= a.T * a.nh) return;
  const int64_t t = w / a.nh, h = w - t * a.nh;
  const float s = row_dot<kD>(a, w, lane);
  if (lane == 0) dsum[h * a.T + t] = s;
}

// dQ = scale * sum over keys of dS K, dS = P * (dP - D), P = exp(S*scale - lse), dP = dO V^T.
template <int kD>
__global__ void __launch_bounds__(32 * kFwdWarps, 1) attn_dq_mma_kernel(FlashArgs a) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTile = kBN * kD * 2;
  const uint32_t sQ = mma::smem_addr(smem), sG = sQ + kFwdBM * kD * 2, sK = sG + kFwdBM * kD * 2,
                 sV = sK + 2 * kTile;
  const QueryTile qt = query_tile<kFwdBM>();
  const int64_t h = qt.h, g = h / a.group, t0 = qt.t0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bf16* k = a.k + g * kD;
  const bf16* v = a.v + g * kD;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const QRows qr = q_rows(a, t0, warp);
  const int64_t kmin = a.cu[doc_of(a.cu, a.ndocs, t0)], kend = min(t0 + kFwdBM, a.T);
  const int ntiles = static_cast<int>((kend - kmin + kBN - 1) / kBN);
  load_rows<kD, kFwdBM, 32 * kFwdWarps>(sQ, a.q + h * kD, qs, t0, a.T);
  load_rows<kD, kFwdBM, 32 * kFwdWarps>(sG, a.dout + h * kD, qs, t0, a.T);
  load_rows<kD, kBN, 32 * kFwdWarps>(sK, k, ks, kmin, kend);
  load_rows<kD, kBN, 32 * kFwdWarps>(sV, v, ks, kmin, kend);
  mma::cp_async_commit();
  const float sl2 = a.scale * kLog2e;
  float lse2[2], dd[2];
  for (int hh = 0; hh < 2; ++hh) {
    const bool ok = qr.r[hh] < a.T;
    lse2[hh] = ok ? a.lse[h * a.T + qr.r[hh]] * kLog2e : 0.0f;
    dd[hh] = ok ? a.dsum[h * a.T + qr.r[hh]] : 0.0f;
  }
  float dq[kD / 8][4] = {};
  for (int jt = 0; jt < ntiles; ++jt) {
    const int64_t kt = kmin + static_cast<int64_t>(jt) * kBN;
    next_kv_tiles<kD>(sK, sV, k, v, ks, kt, kend, jt, ntiles);
    if (qr.hi < qr.lo || kt > qr.hi || kt + kBN <= qr.beg_lo) continue;
    const uint32_t bK = sK + (jt & 1) * kTile, bV = sV + (jt & 1) * kTile;
    float s[8][4], dp[8][4];
    gemm_abt<kD>(s, sQ, warp * 16, bK);
    if (!(kt + kBN - 1 <= qr.lo && kt >= qr.beg_hi)) mask_scores(s, qr, kt);
    gemm_abt<kD>(dp, sG, warp * 16, bV);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] * sl2 - lse2[e >> 1]);
        s[n][e] = p * (dp[n][e] - dd[e >> 1]);  // dS
      }
    gemm_pv<kD>(dq, s, bK);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t r = qr.r[hh];
    if (r >= a.T) continue;
    bf16* row = a.dq + (r * a.nh + h) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<uint32_t*>(row + dt * 8) = pack_bf16(dq[dt][2 * hh] * a.scale, dq[dt][2 * hh + 1] * a.scale);
  }
}

// dK, dV for 64 keys of kv head g over heads [h0, h0 + heads_per_cta) of its group:
// dV += P^T dO, dK += dS^T Q (then * scale), written as f32 partials [split][T][nkv][kD].
template <int kD>
__global__ void __launch_bounds__(32 * kKvWarps, 2) attn_dkdv_mma_kernel(FlashArgs a) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTile = kKvBM * kD * 2;
  const uint32_t sK = mma::smem_addr(smem), sV = sK + kKvBN * kD * 2, sQ = sV + kKvBN * kD * 2, sG = sQ + 2 * kTile;
  float* sL = reinterpret_cast<float*>(smem + 2 * kKvBN * kD * 2 + 4 * kTile);  // [2][kKvBM] lse * log2e
  float* sD = sL + 2 * kKvBM;                                                     // [2][kKvBM] dsum
  const int64_t g = blockIdx.y, split = blockIdx.z;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kKvBN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const int64_t jlast = min(j0 + kKvBN - 1, a.T - 1);
  const int64_t qend = a.cu[doc_of(a.cu, a.ndocs, jlast) + 1];
  int64_t key[2], kend[2];
  for (int hh = 0; hh < 2; ++hh) {
    key[hh] = j0 + warp * 16 + (lane >> 2) + 8 * hh;
    kend[hh] = key[hh] < a.T ? a.cu[doc_of(a.cu, a.ndocs, key[hh]) + 1] : 0;
  }
  const int64_t wlo = j0 + warp * 16, whi = min(wlo + 15, a.T - 1);
  const int64_t wend_lo = wlo < a.T ? a.cu[doc_of(a.cu, a.ndocs, wlo) + 1] : 0;  // smallest doc end of the warp
  const int64_t wend_hi = wlo < a.T ? a.cu[doc_of(a.cu, a.ndocs, whi) + 1] : 0;  // largest
  const int64_t h0 = g * a.group + split * a.heads_per_cta;
  const int qtiles = static_cast<int>((qend - j0 + kKvBM - 1) / kKvBM);
  const int total = qtiles * a.heads_per_cta;
  auto issue = [&](int it) {  // loads of step it = (head, q tile) into buffer it & 1
    const int64_t h = h0 + it / qtiles, q0 = j0 + static_cast<int64_t>(it % qtiles) * kKvBM;
    const int b = it & 1;
    load_rows<kD, kKvBM, 32 * kKvWarps>(sQ + b * kTile, a.q + h * kD, qs, q0, qend);
    load_rows<kD, kKvBM, 32 * kKvWarps>(sG + b * kTile, a.dout + h * kD, qs, q0, qend);
    for (int i = threadIdx.x; i < kKvBM; i += 32 * kKvWarps) {
      const int64_t t = q0 + i;
      sL[b * kKvBM + i] = t < qend ? a.lse[h * a.T + t] * kLog2e : 0.0f;
      sD[b * kKvBM + i] = t < qend ? a.dsum[h * a.T + t] : 0.0f;
    }
  };
  load_rows<kD, kKvBN, 32 * kKvWarps>(sK, a.k + g * kD, ks, j0, a.T);
  load_rows<kD, kKvBN, 32 * kKvWarps>(sV, a.v + g * kD, ks, j0, a.T);
  if (total > 0) issue(0);
  mma::cp_async_commit();
  const float sl2 = a.scale * kLog2e;
  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  for (int it = 0; it < total; ++it) {
    const int64_t q0 = j0 + static_cast<int64_t>(it % qtiles) * kKvBM;
    mma::cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < total) issue(it + 1);
    mma::cp_async_commit();
    // Warp-uniform skip: every query of the tile precedes every key, or is past every key's document.
    if (wlo >= a.T || q0 + kKvBM - 1 < wlo || q0 >= wend_hi) continue;
    const int b = it & 1;
    const uint32_t bQ = sQ + b * kTile, bG = sG + b * kTile;
    const float* L = sL + b * kKvBM;
    const float* Dv = sD + b * kKvBM;
    float s[8][4], dp[8][4];
    gemm_abt<kD>(s, sK, warp * 16, bQ);   // S^T: keys x queries
    gemm_abt<kD>(dp, sV, warp * 16, bG);  // dP^T
    const bool full = q0 >= whi && q0 + kKvBM <= wend_lo;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * (lane & 3) + (e & 1);
        const int64_t qi = q0 + c;
        const int hh = e >> 1;
        float p = exp2f(s[n][e] * sl2 - L[c]);
        if (!full && (qi < key[hh] || qi >= kend[hh])) p = 0.0f;
        s[n][e] = p;
        dp[n][e] = p * (dp[n][e] - Dv[c]);
      }
    gemm_pv<kD>(dv, s, bG);
    gemm_pv<kD>(dk, dp, bQ);
  }
  store_kv_partials<kD>(a, dk, dv, key, g, split);
}

// dk/dv (bf16) = sum over splits, in order, of the f32 partials.
static __global__ void attn_kv_reduce_kernel(const float* __restrict__ pk, const float* __restrict__ pv, int splits,
                                      int64_t n, bf16* __restrict__ dk, bf16* __restrict__ dv) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float sk = 0.0f, sv = 0.0f;
    for (int s = 0; s < splits; ++s) {
      sk += pk[s * n + i];
      sv += pv[s * n + i];
    }
    dk[i] = __float2bfloat16_rn(sk);
    dv[i] = __float2bfloat16_rn(sv);
  }
}

}  // namespace moetrain::cuda::flash
