// Hopper warp-specialized expert dW GEMM: dw[e] (M x K) (+)= dy_e^T x_e, bf16 in, fp32 accumulate.
// Warp 0 loads dy / x k-slabs with TMA into an mbarrier ring; two consumer warpgroups run wgmma on a
// 128 x BN tile, round it (+ the old dw) into a shared staging tile and sum the squares of their
// fragments (fp64 per warp; the staging is grouped_gemm_ws_dw_stage.cuh); warps 1-3 ("store warps")
// write the tile with per-row bulk copies under the next tile's mainloop (or, Cfg::kTma, the default
// bf16 path without sums, their thread 0 one TMA box of 64 columns at a time through a ring of two
// box slots), and their thread 0 adds the 8 warp sums in order. An f32 dw takes 128 x 256
// tiles staged in two halves, its += a bulk reduce-add (Cfg::kHalves), but for a += with sums of squares.
// A bf16 dw may also take 256 x 192 tiles (BM = 256: two 64 x 192 accumulators a consumer warpgroup; the
// store epilogue only): 22% fewer operand bytes from L2 a FLOP, the same k order per output.
// Epi (the epilogue policy) says what else a staged tile gets: StoreEpilogue here, AdamW elsewhere.
#pragma once
#include <cuda.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw_stage.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"

