// Hopper (sm_90a) warp-specialized attention kernels: a producer warp loads tiles with TMA tensor
// copies (128B swizzle, the layout of attention_flash_sm90.cuh) into mbarrier-guarded rings; two
// consumer warpgroups (setmaxnreg 240) run the wgmma. Forward: the softmax of key tile j overlaps the
// P V GEMM of tile j-1. Fused 5-GEMM backward (FlashAttention-2/3): producer warps write dQ from shared
// memory with bulk reduce-adds (ordered by the key-block counters in deterministic mode), off the MMA
// path; prep (D = rowsum(dO*O), zeroing) and finish (ordered dK/dV partial sum, dQ to bf16) kernels.
#pragma once
#include <cuda.h>  // CUtensorMap only (the host encodes it in attention_flash_launch.cuh)

#include "kernels/cuda/attention_flash_sm90.cuh"

namespace moetrain::cuda::flash {

constexpr int kWsThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kWsKeys = 128;     // forward key tile

// ---- PTX helpers ---------------------------------------------------------------------------------
__device__ __forceinline__ void ws_tma_3d(uint32_t dst, const CUtensorMap* m, int c0, int c1, int c2, uint32_t bar) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void ws_prefetch_map(const CUtensorMap* m) {
#if MT_WGMMA_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
#endif
}
// Lane 0 of the warp arrives; predicated in the asm so that no branch splits a warpgroup (C7518).
__device__ __forceinline__ void ws_arrive_lane0(uint32_t bar, int lane) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"(lane)
      : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void ws_regs_dec() {
#if MT_WGMMA_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void ws_regs_inc() {
#if MT_WGMMA_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Barrier over the 256 consumer threads (id 1; 0 is __syncthreads).
__device__ __forceinline__ void ws_consumer_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
// The forward's ping-pong turns (named barriers 2 and 3 over both consumer warpgroups): wait for a
// turn / hand one over when p, as single predicated statements (no branch between a warpgroup's
// wgmma issue and its wait: ptxas would serialize every wgmma, C7518).
__device__ __forceinline__ void ws_turn_wait_if(bool p, int id) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n@q bar.sync %1, 256;\n}\n" ::"r"(static_cast<uint32_t>(p)), "r"(id)
               : "memory");
}
__device__ __forceinline__ void ws_turn_give_if(bool p, int id) {
  asm volatile("{\n.reg .pred q;\nsetp.ne.u32 q, %0, 0;\n@q bar.arrive %1, 256;\n}\n" ::"r"(static_cast<uint32_t>(p)), "r"(id)
               : "memory");
}
// f32 add of `bytes` from shared memory into global memory, in the thread's bulk group.
__device__ __forceinline__ void ws_bulk_reduce_add(float* dst, uint32_t src, uint32_t bytes) {
#if MT_WGMMA_ENABLED
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void ws_fence_proxy_global() {
#if MT_WGMMA_ENABLED
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void st_shared_v2f(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// ---- forward -------------------------------------------------------------------------------------
// Shared memory: Q [128][kD], kStages K tiles, kStages V tiles ([128][kD] each), then the barriers
// q_full, k_full[S], v_full[S], k_empty[S], v_empty[S].
template <int kD, int kStages>
constexpr size_t fwd_ws_smem() {
  return 1024 + (kWgBM + 2 * kStages * kWsKeys) * kD * 2 + (1 + 4 * kStages) * 8;
}

// Forward, 128 queries x 1 head per CTA (grid [ceil(T / 128), nh], last query block first). Maps: q / k / v as
// [T][heads][kD] with boxes of 64 columns x 1 head x 128 rows (rows past T read as zero).
// Each consumer warpgroup runs over its own contiguous range of key tiles [ja, jb] (tiles outside it
// are masked for all its rows and only passed on): iteration j issues S_j = Q K_j^T and O += P_{j-1}
// V_{j-1}, then computes P_j while the second GEMM runs.
template <int kD, int kStages>
__global__ void __launch_bounds__(kWsThreads, 1)
    attn_fwd_ws_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                       const __grid_constant__ CUtensorMap mv, FlashArgs a) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  constexpr int kN = kWsKeys, kTile = kN * kD * 2, kS = kStages;
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  const uint32_t sQ = smem_base1024(smem_wg), sK = sQ + kWgBM * kD * 2, sV = sK + kS * kTile;
  const uint32_t q_full = sV + kS * kTile, k_full = q_full + 8, v_full = k_full + 8 * kS, k_empty = v_full + 8 * kS,
                 v_empty = k_empty + 8 * kS;
  const QueryTile qt = query_tile<kWgBM>();  // launched on query_grid
  const int64_t h = qt.h, g = h / a.group, t0 = qt.t0;
  const int64_t kmin = a.cu[doc_of(a.cu, a.ndocs, t0)], kend = min(t0 + kWgBM, a.T);
  const int ntiles = static_cast<int>((kend - kmin + kN - 1) / kN);
  if (threadIdx.x == 0) {
    wg::mbar_init(q_full, 1);
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(k_full + 8 * s, 1);
      wg::mbar_init(v_full + 8 * s, 1);
      wg::mbar_init(k_empty + 8 * s, 8);  // lane 0 of each consumer warp
      wg::mbar_init(v_empty + 8 * s, 8);
    }
    wg::fence_mbar_init();
  }
  __syncthreads();
  const int wgi = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wgi == 0) {  // ---- producer: thread 0 issues every copy ----
    ws_regs_dec<24>();
    if (threadIdx.x == 0) {
      ws_prefetch_map(&mq);
      ws_prefetch_map(&mk);
      ws_prefetch_map(&mv);
      wg::mbar_arrive_tx(q_full, kWgBM * kD * 2);
#pragma unroll
      for (int cb = 0; cb < kD / 64; ++cb)
        ws_tma_3d(sQ + cb * kWgBM * 128, &mq, cb * 64, static_cast<int>(h), static_cast<int>(t0), q_full);
      // K_j then V_j (K_{j+1} first measured 5% slower on an H100, with 2 stages).
      auto load = [&](uint32_t ring, uint32_t full, uint32_t empty, const CUtensorMap* m, int jt) {
        const int s = jt % kS;
        wg::mbar_wait(empty + 8 * s, (static_cast<uint32_t>(jt / kS) & 1u) ^ 1u);  // fresh: parity 1 passes
        wg::mbar_arrive_tx(full + 8 * s, kTile);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb)
          ws_tma_3d(ring + s * kTile + cb * kN * 128, m, cb * 64, static_cast<int>(g),
                    static_cast<int>(kmin) + jt * kN, full + 8 * s);
      };
      for (int jt = 0; jt < ntiles; ++jt) {
        load(sK, k_full, k_empty, &mk, jt);
        load(sV, v_full, v_empty, &mv, jt);
      }
    }
    __syncwarp();
  } else {  // ---- consumers ----
    ws_regs_inc<240>();
    const int cw = wgi - 1, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) - 4;
    const QRows qr = q_rows(a, t0, warp);
    const WgRows wr = wg_rows(a, t0 + 64 * cw);
    // A warpgroup's tiles: not wholly before its first row's document, not wholly after its last row.
    auto range = [&](const WgRows& r, int& lo, int& hi) {
      lo = ntiles, hi = ntiles - 1;
      if (r.hi >= r.lo) {
        lo = static_cast<int>((r.beg_lo - kmin) / kN);
        hi = min(ntiles - 1, static_cast<int>((r.hi - kmin) / kN));
      }
    };
    int ja, jb, oa, ob;
    range(wr, ja, jb);
    range(wg_rows(a, t0 + 64 * (1 - cw)), oa, ob);
    // Ping-pong (FA3): the warpgroups take turns issuing their GEMMs, so one's softmax runs under the
    // other's. A warpgroup's issue steps: the first S GEMM, one per further tile, the last P V (n =
    // tiles + 1). Warpgroup 0 issues step i after warpgroup 1's step i - 1, warpgroup 1 step i after
    // warpgroup 0's step i; each wait (barrier 2 + cw) pairs with one hand-over from the other side.
    // Only when both walk the same tiles: with a document start inside the 128 rows, one warpgroup
    // passes tiles the other uses, and turns could hold up the ring's releases (a deadlock).
    const bool turns = ja == oa && jb == ob && ja <= jb;
    const int n = jb - ja + 2;
    auto turn_wait = [&](int i) { ws_turn_wait_if(turns && (cw == 1 || i >= 1), 2 + cw); };
    auto turn_give = [&](int i) { ws_turn_give_if(turns && (cw == 0 || i + 1 < n), 3 - cw); };
    auto stage = [](int jt) { return jt % kS; };
    auto parity = [](int jt) { return static_cast<uint32_t>(jt / kS) & 1u; };
    auto pass = [&](int jt) {  // a tile this warpgroup does not use
      wg::mbar_wait(k_full + 8 * stage(jt), parity(jt));
      ws_arrive_lane0(k_empty + 8 * stage(jt), lane);
      wg::mbar_wait(v_full + 8 * stage(jt), parity(jt));
      ws_arrive_lane0(v_empty + 8 * stage(jt), lane);
    };
    for (int jt = 0; jt < min(ja, ntiles); ++jt) pass(jt);
    const float sl2 = a.scale * kLog2e;
    float o[kD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];  // corr: O's pending rescale
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    auto need_mask = [&](int jt) {
      const int64_t kt = kmin + static_cast<int64_t>(jt) * kN;
      return !(kt + kN - 1 <= wr.lo && kt >= wr.beg_hi);
    };
    if (ja <= jb) {
      wg::mbar_wait(q_full, 0);
      uint32_t pa[kN / 16][4];
      float s[kN / 8][4];
      {  // first tile: no P V GEMM in flight
        wg::mbar_wait(k_full + 8 * stage(ja), parity(ja));
        turn_wait(0);
        wg::wgmma_fence();
        gemm_kmaj<kD, kWgBM, kN>(s, desc_kmaj<kWgBM>(sQ, 64 * cw, 0), desc_kmaj<kN>(sK + stage(ja) * kTile, 0, 0));
        wg::wgmma_commit();
        turn_give(0);
        wg::wgmma_wait<0>();
        fence_acc(s);
        ws_arrive_lane0(k_empty + 8 * stage(ja), lane);
        if (need_mask(ja)) mask_scores(s, qr, kmin + static_cast<int64_t>(ja) * kN);
        softmax_step(s, m, l, corr, sl2, [](int, float) {});
        pack_a(pa, s);
      }
      for (int jt = ja + 1; jt <= jb; ++jt) {
        const int sk = stage(jt), sv = stage(jt - 1);
        wg::mbar_wait(k_full + 8 * sk, parity(jt));
        wg::mbar_wait(v_full + 8 * sv, parity(jt - 1));
        const bool masked = need_mask(jt);
        turn_wait(jt - ja);
        wg::wgmma_fence();
        gemm_kmaj<kD, kWgBM, kN>(s, desc_kmaj<kWgBM>(sQ, 64 * cw, 0), desc_kmaj<kN>(sK + sk * kTile, 0, 0));
        wg::wgmma_commit();
        gemm_regs_mn<kN>(o, pa, desc_mn<kN>(sV + sv * kTile, 0));
        wg::wgmma_commit();
        turn_give(jt - ja);
        wg::wgmma_wait<1>();  // S_j is ready; O += P_{j-1} V_{j-1} still runs
        fence_acc(s);
        ws_arrive_lane0(k_empty + 8 * sk, lane);
        if (masked) mask_scores(s, qr, kmin + static_cast<int64_t>(jt) * kN);
        softmax_step(s, m, l, corr, sl2, [](int, float) {});
        wg::wgmma_wait<0>();
        fence_acc(o);
        ws_arrive_lane0(v_empty + 8 * sv, lane);
        scale_rows(o, corr);
        pack_a(pa, s);
      }
      {  // last P V
        const int sv = stage(jb);
        wg::mbar_wait(v_full + 8 * sv, parity(jb));
        turn_wait(jb - ja + 1);
        wg::wgmma_fence();
        gemm_regs_mn<kN>(o, pa, desc_mn<kN>(sV + sv * kTile, 0));
        wg::wgmma_commit();
        turn_give(jb - ja + 1);
        wg::wgmma_wait<0>();
        fence_acc(o);
        ws_arrive_lane0(v_empty + 8 * sv, lane);
      }
    }
    for (int jt = max(jb + 1, ja); jt < ntiles; ++jt) pass(jt);
    store_out_lse<kD>(a, o, m, l, qr.r, h);
  }
