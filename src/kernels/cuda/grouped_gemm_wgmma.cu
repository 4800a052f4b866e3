// Hopper bf16 grouped expert GEMM: wgmma.mma_async (m64n256k16, fp32 accumulation) fed by a
// 4-stage cp.async pipeline into the 128-byte swizzled canonical shared layouts (K-major or
// MN-major per operand, so y, dx and dw share one kernel body). 256 threads = 2 warpgroups, each
// 64 x BN of a 128 x BN output tile. The grid is persistent: each CTA walks tiles t, t + grid, ...
// and its loads run ahead across tile boundaries, so the next tile streams in during an epilogue.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_wgmma.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"

namespace moetrain::cuda {

namespace gwg {

using bf16 = __nv_bfloat16;
constexpr int kBM = 128, kBK = 64, kThreads = 256, kMaxE = 1024;
enum Mode : int { kFwd = 0, kDx = 1, kDw = 2 };

template <int BN>
struct Cfg {
  static constexpr int kStages = BN == 256 ? 4 : 6;
  static constexpr int kABytes = kBM * kBK * 2;  // 16 KB
  static constexpr int kBBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // stages, 1 KB alignment slack, offsets and tile prefix (2 * (kMaxE + 1) ints)
  static constexpr int kSmem = kStages * kStageBytes + 1024 + 2 * (kMaxE + 1) * 4;
};

struct Args {
  const bf16* a;
  const bf16* b;
  const int32_t* off;  // [E+1]
  int E;
  int64_t N;
  int64_t lda, ldb, b_stride;  // b_stride: elements between experts' weights (rows modes)
  int64_t kred;                // reduction length (rows modes)
  int64_t ci, cj;              // output is [ci, cj] per expert (dw) or [N, cj] (rows modes)
  int ncol, nmt;               // column tiles; m tiles per expert (dw)
  void* c;
};

// One operand's 64-deep k slab, copied in 16-byte chunks into the 128B-swizzled layout.
// K-major (kKMajor): R rows of 64 k, row i at i * 128 B. MN-major: 64 k rows of R elements in
// blocks of 64 (block b at b * 8192 B, k row r at r * 128 B inside). Chunk c of a 128-byte row r
// sits at chunk position c ^ (r & 7): the hardware's 128B swizzle on a 1024-aligned base.
// "outer" is the strided index of global memory, "inner" the contiguous one.
template <bool kKMajor, int R>
struct Loader {
  static constexpr int kCh = kKMajor ? 8 : R / 8;  // 16-byte chunks per global row
  static constexpr int kRowStep = kThreads / kCh;
  static constexpr int kIters = (kKMajor ? R : kBK) / kRowStep;
  const bf16* gp;
  int64_t ld, outer_rem, inner_rem;
  int row0, ch;
  uint32_t soff[kIters];