namespace moetrain::cuda::gwd {

using bf16 = __nv_bfloat16;
// 384 threads: warp 0 (lane 0) issues the loads, warps 1-3 are the store warps (kStoreThreads),
// warpgroups 1 and 2 are the consumers.
constexpr int kMaxE = 1024, kThreads = 384, kStoreThreads = 96;  // kBM: grouped_gemm_ws_dw_stage.cuh
// Cfg::kTma's expert limit: its shared offsets hold 192 experts (not kMaxE), which with its two 16 KB
// staging boxes leaves room for 4 stages of 64 k rows (see Cfg).
constexpr int kRingMaxE = 192;

// Shared memory: kStages x (A: BM / 64 blocks | B: BN / 64 blocks, each BK k rows x 128 B), the staging
// tile (BM rows at kPitch bytes; kTma: the box ring), barriers full[kS], empty[kS], sfull[kSlots],
// sready[kSlots], offsets [E+1], then
// 8 doubles (consumers: tiles of empty experts) and 2 x 8 (a tile's consumer warp sums of squares,
// double-buffered; store thread 0 adds them).
template <int BN, typename DwT, int BK, int BM = kBM, bool Tma = false>
struct Cfg {
  static constexpr int kRows = BM;  // tile rows: kBM, or 2 kBM (the tall bf16 tiles)
  // Tma (a bf16 dw, 128-row tiles, the store epilogue): the tile is staged one box at a time, a box
  // being 64 columns x 128 rows of dw (128-byte rows in the 128-byte swizzle), into a ring of kSlots = 2
  // box slots; one store thread writes each box (and, +=, first loads its old values) with a TMA tile
  // copy, and frees its slot for the box after next once the copy has read it. The ring is 32 KB where
  // a whole staged tile is 66 KB, so with the offsets sized for kRingMaxE experts the operand ring gets
  // 4 stages of 64 k rows instead of 3: a tile of up to 256 rows an expert (even routing at seq 4096)
  // has all its operands loaded while the consumers stage the tile before it.
  static constexpr bool kTma = Tma;
  static constexpr int kSlots = Tma ? 2 : 1, kBox = BM * 128;
  static constexpr int kExperts = Tma ? kRingMaxE : kMaxE;  // the shared offsets' capacity
  static constexpr int kBlock = BK * 128;
  static constexpr int kABytes = (BM / 64) * kBlock;
  static constexpr int kStageBytes = kABytes + (BN / 64) * kBlock;
  // kHalves: an f32 tile 256 wide is staged as two 128-column halves, one after the other (a whole
  // one, 132 KB, leaves no room for the ring); only for dispatch_dw (StoreEpilogue), whose += the store
  // warps then do as a bulk reduce-add, so not for a += with sums of squares (see stage_f32_half).
  static constexpr bool kHalves = sizeof(DwT) == 4 && BN == 256;
  static constexpr int kStageCols = kHalves ? BN / 2 : BN;
  static constexpr int kPitch = kStageCols * static_cast<int>(sizeof(DwT)) + (sizeof(DwT) == 4 ? 32 : 16);
  static constexpr int kOutBytes = Tma ? kSlots * kBox : BM * kPitch;
  static_assert(BM == kBM || (BM == 2 * kBM && !kHalves), "tile rows: 128, or 256 without the f32 halves");
  static_assert(!Tma || (BM == kBM && sizeof(DwT) == 2 && BN % 64 == 0), "TMA tile stores: bf16 128-row tiles");
  static constexpr int kOffOff = kOutBytes + 256;
  static constexpr int kRedOff = kOffOff + ((2 * kExperts + 1) * 4 + 7) / 8 * 8;  // offsets [E+1], then the order [E]
  static constexpr int kFixed = 1024 + kRedOff + 24 * 8;
  static constexpr int kFit = (227 * 1024 - kFixed) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;
  static_assert(kStages >= 2, "dW tile does not fit in shared memory");
  static_assert(!Tma || BK != 64 || kStages == 4, "the box ring is there for a fourth stage");
  static_assert((2 * kStages + 2 * kSlots) * 8 <= 256, "barrier space");
  static constexpr int kSmem = kFixed + kStages * kStageBytes;
  // setmaxnreg split (128 x kStoreRegs + 256 x kConsumerRegs <= 64512, the launch's 168 x 384): the
  // consumers (fragments, staging, sums of squares) get the registers; the store warps only copy.
  static constexpr int kStoreRegs = 40, kConsumerRegs = 232;
  static_assert(128 * kStoreRegs + 256 * kConsumerRegs <= 168 * kThreads, "register split");
};

struct Params {
  const int32_t* off;
  void* c;     // dw [E, ci, cj] (the AdamW epilogue: the prior gradient, only read)
  double* ss;  // per-tile sums of squares, or null
  int E, nmt, ncol;
  int64_t ci, cj;  // M, K
  int accumulate;
};

struct Tile {
  int e, ksteps;
  int64_t i0, j0, lo, hi;  // j0: column tile index
};

// Tile t of the walk order: the experts by rows, most first (s_off[E + 1 + r]: the expert of rank r, see
// expert_order), each expert's tiles row-major. A CTA takes t, t + grid, ...: so the longest tiles
// are dealt out first, at most one apart between CTAs, and the short ones even out the end. The dW
// kernel, whose time is its mainloops, gained 11% (f32, same process) and the default-precision layer
// step about 0.13 ms; the fused update, whose time is its walk, is unchanged (docs/performance.md,
// round 18). The order only changes which CTA does a tile, never a value or where it goes.
template <int BN, int BK, int BM = kBM>
__device__ __forceinline__ Tile decode(const Params& p, const int32_t* s_off, int64_t t) {
  Tile x;  // 32-bit index math: the tile count is below 2^31 (dw_params checks it)
  const int per_e = p.nmt * p.ncol, ti = static_cast<int>(t);
  const int rank = ti / per_e;
  x.e = s_off[p.E + 1 + rank];
  const int rem = ti - rank * per_e;
  const int mt = rem / p.ncol;
  x.i0 = static_cast<int64_t>(mt) * BM;
  x.j0 = rem - mt * p.ncol;
  x.lo = s_off[x.e];
  x.hi = s_off[x.e + 1];
  x.ksteps = x.hi > x.lo ? static_cast<int>((x.hi - x.lo + BK - 1) / BK) : 0;
  return x;
}

// The index of tile x in expert order (e, row tile, column tile): where its sum of squares goes.
template <int BM = kBM>
__device__ __forceinline__ int64_t tile_id(const Params& p, const Tile& x) {
  return (x.e * p.nmt + static_cast<int>(x.i0 / BM)) * p.ncol + static_cast<int>(x.j0);
}

// The tile's sum of squares into p.ss: the 8 consumer warps' partials red[0..7], added in warp order
// (deterministic; every epilogue adds them so).
template <int BM = kBM>
__device__ __forceinline__ void put_tile_sum(const Params& p, const Tile& x, const double* red) {
  double s = 0.0;
#pragma unroll
  for (int w = 0; w < 8; ++w) s += red[w];
  p.ss[tile_id<BM>(p, x)] = s;
}

// Bytes of staged row r of tile x that exist in the output (0 for rows past M; columns clipped at K).
template <int BN, typename DwT>
__device__ __forceinline__ uint32_t row_bytes(const Params& p, const Tile& x, int r) {
  if (x.i0 + r >= p.ci) return 0;
  const int64_t cols = p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN;
  return static_cast<uint32_t>(cols * static_cast<int64_t>(sizeof(DwT)));
}
template <int BN, typename DwT>
__device__ __forceinline__ DwT* row_ptr(const Params& p, const Tile& x, int r) {
  return static_cast<DwT*>(p.c) + (x.e * p.ci + x.i0 + r) * p.cj + x.j0 * BN;
}

__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* m, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// Cfg::kTma's boxes of dw [E, M, K] (coordinates: column, row, expert) into shared memory (the stores are
// wg::tma_3d_store).
__device__ __forceinline__ void tma_3d_load(uint32_t dst, const CUtensorMap* m, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void arrive_lane0(uint32_t bar, uint32_t lane) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// ---- the pieces of the kernel ---------------------------------------------------------------------

// All threads, once s_off[0..E] is loaded and visible: s_off[E + 1 + r] = the expert of rank r, by rows
// descending, ties by index (so even routing keeps expert order). Visible after the next barrier.
__device__ __forceinline__ void expert_order(int32_t* s_off, int E, int tid, int nthreads) {
  for (int e = tid; e < E; e += nthreads) {
    const int re = s_off[e + 1] - s_off[e];
    int rank = 0;
    for (int f = 0; f < E; ++f) {
      const int rf = s_off[f + 1] - s_off[f];
      rank += (rf > re) || (rf == re && f < e);
    }
    s_off[E + 1 + rank] = e;
  }
}

// Producer (one thread): each tile's k-slabs, dy as BM / 64 blocks and x as BN / 64 blocks of 64 columns x
// BK rows. Boxes wholly past the last column are skipped (their outputs are never stored).
template <class C, int BN, int BK, class Seek>
__device__ __forceinline__ void produce(const CUtensorMap* map_a, const CUtensorMap* map_b, const Params& p,
                                        const int32_t* s_off, uint32_t base, uint32_t full0, uint32_t empty0,
                                        int64_t total, int64_t stride, Seek seek) {
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
    const Tile x = decode<BN, BK, C::kRows>(p, s_off, t);
    int na = 0, nb = 0;
    for (int b = 0; b < C::kRows / 64; ++b) na += x.i0 + 64 * b < p.ci;
    for (int b = 0; b < BN / 64; ++b) nb += x.j0 * BN + 64 * b < p.cj;
    const uint32_t bytes = static_cast<uint32_t>((na + nb) * C::kBlock);
    for (int k = 0; k < x.ksteps; ++k) {
      wg::mbar_wait_idle(empty0 + 8 * stage, phase ^ 1u);  // sleeps while the consumers walk
      const uint32_t full = full0 + 8 * stage, sa = base + stage * C::kStageBytes;
      const int r = static_cast<int>(x.lo) + k * BK;
      wg::mbar_arrive_tx(full, bytes);
      for (int b = 0; b < na; ++b) tma_2d(sa + b * C::kBlock, map_a, static_cast<int>(x.i0) + 64 * b, r, full);
      for (int b = 0; b < nb; ++b)
        tma_2d(sa + C::kABytes + b * C::kBlock, map_b, static_cast<int>(x.j0) * BN + 64 * b, r, full);
      if (++stage == C::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
  }
}

// Consumers: acc[i] (rows 64 (NA cw + i) .. + 63 of the tile, warpgroup cw's NA accumulators) = dy_e^T x_e
// over the tile's k-slabs, one wgmma group in flight. A slab starts at the expert's first row, so only
// the last one can run into the next expert's rows (or past N, zero-filled by TMA): rows [valid, BK) of
// its blocks are zeroed in shared memory (generic stores, proxy fence, consumer barrier) before its wgmma.
template <class C, int BN, int BK, int NA>
__device__ __forceinline__ void mainloop(float (&acc)[NA][BN / 2], const Tile& x, uint32_t base, uint32_t full0,
                                         uint32_t empty0, int& stage, uint32_t& phase, int ctid, int cw,
                                         int lane) {
  constexpr int kNB = C::kRows / 64 + BN / 64;
  int prev = -1;
  for (int k = 0; k < x.ksteps; ++k) {
    wg::mbar_wait(full0 + 8 * stage, phase);
    const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
    const int valid = static_cast<int>(x.hi - x.lo) - k * BK;
    if (valid < BK) {
      const int chunks = kNB * (BK - valid) * 8;
      for (int c = ctid; c < chunks; c += 256) {
        const int blk = c / ((BK - valid) * 8), rr = c - blk * (BK - valid) * 8;
        const uint32_t a = sa + blk * C::kBlock + (valid + (rr >> 3)) * 128 + (rr & 7) * 16;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
      }
      wg::fence_proxy_async();
      consumers_sync();
    }
#pragma unroll
    for (int i = 0; i < NA; ++i) wg::fence_regs(acc[i]);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < NA; ++i) {
        const uint64_t da = wg::smem_desc(sa + (cw * NA + i) * C::kBlock + kk * 2048, C::kBlock, 1024);
        const uint64_t db = wg::smem_desc(sb + kk * 2048, C::kBlock, 1024);
        wg::wgmma_bf16<BN, 1, 1>(acc[i], da, db, (k > 0 || kk > 0) ? 1 : 0);
      }
    }
    wg::wgmma_commit();
    if (prev >= 0) {
      wg::wgmma_wait<1>();
#pragma unroll
      for (int i = 0; i < NA; ++i) wg::fence_regs(acc[i]);
      arrive_lane0(empty0 + 8 * prev, lane);
    }
    prev = stage;
    if (++stage == C::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  wg::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < NA; ++i) wg::fence_regs(acc[i]);
  arrive_lane0(empty0 + 8 * prev, lane);
}

// Bytes of half hf of staged row r of a wide f32 tile that exist in the output (0 past M or past K).
template <int BN>
__device__ __forceinline__ uint32_t half_bytes(const Params& p, const Tile& x, int r, int hf) {
  if (x.i0 + r >= p.ci) return 0;
  const int64_t cols = p.cj - x.j0 * BN - (BN / 2) * hf;
  return cols <= 0 ? 0u : static_cast<uint32_t>((cols < BN / 2 ? cols : BN / 2) * 4);
}

// Store warp sw (0..2) owns the rows of consumer warps sw, sw + 3 and sw + 6 (< 8), 16 w .. 16 w + 15:
// it stores and reloads only those, so only a __syncwarp orders its reads of them before the next
// tile's loads. Lane `lane`'s rows: row_a always, row_b
// when has_b.
struct StoreRows {
  int a, b;
  bool has_b;
};
__device__ __forceinline__ StoreRows store_rows(int sw, int lane) {
  return {16 * (sw + 3 * (lane >> 4)) + (lane & 15), 16 * (sw + 6) + lane, lane < 16 && sw < 2};
}

// Consumers, after the main loop: the partials of the tiles of experts without rows (skipped above):
// the old dw's squares (+=), or 0. Warp sums, then thread 0 adds the 8 in warp order.
template <int BN, typename DwT, int BK, int BM = kBM>
__device__ __forceinline__ void empty_tile_sums(const Params& p, const int32_t* s_off, double* s_red, int ctid,
                                                int lane, int warp, int64_t total, int64_t stride) {
  for (int64_t t = blockIdx.x; t < total; t += stride) {
    const Tile x = decode<BN, BK, BM>(p, s_off, t);
    if (x.ksteps) continue;
    double ss = 0.0;
    if (p.accumulate) {
      const DwT* src = static_cast<const DwT*>(p.c) + (x.e * p.ci + x.i0) * p.cj + x.j0 * BN;
      const int64_t rows = p.ci - x.i0 < BM ? p.ci - x.i0 : BM;
      const int64_t cols = p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN;
      for (int64_t k = ctid; k < rows * cols; k += 256) {
        const double v = static_cast<float>(src[(k / cols) * p.cj + k % cols]);
        ss += v * v;
      }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) s_red[warp] = ss;
    consumers_sync();
    if (ctid == 0) {
      put_tile_sum<BM>(p, x, s_red);
    }
    consumers_sync();
  }
}

// Epilogue policy of dispatch_dw: the store warps write each staged tile to dw; experts without rows
// get dw = 0 in = mode (the old dw stays in += mode). A policy has: kStore (store warps write the
// staged tile to p.c), kWalk (the consumers call walk() on the complete staged tile before releasing
// it), Pending (what a consumer thread loads ahead for its walk: fetch() issues those loads, before
// the tile's mainloop when kEarly, else after it), kWalkEmpty (the consumers call walk_empty() on
// each tile of an expert without rows in their tile sequence: no mainloop, no staging; it may fetch
// the first loads of the consumer's next tile when that one is idle too, into the Pending it is
// handed, and returns whether it did) and empty_experts() (consumers, after the main loop).
struct StoreEpilogue {
  static constexpr bool kStore = true, kWalk = false, kEarly = false, kWalkEmpty = false;
  struct Pending {};
  template <int BN, typename DwT>
  __device__ bool walk_empty(const Params&, const Tile&, int, Pending&, bool, bool, const Tile) const { return false; }
  template <int BN>
  __device__ void fetch(const Params&, const Tile&, int, Pending&) const {}
  template <int BN, typename DwT, int kPitch>
  __device__ void walk(const Params&, const Tile&, const unsigned char*, int, Pending&) const {}
  template <typename DwT>
  __device__ void empty_experts(const Params& p, const int32_t* s_off, int ctid) const {
    if (p.accumulate) return;
    const int64_t vecs = p.ci * p.cj * static_cast<int64_t>(sizeof(DwT)) / 16;
    for (int e = 0; e < p.E; ++e) {
      if (s_off[e + 1] > s_off[e]) continue;
      uint4* c = reinterpret_cast<uint4*>(static_cast<DwT*>(p.c) + static_cast<int64_t>(e) * p.ci * p.cj);
      for (int64_t v = static_cast<int64_t>(blockIdx.x) * 256 + ctid; v < vecs; v += gridDim.x * 256ll)
        c[v] = make_uint4(0, 0, 0, 0);
    }
  }
};

// ---- the kernel -----------------------------------------------------------------------------------
// Tiles walk t, t + grid, ... (tiles of experts without rows skipped; one CTA per tile, rows in order:
// deterministic). Per tile: the consumers' mainloop, then (once sready says the staging tile is free
// and, +=, holds the old rows) they stage it and arrive on sfull; the store warps wait on sfull, issue
// the row stores, sum the squares, and once the stores have read the tile, load the next tile's old
// rows and arrive on sready. map_a: dy [N, M], map_b: x [N, K], boxes 64 columns x BK rows; map_c: dw
// [E, M, K], boxes 64 columns x 128 rows (Cfg::kTma: store thread 0 alone writes and loads the tiles
// with it; unused otherwise).
template <int BN, typename DwT, int BK, class Epi, int BM = kBM, bool Tma = false>
__global__ void __launch_bounds__(kThreads, 1)
    gmm_ws_dw_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_c, const Params p, const Epi epi) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  using C = Cfg<BN, DwT, BK, BM, Tma>;
  static_assert(!Tma || (Epi::kStore && !Epi::kWalk), "TMA tile stores: the store epilogue only");
  constexpr int kS = C::kStages;
  constexpr int NA = BM / kBM;  // accumulators a consumer warpgroup (64 rows each)
  static_assert(NA == 1 || (Epi::kStore && !Epi::kWalk), "tall tiles: the store epilogue only");
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* out_p = smem_raw + (base - raw) + kS * C::kStageBytes;
  const uint32_t sout = base + kS * C::kStageBytes;
  const uint32_t full0 = sout + C::kOutBytes, empty0 = full0 + 8 * kS, sfull = empty0 + 8 * kS;
  const uint32_t sready = sfull + 8 * C::kSlots;  // sfull[kSlots], sready[kSlots]
  int32_t* s_off = reinterpret_cast<int32_t*>(out_p + C::kOffOff);
  double* s_red = reinterpret_cast<double*>(out_p + C::kRedOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= p.E; i += kThreads) s_off[i] = p.off[i];
  __syncthreads();
  expert_order(s_off, p.E, tid, kThreads);
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(full0 + 8 * s, 1);
      wg::mbar_init(empty0 + 8 * s, 8);
    }
    for (int s = 0; s < C::kSlots; ++s) {
      wg::mbar_init(sfull + 8 * s, 256);
      wg::mbar_init(sready + 8 * s, C::kTma ? 1 : kStoreThreads);
    }
    wg::fence_mbar_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
    if (C::kTma) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_c)) : "memory");
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(p.E) * p.nmt * p.ncol, stride = gridDim.x;
  auto seek = [&](int64_t t) {  // first tile at or after t (step = grid) whose expert has rows
    while (t < total && decode<BN, BK, BM>(p, s_off, t).ksteps == 0) t += stride;
    return t;
  };
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kStoreRegs));
    if (__shfl_sync(0xffffffffu, tid / 32, 0) == 0) {  // ---- producer warp ----
      if (tid == 0) produce<C, BN, BK>(&map_a, &map_b, p, s_off, base, full0, empty0, total, stride, seek);
      __syncwarp();
      return;
    }
    // A walking epilogue with nothing to load into the staging tile needs no store warps: the
    // consumers order the tiles themselves (see `solo` below). Left waiting, these warps issued 10%
    // of the fused kernel's instructions, sleeping waits included (the H100 time did not change).
    if (!Epi::kStore && !p.accumulate) return;
    // ---- store warps (see store_rows) ----
    const int st = tid - 32, sw = st >> 5, lane = tid & 31;
    const StoreRows own = store_rows(sw, lane);
    if constexpr (C::kTma) {  // store thread 0 alone: the box ring (see Cfg)
      if (st != 0) return;
      constexpr int kNB = BN / 64;  // boxes a tile (dispatch_dw: whole boxes only)
      static_assert(kNB >= C::kSlots, "a tile of at least two boxes");
      auto release = [&](const Tile& x, int b, int s) {  // slot s takes box b of x (+=: its old values first)
        const uint32_t bar = sready + 8 * s;
        if (!p.accumulate) {
          wg::mbar_arrive(bar);
          return;
        }
        wg::mbar_arrive_tx(bar, C::kBox);
        tma_3d_load(sout + s * C::kBox, &map_c, static_cast<int>(x.j0) * BN + 64 * b, static_cast<int>(x.i0), x.e,
                    bar);
      };
      int64_t t = seek(blockIdx.x);
      if (t < total) {
        const Tile x = decode<BN, BK, BM>(p, s_off, t);
        release(x, 0, 0);
        release(x, 1, 1);
      }
      uint32_t g = 0;  // boxes so far; box g is in slot g % 2
      for (uint32_t it = 0; t < total; ++it) {
        const Tile x = decode<BN, BK, BM>(p, s_off, t);
        const int64_t tn = seek(t + stride);
        for (int b = 0; b < kNB; ++b, ++g) {
          const int s = static_cast<int>(g & 1u);
          wg::mbar_wait_idle(sfull + 8 * s, (g >> 1) & 1u);
          wg::tma_3d_store(&map_c, sout + s * C::kBox, static_cast<int>(x.j0) * BN + 64 * b, static_cast<int>(x.i0),
                           x.e);
          wg::bulk_commit();
          if (b == kNB - 1 && p.ss) {  // the consumers' 8 warp sums (before the last box's sfull), in warp order
            put_tile_sum<BM>(p, x, s_red + 8 + 8 * (it & 1u));
          }
          if (g > 0) {  // box g - 1's copy has read the other slot: it takes box g + 1
            wg::bulk_wait_read_but_last();
            if (b + 1 < kNB) release(x, b + 1, s ^ 1);
            else if (tn < total) release(decode<BN, BK, BM>(p, s_off, tn), 0, s ^ 1);
          }
        }
        t = tn;
      }
      wg::bulk_wait_all();
      return;
    }
    if constexpr (C::kHalves) {  // two rounds a tile: store (=) or reduce-add (+=) a half, free the staging
      uint32_t it = 0, tt = 0;
      int64_t t = seek(blockIdx.x);
      if (t < total) wg::mbar_arrive(sready);
      while (t < total) {
        const Tile x = decode<BN, BK, BM>(p, s_off, t);
        const int64_t tn = seek(t + stride);
        for (int hf = 0; hf < 2; ++hf, ++it) {
          wg::mbar_wait_idle(sfull, it & 1u);
          if (hf == 1 && p.ss && st == 0) {  // the consumers' 8 warp sums (before sfull), in warp order
            put_tile_sum<BM>(p, x, s_red + 8 + 8 * (tt & 1u));
          }
          const uint32_t na = half_bytes<BN>(p, x, own.a, hf), nb = own.has_b ? half_bytes<BN>(p, x, own.b, hf) : 0u;
          float* ga = row_ptr<BN, float>(p, x, own.a) + (BN / 2) * hf;
          float* gb = row_ptr<BN, float>(p, x, own.b) + (BN / 2) * hf;
          if (p.accumulate) {
            if (na) wg::bulk_reduce_add_f32(ga, sout + own.a * C::kPitch, na);
            if (nb) wg::bulk_reduce_add_f32(gb, sout + own.b * C::kPitch, nb);
          } else {
            if (na) wg::bulk_store(ga, sout + own.a * C::kPitch, na);
            if (nb) wg::bulk_store(gb, sout + own.b * C::kPitch, nb);
          }
          wg::bulk_commit();
          __syncwarp();
          wg::bulk_wait_read();
          if (hf == 0 || tn < total) wg::mbar_arrive(sready);
        }
        ++tt;
        t = tn;
      }
      wg::bulk_wait_all();
      return;
    }
    // A lane's rows: own.a and (has_b) own.b of each 128-row half of the tile (one half but for tall tiles).
    auto release = [&](const Tile& x) {  // own rows free: (+=) load tile x's old rows; arrive on sready
      if constexpr (NA == 1) {
        const uint32_t na = p.accumulate ? row_bytes<BN, DwT>(p, x, own.a) : 0u;
        const uint32_t nb = p.accumulate && own.has_b ? row_bytes<BN, DwT>(p, x, own.b) : 0u;
        if (na + nb == 0) {
          wg::mbar_arrive(sready);
          return;
        }
        wg::mbar_arrive_tx(sready, na + nb);
        if (na) wg::bulk_load(sout + own.a * C::kPitch, row_ptr<BN, DwT>(p, x, own.a), na, sready);
        if (nb) wg::bulk_load(sout + own.b * C::kPitch, row_ptr<BN, DwT>(p, x, own.b), nb, sready);
      } else {
        uint32_t na[NA], nb[NA], n = 0;
#pragma unroll
        for (int h = 0; h < NA; ++h) {
          na[h] = p.accumulate ? row_bytes<BN, DwT>(p, x, own.a + kBM * h) : 0u;
          nb[h] = p.accumulate && own.has_b ? row_bytes<BN, DwT>(p, x, own.b + kBM * h) : 0u;
          n += na[h] + nb[h];
        }
        if (n == 0) {
          wg::mbar_arrive(sready);
          return;
        }
        wg::mbar_arrive_tx(sready, n);
#pragma unroll
        for (int h = 0; h < NA; ++h) {
          const int ra = own.a + kBM * h, rb = own.b + kBM * h;
          if (na[h]) wg::bulk_load(sout + ra * C::kPitch, row_ptr<BN, DwT>(p, x, ra), na[h], sready);
          if (nb[h]) wg::bulk_load(sout + rb * C::kPitch, row_ptr<BN, DwT>(p, x, rb), nb[h], sready);
        }
      }
    };
    int64_t t = seek(blockIdx.x);
    if (t < total) release(decode<BN, BK, BM>(p, s_off, t));
    for (uint32_t it = 0; t < total; ++it) {
      const Tile x = decode<BN, BK, BM>(p, s_off, t);
      const int64_t tn = seek(t + stride);
      wg::mbar_wait_idle(sfull, it & 1u);
      if constexpr (Epi::kStore) {
#pragma unroll
        for (int h = 0; h < NA; ++h) {
          const int ra = own.a + kBM * h, rb = own.b + kBM * h;
          const uint32_t na = row_bytes<BN, DwT>(p, x, ra);
          const uint32_t nb = own.has_b ? row_bytes<BN, DwT>(p, x, rb) : 0u;
          if (na) wg::bulk_store(row_ptr<BN, DwT>(p, x, ra), sout + ra * C::kPitch, na);
          if (nb) wg::bulk_store(row_ptr<BN, DwT>(p, x, rb), sout + rb * C::kPitch, nb);
        }
        wg::bulk_commit();
      }
      if (p.ss && st == 0) {  // the consumers' 8 warp sums (before sfull), added in warp order: deterministic
        put_tile_sum<BM>(p, x, s_red + 8 + 8 * (it & 1u));  // double-buffered: consumers fill the other next
      }
      wg::fence_proxy_async();  // this lane's reads of the staging rows, before the bulk loads into them
      __syncwarp();
      if constexpr (Epi::kStore) wg::bulk_wait_read();
      if (tn < total) release(decode<BN, BK, BM>(p, s_off, tn));
      t = tn;
    }
    wg::bulk_wait_all();
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  const int ctid = tid - 128, cw = ctid >> 7, lane = tid & 31, warp = ctid >> 5;
  int stage = 0;
  uint32_t phase = 0, rphase = 0, cit = 0, cbox = 0;  // cbox: kTma's boxes so far (box g in slot g % 2)
  float acc[NA][BN / 2];
  typename Epi::Pending pend;
  bool ahead = false;  // kWalkEmpty: pend holds this idle tile's first batch (the previous idle tile fetched it)
  const bool solo = !Epi::kStore && !p.accumulate;  // no store warps (they returned above)
  // with kWalkEmpty the consumers also visit the tiles of experts without rows (the producer and the
  // store warps skip them), so that this work is spread over the CTAs like the rest
  for (int64_t t = Epi::kWalkEmpty ? blockIdx.x : seek(blockIdx.x); t < total;
       t = Epi::kWalkEmpty ? t + stride : seek(t + stride)) {
    const Tile x = decode<BN, BK, BM>(p, s_off, t);
    if constexpr (Epi::kWalkEmpty) {
      if (x.ksteps == 0) {
        const Tile nx = t + stride < total ? decode<BN, BK, BM>(p, s_off, t + stride) : x;
        const bool nidle = t + stride < total && nx.ksteps == 0;
        ahead = epi.template walk_empty<BN, DwT>(p, x, ctid, pend, ahead, nidle, nx);
        continue;
      }
    }
#pragma unroll
    for (int a = 0; a < NA; ++a)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[a][i] = 0.0f;  // dead between tiles (the first wgmma ignores them)
    if constexpr (Epi::kWalk && Epi::kEarly) epi.template fetch<BN>(p, x, ctid, pend);
    mainloop<C, BN, BK, NA>(acc, x, base, full0, empty0, stage, phase, ctid, cw, lane);
    if constexpr (Epi::kWalk && !Epi::kEarly) epi.template fetch<BN>(p, x, ctid, pend);
    if constexpr (C::kHalves) {  // (StoreEpilogue; sums of squares only with =: dispatch_dw checks)
      const int nrows = static_cast<int>(p.ci - x.i0 < BM ? p.ci - x.i0 : BM);
      const int ncols = static_cast<int>(p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN);
      wg::SumSq4 sq;
      wg::mbar_wait(sready, rphase);
      rphase ^= 1u;
      stage_f32_half<BN, C::kPitch, 0>(acc[0], out_p, lane, warp, sq, p.ss != nullptr, nrows, ncols);
      wg::fence_proxy_async();
      wg::mbar_arrive(sfull);
      wg::mbar_wait(sready, rphase);
      rphase ^= 1u;
      stage_f32_half<BN, C::kPitch, 1>(acc[0], out_p, lane, warp, sq, p.ss != nullptr, nrows, ncols);
      if (p.ss) {  // read by store thread 0 after this tile's second sfull
        double ss = sq.total();
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) s_red[8 + 8 * (cit & 1u) + warp] = ss;
        ++cit;
      }
      wg::fence_proxy_async();
      wg::mbar_arrive(sfull);
      continue;
    }
    if constexpr (C::kTma) {  // the box ring (whole boxes: every row and column of the tile is in dw)
      double* red = p.ss ? s_red + 8 + 8 * (cit++ & 1u) : nullptr;  // read by store thread 0 after the last box
      const bool row_in[2] = {true, true};
      wg::SumSq4 sq;
#pragma unroll
      for (int b = 0; b < BN / 64; ++b, ++cbox) {
        const int s = static_cast<int>(cbox & 1u);
        wg::mbar_wait(sready + 8 * s, (cbox >> 1) & 1u);
        const uint32_t at = sout + (s - b) * C::kBox;  // box b lands at slot s (see stage_bf16)
        if (red)
          stage_bf16<BN, C::kPitch, true, true>(acc[0], p.accumulate != 0, at, lane, warp, sq, true, row_in, BN, 8 * b,
                                                8 * b + 8);
        else
          stage_bf16<BN, C::kPitch, false, true>(acc[0], p.accumulate != 0, at, lane, warp, sq, false, row_in, BN,
                                                 8 * b, 8 * b + 8);
        if (red && b == BN / 64 - 1) warp_sum_squares(sq, lane, warp, red);
        wg::fence_proxy_async();  // the box's staging writes, before the store thread's copy reads them
        wg::mbar_arrive(sfull + 8 * s);
      }
      continue;
    }
    if (solo) {
      consumers_sync();  // every consumer has walked the previous staged tile
    } else {
      wg::mbar_wait(sready, rphase);
      rphase ^= 1u;
    }
    const int nrows = static_cast<int>(p.ci - x.i0 < BM ? p.ci - x.i0 : BM);
    const int ncols = static_cast<int>(p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN);
    double* red = p.ss ? s_red + 8 + 8 * (cit++ & 1u) : nullptr;  // read by store thread 0 after sfull
    stage_tile<BN, DwT, C::kPitch, NA>(acc, p.accumulate != 0, sout, out_p, lane, warp, red, nrows, ncols);
    wg::fence_proxy_async();  // staging writes, before the store warps' bulk stores read them
    if constexpr (Epi::kWalk) {
      consumers_sync();
      if (solo && p.ss && ctid == 0) {  // the 8 warp sums in warp order, as store thread 0 adds them
        put_tile_sum<BM>(p, x, red);
      }
      epi.template walk<BN, DwT, C::kPitch>(p, x, out_p, ctid, pend);
      wg::fence_proxy_async();  // the walk's reads, before the next tile's bulk loads into the staging tile
    }
    if (!solo) wg::mbar_arrive(sfull);
  }
  if (p.ss) empty_tile_sums<BN, DwT, BK, BM>(p, s_off, s_red, ctid, lane, warp, total, stride);
  epi.template empty_experts<DwT>(p, s_off, ctid);
