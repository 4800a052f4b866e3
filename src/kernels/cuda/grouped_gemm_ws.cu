// Hopper warp-specialized grouped expert GEMM (y = x W[e]^T, dx = dy W[e], and dW through
// grouped_gemm_ws_dw.cuh; bf16 in, fp32 accumulate).
// A producer warp issues TMA tensor copies (128B swizzle) of the A rows and the W tile into a ring
// of stages guarded by full / empty mbarriers; two consumer warpgroups run wgmma m64n256k16 from
// shared memory, stage their bf16 tile in shared memory (stmatrix) and write the expert's rows with
// one bulk copy per row. A persistent scheduler walks units (expert, column tile, row block) from an
// on-device prefix of the offsets. Knobs (benchmarks): pingpong warpgroups, 2-CTA W multicast, tall
// 256 x 192 tiles (each warpgroup 128 x 192 on two m64n192k16 accumulators).
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's entry point

#include <cub/block/block_scan.cuh>
#include <type_traits>
#include <utility>

#include "core/env.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"

namespace moetrain::cuda {

namespace gws {

using bf16 = __nv_bfloat16;
constexpr int kBK = 64, kMaxE = 1024, kThreads = 384;
enum Mode : int { kFwd = 0, kDx = 1 };
// kCoop: both consumer warpgroups share one 128 x 256 tile (64 rows each). kPing: each warpgroup
// takes every other 64 x 256 tile, so one's epilogue overlaps the other's mainloop. kTall: both share
// one 256 x 192 tile (128 rows each, two m64n192 accumulators): 112 FLOP per operand byte read from L2
// against the 128 x 256 tile's 85, at 192 accumulator registers a thread instead of 128.
enum Sched : int { kCoop = 0, kPing = 1, kTall = 2 };

// Shared memory: kStages x (A rows x 64 k | W kBN x 64 k), then a staging tile of 64 rows per
// consumer warpgroup (the epilogue: its bulk row stores run on under the next mainloop; a tall
// warpgroup stages its 128 rows in two rounds), barriers, offsets [E+1] and the row-block prefix [E+1].
template <int kSched, int kCluster>
struct Cfg {
  static constexpr int kBN = kSched == kTall ? 192 : 256;  // output columns per unit
  // A rows per stage = rows per CTA per unit; rows per consumer warpgroup (64 per accumulator).
  static constexpr int kRows = kSched == kCoop ? 128 : kSched == kTall ? 256 : 64;
  static constexpr int kWgRows = kSched == kTall ? 128 : 64;
  static constexpr int kAccs = kWgRows / 64;
  // Experts the shared offsets hold: the tall tile's stages need the 4 KB that 512 more would take.
  static constexpr int kMaxExperts = kSched == kTall ? 512 : kMaxE;
  static constexpr int kABytes = kRows * kBK * 2;
  static constexpr int kBBytes = kBN * kBK * 2;  // 32 KB (24 KB tall)
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kPitch = kBN * 2 + 16;                 // staging row: 16-byte skew, stmatrix conflict free
  static constexpr int kEpiBytes = 2 * 64 * kPitch;
  static constexpr int kFixed = 1024 + kEpiBytes + 128 + 2 * (kMaxExperts + 1) * 4;  // alignment, staging, barriers, offsets
  static constexpr int kStages = (227 * 1024 - kFixed) / kStageBytes;  // 3 (coop 48 KB, ping 40 KB, tall 56 KB)
  static constexpr int kEpiOff = kStages * kStageBytes;
  static constexpr int kBarOff = kEpiOff + kEpiBytes;
  // full[kStages], empty[kStages], turn[2] (pingpong hand-over), then offsets and unit prefix.
  static constexpr int kSmem = 1024 + kBarOff + (2 * kStages + 2) * 8 + 16 + 2 * (kMaxExperts + 1) * 4;
  static_assert((2 * kStages + 2) * 8 + 16 <= 128, "barrier space");  // + the dynamic schedule's unit ring
  // One arrival per consumer warp that reads a stage, from each CTA of the cluster.
  static constexpr int kEmptyCount = (kSched == kPing ? 4 : 8) * kCluster;
  static_assert(kStages >= 3, "fewer than 3 stages");
  static_assert(kSmem <= 227 * 1024, "stages do not fit in shared memory");
};

struct Params {
  const int32_t* off;  // [E+1], device
  bf16* c;             // [N, cols]
  int E;
  int ncol;    // column tiles of Cfg::kBN
  int order;   // units inside an expert: 0 = (column tile, row block), 1 = (row block, column tile)
  // Dynamic schedule (single CTAs, not pingpong): [next unit, CTAs done], zero between launches (the
  // last CTA to finish resets both); null: the static stride (CTA i takes units i, i + grid, ...).
  int* counter;
  int ksteps;  // ceil(reduction / kBK)
  int64_t N, cols;
};

// ---- PTX helpers (sm_90a) ---------------------------------------------------------------------
__device__ __forceinline__ uint64_t map_addr(const CUtensorMap* m) { return reinterpret_cast<uint64_t>(m); }
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* m, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* m, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Same copy delivered to the same shared offset (and mbarrier) of every CTA in `mask`.
__device__ __forceinline__ void tma_load_3d_mc(uint32_t dst, const CUtensorMap* m, int c0, int c1, int c2,
                                               uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void prefetch_map(const CUtensorMap* m) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_addr(m)) : "memory");
}
// Lane 0 of the warp arrives on the local mbarrier / on the one at the same shared offset in CTA
// `cta` of the cluster. Predicated inside the asm: a branch around it would be a divergent path
// that makes ptxas serialize the in-flight wgmma (C7518). Default (.release.cta) semantics: what
// the arrival publishes is that this warp's wgmma reads of the stage are complete.
__device__ __forceinline__ void mbar_arrive_lane0(uint32_t bar, uint32_t lane) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_cta_lane0(uint32_t bar, uint32_t cta, uint32_t lane) {
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 ra;\nsetp.eq.u32 p, %2, 0;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
      "@p mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta), "r"(lane)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Barrier over the 128 threads of one consumer warpgroup (ids 1, 2; 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- schedule ---------------------------------------------------------------------------------
// Expert e has mu_e = ceil(rows_e / (kRows * kCluster)) row blocks; units are ordered (expert,
// column tile, row block) so that an expert's W tile is read by consecutive units while hot in L2
// (order 1: (expert, row block, column tile), a benchmark knob).
// A cluster splits its row block between its CTAs in multiples of 64 rows (a short last block
// leaves the second CTA's second warpgroup, or the whole second CTA, without rows).
struct Unit {
  int e, j;
  int rb, re;  // this CTA's rows [rb, re), possibly empty
};

template <int kRows, int kCluster>
__device__ __forceinline__ Unit decode(const Params& p, const int32_t* s_off, const int32_t* s_ts, int64_t u,
                                       int rank) {
  const int32_t blk = static_cast<int32_t>(u / p.ncol);  // s_ts[e] <= blk < s_ts[e + 1]
  int lo_e = 0, hi_e = p.E - 1;
  while (lo_e < hi_e) {
    const int mid = (lo_e + hi_e + 1) >> 1;
    if (s_ts[mid] <= blk) lo_e = mid; else hi_e = mid - 1;
  }
  Unit x;
  x.e = lo_e;
  const int mu = s_ts[x.e + 1] - s_ts[x.e];
  const int local = static_cast<int>(u - static_cast<int64_t>(s_ts[x.e]) * p.ncol);
  int q;
  if (p.order == 0) {
    x.j = local / mu;
    q = local - x.j * mu;
  } else {
    q = local / p.ncol;
    x.j = local - q * p.ncol;
  }
  const int hi = s_off[x.e + 1];
  const int b0 = s_off[x.e] + q * kRows * kCluster;
  const int rem = min(kRows * kCluster, hi - b0);
  if constexpr (kCluster == 1) {
    x.rb = b0;
    x.re = b0 + rem;
  } else {
    const int h = min(kRows, ((rem + kCluster - 1) / kCluster + 63) / 64 * 64);
    x.rb = min(b0 + rank * h, b0 + rem);
    x.re = min(b0 + rem, x.rb + h);
  }
  return x;
}

// Epilogue of one consumer warpgroup's 64 rows: its 64 x kBN fp32 fragments (warp w, lane l: rows
// 16 w + l/4 (+8), columns 8 i + 2 (l % 4) (+1)) -> bf16 staging tile at `stg` (kPitch-byte rows) by stmatrix,
// then thread t < 64 bulk-copies row t when r0 + t < rend, clipped to the output's columns: rows of
// the next expert are never written. Thread t owns staging row t for every store, so its wait for
// the previous store's read, then the warpgroup barrier `bar`, make the tile free again.
template <int kBN, int kPitch>
__device__ __forceinline__ void store_rows(const Params& p, uint32_t stg, int bar, int r0, int rend, int j,
                                           const float (&acc)[kBN / 2]) {
  const int wtid = threadIdx.x & 127, lane = threadIdx.x & 31, q = lane >> 3;
  if (wtid < 64) wg::bulk_wait_read();
  named_sync(bar);
  // stmatrix x4: matrix q = rows + 8 (q & 1), column block i + (q >> 1); lanes 8q..8q+7 address it.
  const uint32_t rowaddr = stg + ((wtid >> 5) * 16 + ((q & 1) << 3) + (lane & 7)) * kPitch + (q >> 1) * 16;
#pragma unroll
  for (int i = 0; i < kBN / 8; i += 2)
    wg::stmatrix_x4(rowaddr + i * 16, mma::pack_bf16(acc[4 * i], acc[4 * i + 1]),
                    mma::pack_bf16(acc[4 * i + 2], acc[4 * i + 3]), mma::pack_bf16(acc[4 * i + 4], acc[4 * i + 5]),
                    mma::pack_bf16(acc[4 * i + 6], acc[4 * i + 7]));
  wg::fence_proxy_async();  // generic-proxy writes, read next by the bulk copy engine
  named_sync(bar);
  if (wtid < 64 && r0 + wtid < rend) {
    const int64_t c0 = static_cast<int64_t>(j) * kBN;
    const int64_t ncols = p.cols - c0 < kBN ? p.cols - c0 : kBN;
    wg::bulk_store(p.c + static_cast<int64_t>(r0 + wtid) * p.cols + c0, stg + wtid * kPitch,
                   static_cast<uint32_t>(ncols * 2));
    wg::bulk_commit();
  }
}

// ---- kernel -----------------------------------------------------------------------------------
// Threads 0..127: producer warpgroup (thread 0 issues every copy; registers given back). Threads
// 128..383: consumer warpgroups 0 and 1. map_a: [N, red] rows, box kRows x 64. map_b: W as
// [E, M, K]; fwd box 128 (M) x 64 (K), dx box 64 (K) x 64 (M).
template <int kMode, int kSched, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    gmm_ws_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const Params p) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  using C = Cfg<kSched, kCluster>;
  constexpr int kS = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // same offset in every CTA: multicast targets match
  const uint32_t full0 = base + C::kBarOff, empty0 = full0 + kS * 8, turn0 = empty0 + kS * 8;
  int32_t* s_off = reinterpret_cast<int32_t*>(smem_raw + (base - raw) + C::kBarOff + (2 * kS + 2) * 8 + 16);
  int32_t* s_ts = s_off + (C::kMaxExperts + 1);
  // The dynamic schedule's ring of unit indices, between the barriers and the offsets (4 slots: the
  // producer runs at most kStages stages, so at most 3 units, ahead of the consumers).
  volatile int32_t* s_unit = reinterpret_cast<volatile int32_t*>(s_off) - 4;
  const bool dyn = kCluster == 1 && kSched != kPing && p.counter != nullptr;
  const int tid = threadIdx.x;
  const int rank = kCluster > 1 ? static_cast<int>(cluster_rank()) : 0;
  for (int i = tid; i <= p.E; i += kThreads) s_off[i] = p.off[i];
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(full0 + 8 * s, 1);
      wg::mbar_init(empty0 + 8 * s, C::kEmptyCount);
    }
    wg::mbar_init(turn0, 4);
    wg::mbar_init(turn0 + 8, 4);
    wg::fence_mbar_init();
    prefetch_map(&map_a);
    prefetch_map(&map_b);
  }
  __syncthreads();
  {  // s_ts[e] = row blocks of the experts before e (3 experts per thread, E <= 1024)
    using Scan = cub::BlockScan<int32_t, kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    int32_t cnt[3], sum = 0;
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const int e = tid * 3 + q;
      const int32_t rows = e < p.E ? s_off[e + 1] - s_off[e] : 0;
      cnt[q] = rows > 0 ? (rows + C::kRows * kCluster - 1) / (C::kRows * kCluster) : 0;
      sum += cnt[q];
    }
    int32_t excl, agg;
    Scan(scan_tmp).ExclusiveSum(sum, excl, agg);
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const int e = tid * 3 + q;
      if (e < p.E) s_ts[e] = excl;
      excl += cnt[q];
    }
    if (tid == 0) s_ts[p.E] = agg;
  }
  __syncthreads();
  if constexpr (kCluster > 1) cluster_sync();  // peers' barriers exist before any multicast / remote arrive
  const int64_t total = static_cast<int64_t>(s_ts[p.E]) * p.ncol;
  const int64_t first = blockIdx.x / kCluster, step = gridDim.x / kCluster;

  // Warpgroup index made provably warp-uniform (a shuffle), so that ptxas sees the role branches and
  // everything derived from them as non-divergent.
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {  // ---- producer ----
    regs_dec<40>();  // 128 x 40 + 256 x 232 <= 64K registers
    if (tid == 0) {
      // The W boxes of unit x's k step that this CTA issues: fn(shared offset in the B tile, c0, c1).
      // fwd: 256 rows of M x 64 K as two 128-row boxes; dx: 64 rows of M x 256 K as four 64-column
      // boxes (the MN-major blocks). With clusters each CTA issues its half and multicasts it. Tall
      // tiles: three 64-row (fwd) or 64-column (dx) boxes. Boxes wholly past the last column are
      // skipped: those columns are never stored.
      auto for_each_b = [&](const Unit& x, int k, auto&& fn) {
        if constexpr (kSched == kTall) {
#pragma unroll
          for (int b = 0; b < 3; ++b) {
            const int c = x.j * C::kBN + b * 64;
            if (c < p.cols) {
              if constexpr (kMode == kFwd) fn(b * 8192, k * kBK, c);
              else fn(b * 8192, c, k * kBK);
            }
          }
        } else if constexpr (kMode == kFwd) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if ((kCluster == 1 || h == rank) && x.j * C::kBN + h * 128 < p.cols)
              fn(h * 16384, k * kBK, x.j * C::kBN + h * 128);
        } else {
#pragma unroll
          for (int b = 0; b < 4; ++b)
            if ((kCluster == 1 || (b >> 1) == rank) && x.j * C::kBN + b * 64 < p.cols)
              fn(b * 8192, x.j * C::kBN + b * 64, k * kBK);
        }
      };
      // Bytes that land in this CTA's stage: A (unless it has no rows) and every W box of the cluster.
      // Tall tiles load A as two 128-row boxes, the second only when the unit has rows past its first 128.
      auto stage_bytes = [&](const Unit& x) {
        const int64_t left = p.cols - static_cast<int64_t>(x.j) * C::kBN;
        if constexpr (kSched == kTall) {
          const int boxes = static_cast<int>(left >= 192 ? 3 : (left + 63) / 64);
          return static_cast<uint32_t>((x.rb < x.re ? 16384 : 0) + (x.rb + 128 < x.re ? 16384 : 0) + boxes * 8192);
        }
        const int boxes = kMode == kFwd ? (left > 128 ? 2 : 1) : static_cast<int>(left >= 256 ? 4 : (left + 63) / 64);
        return static_cast<uint32_t>((x.rb < x.re ? C::kABytes : 0) + boxes * (C::kBBytes / (kMode == kFwd ? 2 : 4)));
      };
      int stage = 0;
      uint32_t phase = 0, seq = 0;
      // Dynamic: each unit is taken from the shared counter, and its index is left in s_unit for the
      // consumers (read after the full barrier of the unit's first stage); -1 after the last one.
      auto next_unit = [&](int64_t u) -> int64_t { return dyn ? atomicAdd(p.counter, 1) : u + step; };
      for (int64_t u = dyn ? atomicAdd(p.counter, 1) : first; u < total; u = next_unit(u), ++seq) {
        const Unit x = decode<C::kRows, kCluster>(p, s_off, s_ts, u, rank);
        const uint32_t bytes = stage_bytes(x);
        for (int k = 0; k < p.ksteps; ++k) {
          wg::mbar_wait_idle(empty0 + 8 * stage, phase ^ 1u);  // a fresh barrier passes parity 1 at once
          const uint32_t full = full0 + 8 * stage, sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
          if (dyn && k == 0) s_unit[seq & 3] = static_cast<int32_t>(u);
          wg::mbar_arrive_tx(full, bytes);
          if (x.rb < x.re) tma_load_2d(sa, &map_a, k * kBK, x.rb, full);
          if (kSched == kTall && x.rb + 128 < x.re) tma_load_2d(sa + 16384, &map_a, k * kBK, x.rb + 128, full);
          for_each_b(x, k, [&](int off, int c0, int c1) {
            if constexpr (kCluster == 1) tma_load_3d(sb + off, &map_b, c0, c1, x.e, full);
            else tma_load_3d_mc(sb + off, &map_b, c0, c1, x.e, full, (1u << kCluster) - 1);
          });
          if (++stage == kS) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
      if (dyn) {
        // The end: a stage's full barrier completed without loads, with -1 for its unit.
        wg::mbar_wait_idle(empty0 + 8 * stage, phase ^ 1u);
        s_unit[seq & 3] = -1;
        wg::mbar_arrive(full0 + 8 * stage);
        // The last CTA to get here (every CTA has then taken its last unit) zeroes the counter.
        if (atomicAdd(p.counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
          atomicExch(p.counter, 0);
          atomicExch(p.counter + 1, 0);
        }
      }
    }
    __syncwarp();
  } else {  // ---- consumers ----
    regs_inc<232>();
    const int cw = wgi - 1, wtid = tid & 127;
    const uint32_t lane = tid & 31;
    const int64_t utotal = __shfl_sync(0xffffffffu, total, 0);
    auto release = [&](int s) {  // this warp has finished reading stage s (its wgmma retired)
      if constexpr (kCluster == 1) mbar_arrive_lane0(empty0 + 8 * s, lane);
      else
#pragma unroll
        for (int r = 0; r < kCluster; ++r) mbar_arrive_cta_lane0(empty0 + 8 * s, r, lane);
    };
    int stage = 0;
    uint32_t phase = 0, tphase = 0;
    // kAccs accumulators of 64 rows x kBN columns: one (128 registers) or, tall, two (96 each).
    float acc[C::kAccs][C::kBN / 2];
#pragma unroll
    for (int a = 0; a < C::kAccs; ++a)
#pragma unroll
      for (int i = 0; i < C::kBN / 2; ++i) acc[a][i] = 0.0f;
    int64_t it = 0;
    uint32_t seq = 0;
    for (int64_t u = first;; ++it) {
      if (dyn) {  // the unit the producer took, published with its first stage
        wg::mbar_wait(full0 + 8 * stage, phase);
        u = __shfl_sync(0xffffffffu, s_unit[seq & 3], 0);
        ++seq;
        if (u < 0) break;
      } else {
        if (it > 0) u += step;
        if (u >= utotal) break;
      }
      if constexpr (kSched == kPing) {
        if ((it & 1) != cw) {  // the other warpgroup's unit: skip its stages
          const int adv = stage + p.ksteps;
          stage = adv % kS;
          phase ^= static_cast<uint32_t>(adv / kS) & 1u;
          continue;
        }
        // Wait until the other warpgroup has waited on all stages of the previous unit, so that
        // every full barrier is at most one phase behind this warpgroup's parity.
        if (it > 0) {
          wg::mbar_wait(turn0 + 8 * cw, tphase);
          tphase ^= 1u;
        }
      }
      const Unit x = decode<C::kRows, kCluster>(p, s_off, s_ts, u, rank);
      // Rows of this warpgroup: tall units of at most 128 rows are split 64 / 64 like cooperative
      // ones (one accumulator each), so that both warpgroups work on them.
      const int rb = __shfl_sync(0xffffffffu, x.rb, 0), re = __shfl_sync(0xffffffffu, x.re, 0);
      const int wg_rows = kSched == kTall && re - rb <= 128 ? 64 : C::kWgRows;
      const int r0 = rb + (kSched == kPing ? 0 : wg_rows * cw);
      const uint32_t aoff = kSched == kPing ? 0 : cw * (wg_rows * 128);
      // Tall: whether this warpgroup's second 64 rows hold any of the unit's rows (else that
      // accumulator's wgmma and stores are skipped). Warp-uniform: r0 and re come from lane 0.
      const bool second = C::kAccs > 1 && wg_rows > 64 && r0 + 64 < re;
      auto advance = [&]() {
        if (++stage == kS) {
          stage = 0;
          phase ^= 1u;
        }
      };
      auto fence_acc = [&]() {
#pragma unroll
        for (int a = 0; a < C::kAccs; ++a) wg::fence_regs(acc[a]);
      };
      // The wgmma of one k step on the current stage (4 per accumulator used), committed. nacc: the
      // accumulators used, a compile-time count (a run-time test between the wgmma makes ptxas add
      // warpgroup arrives around them).
      auto mma_step = [&](auto nacc, int k) {
        const uint32_t sa = base + stage * C::kStageBytes + aoff, sb = base + stage * C::kStageBytes + C::kABytes;
        fence_acc();
        wg::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t db = kMode == kFwd ? wg::smem_desc(sb + kk * 32, 16, 1024)
                                            : wg::smem_desc(sb + kk * 2048, 8192, 1024);
#pragma unroll
          for (int a = 0; a < decltype(nacc)::value; ++a) {
            const uint64_t da = wg::smem_desc(sa + a * 8192 + kk * 32, 16, 1024);
            constexpr int kTB = kMode == kFwd ? 0 : 1;
            const int scale = (k > 0 || kk > 0) ? 1 : 0;
            if constexpr (C::kBN == 256) wg::wgmma_m64n256k16<0, kTB>(acc[a], da, db, scale);
            else wg::wgmma_m64n192k16<0, kTB>(acc[a], da, db, scale);
          }
        }
        wg::wgmma_commit();
      };
      // One wgmma group stays in flight: step k's stage is released once step k + 1 is issued.
      auto mainloop = [&](auto nacc) {
        wg::mbar_wait(full0 + 8 * stage, phase);
        mma_step(nacc, 0);
        int prev = stage;
        advance();
        for (int k = 1; k < p.ksteps; ++k) {
          wg::mbar_wait(full0 + 8 * stage, phase);
          mma_step(nacc, k);
          wg::wgmma_wait<1>();
          fence_acc();
          release(prev);
          prev = stage;
          advance();
        }
        return prev;
      };
      if (r0 < re) {
        const int prev = second ? mainloop(std::integral_constant<int, C::kAccs>{})
                                : mainloop(std::integral_constant<int, 1>{});
        if constexpr (kSched == kPing) mbar_arrive_lane0(turn0 + 8 * (1 - cw), lane);
        wg::wgmma_wait<0>();
        fence_acc();
        release(prev);
        const int j = __shfl_sync(0xffffffffu, x.j, 0);
#pragma unroll
        for (int a = 0; a < C::kAccs; ++a)
          if (a == 0 || second)
            store_rows<C::kBN, C::kPitch>(p, base + C::kEpiOff + cw * 64 * C::kPitch, 1 + cw, r0 + 64 * a, re, j,
                                          acc[a]);
      } else {  // no rows for this warpgroup: pass the stages on
        for (int k = 0; k < p.ksteps; ++k) {
          wg::mbar_wait(full0 + 8 * stage, phase);
          release(stage);
          advance();
        }
        if constexpr (kSched == kPing) mbar_arrive_lane0(turn0 + 8 * (1 - cw), lane);
      }
    }
    if (wtid < 64) wg::bulk_wait_all();  // the staging tile must outlive the bulk stores that read it
    {  // rows past offsets[E] are unused capacity: zeros (consumer threads of every CTA)
      const int64_t r0 = s_off[p.E];
      const int64_t vecs = (p.N - r0) * p.cols / 8;
      uint4* c = reinterpret_cast<uint4*>(p.c + r0 * p.cols);
      const int64_t nthr = static_cast<int64_t>(gridDim.x) * 256;
      for (int64_t v = static_cast<int64_t>(blockIdx.x) * 256 + (tid - 128); v < vecs; v += nthr)
        c[v] = make_uint4(0, 0, 0, 0);
    }
  }
  // No CTA may leave while its peer can still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) cluster_sync();
#endif
}