  __device__ __forceinline__ Loader() {
    row0 = static_cast<int>(threadIdx.x) / kCh;
    ch = static_cast<int>(threadIdx.x) % kCh;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int r = row0 + it * kRowStep;
      soff[it] = kKMajor ? static_cast<uint32_t>(r * 128 + ((ch ^ (r & 7)) << 4))
                         : static_cast<uint32_t>((ch >> 3) * 8192 + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
    }
  }
  __device__ __forceinline__ void set(const bf16* p, int64_t ld_, int64_t outer0, int64_t outer_lim, int64_t inner0,
                                      int64_t inner_lim) {
    ld = ld_;
    outer_rem = outer_lim - (outer0 + row0);
    inner_rem = inner_lim - (inner0 + ch * 8);
    const bool in = outer_rem > 0 && inner_rem > 0;
    gp = in ? p + (outer0 + row0) * ld + inner0 + ch * 8 : p;
    if (!in) outer_rem = inner_rem = 0;
  }
  // Slab at reduction offset k0 into shared address s; out-of-range chunks are zero-filled.
  __device__ __forceinline__ void load(uint32_t s, int64_t k0) const {
    const int64_t orem = kKMajor ? outer_rem : outer_rem - k0;
    const bool inner_ok = kKMajor ? inner_rem > k0 : inner_rem > 0;
    const bf16* base = kKMajor ? gp + k0 : gp + k0 * ld;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const bool ok = inner_ok && it * kRowStep < orem;
      mma::cp_async16(s + soff[it], ok ? base + it * kRowStep * ld : gp, ok);
    }
  }
};

// One output tile: expert e, output rows [i0, ...) (rows modes: bounded by hi; dw: m rows),
// columns [j0, j0 + BN), reduction rows [lo, hi) for dw. ksteps = number of 64-deep k slabs.
struct Tile {
  int e, ksteps;
  int64_t i0, lo, hi, j0;
};

template <int kMode>
__device__ __forceinline__ Tile decode(const Args& g, const int32_t* s_off, const int32_t* s_ts, int64_t t) {
  Tile x{};
  if constexpr (kMode == kDw) {
    const int64_t per_e = static_cast<int64_t>(g.nmt) * g.ncol;
    x.e = static_cast<int>(t / per_e);
    const int64_t rem = t - x.e * per_e;
    const int mt = static_cast<int>(rem / g.ncol);
    x.i0 = static_cast<int64_t>(mt) * kBM;
    x.j0 = rem - static_cast<int64_t>(mt) * g.ncol;  // column tile index
    x.lo = s_off[x.e];
    x.hi = s_off[x.e + 1];
    x.ksteps = x.hi > x.lo ? static_cast<int>((x.hi - x.lo + kBK - 1) / kBK) : 0;
  } else {
    const int32_t mt = static_cast<int32_t>(t / g.ncol);
    x.j0 = t - static_cast<int64_t>(mt) * g.ncol;  // column tile index
    int lo_e = 0, hi_e = g.E - 1;  // the last expert whose tile range starts at or before mt
    while (lo_e < hi_e) {
      const int mid = (lo_e + hi_e + 1) >> 1;
      if (s_ts[mid] <= mt) lo_e = mid; else hi_e = mid - 1;
    }
    x.e = lo_e;
    x.lo = s_off[x.e];
    x.hi = s_off[x.e + 1];
    x.i0 = x.lo + static_cast<int64_t>(mt - s_ts[x.e]) * kBM;
    x.ksteps = static_cast<int>((g.kred + kBK - 1) / kBK);
  }
  return x;
}

// The 128 x BN output tile of tile x, from 2 warpgroups' fragments: thread (warp w of warpgroup
// wg, lane l) holds rows 64 wg + 16 w + l/4 (+8) and columns 8 j + 2 (l % 4) (+1).
template <int kMode, int BN, typename DwT>
__device__ __forceinline__ void epilogue(const Args& g, const Tile& x, float (&acc)[BN / 2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rbase = x.i0 + (warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2);
  const int64_t cbase = x.j0 * BN + 2 * (lane & 3);
  if constexpr (kMode != kDw) {
    bf16* c = static_cast<bf16*>(g.c);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = rbase + h * 8;
      if (r >= x.hi) continue;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t col = cbase + j * 8;
        if (col < g.cj)
          *reinterpret_cast<uint32_t*>(c + r * g.cj + col) = mma::pack_bf16(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  } else {
    DwT* c = static_cast<DwT*>(g.c) + static_cast<int64_t>(x.e) * g.ci * g.cj;
    constexpr int kBatch = 8;  // column blocks whose old values are loaded before any store
#pragma unroll
    for (int jb = 0; jb < BN / 8; jb += kBatch) {
      float2 old[2][kBatch];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          const int64_t r = rbase + h * 8, col = cbase + (jb + q) * 8;
          old[h][q] = make_float2(0.0f, 0.0f);
          if (r < g.ci && col < g.cj) {
            if constexpr (sizeof(DwT) == 4) {
              old[h][q] = *reinterpret_cast<const float2*>(c + r * g.cj + col);
            } else {
              old[h][q] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(c + r * g.cj + col));
            }
          }
        }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < kBatch; ++q) {
          const int64_t r = rbase + h * 8, col = cbase + (jb + q) * 8;
          if (r < g.ci && col < g.cj) {
            const float v0 = old[h][q].x + acc[4 * (jb + q) + 2 * h], v1 = old[h][q].y + acc[4 * (jb + q) + 2 * h + 1];
            if constexpr (sizeof(DwT) == 4) {
              *reinterpret_cast<float2*>(c + r * g.cj + col) = make_float2(v0, v1);
            } else {
              *reinterpret_cast<uint32_t*>(c + r * g.cj + col) = mma::pack_bf16(v0, v1);
            }
          }
        }
    }
  }
}