#endif
}

// ---- host -------------------------------------------------------------------------------------
using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeFn dw_encoder() {
  static const EncodeFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    MT_CHECK(q == cudaDriverEntryPointSuccess && f != nullptr,
             "[grouped_gemm_ws] the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or later)");
    return reinterpret_cast<EncodeFn>(f);
  }();
  return fn;
}

// [rows, cols] bf16 row-major, box 64 columns x `box_rows` rows, 128B swizzle, zero fill.
inline CUtensorMap dw_map(const void* ptr, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)}, estr[2] = {1, 1};
  const CUresult r = dw_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims, strides, box,
                                  estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "[grouped_gemm_ws] cuTensorMapEncodeTiled failed with error {}", static_cast<int>(r));
  return m;
}

inline int dw_sm_count(const Context& ctx) {
  int sms = ctx.facts().sm_count;
  if (sms <= 0) {
    int dev = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return sms;
}

// Params of an [E, M, K] dW problem over BM x BN tiles; c: dw (or the AdamW prior), null allowed.
template <int BN, int BM = kBM>
inline Params dw_params(const int32_t* off, int E, int64_t K, int64_t M, void* c, bool accumulate, double* partial) {
  Params p{};
  p.off = off;
  p.c = c;
  p.ss = partial;
  p.E = E;
  p.ci = M;
  p.cj = K;
  p.ncol = static_cast<int>((K + BN - 1) / BN);
  p.nmt = static_cast<int>((M + BM - 1) / BM);
  MT_CHECK(static_cast<int64_t>(E) * p.nmt * p.ncol < (int64_t(1) << 31), "[grouped_gemm_ws] dW of {} experts x {} x {}: too many tiles", E, M, K);
  p.accumulate = accumulate ? 1 : 0;
  return p;
}

// The kernel with epilogue policy epi on `grid` CTAs. x [N, K], dy [N, M].
// Cfg::kTma's map of a bf16 dw [E, M, K]: boxes of 64 columns x 128 rows of one expert, 128B swizzle.
inline CUtensorMap dw_out_map(void* dw, int64_t E, int64_t M, int64_t K) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(M * K) * 2};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kBM), 1}, estr[3] = {1, 1, 1};
  const CUresult r = dw_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, dw, dims, strides, box, estr,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "[grouped_gemm_ws] cuTensorMapEncodeTiled (dW) failed with error {}",
           static_cast<int>(r));
  return m;
}

