// Hopper bf16 grouped expert GEMM: wgmma.mma_async (m64n256k16, fp32 accumulation) fed by a
// 4-stage cp.async pipeline into the 128-byte swizzled canonical shared layouts (K-major or
// MN-major per operand). 256 threads = 2 warpgroups, each 64 x BN of a 128 x BN output tile. The
// grid is persistent: each CTA walks tiles t, t + grid, ... and its loads run ahead across tile
// boundaries, so the next tile streams in during an epilogue. y and dx share one kernel; dW has its
// own, whose epilogue goes through shared memory with per-row bulk copies (overwrite or +=).
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
  double* ss;                  // dw: per-tile sums of squares of the final values, or null
};

// One operand's BK-deep k slab, copied in 16-byte chunks into the 128B-swizzled layout.
// K-major (kKMajor, BK = 64): R rows of 64 k, row i at i * 128 B. MN-major: BK k rows of R elements
// in blocks of 64 (block b at b * BK * 128 B, k row r at r * 128 B inside). Chunk c of a 128-byte row r
// sits at chunk position c ^ (r & 7): the hardware's 128B swizzle on a 1024-aligned base.
// "outer" is the strided index of global memory, "inner" the contiguous one.
template <bool kKMajor, int R, int BK = kBK>
struct Loader {
  static_assert(!kKMajor || BK == 64, "K-major slabs are 64 deep (one 128-byte row)");
  static constexpr int kCh = kKMajor ? 8 : R / 8;  // 16-byte chunks per global row
  static constexpr int kRowStep = kThreads / kCh;
  static constexpr int kIters = (kKMajor ? R : BK) / kRowStep;
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
                         : static_cast<uint32_t>((ch >> 3) * (BK * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
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

template <int kMode, int BK = kBK>
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
    x.ksteps = x.hi > x.lo ? static_cast<int>((x.hi - x.lo + BK - 1) / BK) : 0;
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

// The 128 x BN output tile of tile x (y or dx, bf16), from 2 warpgroups' fragments: thread (warp
// w of warpgroup wg, lane l) holds rows 64 wg + 16 w + l/4 (+8) and columns 8 j + 2 (l % 4) (+1).
template <int BN>
__device__ __forceinline__ void epilogue_rows(const Args& g, const Tile& x, float (&acc)[BN / 2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t rbase = x.i0 + (warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2);
  const int64_t cbase = x.j0 * BN + 2 * (lane & 3);
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
}

// y (kFwd) or dx (kDx): persistent CTAs over (m tile, column tile) work items.
template <int kMode, int BN>
__global__ void __launch_bounds__(kThreads, 1) gmm_wgmma_kernel(const Args g) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  using C = Cfg<BN>;
  constexpr int kS = C::kStages;
  constexpr bool kAK = true, kBKm = kMode == kFwd;  // K-major operands
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem_raw + (base - raw) + kS * C::kStageBytes);
  int32_t* s_ts = s_off + (kMaxE + 1);
  const int tid = threadIdx.x;
  for (int i = tid; i <= g.E; i += kThreads) s_off[i] = g.off[i];
  __syncthreads();
  int64_t total;
  {
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
  }
  const int64_t stride = gridDim.x;
  auto seek = [&](int64_t t) { return t; };  // every rows-mode tile has work
  Loader<kAK, kBM> la;
  Loader<kBKm, BN> lb;
  auto set_loaders = [&](const Tile& x) {
    const int64_t j0 = x.j0 * BN;
    la.set(g.a, g.lda, x.i0, x.hi, 0, g.kred);
    const bf16* be = g.b + x.e * g.b_stride;
    if constexpr (kMode == kFwd) lb.set(be, g.ldb, j0, g.cj, 0, g.kred);
    else lb.set(be, g.ldb, 0, g.kred, j0, g.cj);
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
    // Fills the stage read two steps ago (finished: every warpgroup waited for it). Issuing the
    // step's wgmma before these loads measured 5-15% slower (docs/design/kernels.md).
    produce();
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
      epilogue_rows<BN>(g, ctile, acc);
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

  {  // rows past offsets[E] are unused capacity: zeros
    const int64_t r0 = s_off[g.E];
    const int64_t vecs = (g.N - r0) * g.cj / 8;
    uint4* c = reinterpret_cast<uint4*>(static_cast<bf16*>(g.c) + r0 * g.cj);
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + tid; v < vecs; v += stride * kThreads)
      c[v] = make_uint4(0, 0, 0, 0);
  }
#endif
}

// ---- dW: dw[e] (= or +=) dy_e^T x_e ------------------------------------------------------------
// Shared memory: the k-slab stages, then an output staging tile of 128 rows at kPitch bytes, an
// mbarrier and the offsets. The staging tile is filled (+=: by per-row bulk loads of the old dw,
// issued when the tile's first k step starts, so they overlap the mainloop), updated in place from
// the accumulator fragments, and written back by per-row bulk stores that run on while the next
// tile computes. Thread r < 128 owns row r of the staging tile for every bulk copy.
template <int BN, typename DwT, int BK>
struct DwCfg {
  static constexpr int kABytes = kBM * BK * 2;
  static constexpr int kStageBytes = kABytes + BN * BK * 2;
  static constexpr int kRowBytes = BN * static_cast<int>(sizeof(DwT));
  // Fragment accesses (8 rows x 4 threads) hit distinct banks: f32 float2 (half-warp phases of 4
  // rows) needs a 32-byte row skew, bf16 pairs a 16-byte one.
  static constexpr int kPitch = kRowBytes + (sizeof(DwT) == 4 ? 32 : 16);
  static constexpr int kOutBytes = kBM * kPitch;
  // After the staging tile: the mbarrier (16 B), the offsets, then 8 doubles for the tile's sum of squares.
  static constexpr int kRedOff = kOutBytes + 16 + ((kMaxE + 1) * 4 + 7) / 8 * 8;
  static constexpr int kFixed = 1024 + kRedOff + 8 * 8;
  // As many stages as fit (at most 8): the loads run kStages - 2 slabs ahead.
  static constexpr int kFit = (227 * 1024 - kFixed) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;
  static_assert(kStages >= 3, "dW tile does not fit in shared memory");
  static constexpr int kSmem = kFixed + kStages * kStageBytes;
  static_assert(kSmem <= 227 * 1024, "dW tile does not fit in shared memory");
};

template <int BN, typename DwT, int BK>
__global__ void __launch_bounds__(kThreads, 1) gmm_wgmma_dw_kernel(const Args g, int accumulate) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  using C = DwCfg<BN, DwT, BK>;
  constexpr int kS = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* out_p = smem_raw + (base - raw) + kS * C::kStageBytes;
  const uint32_t sout = base + kS * C::kStageBytes, bar = sout + C::kOutBytes;
  int32_t* s_off = reinterpret_cast<int32_t*>(out_p + C::kOutBytes + 16);
  double* s_red = reinterpret_cast<double*>(out_p + C::kRedOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= g.E; i += kThreads) s_off[i] = g.off[i];
  if (tid == 0) {
    wg::mbar_init(bar, kBM);
    wg::fence_mbar_init();
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(g.E) * g.nmt * g.ncol;
  const int64_t stride = gridDim.x;
  auto seek = [&](int64_t t) {  // first tile at or after t (step = grid) whose expert has rows
    while (t < total && decode<kDw, BK>(g, s_off, nullptr, t).ksteps == 0) t += stride;
    return t;
  };
  Loader<false, kBM, BK> la;
  Loader<false, BN, BK> lb;
  auto set_loaders = [&](const Tile& x) {
    la.set(g.a, g.lda, x.lo, x.hi, x.i0, g.ci);
    lb.set(g.b, g.ldb, x.lo, x.hi, x.j0 * BN, g.cj);
  };
  // Row `tid` of tile x in global memory, and its length in bytes (0 past the last row).
  DwT* const dw = static_cast<DwT*>(g.c);
  auto row_ptr = [&](const Tile& x) { return dw + (x.e * g.ci + x.i0 + tid) * g.cj + x.j0 * BN; };
  auto row_bytes = [&](const Tile& x) -> uint32_t {
    if (x.i0 + tid >= g.ci) return 0;
    const int64_t cols = g.cj - x.j0 * BN < BN ? g.cj - x.j0 * BN : BN;
    return static_cast<uint32_t>(cols * static_cast<int64_t>(sizeof(DwT)));
  };

  int64_t pt = seek(blockIdx.x);
  Tile ptile{};
  if (pt < total) {
    ptile = decode<kDw, BK>(g, s_off, nullptr, pt);
    set_loaders(ptile);
  }
  int64_t ct = pt;
  Tile ctile = ptile;
  int pk = 0, ck = 0, pstage = 0, cstage = 0;
  uint32_t phase = 0;
  auto produce = [&]() {
    if (pt < total) {
      const uint32_t s = base + pstage * C::kStageBytes;
      la.load(s, static_cast<int64_t>(pk) * BK);
      lb.load(s + C::kABytes, static_cast<int64_t>(pk) * BK);
      if (++pk == ptile.ksteps) {
        pk = 0;
        pt = seek(pt + stride);
        if (pt < total) {
          ptile = decode<kDw, BK>(g, s_off, nullptr, pt);
          set_loaders(ptile);
        }
      }
    }
    mma::cp_async_commit();
    pstage = pstage + 1 == kS ? 0 : pstage + 1;
  };
#pragma unroll
  for (int i = 0; i < kS - 2; ++i) produce();

  const int wgi = tid >> 7, lane = tid & 31, warp = tid >> 5;
  const int frow = (warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2), fcol = 2 * (lane & 3);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  if (ct < total) for (;;) {
    mma::cp_async_wait<kS - 3>();
    wg::fence_proxy_async();
    __syncthreads();
    produce();
    const uint32_t sa = base + cstage * C::kStageBytes, sb = sa + C::kABytes;
    wg::fence_regs(acc);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {  // MN-major: 64-element blocks BK * 128 B apart
      const uint64_t da = wg::smem_desc(sa + wgi * (BK * 128) + kk * 2048, BK * 128, 1024);
      const uint64_t db = wg::smem_desc(sb + kk * 2048, BK * 128, 1024);
      wg::wgmma_bf16<BN, 1, 1>(acc, da, db, (ck > 0 || kk > 0) ? 1 : 0);
    }
    wg::wgmma_commit();
    if (accumulate && ck == 0 && tid < kBM) {  // old dw rows of this tile -> staging tile
      wg::bulk_wait_read();                    // the previous tile's store has left the staging rows
      const uint32_t nb = row_bytes(ctile);
      if (nb) {
        wg::mbar_arrive_tx(bar, nb);
        wg::bulk_load(sout + tid * C::kPitch, row_ptr(ctile), nb, bar);
      } else {
        wg::mbar_arrive(bar);
      }
    }
    if (++ck == ctile.ksteps) {
      wg::wgmma_wait<0>();
      wg::fence_regs(acc);
      if (accumulate) {
        wg::mbar_wait(bar, phase);
        phase ^= 1u;
      } else {
        if (tid < kBM) wg::bulk_wait_read();
        __syncthreads();
      }
      // Sum of squares of the values as stored, over the tile's in-range part (rows past ci and
      // columns past cj of the staging tile hold stale data).
      wg::SumSq4 sq;  // the same chains and order as grouped_gemm_ws_dw_stage.cuh's stage_tile
      const int64_t col0 = ctile.j0 * BN + fcol;
      const bool row_in[2] = {ctile.i0 + frow < g.ci, ctile.i0 + frow + 8 < g.ci};
      if constexpr (sizeof(DwT) == 4) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned char* rp = out_p + (frow + 8 * h) * C::kPitch;
#pragma unroll
          for (int j = 0; j < BN / 8; j += 2) {
            float s4[4];  // column blocks j and j + 1, 0 past the edge (stage_tile's groups)
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
              float2* p = reinterpret_cast<float2*>(rp + (fcol + 8 * (j + jj)) * 4);
              float v0 = acc[4 * (j + jj) + 2 * h], v1 = acc[4 * (j + jj) + 2 * h + 1];
              if (accumulate) {
                const float2 o = *p;
                v0 = o.x + v0;
                v1 = o.y + v1;
              }
              *p = make_float2(v0, v1);
              const bool in = row_in[h] && col0 + 8 * (j + jj) < g.cj;
              s4[2 * jj] = in ? v0 : 0.0f;
              s4[2 * jj + 1] = in ? v1 : 0.0f;
            }
            if (g.ss) sq.add4(h, j, s4[0], s4[1], s4[2], s4[3]);
          }
        }
      } else {
        // ldmatrix / stmatrix x4 move 8x8 blocks in the accumulator's own fragment layout: block
        // q (lanes 8q..8q+7 give its row addresses) = rows +8 (q & 1), column block j + (q >> 1).
        const int q = lane >> 3;
        const uint32_t rowaddr =
            sout + ((warp >> 2) * 64 + (warp & 3) * 16 + ((q & 1) << 3) + (lane & 7)) * C::kPitch + (q >> 1) * 16;
#pragma unroll
        for (int j = 0; j < BN / 8; j += 2) {
          float v[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = acc[4 * j + i];
          if (accumulate) {
            uint32_t o[4];
            mma::ldmatrix_x4(o, rowaddr + j * 16);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o[i]));
              v[2 * i] = f.x + v[2 * i];
              v[2 * i + 1] = f.y + v[2 * i + 1];
            }
          }
          const uint32_t p[4] = {mma::pack_bf16(v[0], v[1]), mma::pack_bf16(v[2], v[3]), mma::pack_bf16(v[4], v[5]),
                                 mma::pack_bf16(v[6], v[7])};
          wg::stmatrix_x4(rowaddr + j * 16, p[0], p[1], p[2], p[3]);
          if (g.ss) {  // p[i]: row frow + 8 (i & 1), column block j + (i >> 1); stage_tile's groups
            float f[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const bool in = row_in[i & 1] && col0 + 8 * (j + (i >> 1)) < g.cj;
              const float2 x2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&p[i]));
              f[2 * i] = in ? x2.x : 0.0f;
              f[2 * i + 1] = in ? x2.y : 0.0f;
            }
            sq.add4(0, j, f[0], f[1], f[4], f[5]);
            sq.add4(1, j, f[2], f[3], f[6], f[7]);
          }
        }
      }
      if (g.ss) {  // warp sums here; thread 0 adds the 8 after the barrier below, in warp order
        double ss = sq.total();
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) s_red[warp] = ss;
      }
      wg::fence_proxy_async();
      __syncthreads();
      if (g.ss && tid == 0) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) t += s_red[w];
        g.ss[ct] = t;  // s_red is rewritten only after the next tile's first k-step barrier
      }
      if (tid < kBM) {
        const uint32_t nb = row_bytes(ctile);
        if (nb) wg::bulk_store(row_ptr(ctile), sout + tid * C::kPitch, nb);
        wg::bulk_commit();
      }
      ck = 0;
      ct = seek(ct + stride);
      if (ct >= total) break;
      ctile = decode<kDw, BK>(g, s_off, nullptr, ct);
    } else {
      wg::wgmma_wait<1>();
    }
    cstage = cstage + 1 == kS ? 0 : cstage + 1;
  }
  mma::cp_async_wait<0>();
  if (g.ss) {  // the tiles of experts without rows, skipped above: the old dw's squares (+=), or 0
    __syncthreads();  // thread 0 has read s_red for the last tile
    for (int64_t t = blockIdx.x; t < total; t += stride) {
      const Tile x = decode<kDw, BK>(g, s_off, nullptr, t);
      if (x.ksteps) continue;
      double ss = 0.0;
      if (accumulate) {
        const DwT* src = dw + (x.e * g.ci + x.i0) * g.cj + x.j0 * BN;
        const int64_t rows = g.ci - x.i0 < kBM ? g.ci - x.i0 : kBM;
        const int64_t cols = g.cj - x.j0 * BN < BN ? g.cj - x.j0 * BN : BN;
        for (int64_t k = tid; k < rows * cols; k += kThreads) {
          const double v = static_cast<float>(src[(k / cols) * g.cj + k % cols]);
          ss += v * v;
        }
      }
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) s_red[warp] = ss;
      __syncthreads();
      if (tid == 0) {
        double sum = 0.0;
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) sum += s_red[w];
        g.ss[t] = sum;
      }
      __syncthreads();
    }
  }
  if (!accumulate) {  // experts with no rows: dw[e] = 0
    const int64_t vecs = g.ci * g.cj * static_cast<int64_t>(sizeof(DwT)) / 16;
    for (int e = 0; e < g.E; ++e) {
      if (s_off[e + 1] > s_off[e]) continue;
      uint4* c = reinterpret_cast<uint4*>(dw + static_cast<int64_t>(e) * g.ci * g.cj);
      for (int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + tid; v < vecs; v += stride * kThreads)
        c[v] = make_uint4(0, 0, 0, 0);
    }
  }
  if (tid < kBM) wg::bulk_wait_all();