#endif
}

// ---- fused backward ------------------------------------------------------------------------------
// Shared memory: K, V [128][kD]; 2 stages of Q, dO [64][kD]; one dS^T tile [128 keys][64 queries]
// bf16; two dQ staging tiles [64][kD] f32 (even and odd steps) with kDqPitch-byte rows (conflict-free
// float2 stores); lse * log2e and D [2][64] f32; barriers kv_full, q_full[2], q_empty[2], dq_full[2], dq_empty[2].
template <int kD>
__host__ __device__ constexpr int ws_dq_pitch() { return kD * 4 + 32; }
template <int kD>
constexpr size_t bwd_ws_smem() {
  return 1024 + (2 * kWgBM + 4 * kWgBN) * kD * 2 + kWgBM * kWgBN * 2 + 2 * kWgBN * ws_dq_pitch<kD>() +
         4 * kWgBN * 4 + 10 * 8;
}

// One CTA owns 128 keys (64 per consumer warpgroup) of a kv head and heads_per_cta heads of its GQA
// group (CTA ticket -> fused_item); steps run query tile (64) outer, head inner. Warp 0
// loads (K, V once; per step Q and dO by TMA, lse and D by its lanes); warps 1 and 2 (even / odd
// steps) write each step's dQ tile from shared memory with one bulk copy per row (first key block: store; later: f32 add), in
// deterministic mode after the counter shows every earlier key block, then advances the counter.
// Consumer warpgroups: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q (f32 partials per head
// split); dS^T to shared memory; barrier; dQ = dS K. dq_acc is [nh][T][kD] f32 (unscaled).
template <int kD>
__global__ void __launch_bounds__(kWsThreads, 1)
    attn_bwd_ws_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                       const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mg, FlashArgs a,
                       int desc) {
  pdl_wait();
#if MT_WGMMA_ENABLED
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  __shared__ int s_ticket;
  constexpr int kM = kWgBN, kTile = kM * kD * 2, kPitch = ws_dq_pitch<kD>();
  const uint32_t sK = smem_base1024(smem_wg), sV = sK + kWgBM * kD * 2, sQ = sV + kWgBM * kD * 2,
                 sG = sQ + 2 * kTile, sS = sG + 2 * kTile, sDQ = sS + kWgBM * kM * 2,
                 sLa = sDQ + 2 * kM * kPitch, sDa = sLa + 2 * kM * 4, bars = sDa + 2 * kM * 4;
  const uint32_t kv_full = bars, q_full = bars + 8, q_empty = bars + 24, dq_full = bars + 40, dq_empty = bars + 56;
  float* sL = reinterpret_cast<float*>(smem_wg + (sLa - mma::smem_addr(smem_wg)));
  float* sD = sL + 2 * kM;
  if (threadIdx.x == 0) {
    s_ticket = atomicAdd(a.ticket, 1);
    wg::mbar_init(kv_full, 1);
    for (int s = 0; s < 2; ++s) {
      wg::mbar_init(q_full + 8 * s, 32);  // every loader lane (lse, D), lane 0 with the TMA bytes
      wg::mbar_init(q_empty + 8 * s, 8);  // lane 0 of each consumer warp
    }
    for (int s = 0; s < 2; ++s) {
      wg::mbar_init(dq_full + 8 * s, 8);  // steps of this parity: lane 0 of each consumer warp
      wg::mbar_init(dq_empty + 8 * s, 1);
    }
    wg::fence_mbar_init();
  }
  __syncthreads();
  const FusedItem w = fused_item(a, s_ticket);
  const int64_t g = w.g, j0 = w.jb * kWgBM;
  const int64_t jlast = min(j0 + kWgBM - 1, a.T - 1);
  const int64_t qend = a.cu[doc_of(a.cu, a.ndocs, jlast) + 1];
  const int64_t nqt = (a.T + kM - 1) / kM;
  const int hpc = a.heads_per_cta;
  const int64_t h0 = g * a.group + w.split * hpc;
  const int qtiles = static_cast<int>((qend - j0 + kM - 1) / kM);
  const int total = qtiles * hpc;
  // Deterministic mode walks the query tiles backwards: every key block of a document then reaches
  // a tile at the same step, so block jb + 1 waits about one dQ write for block jb, not two steps.
  const int rev = a.deterministic && desc;
  auto step_q0 = [&](int it) {
    const int qt = it / hpc;
    return static_cast<int>(j0) + (rev ? qtiles - 1 - qt : qt) * kM;
  };
  const int lane = threadIdx.x & 31;
  const int wgi = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (wgi == 0) {
    ws_regs_dec<24>();
    const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 32, 0);
    if (warp == 0) {  // ---- loader ----
      if (lane == 0) {
        ws_prefetch_map(&mq);
        ws_prefetch_map(&mg);
        wg::mbar_arrive_tx(kv_full, 2 * kWgBM * kD * 2);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb) {
          ws_tma_3d(sK + cb * kWgBM * 128, &mk, cb * 64, static_cast<int>(g), static_cast<int>(j0), kv_full);
          ws_tma_3d(sV + cb * kWgBM * 128, &mv, cb * 64, static_cast<int>(g), static_cast<int>(j0), kv_full);
        }
      }
      for (int it = 0; it < total; ++it) {
        const int s = it & 1;
        const int hd = static_cast<int>(h0) + it % hpc, q0 = step_q0(it);
        wg::mbar_wait(q_empty + 8 * s, ((static_cast<uint32_t>(it) >> 1) & 1u) ^ 1u);
        for (int i = lane; i < kM; i += 32) {
          const int t = q0 + i;
          const bool ok = t < qend;
          sL[s * kM + i] = ok ? a.lse[hd * a.T + t] * kLog2e : 0.0f;
          sD[s * kM + i] = ok ? a.dsum[hd * a.T + t] : 0.0f;
        }
        if (lane == 0) {
          wg::mbar_arrive_tx(q_full + 8 * s, 2 * kTile);
#pragma unroll
          for (int cb = 0; cb < kD / 64; ++cb) {
            ws_tma_3d(sQ + s * kTile + cb * kM * 128, &mq, cb * 64, hd, q0, q_full + 8 * s);
            ws_tma_3d(sG + s * kTile + cb * kM * 128, &mg, cb * 64, hd, q0, q_full + 8 * s);
          }
        } else {
          wg::mbar_arrive(q_full + 8 * s);
        }
      }
    } else if (warp <= 2) {  // ---- dQ writers: warp 1 even steps, warp 2 odd (completion waits overlap) ----
      for (int it = warp - 1; it < total; it += 2) {
        const int hd = static_cast<int>(h0) + it % hpc, q0 = step_q0(it);
        const int* sem = a.sems + hd * nqt + q0 / kM;
        int first = 0;
        if (a.deterministic && lane == 0) {
          const int jlo = a.jb_lo[q0 / kM];
          const int target = static_cast<int>(w.jb) - jlo;
          first = w.jb == jlo;
          for (int64_t spins = 0; ld_acquire_gpu_if(true, sem) < target;)
            if (++spins > (int64_t{1} << 26)) __trap();  // a scheduling bug becomes an error, not a hang
          ws_fence_proxy_global();
        }
        first = __shfl_sync(0xffffffffu, first, 0);
        wg::mbar_wait(dq_full + 8 * (it & 1), (static_cast<uint32_t>(it) >> 1) & 1u);
        const int rows = min(kM, static_cast<int>(a.T) - q0);
        const uint32_t tile = sDQ + (warp - 1) * kM * kPitch;  // this writer's steps' staging tile
        float* dst = a.dq_acc + (static_cast<int64_t>(hd) * a.T + q0) * kD;
        for (int r = lane; r < rows; r += 32) {
          if (first)
            wg::bulk_store(dst + r * kD, tile + r * kPitch, kD * 4);
          else
            ws_bulk_reduce_add(dst + r * kD, tile + r * kPitch, kD * 4);
        }
        wg::bulk_commit();
        wg::bulk_wait_read();
        __syncwarp();
        if (lane == 0) wg::mbar_arrive(dq_empty + 8 * (it & 1));
        if (a.deterministic) {
          wg::bulk_wait_all();
          ws_fence_proxy_global();
          __syncwarp();
          red_release_gpu_if(lane == 0, sem);
        }
      }
      wg::bulk_wait_all();
    }
    __syncwarp();
  } else {  // ---- consumers ----
    ws_regs_inc<240>();
    const int cw = wgi - 1, warp = (threadIdx.x >> 5) - 4;
    int key[2], kend[2];
    for (int hh = 0; hh < 2; ++hh) {
      key[hh] = static_cast<int>(j0) + warp * 16 + (lane >> 2) + 8 * hh;
      kend[hh] = key[hh] < a.T ? a.cu[doc_of(a.cu, a.ndocs, key[hh]) + 1] : 0;
    }
    const WgRows wr64 = wg_rows(a, j0 + 64 * cw);  // here the rows are keys
    const int wr_hi = static_cast<int>(wr64.hi), wr_end_lo = static_cast<int>(wr64.end_lo);
    const float sl2 = a.scale * kLog2e;
    const int srow = 64 * cw + (warp & 3) * 16 + (lane >> 2);  // this thread's first dS^T row (key)
    float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    wg::mbar_wait(kv_full, 0);
    for (int it = 0; it < total; ++it) {
      const int q0 = step_q0(it);
      const int b = it & 1;
      wg::mbar_wait(q_full + 8 * b, (static_cast<uint32_t>(it) >> 1) & 1u);
      // One dS^T tile: the other warpgroup's dQ GEMM of the step before has read it once both are here
      // (round 38: with two dS^T tiles and one dQ staging tile, the consumers waited for the dQ writer
      // before each staging store; two staging tiles took 143 us off a layer's attention backward in
      // the kernel trace).
      ws_consumer_sync();
      const uint32_t bQ = sQ + b * kTile, bG = sG + b * kTile, bS = sS;
      const float* L = sL + b * kM;
      const float* Dv = sD + b * kM;
      float s[kM / 8][4], dp[kM / 8][4];
      wg::wgmma_fence();
      // Descriptors built once a step and moved by a constant a k step (round 37: the rebuilt ones were
      // about 8 uniform instructions a wgmma on the warps' issue path).
      gemm_kmaj<kD, kWgBM, kM>(s, desc_kmaj<kWgBM>(sK, 64 * cw, 0), desc_kmaj<kM>(bQ, 0, 0));
      wg::wgmma_commit();
      gemm_kmaj<kD, kWgBM, kM>(dp, desc_kmaj<kWgBM>(sV, 64 * cw, 0), desc_kmaj<kM>(bG, 0, 0));
      wg::wgmma_commit();
      wg::wgmma_wait<1>();  // S^T is ready: P^T and dV += P^T dO overlap the dP^T GEMM
      fence_acc(s);
      // Steps whose 64 queries are all visible to all of this warpgroup's keys (every one but the diagonal
      // and document-boundary steps) take the branch without the mask: with the mask inline, the compiler
      // packed 32 mask bits a step into a register ahead of the S^T wait, about 7 instructions an element.
      // exp2 without the denormal-result path: a result below 2^-126 is 0.
      const bool full = q0 >= wr_hi && q0 + kM <= wr_end_lo;
      if (full) {
#pragma unroll
        for (int n = 0; n < kM / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = exp2_ftz(fmaf(s[n][e], sl2, -L[n * 8 + 2 * (lane & 3) + (e & 1)]));
      } else {
#pragma unroll
        for (int n = 0; n < kM / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = n * 8 + 2 * (lane & 3) + (e & 1);
            const int qi = q0 + c;
            const int hh = e >> 1;
            const float p = exp2_ftz(fmaf(s[n][e], sl2, -L[c]));
            s[n][e] = qi < key[hh] || qi >= kend[hh] ? 0.0f : p;
          }
      }
      uint32_t pa[kM / 16][4];
      pack_a(pa, s);
      wg::wgmma_fence();
      gemm_regs_mn<kM>(dv, pa, desc_mn<kM>(bG, 0));
      wg::wgmma_commit();
      wg::wgmma_wait<1>();  // dP^T is ready (groups retire in order); dV may still run
      fence_acc(dp);
#pragma unroll
      for (int n = 0; n < kM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * (lane & 3) + (e & 1);
          dp[n][e] = s[n][e] * (dp[n][e] - Dv[c]);
        }
      pack_a(pa, dp);
      wg::wgmma_fence();
      gemm_regs_mn<kM>(dk, pa, desc_mn<kM>(bQ, 0));
      wg::wgmma_commit();
      // dS^T into shared memory for the dQ GEMM: pa[kk][x] holds row srow + 8 (x & 1), query chunk 2 kk + (x >> 1).
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          st_shared_b32(bS + sw_off<kWgBM>(srow + 8 * (x & 1), 2 * kk + (x >> 1)) + 4 * (lane & 3), pa[kk][x]);
      wg::fence_proxy_async();
      ws_consumer_sync();  // both halves of dS^T are written
      float dq[8][4];
      const uint32_t bK = sK + (kD == 128 ? cw * kWgBM * 128 : 0);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kWgBM / 16; ++kk)
        wgmma_ss_tt(dq, desc_plus(desc_mn<kWgBM>(bS, 0), 16 * kk * 128), desc_plus(desc_mn<kWgBM>(bK, 0), 16 * kk * 128), kk);
      wg::wgmma_commit();
      wg::wgmma_wait<0>();
      fence_acc(dk);
      fence_acc(dv);
      fence_acc(dq);
      ws_arrive_lane0(q_empty + 8 * b, lane);  // Q, dO, lse, D of this stage are no longer read
      // The writer of step it - 2 has read this step's staging tile.
      if (it > 1) wg::mbar_wait(dq_empty + 8 * b, (static_cast<uint32_t>(it - 2) >> 1) & 1u);
      const uint32_t dq_tile = sDQ + b * kM * kPitch;
      if (kD == 128 || cw == 0) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t row = dq_tile + ((warp & 3) * 16 + (lane >> 2) + 8 * hh) * kPitch + (64 * cw + 2 * (lane & 3)) * 4;
#pragma unroll
          for (int n = 0; n < 8; ++n) st_shared_v2f(row + n * 32, dq[n][2 * hh], dq[n][2 * hh + 1]);
        }
      }
      wg::fence_proxy_async();  // read next by the bulk copies
      __syncwarp();
      ws_arrive_lane0(dq_full + 8 * (it & 1), lane);
    }
    store_kv_partials<kD>(a, dk, dv, key, g, w.split);
  }
