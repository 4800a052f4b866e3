// Hopper (sm_90a) bf16 attention kernels on warpgroup MMA (wgmma.mma_async), FlashAttention-3 in
// spirit but without warp specialization: cp.async double-buffered tiles in 128-byte-swizzled shared
// memory, S = Q K^T with both operands from shared memory, P (or dS) fed from registers into the
// second GEMM against an MN-major shared tile. Each warpgroup owns 64 rows (queries, or keys in dK/dV).
// Same masking, document and determinism rules as attention_flash_sm80.cuh, whose helpers it uses.
#pragma once
#include "kernels/cuda/attention_flash_sm80.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_ATTN_SM90A 1
#else
#define MT_ATTN_SM90A 0
#endif

namespace moetrain::cuda::flash {

// ---- wgmma building blocks -----------------------------------------------------------------
__device__ __forceinline__ void wg_fence() {
#if MT_ATTN_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if MT_ATTN_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wg_wait() {
#if MT_ATTN_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
// Makes cp.async-written shared memory visible to the tensor cores' (async proxy) reads.
__device__ __forceinline__ void fence_async_smem() {
#if MT_ATTN_SM90A
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// Tiles of kRows rows x kD bf16 are stored as kD/64 column blocks of [kRows][64], 128-byte rows
// with the 16-byte chunk index XORed with row & 7 (the wgmma 128B swizzle; tile bases 1024-aligned).
template <int kRows>
__device__ __forceinline__ uint32_t sw_off(int r, int ch) {
  return static_cast<uint32_t>((ch >> 3) * (kRows * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// K-major operand (reduction over the kD columns): rows row0.. of the tile, k step ks (16 columns).
template <int kRows>
__device__ __forceinline__ uint64_t desc_kmaj(uint32_t tile, int row0, int ks) {
  return sw128_desc(tile + (ks >> 2) * (kRows * 128) + row0 * 128 + (ks & 3) * 32, 16, 1024);
}
// MN-major B operand (reduction over rows k0 .. k0+15 of the tile, N = the kD columns).
template <int kRows>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0) {
  return sw128_desc(tile + k0 * 128, kRows * 128, 1024);
}

// Rows t0 .. t0+kRows-1 (zero past lim) of one head of x into a swizzled tile, with cp.async.
template <int kD, int kRows, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t s, const bf16* x, int64_t rs, int64_t t0, int64_t lim) {
  constexpr int kCh = kD / 8;
#pragma unroll
  for (int it = 0; it < kRows * kCh / kThreads; ++it) {
    const int q = static_cast<int>(threadIdx.x) + it * kThreads, r = q / kCh, c = q % kCh;
    const int64_t t = t0 + r;
    const bool ok = t < lim;
    mma::cp_async16(s + sw_off<kRows>(r, c), ok ? x + t * rs + c * 8 : x, ok);
  }
}

// A fragment (16 x 16, mma.sync layout) from columns 16kk.. of an accumulator tile.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&p)[N][4], int kk) {
  a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// d[8][4] = (accumulate ? d : 0) + A (64 x 16, smem) * B (16 x 64, smem); both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_ATTN_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// d[8][4] += A (64 x 16 in registers, per warp as for mma.sync) * B (16 x 64, MN-major smem).
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
#if MT_ATTN_SM90A
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

// d[16][4] = (accumulate ? d : 0) + A (64 x 16, smem) * B (16 x 128, smem); both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_ATTN_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// d[16][4] += A (64 x 16 in registers, per warp as for mma.sync) * B (16 x 128, MN-major smem).
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) {
#if MT_ATTN_SM90A
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

// Sets masked scores (key outside [beg, row]) of an N-tile-wide score block to -inf.
template <int N>
__device__ __forceinline__ void mask_scores_n(float (&s)[N][4], const QRows& q, int64_t kt) {
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

// The 64 rows of one warpgroup: first/last valid row and their documents' bounds.
struct WgRows {
  int64_t lo, hi, beg_lo, beg_hi, end_lo, end_hi;
};
__device__ __forceinline__ WgRows wg_rows(const FlashArgs& a, int64_t r0) {
  WgRows w;
  w.lo = r0;
  w.hi = min(r0 + 63, a.T - 1);
  const bool any = w.hi >= w.lo;
  const int dl = any ? doc_of(a.cu, a.ndocs, w.lo) : 0, dh = any ? doc_of(a.cu, a.ndocs, w.hi) : 0;
  w.beg_lo = any ? a.cu[dl] : 0;
  w.beg_hi = any ? a.cu[dh] : 0;
  w.end_lo = any ? a.cu[dl + 1] : 0;
  w.end_hi = any ? a.cu[dh + 1] : 0;
  return w;
}

constexpr int kWgThreads = 256;  // two warpgroups per CTA in every sm90 kernel
constexpr int kWgBM = 128;       // forward / dQ: queries per CTA; dK/dV: keys per CTA
constexpr int kWgBN = 64;        // dQ: keys per tile; dK/dV: queries per tile

__device__ __forceinline__ uint32_t smem_base1024(const unsigned char* smem) {
  return (mma::smem_addr(smem) + 1023u) & ~1023u;
}

template <int kD, int kN>
constexpr size_t fwd_wgmma_smem() { return 1024 + (kWgBM + 4 * kN) * kD * 2; }
template <int kD, int kN>
constexpr size_t dq_wgmma_smem() { return 1024 + (2 * kWgBM + 4 * kN) * kD * 2; }
template <int kD>
constexpr size_t dkdv_wgmma_smem() { return 1024 + (2 * kWgBM + 4 * kWgBN) * kD * 2 + 4 * kWgBN * 4; }

// Forward: 128 queries x 1 head per CTA, key tiles of kN, online softmax in the exp2 domain.
template <int kD, int kN>
__global__ void __launch_bounds__(kWgThreads, 1) attn_fwd_wgmma_kernel(FlashArgs a) {
#if MT_ATTN_SM90A
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  constexpr int kTile = kN * kD * 2;
  const uint32_t sQ = smem_base1024(smem_wg), sK = sQ + kWgBM * kD * 2, sV = sK + 2 * kTile;
  const int64_t h = blockIdx.y, g = h / a.group;
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kWgBM;  // long causal rows first
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const bf16* k = a.k + g * kD;
  const bf16* v = a.v + g * kD;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const QRows qr = q_rows(a, t0, warp);
  const WgRows wr = wg_rows(a, t0 + 64 * wg);
  const int64_t kmin = a.cu[doc_of(a.cu, a.ndocs, t0)], kend = min(t0 + kWgBM, a.T);
  const int ntiles = static_cast<int>((kend - kmin + kN - 1) / kN);
  load_tile<kD, kWgBM, kWgThreads>(sQ, a.q + h * kD, qs, t0, a.T);
  load_tile<kD, kN, kWgThreads>(sK, k, ks, kmin, kend);
  load_tile<kD, kN, kWgThreads>(sV, v, ks, kmin, kend);
  mma::cp_async_commit();
  const float sl2 = a.scale * kLog2e;
  float o[kD / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int jt = 0; jt < ntiles; ++jt) {
    const int64_t kt = kmin + static_cast<int64_t>(jt) * kN;
    mma::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    if (jt + 1 < ntiles) {
      const int nb = (jt + 1) & 1;
      load_tile<kD, kN, kWgThreads>(sK + nb * kTile, k, ks, kt + kN, kend);
      load_tile<kD, kN, kWgThreads>(sV + nb * kTile, v, ks, kt + kN, kend);
    }
    mma::cp_async_commit();
    // Warpgroup-uniform skip: every key is after every row, or before every row's document.
    if (wr.hi < wr.lo || kt > wr.hi || kt + kN <= wr.beg_lo) continue;
    const uint32_t bK = sK + (jt & 1) * kTile, bV = sV + (jt & 1) * kTile;
    float s[kN / 8][4];
    wg_fence();
#pragma unroll
    for (int kq = 0; kq < kD / 16; ++kq)
      wgmma_ss(s, desc_kmaj<kWgBM>(sQ, 64 * wg, kq), desc_kmaj<kN>(bK, 0, kq), kq);
    wg_commit();
    wg_wait0();
    fence_acc(s);
    if (!(kt + kN - 1 <= wr.lo && kt >= wr.beg_hi)) mask_scores_n(s, qr, kt);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * hh], s[n][2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[hh], mx * sl2);  // running max in the scaled log2 domain
      const float base = mn == -INFINITY ? 0.0f : mn;
      const float corr = exp2f(m[hh] - base);
      m[hh] = mn;
      float rs = 0.0f;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = exp2f(fmaf(s[n][2 * hh + e], sl2, -base));
          s[n][2 * hh + e] = p;
          rs += p;
        }
      l[hh] = l[hh] * corr + rs;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        o[dt][2 * hh] *= corr;
        o[dt][2 * hh + 1] *= corr;
      }
    }
    uint32_t pa[kN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) acc_to_a(pa[kk], s, kk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs(o, pa[kk], desc_mn<kN>(bV, 16 * kk));
    wg_commit();
    wg_wait0();
    fence_acc(o);
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float lt = l[hh];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int64_t r = qr.r[hh];
    if (r >= a.T) continue;
    const float inv = 1.0f / lt;
    bf16* orow = a.out + (r * a.nh + h) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8) = pack_bf16(o[dt][2 * hh] * inv, o[dt][2 * hh + 1] * inv);
    if ((lane & 3) == 0) a.lse_out[h * a.T + r] = (m[hh] + log2f(lt)) * kLn2;
  }
#endif
}

// dQ = scale * sum over keys of dS K, dS = P * (dP - D): 128 queries per CTA, key tiles of kN.
template <int kD, int kN>
__global__ void __launch_bounds__(kWgThreads, 1) attn_dq_wgmma_kernel(FlashArgs a) {
#if MT_ATTN_SM90A
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  constexpr int kTile = kN * kD * 2;
  const uint32_t sQ = smem_base1024(smem_wg), sG = sQ + kWgBM * kD * 2, sK = sG + kWgBM * kD * 2,
                 sV = sK + 2 * kTile;
  const int64_t h = blockIdx.y, g = h / a.group;
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kWgBM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const bf16* k = a.k + g * kD;
  const bf16* v = a.v + g * kD;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const QRows qr = q_rows(a, t0, warp);
  const WgRows wr = wg_rows(a, t0 + 64 * wg);
  const int64_t kmin = a.cu[doc_of(a.cu, a.ndocs, t0)], kend = min(t0 + kWgBM, a.T);
  const int ntiles = static_cast<int>((kend - kmin + kN - 1) / kN);
  load_tile<kD, kWgBM, kWgThreads>(sQ, a.q + h * kD, qs, t0, a.T);
  load_tile<kD, kWgBM, kWgThreads>(sG, a.dout + h * kD, qs, t0, a.T);
  load_tile<kD, kN, kWgThreads>(sK, k, ks, kmin, kend);
  load_tile<kD, kN, kWgThreads>(sV, v, ks, kmin, kend);
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
    const int64_t kt = kmin + static_cast<int64_t>(jt) * kN;
    mma::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    if (jt + 1 < ntiles) {
      const int nb = (jt + 1) & 1;
      load_tile<kD, kN, kWgThreads>(sK + nb * kTile, k, ks, kt + kN, kend);
      load_tile<kD, kN, kWgThreads>(sV + nb * kTile, v, ks, kt + kN, kend);
    }
    mma::cp_async_commit();
    if (wr.hi < wr.lo || kt > wr.hi || kt + kN <= wr.beg_lo) continue;
    const uint32_t bK = sK + (jt & 1) * kTile, bV = sV + (jt & 1) * kTile;
    float s[kN / 8][4], dp[kN / 8][4];
    wg_fence();
#pragma unroll
    for (int kq = 0; kq < kD / 16; ++kq)
      wgmma_ss(s, desc_kmaj<kWgBM>(sQ, 64 * wg, kq), desc_kmaj<kN>(bK, 0, kq), kq);
    wg_commit();
#pragma unroll
    for (int kq = 0; kq < kD / 16; ++kq)
      wgmma_ss(dp, desc_kmaj<kWgBM>(sG, 64 * wg, kq), desc_kmaj<kN>(bV, 0, kq), kq);
    wg_commit();
    wg_wait<1>();  // S is ready; P is computed while the tensor cores still work on dP
    fence_acc(s);
    if (!(kt + kN - 1 <= wr.lo && kt >= wr.beg_hi)) mask_scores_n(s, qr, kt);
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = exp2f(fmaf(s[n][e], sl2, -lse2[e >> 1]));
    wg_wait0();
    fence_acc(dp);
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - dd[e >> 1];  // dS
    uint32_t pa[kN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) acc_to_a(pa[kk], s, kk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs(dq, pa[kk], desc_mn<kN>(bK, 16 * kk));
    wg_commit();
    wg_wait0();
    fence_acc(dq);
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
#endif
}

// dK, dV for 128 keys (64 per warpgroup) of kv head g over heads [h0, h0 + heads_per_cta) of its
// group, query tiles of 64: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q (then * scale),
// written as f32 partials [split][T][nkv][kD] and summed in order by attn_kv_reduce_kernel.
template <int kD>
__global__ void __launch_bounds__(kWgThreads, 1) attn_dkdv_wgmma_kernel(FlashArgs a) {
#if MT_ATTN_SM90A
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  constexpr int kM = kWgBN, kTile = kM * kD * 2;
  const uint32_t sK = smem_base1024(smem_wg), sV = sK + kWgBM * kD * 2, sQ = sV + kWgBM * kD * 2,
                 sG = sQ + 2 * kTile;
  float* sL = reinterpret_cast<float*>(smem_wg + (sG + 2 * kTile - mma::smem_addr(smem_wg)));  // [2][kM] lse*log2e
  float* sD = sL + 2 * kM;                                                                // [2][kM] dsum
  const int64_t g = blockIdx.y, split = blockIdx.z;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kWgBM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const int64_t jlast = min(j0 + kWgBM - 1, a.T - 1);
  const int64_t qend = a.cu[doc_of(a.cu, a.ndocs, jlast) + 1];
  int64_t key[2], kend[2];
  for (int hh = 0; hh < 2; ++hh) {
    key[hh] = j0 + warp * 16 + (lane >> 2) + 8 * hh;
    kend[hh] = key[hh] < a.T ? a.cu[doc_of(a.cu, a.ndocs, key[hh]) + 1] : 0;
  }
  const WgRows wr = wg_rows(a, j0 + 64 * wg);  // here the rows are keys
  const int64_t h0 = g * a.group + split * a.heads_per_cta;
  const int qtiles = static_cast<int>((qend - j0 + kM - 1) / kM);
  const int total = qtiles * a.heads_per_cta;
  auto issue = [&](int it) {  // loads of step it = (head, q tile) into buffer it & 1
    const int64_t hd = h0 + it / qtiles, q0 = j0 + static_cast<int64_t>(it % qtiles) * kM;
    const int b = it & 1;
    load_tile<kD, kM, kWgThreads>(sQ + b * kTile, a.q + hd * kD, qs, q0, qend);
    load_tile<kD, kM, kWgThreads>(sG + b * kTile, a.dout + hd * kD, qs, q0, qend);
    for (int i = threadIdx.x; i < kM; i += kWgThreads) {
      const int64_t t = q0 + i;
      sL[b * kM + i] = t < qend ? a.lse[hd * a.T + t] * kLog2e : 0.0f;
      sD[b * kM + i] = t < qend ? a.dsum[hd * a.T + t] : 0.0f;
    }
  };
  load_tile<kD, kWgBM, kWgThreads>(sK, a.k + g * kD, ks, j0, a.T);
  load_tile<kD, kWgBM, kWgThreads>(sV, a.v + g * kD, ks, j0, a.T);
  if (total > 0) issue(0);
  mma::cp_async_commit();
  const float sl2 = a.scale * kLog2e;
  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  for (int it = 0; it < total; ++it) {
    const int64_t q0 = j0 + static_cast<int64_t>(it % qtiles) * kM;
    mma::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    if (it + 1 < total) issue(it + 1);
    mma::cp_async_commit();
    // Warpgroup-uniform skip: every query precedes every key, or is past every key's document.
    if (wr.hi < wr.lo || q0 + kM - 1 < wr.lo || q0 >= wr.end_hi) continue;
    const int b = it & 1;
    const uint32_t bQ = sQ + b * kTile, bG = sG + b * kTile;
    const float* L = sL + b * kM;
    const float* Dv = sD + b * kM;
    float s[kM / 8][4], dp[kM / 8][4];
    wg_fence();
#pragma unroll
    for (int kq = 0; kq < kD / 16; ++kq)
      wgmma_ss(s, desc_kmaj<kWgBM>(sK, 64 * wg, kq), desc_kmaj<kM>(bQ, 0, kq), kq);
    wg_commit();
#pragma unroll
    for (int kq = 0; kq < kD / 16; ++kq)
      wgmma_ss(dp, desc_kmaj<kWgBM>(sV, 64 * wg, kq), desc_kmaj<kM>(bG, 0, kq), kq);
    wg_commit();
    wg_wait<1>();  // S^T is ready: P^T and dV += P^T dO overlap the dP^T GEMM
    fence_acc(s);
    const bool full = q0 >= wr.hi && q0 + kM <= wr.end_lo;
#pragma unroll
    for (int n = 0; n < kM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * (lane & 3) + (e & 1);
        const int64_t qi = q0 + c;
        const int hh = e >> 1;
        float p = exp2f(fmaf(s[n][e], sl2, -L[c]));
        if (!full && (qi < key[hh] || qi >= kend[hh])) p = 0.0f;
        s[n][e] = p;
      }
    uint32_t pa[kM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) acc_to_a(pa[kk], s, kk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) wgmma_rs(dv, pa[kk], desc_mn<kM>(bG, 16 * kk));
    wg_commit();
    wg_wait<1>();  // dP^T is ready (groups retire in order); dV may still run
    fence_acc(dp);
#pragma unroll
    for (int n = 0; n < kM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * (lane & 3) + (e & 1);
        dp[n][e] = s[n][e] * (dp[n][e] - Dv[c]);
      }
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) acc_to_a(pa[kk], dp, kk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) wgmma_rs(dk, pa[kk], desc_mn<kM>(bQ, 16 * kk));
    wg_commit();
    wg_wait0();
    fence_acc(dk);
    fence_acc(dv);
  }
  float* pk = a.part_k + split * a.T * a.nkv * kD;
  float* pv = a.part_v + split * a.T * a.nkv * kD;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (key[hh] >= a.T) continue;
    const int64_t base = (key[hh] * a.nkv + g) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<float2*>(pk + base + dt * 8) = make_float2(dk[dt][2 * hh] * a.scale, dk[dt][2 * hh + 1] * a.scale);
      *reinterpret_cast<float2*>(pv + base + dt * 8) = make_float2(dv[dt][2 * hh], dv[dt][2 * hh + 1]);
    }
  }
#endif
}

}  // namespace moetrain::cuda::flash