template <int kMode, int BN, typename DwT>
__global__ void __launch_bounds__(kThreads, 1) gmm_wgmma_kernel(const Args g) {
#if MT_WGMMA_ENABLED
  using C = Cfg<BN>;
  constexpr int kS = C::kStages;
  constexpr bool kAK = kMode != kDw, kBKm = kMode == kFwd;  // K-major operands
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem_raw + (base - raw) + kS * C::kStageBytes);
  int32_t* s_ts = s_off + (kMaxE + 1);
  const int tid = threadIdx.x;
  for (int i = tid; i <= g.E; i += kThreads) s_off[i] = g.off[i];
  __syncthreads();
  int64_t total;
  if constexpr (kMode != kDw) {
    // s_ts[e] = m tiles of experts before e (4 experts per thread, E <= 1024).
    using Scan = cub::BlockScan<int32_t, kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    int32_t cnt[4], sum = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = tid * 4 + q;
      cnt[q] = 0;
      if (e < g.E) {
        const int32_t rows = s_off[e + 1] - s_off[e];
        cnt[q] = rows > 0 ? (rows + kBM - 1) / kBM : 0;
      }
      sum += cnt[q];
    }
    int32_t excl, agg;
    Scan(scan_tmp).ExclusiveSum(sum, excl, agg);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int e = tid * 4 + q;
      if (e < g.E) s_ts[e] = excl;
      excl += cnt[q];
    }
    if (tid == 0) s_ts[g.E] = agg;
    __syncthreads();
    total = static_cast<int64_t>(s_ts[g.E]) * g.ncol;
  } else {
    total = static_cast<int64_t>(g.E) * g.nmt * g.ncol;
  }
  const int64_t stride = gridDim.x;
  auto seek = [&](int64_t t) {  // first tile at or after t (step = grid) with work
    if constexpr (kMode == kDw) {
      while (t < total && decode<kMode>(g, s_off, s_ts, t).ksteps == 0) t += stride;
    }
    return t;
  };
  Loader<kAK, kBM> la;
  Loader<kBKm, BN> lb;
  auto set_loaders = [&](const Tile& x) {
    const int64_t j0 = x.j0 * BN;
    if constexpr (kMode == kDw) {
      la.set(g.a, g.lda, x.lo, x.hi, x.i0, g.ci);
      lb.set(g.b, g.ldb, x.lo, x.hi, j0, g.cj);
    } else {
      la.set(g.a, g.lda, x.i0, x.hi, 0, g.kred);
      const bf16* be = g.b + x.e * g.b_stride;
      if constexpr (kMode == kFwd) lb.set(be, g.ldb, j0, g.cj, 0, g.kred);
      else lb.set(be, g.ldb, 0, g.kred, j0, g.cj);
    }
  };

  int64_t pt = seek(blockIdx.x);
  Tile ptile{};
  if (pt < total) {
    ptile = decode<kMode>(g, s_off, s_ts, pt);
    set_loaders(ptile);
  }
  int64_t ct = pt;
  Tile ctile = ptile;
  int pk = 0, ck = 0, pstage = 0, cstage = 0;
  auto produce = [&]() {
    if (pt < total) {
      const uint32_t s = base + pstage * C::kStageBytes;
      la.load(s, static_cast<int64_t>(pk) * kBK);
      lb.load(s + C::kABytes, static_cast<int64_t>(pk) * kBK);
      if (++pk == ptile.ksteps) {
        pk = 0;
        pt = seek(pt + stride);
        if (pt < total) {
          ptile = decode<kMode>(g, s_off, s_ts, pt);
          set_loaders(ptile);
        }
      }
    }
    mma::cp_async_commit();
    pstage = pstage + 1 == kS ? 0 : pstage + 1;
  };
#pragma unroll
  for (int i = 0; i < kS - 2; ++i) produce();

  const int wgi = tid >> 7;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  // The loop leaves only right after an epilogue (all wgmma retired), never from an in-flight step.
  if (ct < total) for (;;) {
    mma::cp_async_wait<kS - 3>();
    wg::fence_proxy_async();
    __syncthreads();
    produce();  // into the stage read two steps ago (finished: every warpgroup waited for it)
    const uint32_t sa = base + cstage * C::kStageBytes, sb = sa + C::kABytes;
    wg::fence_regs(acc);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da = kAK ? wg::smem_desc(sa + wgi * 8192 + kk * 32, 16, 1024)
                              : wg::smem_desc(sa + wgi * 8192 + kk * 2048, 8192, 1024);
      const uint64_t db = kBKm ? wg::smem_desc(sb + kk * 32, 16, 1024) : wg::smem_desc(sb + kk * 2048, 8192, 1024);
      wg::wgmma_bf16<BN, kAK ? 0 : 1, kBKm ? 0 : 1>(acc, da, db, (ck > 0 || kk > 0) ? 1 : 0);
    }
    wg::wgmma_commit();
    if (++ck == ctile.ksteps) {
      wg::wgmma_wait<0>();
      wg::fence_regs(acc);
      epilogue<kMode, BN, DwT>(g, ctile, acc);
      ck = 0;
      ct = seek(ct + stride);
      if (ct >= total) break;
      ctile = decode<kMode>(g, s_off, s_ts, ct);
    } else {
      wg::wgmma_wait<1>();
    }
    cstage = cstage + 1 == kS ? 0 : cstage + 1;
  }
  mma::cp_async_wait<0>();

  if constexpr (kMode != kDw) {  // rows past offsets[E] are unused capacity: zeros
    const int64_t r0 = s_off[g.E];
    const int64_t vecs = (g.N - r0) * g.cj / 8;
    uint4* c = reinterpret_cast<uint4*>(static_cast<bf16*>(g.c) + r0 * g.cj);
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + tid; v < vecs; v += stride * kThreads)
      c[v] = make_uint4(0, 0, 0, 0);
  }