#endif
}

// D[h, t] = dO[t, h] . O[t, h] (one warp per row, grid-stride), the dQ counters and the CTA ticket
// set to 0, jb_lo[i] = first key block adding into 64-query tile i, and (non-deterministic mode)
// dq_acc zeroed.
template <int kD>
__global__ void attn_bwd_prep_kernel(FlashArgs a, float* __restrict__ dsum, int* __restrict__ jb_lo, int64_t ncounters,
                                     int zero_dq) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  const int64_t wid = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5), rows = a.T * a.nh;
  if constexpr (kD == 128) {
    // Two rows a warp, a half-warp each (row_dot leaves lanes 16-31 idle at d 128). A lane's 8
    // products are added as in row_dot, then + 0.0f where row_dot adds the idle partner lane's zero,
    // then the steps 8, 4, 2, 1 inside the half: row_dot's bits. O is read only here (streaming hint).
    const int half = lane >> 4, q = lane & 15;
    for (int64_t w = 2 * wid; w < rows; w += 2 * nwarps) {
      const int64_t r = w + half;
      float s = 0.0f;
      if (r < rows) {
        const uint4 ov = __ldcs(reinterpret_cast<const uint4*>(a.o + r * kD + q * 8));
        const uint4 gv = *reinterpret_cast<const uint4*>(a.dout + r * kD + q * 8);
        const bf16* op = reinterpret_cast<const bf16*>(&ov);
        const bf16* gp = reinterpret_cast<const bf16*>(&gv);
#pragma unroll
        for (int i = 0; i < 8; ++i) s += __bfloat162float(op[i]) * __bfloat162float(gp[i]);
      }
      s = s + 0.0f;
      for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (q == 0 && r < rows) {
        const int64_t t = r / a.nh, h = r - t * a.nh;
        dsum[h * a.T + t] = s;
      }
    }
  } else {
    for (int64_t w = wid; w < rows; w += nwarps) {
      const int64_t t = w / a.nh, h = w - t * a.nh;
      const float s = row_dot<kD>(a, w, lane);
      if (lane == 0) dsum[h * a.T + t] = s;
    }
  }
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < ncounters; i += nthreads) a.sems[i] = 0;  // the ticket is the last counter
  for (int64_t i = tid; i * kDqRows < a.T; i += nthreads)
    jb_lo[i] = a.cu[doc_of(a.cu, a.ndocs, i * kDqRows)] / kWgBM;
  if (zero_dq) {
    const int64_t n4 = a.nh * a.T * kD / 4;
    for (int64_t i = tid; i < n4; i += nthreads) reinterpret_cast<float4*>(a.dq_acc)[i] = make_float4(0, 0, 0, 0);
  }
}