template <int BN, typename DwT, int BK, int BM = kBM, bool Tma = false, class Epi>
void launch_dw_kernel(Context& ctx, const bf16* x, const bf16* dy, int64_t N, int64_t K, int64_t M, const Params& p,
                      const Epi& epi, int64_t grid, const char* op) {
  using C = Cfg<BN, DwT, BK, BM, Tma>;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, BK), mb = dw_map(x, N > 0 ? N : 1, K, BK);
  CUtensorMap mc{};  // unused unless Tma
  if constexpr (Tma) mc = dw_out_map(p.c, p.E, M, K);
  auto kernel = gmm_ws_dw_kernel<BN, DwT, BK, Epi, BM, Tma>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  launch_pdl(kernel, static_cast<unsigned>(grid), kThreads, C::kSmem, stream_of(ctx), ma, mb, mc, p, epi);
  check_launch(op);
}

// x [N, K], dy [N, M]; dw [E, M, K]; per-tile partials of the sum of squares into `partial` (or null).
template <int BN, typename DwT, int BK, int BM = kBM, bool Tma = false>
void launch_dw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
               int64_t M, void* dw, bool accumulate, double* partial) {
  const Params p = dw_params<BN, BM>(off, E, K, M, dw, accumulate, partial);
  const int64_t bound = static_cast<int64_t>(E) * p.nmt * p.ncol, sms = dw_sm_count(ctx);
  const int64_t grid = bound < sms ? (bound > 0 ? bound : 1) : sms;
  launch_dw_kernel<BN, DwT, BK, BM, Tma>(ctx, x, dy, N, K, M, p, StoreEpilogue{}, grid, "grouped_matmul_backward");
}

