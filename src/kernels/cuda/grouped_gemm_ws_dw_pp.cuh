// Ping-pong form of gmm_ws_dw_kernel for a walking epilogue without a prior gradient (the fused
// expert update of a step's only micro-batch): the two consumer warpgroups work independently, each
// on its own 64-row half of every 128 x BN tile, with its own TMA ring (and producer thread) and its
// own staging half. A token passed through two named barriers makes their mainloops alternate, so
// one warpgroup's wgmma, staging and barriers run while the other walks its half through DRAM, instead
// of both stopping the walk for every tile's mainloop as in gmm_ws_dw_kernel.
// Same tiles in the same order per CTA, the same staged values, the same walk (Epi::walk with 128
// threads over 64 rows), the same per-tile sums of squares (the 8 warp partials, added in warp order
// by whichever warpgroup finishes the tile second): bit-identical results.
#pragma once
#include <cuda.h>

#include "kernels/cuda/grouped_gemm_ws_dw.cuh"

namespace moetrain::cuda::gwd {

// Shared memory: 2 rings of kStages x (A: 1 block | B: BN / 64 blocks, each BK k rows x 128 B), two
// 64-row staging halves (kPitch bytes per row), barriers full[2][kS], empty[2][kS], offsets [E+1],
// then 8 doubles (tiles of empty experts), kSlots x 8 doubles (a tile's warp sums) and kSlots counters.
template <int BN, typename DwT, int BK>
struct CfgPP {
  static constexpr int kBlock = BK * 128;
  static constexpr int kStageBytes = kBlock + (BN / 64) * kBlock;
  static constexpr int kPitch = BN * static_cast<int>(sizeof(DwT)) + (sizeof(DwT) == 4 ? 32 : 16);
  static constexpr int kHalfBytes = 64 * kPitch;
  static constexpr int kOutBytes = 2 * kHalfBytes;
  static constexpr int kSlots = 4;
  static constexpr int kOffOff = kOutBytes + 256;
  static constexpr int kRedOff = kOffOff + ((kMaxE + 1) * 4 + 7) / 8 * 8;
  static constexpr int kCntOff = kRedOff + (8 + 8 * kSlots) * 8;
  static constexpr int kFixed = 1024 + kCntOff + kSlots * 4;
  static constexpr int kFit = (227 * 1024 - kFixed) / (2 * kStageBytes);
  static constexpr int kStages = kFit < 6 ? kFit : 6;
  static_assert(kStages >= 2, "ping-pong dW rings do not fit in shared memory");
  static_assert(4 * kStages * 8 <= 256, "barrier space");
  static constexpr int kSmem = kFixed + 2 * kStages * kStageBytes;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads, "register split");
};