// ---- host -------------------------------------------------------------------------------------
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver through the runtime (no libcuda link); looked up once.
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    MT_CHECK(q == cudaDriverEntryPointSuccess && f != nullptr,
             "[grouped_gemm_ws] the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or later)");
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// bf16 tensor map, 128B swizzle, zero fill out of bounds; dims / box innermost first, strides in bytes.
CUtensorMap make_map(const void* ptr, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                     const cuuint32_t* box) {
  CUtensorMap m;
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r =
      encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), const_cast<void*>(ptr), dims,
                strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "[grouped_gemm_ws] cuTensorMapEncodeTiled failed with error {}", static_cast<int>(r));
  return m;
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

// a: [N, red] (lda = red); w: [E, M, K]; the output is [N, cols] (fwd: cols = M, red = K; dx: cols
// = K, red = M).
template <int kMode, int kSched, int kCluster>
void launch(Context& ctx, const bf16* a, const bf16* w, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
            bf16* out, const char* op, int order = 0, bool dynamic = false) {
  using C = Cfg<kSched, kCluster>;
  const int64_t red = kMode == kFwd ? K : M, cols = kMode == kFwd ? M : K;
  if (N <= 0) return;
  const cuuint64_t da[2] = {static_cast<cuuint64_t>(red), static_cast<cuuint64_t>(N)};
  const cuuint64_t sa[1] = {static_cast<cuuint64_t>(red) * 2};
  const cuuint32_t ba[2] = {kBK, kSched == kTall ? 128 : C::kRows};  // tall: two 128-row boxes
  const CUtensorMap map_a = make_map(a, 2, da, sa, ba);
  const cuuint64_t db[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t sb[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(M * K) * 2};
  const cuuint32_t bfwd[3] = {kBK, kSched == kTall ? 64u : 128u, 1}, bdx[3] = {64, kBK, 1};
  const CUtensorMap map_b = make_map(w, 3, db, sb, kMode == kFwd ? bfwd : bdx);

  Params p{};
  p.off = off;
  p.c = out;
  p.E = E;
  p.ncol = static_cast<int>((cols + C::kBN - 1) / C::kBN);
  p.order = order;
  p.counter = dynamic && kCluster == 1 && kSched != kPing ? ctx.schedule_counter() : nullptr;
  p.ksteps = static_cast<int>((red + kBK - 1) / kBK);
  p.N = N;
  p.cols = cols;

  auto kernel = gmm_ws_kernel<kMode, kSched, kCluster>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1] = pdl_attribute();  // the kernel's pdl_wait() comes before its first global access
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream_of(ctx);
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  // Persistent grid: as many clusters as fit at once (a device fact, read once per kernel), or
  // fewer when there are fewer units (bound: N / rows + E row blocks per column tile).
  int64_t slots = sm_count(ctx) / kCluster;
  if constexpr (kCluster > 1) {
    static int fit = -1;  // queried once per process
    if (fit < 0) {
      cfg.gridDim = dim3(static_cast<unsigned>(slots * kCluster), 1, 1);
      MT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg));
    }
    // No cluster fits (a partitioned or constrained GPU): the single-CTA kernel, same results.
    if (fit <= 0) return launch<kMode, kSched, 1>(ctx, a, w, off, E, N, K, M, out, op, order);
    if (fit < slots) slots = fit;
  }
  const int64_t bound = (N / (C::kRows * kCluster) + E) * p.ncol;
  const int64_t clusters = bound < slots ? (bound > 0 ? bound : 1) : slots;
  cfg.gridDim = dim3(static_cast<unsigned>(clusters * kCluster), 1, 1);
  MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, map_a, map_b, p));
  check_launch(op);
}