#endif
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int sm_count(const Context& ctx) {
  int sms = ctx.facts().sm_count;
  if (sms <= 0) {
    int dev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return sms;
}

// Persistent launch: one CTA per SM, or one per tile when there are fewer tiles.
template <typename K, typename... P>
void launch_persistent(Context& ctx, K kernel, int smem, int64_t tile_bound, const char* op, P... params) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int sms = sm_count(ctx);
  const int64_t grid = tile_bound < sms ? (tile_bound > 0 ? tile_bound : 1) : sms;
  launch_pdl(kernel, static_cast<unsigned>(grid), kThreads, smem, stream_of(ctx), params...);
  check_launch(op);
}

template <int kMode>
void launch_rows(Context& ctx, Args g, int tile_n, const char* op) {
  const int bn = tile_n == 128 ? 128 : 256;
  g.ncol = static_cast<int>((g.cj + bn - 1) / bn);
  const int64_t bound = (g.N / kBM + g.E) * g.ncol;
  if (bn == 128) launch_persistent(ctx, gmm_wgmma_kernel<kMode, 128>, Cfg<128>::kSmem, bound, op, g);
  else launch_persistent(ctx, gmm_wgmma_kernel<kMode, 256>, Cfg<256>::kSmem, bound, op, g);
}

// sum_squares: null, or acc[0] += the sum of squares of the final dw (per-tile partials added in
// tile order: deterministic).
template <int BN, typename DwT, int BK>
void launch_dw(Context& ctx, Args g, bool accumulate, double* sum_squares) {
  g.ncol = static_cast<int>((g.cj + BN - 1) / BN);
  g.nmt = static_cast<int>((g.ci + kBM - 1) / kBM);
  const int64_t bound = static_cast<int64_t>(g.E) * g.nmt * g.ncol;
  Tensor partial;
  if (sum_squares) {
    partial = device_scratch(ctx, bound * 8);
    g.ss = static_cast<double*>(partial.data_ptr());
  }
  launch_persistent(ctx, gmm_wgmma_dw_kernel<BN, DwT, BK>, DwCfg<BN, DwT, BK>::kSmem, bound, "grouped_matmul_backward", g,
                    accumulate ? 1 : 0);
  if (sum_squares) add_partials_into(ctx, g.ss, bound, sum_squares);
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
                           int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate, int tile_n,
                           int tile_k, double* sum_squares) {
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
  // Defaults (measured, docs/design/kernels.md): 256-wide tiles take 32-row stages (6 fit beside
  // the staging tile), 128-wide ones 64-row stages.
  if (!dw_bf16) {  // a 128 x 256 f32 staging tile does not fit
    if (tile_k == 32) gwg::launch_dw<128, float, 32>(ctx, g, accumulate, sum_squares);
    else gwg::launch_dw<128, float, 64>(ctx, g, accumulate, sum_squares);
  } else if (tile_n == 128) {
    if (tile_k == 32) gwg::launch_dw<128, __nv_bfloat16, 32>(ctx, g, accumulate, sum_squares);
    else gwg::launch_dw<128, __nv_bfloat16, 64>(ctx, g, accumulate, sum_squares);
  } else {
    if (tile_k == 64) gwg::launch_dw<256, __nv_bfloat16, 64>(ctx, g, accumulate, sum_squares);
    else gwg::launch_dw<256, __nv_bfloat16, 32>(ctx, g, accumulate, sum_squares);
  }
}

}  // namespace moetrain::cuda