namespace pp {

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Named barriers: 1 = both consumer warpgroups (consumers_sync), 2 + w = warpgroup w, 4 + w = the
// token: warpgroup w may start a mainloop (the other one arrives).
__device__ __forceinline__ void wg_sync(int w) { bar_sync(2 + w, 128); }

// Producer thread of warpgroup w's ring: per tile its half's dy block (rows i0 + 64 w of dw, when
// inside M) and the tile's BN / 64 x blocks, each k-slab of the expert's rows.
template <class C, int BN, int BK, class Seek>
__device__ __forceinline__ void produce_half(const CUtensorMap* map_a, const CUtensorMap* map_b, const Params& p,
                                             const int32_t* s_off, uint32_t base, uint32_t full0, uint32_t empty0,
                                             int64_t total, int64_t stride, Seek seek, int w) {
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
    const Tile x = decode<BN, BK>(p, s_off, t);
    const int64_t i0 = x.i0 + 64 * w;
    const int na = i0 < p.ci ? 1 : 0;
    int nb = 0;
    for (int b = 0; b < BN / 64; ++b) nb += x.j0 * BN + 64 * b < p.cj;
    const uint32_t bytes = static_cast<uint32_t>((na + nb) * C::kBlock);
    for (int k = 0; k < x.ksteps; ++k) {
      wg::mbar_wait_idle(empty0 + 8 * stage, phase ^ 1u);
      const uint32_t full = full0 + 8 * stage, sa = base + stage * C::kStageBytes;
      const int r = static_cast<int>(x.lo) + k * BK;
      wg::mbar_arrive_tx(full, bytes);
      if (na) tma_2d(sa, map_a, static_cast<int>(i0), r, full);
      for (int b = 0; b < nb; ++b) tma_2d(sa + C::kBlock + b * C::kBlock, map_b, static_cast<int>(x.j0) * BN + 64 * b, r, full);
      if (++stage == C::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
  }
}

// Warpgroup w's acc (its 64 x BN half) = dy_e^T x_e over the tile's k-slabs of its own ring; as
// mainloop() with one A block per stage and the warpgroup's own barrier for the zeroed rows.
template <class C, int BN, int BK>
__device__ __forceinline__ void mainloop_half(float (&acc)[BN / 2], const Tile& x, uint32_t base, uint32_t full0,
                                              uint32_t empty0, int& stage, uint32_t& phase, int wtid, int w,
                                              int lane) {
  constexpr int kNB = 1 + BN / 64;
  int prev = -1;
  for (int k = 0; k < x.ksteps; ++k) {
    wg::mbar_wait(full0 + 8 * stage, phase);
    const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kBlock;
    const int valid = static_cast<int>(x.hi - x.lo) - k * BK;
    if (valid < BK) {
      const int chunks = kNB * (BK - valid) * 8;
      for (int c = wtid; c < chunks; c += 128) {
        const int blk = c / ((BK - valid) * 8), rr = c - blk * (BK - valid) * 8;
        const uint32_t a = sa + blk * C::kBlock + (valid + (rr >> 3)) * 128 + (rr & 7) * 16;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
      }
      wg::fence_proxy_async();
      wg_sync(w);
    }
    wg::fence_regs(acc);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint64_t da = wg::smem_desc(sa + kk * 2048, C::kBlock, 1024);
      const uint64_t db = wg::smem_desc(sb + kk * 2048, C::kBlock, 1024);
      wg::wgmma_bf16<BN, 1, 1>(acc, da, db, (k > 0 || kk > 0) ? 1 : 0);
    }
    wg::wgmma_commit();
    if (prev >= 0) {
      wg::wgmma_wait<1>();
      wg::fence_regs(acc);
      arrive_lane0(empty0 + 8 * prev, lane);
    }
    prev = stage;
    if (++stage == C::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  wg::wgmma_wait<0>();
  wg::fence_regs(acc);
  arrive_lane0(empty0 + 8 * prev, lane);
}

}  // namespace pp

// The kernel (Epi: a walking epilogue, kWalkEmpty; p.accumulate == 0). Tiles as gmm_ws_dw_kernel:
// t, t + grid, ...; warpgroup w takes rows i0 + 64 w .. + 63 of each. Warps 0 and 1 (lane 0) feed the
// two rings; warps 2 and 3 exit.
template <int BN, typename DwT, int BK, class Epi>
__global__ void __launch_bounds__(kThreads, 1)
    gmm_ws_dw_pp_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                        const Params p, const Epi epi) {
#if MT_WGMMA_ENABLED
  static_assert(Epi::kWalk && Epi::kWalkEmpty && !Epi::kStore, "ping-pong dW: walking epilogues only");
  using C = CfgPP<BN, DwT, BK>;
  constexpr int kS = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* out_p = smem_raw + (base - raw) + 2 * kS * C::kStageBytes;
  const uint32_t sout = base + 2 * kS * C::kStageBytes;
  const uint32_t bar0 = sout + C::kOutBytes;  // full[w][s] at bar0 + 8 (2 kS w + s), empty at + 8 kS
  int32_t* s_off = reinterpret_cast<int32_t*>(out_p + C::kOffOff);
  double* s_red = reinterpret_cast<double*>(out_p + C::kRedOff);
  double* s_slot = s_red + 8;
  int* s_cnt = reinterpret_cast<int*>(out_p + C::kCntOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= p.E; i += kThreads) s_off[i] = p.off[i];
  if (tid < C::kSlots) s_cnt[tid] = 0;
  if (tid == 0) {
    for (int w = 0; w < 2; ++w)
      for (int s = 0; s < kS; ++s) {
        wg::mbar_init(bar0 + 8 * (2 * kS * w + s), 1);
        wg::mbar_init(bar0 + 8 * (2 * kS * w + kS + s), 4);
      }
    wg::fence_mbar_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(p.E) * p.nmt * p.ncol, stride = gridDim.x;
  auto seek = [&](int64_t t) {
    while (t < total && decode<BN, BK>(p, s_off, t).ksteps == 0) t += stride;
    return t;
  };
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    const int pw = __shfl_sync(0xffffffffu, tid / 32, 0);
    if (pw < 2 && (tid & 31) == 0)
      pp::produce_half<C, BN, BK>(&map_a, &map_b, p, s_off, base + pw * kS * C::kStageBytes, bar0 + 8 * (2 * kS * pw),
                                  bar0 + 8 * (2 * kS * pw + kS), total, stride, seek, pw);
    __syncwarp();
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  const int ctid = tid - 128, w = ctid >> 7, wtid = ctid & 127, lane = tid & 31, warp = ctid >> 5, w4 = warp & 3;
  const uint32_t rbase = base + w * kS * C::kStageBytes, full0 = bar0 + 8 * (2 * kS * w),
                 empty0 = full0 + 8 * kS;
  const uint32_t my_out = sout + w * C::kHalfBytes;
  unsigned char* my_out_p = out_p + w * C::kHalfBytes;
  int stage = 0;
  uint32_t phase = 0, ait = 0;
  float acc[BN / 2];
  typename Epi::Pending pend;
  bool ahead = false;
  // the token: warpgroup 0 starts; each passes it on after staging its half, except warpgroup 1
  // after the CTA's last active tile (so every arrival meets a wait)
  const int64_t first_active = seek(blockIdx.x);
  if (w == 1 && first_active < total) pp::bar_arrive(4, 256);
  for (int64_t t = blockIdx.x; t < total; t += stride) {
    const Tile x = decode<BN, BK>(p, s_off, t);
    Tile xh = x;
    xh.i0 = x.i0 + 64 * w;
    if (x.ksteps == 0) {
      Tile nx = t + stride < total ? decode<BN, BK>(p, s_off, t + stride) : x;
      const bool nidle = t + stride < total && nx.ksteps == 0;
      nx.i0 += 64 * w;
      ahead = epi.template walk_empty<BN, DwT, 128, 64>(p, xh, wtid, pend, ahead, nidle, nx);
      continue;
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    epi.template fetch<BN, 128, 64>(p, xh, wtid, pend);
    pp::bar_sync(4 + w, 256);
    pp::mainloop_half<C, BN, BK>(acc, x, rbase, full0, empty0, stage, phase, wtid, w, lane);
    pp::wg_sync(w);  // every thread of this warpgroup has walked its previous half
    const int64_t rem = p.ci - xh.i0;
    const int nrows = static_cast<int>(rem < 64 ? (rem > 0 ? rem : 0) : 64);
    const int ncols = static_cast<int>(p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN);
    const int slot = static_cast<int>(ait++ % C::kSlots);
    double* red = p.ss ? s_slot + 8 * slot + 4 * w : nullptr;
    stage_tile<BN, DwT, C::kPitch>(acc, false, my_out, my_out_p, lane, w4, red, nrows, ncols);
    if (w == 0 || seek(t + stride) < total) pp::bar_arrive(4 + (w ^ 1), 256);
    pp::wg_sync(w);
    if (p.ss && wtid == 0) {  // the second warpgroup to finish tile t adds its 8 warp sums in warp order
      __threadfence_block();
      if (atomicAdd(s_cnt + slot, 1) == 1) {
        __threadfence_block();
        const volatile double* r8 = s_slot + 8 * slot;
        double s = 0.0;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += r8[i];
        p.ss[t] = s;
        s_cnt[slot] = 0;
      }
    }
    epi.template walk<BN, DwT, C::kPitch, 128, 64>(p, xh, my_out_p, wtid, pend);
  }
  if (p.ss) empty_tile_sums<BN, DwT, BK>(p, s_off, s_red, ctid, lane, warp, total, stride);
  epi.template empty_experts<DwT>(p, s_off, ctid);
#endif
}

template <int BN, typename DwT, int BK, class Epi>
void launch_dw_pp_kernel(Context& ctx, const bf16* x, const bf16* dy, int64_t N, int64_t K, int64_t M, const Params& p,
                         const Epi& epi, int64_t grid, const char* op) {
  using C = CfgPP<BN, DwT, BK>;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, BK), mb = dw_map(x, N > 0 ? N : 1, K, BK);
  auto kernel = gmm_ws_dw_pp_kernel<BN, DwT, BK, Epi>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  kernel<<<static_cast<unsigned>(grid), kThreads, C::kSmem, stream_of(ctx)>>>(ma, mb, p, epi);
  check_launch(op);
}

}  // namespace moetrain::cuda::gwd