// Variants 7 and 8 take units from an atomic counter instead of the static stride (1 and 6 otherwise):
// same bits, since no unit's result depends on which CTA computes it (docs/design/kernels.md, round 41).
// Variant 0 (the default) picks per mode. dx: 8, the tall 256 x 192 tiles with the dynamic schedule.
// In the proxy's step it took 3.4% off the ws kernels' trace time and won 6 of 7 alternating step
// pairs against round 41's default (1 for the gate_up dx, 2-CTA clusters for the down dx, whose
// reduction is twice its width); in the harness it is 7% faster than the clusters on the down dx at
// every routing, and 5-7% slower than 1 on the gate_up dx at even routing (equal or faster when skewed),
// docs/performance.md, round 42. y: 7, cooperative 128 x 256 tiles on single CTAs with the dynamic
// schedule (round 48: 3.7% faster than 1 on the gate_up forward at even routing, median of seven
// alternating processes, equal on down; in the proxy's step within the noise, round 42; the tall tiles
// were slower there, round 41). Variant 9 (8 for the down dx only, the alternative that the
// harness favours at even routing) measured within the noise in the step (round 43): a knob.
template <int kMode>
void dispatch(Context& ctx, const bf16* a, const bf16* w, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
              bf16* out, int variant, const char* op) {
  if (variant == 0) variant = kMode == kDx ? 8 : 7;
  switch (variant) {
    case 2: launch<kMode, kCoop, 2>(ctx, a, w, off, E, N, K, M, out, op); break;
    case 3: launch<kMode, kPing, 1>(ctx, a, w, off, E, N, K, M, out, op); break;
    case 4: launch<kMode, kPing, 2>(ctx, a, w, off, E, N, K, M, out, op); break;
    case 5: launch<kMode, kCoop, 1>(ctx, a, w, off, E, N, K, M, out, op, 1); break;
    case 6:  // tall tiles hold the offsets of at most 512 experts in shared memory
    case 8:  // 8: 6 with the dynamic schedule
      if (E <= Cfg<kTall, 1>::kMaxExperts) launch<kMode, kTall, 1>(ctx, a, w, off, E, N, K, M, out, op, 0, variant == 8);
      else launch<kMode, kCoop, 1>(ctx, a, w, off, E, N, K, M, out, op, 0, variant == 8);
      break;
    case 7: launch<kMode, kCoop, 1>(ctx, a, w, off, E, N, K, M, out, op, 0, true); break;  // 1, dynamic schedule
    case 9:  // 8 for a dx whose reduction is at least twice its width (the down dx), else 1
      if (kMode == kDx && M >= 2 * K) dispatch<kMode>(ctx, a, w, off, E, N, K, M, out, 8, op);
      else launch<kMode, kCoop, 1>(ctx, a, w, off, E, N, K, M, out, op);
      break;
    default: launch<kMode, kCoop, 1>(ctx, a, w, off, E, N, K, M, out, op); break;
  }
}

}  // namespace gws