// dk/dv (bf16) = sum over head splits, in order, of the f32 partials; dq (bf16, [T][nh][kD]) =
// scale * dq_acc ([nh][T][kD]). Four elements per thread step.
template <int kD>
__global__ void attn_bwd_finish_kernel(FlashArgs a, int splits, bf16* __restrict__ dk, bf16* __restrict__ dv) {
  pdl_wait();
  const int64_t n_kv = a.T * a.nkv * kD / 4, n_q = a.T * a.nh * kD / 4;
  const float4* pk = reinterpret_cast<const float4*>(a.part_k);
  const float4* pv = reinterpret_cast<const float4*>(a.part_v);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_kv + n_q;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < n_kv) {
      // the partials and dq_acc are read once (streaming hint): dq, dk, dv, which the q/k norm + RoPE
      // backward and the projections' GEMMs read next, stay in L2 longer
      float4 sk = __ldcs(pk + i), sv = __ldcs(pv + i);
      for (int s = 1; s < splits; ++s) {
        const float4 xk = __ldcs(pk + s * n_kv + i), xv = __ldcs(pv + s * n_kv + i);
        sk = make_float4(sk.x + xk.x, sk.y + xk.y, sk.z + xk.z, sk.w + xk.w);
        sv = make_float4(sv.x + xv.x, sv.y + xv.y, sv.z + xv.z, sv.w + xv.w);
      }
      uint2 ok, ov;
      ok.x = pack_bf16(sk.x, sk.y);
      ok.y = pack_bf16(sk.z, sk.w);
      ov.x = pack_bf16(sv.x, sv.y);
      ov.y = pack_bf16(sv.z, sv.w);
      const int64_t e = 4 * i, w = a.nkv * kD, t = e / w, c = e - t * w;  // token t, column c of dk, dv
      *reinterpret_cast<uint2*>(dk + t * a.dk_row + c) = ok;
      *reinterpret_cast<uint2*>(dv + t * a.dv_row + c) = ov;
    } else {
      const int64_t o = (i - n_kv) * 4;  // element index in dq [T][nh][kD] when packed
      const int64_t c = o % kD, th = o / kD, t = th / a.nh, h = th - t * a.nh;
      const float4 x = __ldcs(reinterpret_cast<const float4*>(a.dq_acc + (h * a.T + t) * kD + c));
      uint2 r;
      r.x = pack_bf16(x.x * a.scale, x.y * a.scale);
      r.y = pack_bf16(x.z * a.scale, x.w * a.scale);
      *reinterpret_cast<uint2*>(a.dq + t * a.dq_row + h * kD + c) = r;
    }
  }
}

}  // namespace moetrain::cuda::flash