#endif
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int kMode, int BN, typename DwT>
void launch(Context& ctx, const Args& g, int64_t tile_bound, const char* op) {
  auto kernel = gmm_wgmma_kernel<kMode, BN, DwT>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg<BN>::kSmem));
  int sms = ctx.facts().sm_count;
  if (sms <= 0) {
    int dev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  const int64_t grid = tile_bound < sms ? (tile_bound > 0 ? tile_bound : 1) : sms;
  kernel<<<static_cast<unsigned>(grid), kThreads, Cfg<BN>::kSmem, stream_of(ctx)>>>(g);
  check_launch(op);
}

template <int kMode>
void launch_rows(Context& ctx, Args g, int tile_n, const char* op) {
  const int bn = tile_n == 128 ? 128 : 256;
  g.ncol = static_cast<int>((g.cj + bn - 1) / bn);
  const int64_t bound = (g.N / kBM + g.E) * g.ncol;
  if (bn == 128) launch<kMode, 128, float>(ctx, g, bound, op);
  else launch<kMode, 256, float>(ctx, g, bound, op);
}

}  // namespace gwg

bool grouped_gemm_wgmma_supported(const Context& ctx, int64_t N, int64_t K, int64_t M, int64_t E, const void* x,
                                  const void* w, const void* out) {
  (void)N;
  return ctx.facts().cc_major == 9 && ctx.facts().cc_minor == 0 && K > 0 && M > 0 && K % 8 == 0 && M % 8 == 0 &&
         E >= 1 && E <= gwg::kMaxE && gwg::aligned16(x) && gwg::aligned16(w) && gwg::aligned16(out);
}

void grouped_gemm_wgmma_forward(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* off,
                                int E, int64_t N, int64_t K, int64_t M, __nv_bfloat16* y, int tile_n) {
  gwg::Args g{};
  g.a = x;
  g.b = w;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = K;
  g.ldb = K;
  g.b_stride = M * K;
  g.kred = K;
  g.cj = M;
  g.c = y;
  gwg::launch_rows<gwg::kFwd>(ctx, g, tile_n, "grouped_matmul");
}

void grouped_gemm_wgmma_dx(Context& ctx, const __nv_bfloat16* dy, const __nv_bfloat16* w, const int32_t* off, int E,
                           int64_t N, int64_t K, int64_t M, __nv_bfloat16* dx, int tile_n) {
  gwg::Args g{};
  g.a = dy;
  g.b = w;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = M;
  g.ldb = K;
  g.b_stride = M * K;
  g.kred = M;
  g.cj = K;
  g.c = dx;
  gwg::launch_rows<gwg::kDx>(ctx, g, tile_n, "grouped_matmul_backward");
}

void grouped_gemm_wgmma_dw(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* off, int E,
                           int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, int tile_n) {
  gwg::Args g{};
  g.a = dy;
  g.b = x;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = M;
  g.ldb = K;
  g.ci = M;
  g.cj = K;
  g.c = dw;
  const int bn = tile_n == 128 ? 128 : 256;
  g.ncol = static_cast<int>((K + bn - 1) / bn);
  g.nmt = static_cast<int>((M + gwg::kBM - 1) / gwg::kBM);
  const int64_t bound = static_cast<int64_t>(E) * g.nmt * g.ncol;
  const char* op = "grouped_matmul_backward";
  if (bn == 128) {
    if (dw_bf16) gwg::launch<gwg::kDw, 128, __nv_bfloat16>(ctx, g, bound, op);
    else gwg::launch<gwg::kDw, 128, float>(ctx, g, bound, op);
  } else {
    if (dw_bf16) gwg::launch<gwg::kDw, 256, __nv_bfloat16>(ctx, g, bound, op);
    else gwg::launch<gwg::kDw, 256, float>(ctx, g, bound, op);
  }
}

}  // namespace moetrain::cuda