bool grouped_gemm_ws_supported(const Context& ctx, int64_t N, int64_t K, int64_t M, int64_t E, const void* x,
                               const void* w, const void* out) {
  return ctx.facts().cc_major == 9 && ctx.facts().cc_minor == 0 && N >= 0 && N < (int64_t(1) << 31) && K > 0 &&
         M > 0 && K % 8 == 0 && M % 8 == 0 && E >= 1 && E <= gws::kMaxE && gws::aligned16(x) && gws::aligned16(w) &&
         gws::aligned16(out);
}

void grouped_gemm_ws_forward(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* w, const int32_t* off,
                             int E, int64_t N, int64_t K, int64_t M, __nv_bfloat16* y, int variant) {
  gws::dispatch<gws::kFwd>(ctx, x, w, off, E, N, K, M, y, variant, "grouped_matmul");
}

void grouped_gemm_ws_dx(Context& ctx, const __nv_bfloat16* dy, const __nv_bfloat16* w, const int32_t* off, int E,
                        int64_t N, int64_t K, int64_t M, __nv_bfloat16* dx, int variant) {
  gws::dispatch<gws::kDx>(ctx, dy, w, off, E, N, K, M, dx, variant, "grouped_matmul_backward");
}

void grouped_gemm_ws_dw(Context& ctx, const __nv_bfloat16* x, const __nv_bfloat16* dy, const int32_t* off, int E,
                        int64_t N, int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate, double* sum_squares) {
  // MT_DW_F32_WIDE (read once; benchmarks): 0 keeps f32 gradients on the 128-wide tiles (dispatch_dw's
  // variant bit 1), same values (the sums of squares in another order). MT_DW_DEEP (read once;
  // benchmarks): 1 takes the other slab depth (variant bit 0: bf16 32-row slabs in 6 stages instead of
  // 64 in 3), same values and sums (the same k order per output). MT_DW_TALL (read once; benchmarks):
  // 1 puts a bf16 gradient on 256 x 192 tiles (variant bit 2), same values (the sums in another grouping).
  // MT_DW_TMA (read once; benchmarks): the bf16 box ring (gwd::dw_ring: a two-box staging ring, TMA box
  // stores, a fourth operand stage), by default where the shape allows it and there are no sums of
  // squares; 1 takes it with sums too (variant bit 3), 0 never (bit 4); same values and sums.
  static const int variant = [] {
    const long v = env_int("MT_DW_F32_WIDE", 1), d = env_int("MT_DW_DEEP", 0), t = env_int("MT_DW_TALL", 0);
    const long b = env_int("MT_DW_TMA", -1);
    MT_CHECK(v == 0 || v == 1, "[grouped_matmul_backward] MT_DW_F32_WIDE={}: expected 0 or 1", v);
    MT_CHECK(d == 0 || d == 1, "[grouped_matmul_backward] MT_DW_DEEP={}: expected 0 or 1", d);
    MT_CHECK(t == 0 || t == 1, "[grouped_matmul_backward] MT_DW_TALL={}: expected 0 or 1", t);
    MT_CHECK(b == -1 || b == 0 || b == 1, "[grouped_matmul_backward] MT_DW_TMA={}: expected 0 or 1", b);
    return (v == 0 ? 2 : 0) | (d == 1 ? 1 : 0) | (t == 1 ? 4 : 0) | (b == 1 ? 8 : 0) | (b == 0 ? 16 : 0);
  }();
  const int64_t tiles = gwd::dw_sums_tiles(E, K, M, dw_bf16, accumulate, variant);
  Tensor partial;
  double* part = nullptr;
  if (sum_squares) {
    partial = device_scratch(ctx, tiles * 8);
    part = static_cast<double*>(partial.data_ptr());
  }
  gwd::dispatch_dw(ctx, x, dy, off, E, N, K, M, dw, dw_bf16, accumulate, part, variant);
  if (sum_squares) add_partials_into(ctx, part, tiles, sum_squares);
}

}  // namespace moetrain::cuda