// Whether dispatch_dw runs an f32 gradient on 128 x 256 tiles staged in halves (see there).
inline bool dw_f32_wide(bool accumulate, bool sums, int variant) { return !(variant & 2) && !(accumulate && sums); }
// Whether dispatch_dw runs a bf16 gradient on the tall 256 x 192 tiles (variant bit 2).
inline bool dw_tall(bool dw_bf16, int variant) { return dw_bf16 && (variant & 4); }
// Whether dispatch_dw stages a bf16 gradient in the box ring (Cfg::kTma): whole boxes only (M a multiple
// of 128, K of 256, so that no box reaches past the gradient) and at most kRingMaxE experts; by default
// only without sums of squares (with them the ring measured 8% slower on the H200 in round 50 and level
// since round 51's span sums; without them 4-5% faster); variant bit 3 (8) takes it with sums too, bit 4
// (16) never.
inline bool dw_ring(bool dw_bf16, int E, int64_t K, int64_t M, bool sums, int variant) {
  if (!dw_bf16 || (variant & (4 | 16)) || M % kBM != 0 || K % 256 != 0 || E > kRingMaxE) return false;
  return (variant & 8) || !sums;
}
// Per-tile partials of the sum of squares over [E, M, K] in bm x bn tiles (size of the `partial` buffer).
inline int64_t dw_tiles(int E, int64_t K, int64_t M, int bn, int bm = kBM) {
  return static_cast<int64_t>(E) * ((M + bm - 1) / bm) * ((K + bn - 1) / bn);
}
// dispatch_dw's partials: 256 x 192 tiles (tall), 128 x 256, or 128 x 128 for f32 on the old tiles.
inline int64_t dw_sums_tiles(int E, int64_t K, int64_t M, bool dw_bf16, bool accumulate, int variant) {
  if (dw_tall(dw_bf16, variant)) return dw_tiles(E, K, M, 192, 2 * kBM);
  return dw_tiles(E, K, M, dw_bf16 || dw_f32_wide(accumulate, true, variant) ? 256 : 128);
}
// Same contract as grouped_gemm_wgmma_dw. variant (benchmark knob), bit 0 (1) = the other slab depth
// (bf16: 32 rows / 6 stages instead of 64 / 3; f32 128 wide: 64 / 4 instead of 32 / 8; f32 256 wide:
// 32 / 6 instead of 64 / 3; bf16 tall: 64 / 2 instead of 32 / 4), bit 1 (2) = f32 on 128-wide tiles always,
// bit 2 (4) = bf16 on 256 x 192 tiles (two 64 x 192 accumulators a consumer warpgroup; the same values,
// the sums of squares grouped per tile), bits 3 and 4: the bf16 box ring (see dw_ring) with sums of squares
// too / never (Cfg::kTma: tiles staged a box at a time in a ring of two and stored (and, +=, loaded) as
// TMA tensor boxes by one store thread, with 4 stages of 64 k rows instead of 3, or 8 of 32 with bit 0;
// the same values and sums). Defaults: the ring where dw_ring allows it (without sums), else bf16 128 x 256 tiles;
// f32 128 x 256 tiles staged in halves, with the += as a bulk reduce-add, except for a += with sums of
// squares (the last micro-batch of several without the update in backward: the sums need the stored
// value, which only the old rows' load gives), which keeps 128 x 128 tiles.
inline void dispatch_dw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
                        int64_t M, void* dw, bool dw_bf16, bool accumulate, double* partial, int variant) {
  const bool deep = variant & 1, wide = dw_f32_wide(accumulate, partial != nullptr, variant);
  if (dw_tall(dw_bf16, variant)) {
    if (deep) launch_dw<192, bf16, 64, 2 * kBM>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<192, bf16, 32, 2 * kBM>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  } else if (dw_ring(dw_bf16, E, K, M, partial != nullptr, variant)) {
    if (deep) launch_dw<256, bf16, 32, kBM, true>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<256, bf16, 64, kBM, true>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  } else if (dw_bf16) {
    if (deep) launch_dw<256, bf16, 32>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<256, bf16, 64>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  } else if (wide) {
    if (deep) launch_dw<256, float, 32>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<256, float, 64>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  } else {
    if (deep) launch_dw<128, float, 64>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<128, float, 32>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  }
}

}  // namespace moetrain::cuda::gwd
