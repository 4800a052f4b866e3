// Hopper (sm_90a) fused attention backward: 5 GEMMs per tile pair (FlashAttention-2/3 style) instead
// of the 7 of the split dQ + dK/dV kernels. One CTA owns 128 keys of a kv head and a subset of its
// GQA group's heads; besides dK/dV it writes dS^T to shared memory and adds dQ += dS K for every
// query tile into an f32 accumulator. Deterministic mode orders those adds per (head, query tile)
// by key block with a counter in global memory; a prep kernel (D = rowsum(dO*O), zeroing) and a
// finish kernel (ordered dK/dV partial sum, dQ to bf16) run around it.
#pragma once
#include "kernels/cuda/attention_flash_sm90.cuh"

namespace moetrain::cuda::flash {

// d[8][4] = (accumulate ? d : 0) + A (64 x 16) * B (16 x 64), both MN-major in shared memory.
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_ATTN_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}

// Thread-predicated counter accesses as single PTX statements, so they add no branch.
__device__ __forceinline__ int ld_acquire_gpu_if(bool pred, const int* p) {
  int v = 0;
#if MT_ATTN_SM90A
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %1, 0;\n@q ld.acquire.gpu.global.b32 %0, [%2];\n}\n"
      : "+r"(v)
      : "r"(static_cast<int>(pred)), "l"(p)
      : "memory");
#endif
  return v;
}
// Release-add 1 (fence.acq_rel.gpu semantics first: every write ordered before it, including the
// other threads' writes before a preceding __syncthreads, is visible before the new count).
__device__ __forceinline__ void red_release_gpu_if(bool pred, const int* p) {
#if MT_ATTN_SM90A
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %0, 0;\n@q red.release.gpu.global.add.s32 [%1], 1;\n}\n" ::"r"(
          static_cast<int>(pred)),
      "l"(p)
      : "memory");
#endif
}
// 4 bytes global -> shared with cp.async; zero-filled (src not read) when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

constexpr int kDqRows = kWgBN;  // queries per step, and the granularity of the dQ counters

template <int kD>
constexpr size_t bwd_fused_smem() {
  return 1024 + (2 * kWgBM + 4 * kWgBN) * kD * 2 + kWgBM * kWgBN * 2 + 4 * kWgBN * 4;
}

// Work item of CTA ticket tk: key block first (ascending, so longest causal work first and every
// dQ counter wait is on a smaller ticket, hence on a CTA already running or done), then kv head
// and head split.
struct FusedItem {
  int64_t jb, g, split;
};
__device__ __forceinline__ FusedItem fused_item(const FlashArgs& a, int64_t tk) {
  const int64_t splits = a.group / a.heads_per_cta, per_j = a.nkv * splits;
  return FusedItem{tk / per_j, (tk % per_j) / splits, tk % splits};
}

// dK, dV (f32 partials per head split, as attn_dkdv_wgmma_kernel) and dQ += dS K for 128 keys of one
// kv head over heads_per_cta heads. Steps run query tile outer, head inner (so a head split adds
// no extra lag between consecutive key blocks' dQ adds). dq_acc is [nh][T][kD] f32 (unscaled).
template <int kD>
__global__ void __launch_bounds__(kWgThreads, 1) attn_bwd_fused_wgmma_kernel(FlashArgs a) {
#if MT_ATTN_SM90A
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  __shared__ int s_ticket;
  constexpr int kM = kWgBN, kTile = kM * kD * 2;
  const uint32_t sK = smem_base1024(smem_wg), sV = sK + kWgBM * kD * 2, sQ = sV + kWgBM * kD * 2,
                 sG = sQ + 2 * kTile, sS = sG + 2 * kTile;  // sS: dS^T [128 keys][64 queries] bf16
  const uint32_t sLa = sS + kWgBM * kM * 2, sDa = sLa + 2 * kM * 4;  // lse, D: [2][kM] f32 each
  const float* sL = reinterpret_cast<const float*>(smem_wg + (sLa - mma::smem_addr(smem_wg)));
  const float* sD = sL + 2 * kM;
  if (threadIdx.x == 0) s_ticket = atomicAdd(a.ticket, 1);
  __syncthreads();
  const FusedItem w = fused_item(a, s_ticket);
  const int64_t g = w.g, j0 = w.jb * kWgBM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2;
  const int64_t qs = a.nh * kD, ks = a.nkv * kD;
  const int64_t jlast = min(j0 + kWgBM - 1, a.T - 1);
  const int64_t qend = a.cu[doc_of(a.cu, a.ndocs, jlast) + 1];
  const int64_t nqt = (a.T + kM - 1) / kM;
  // 32-bit positions in the loop (T < 2^31, as cu_seqlens is i32) keep the kernel free of spills.
  int key[2], kend[2];
  for (int hh = 0; hh < 2; ++hh) {
    key[hh] = static_cast<int>(j0) + warp * 16 + (lane >> 2) + 8 * hh;
    kend[hh] = key[hh] < a.T ? a.cu[doc_of(a.cu, a.ndocs, key[hh]) + 1] : 0;
  }
  const WgRows wr64 = wg_rows(a, j0 + 64 * wg);  // here the rows are keys
  const int wr_hi = static_cast<int>(wr64.hi), wr_end_lo = static_cast<int>(wr64.end_lo);
  const int hpc = a.heads_per_cta;
  const int64_t h0 = g * a.group + w.split * hpc;
  const int qtiles = static_cast<int>((qend - j0 + kM - 1) / kM);
  const int total = qtiles * hpc;
  auto issue = [&](int it) {  // loads of step it = (q tile, head) into buffer it & 1
    const int64_t hd = h0 + it % hpc, q0 = j0 + static_cast<int64_t>(it / hpc) * kM;
    const int b = it & 1;
    load_tile<kD, kM, kWgThreads>(sQ + b * kTile, a.q + hd * kD, qs, q0, qend);
    load_tile<kD, kM, kWgThreads>(sG + b * kTile, a.dout + hd * kD, qs, q0, qend);
    // lse and D (0 past qend) by cp.async too: a plain load here would stall the issuing warps.
    if (threadIdx.x < 2 * kM) {
      const int i = threadIdx.x & (kM - 1);
      const int64_t t = q0 + i;
      const float* src = (threadIdx.x < kM ? a.lse : a.dsum) + hd * a.T;
      cp_async4((threadIdx.x < kM ? sLa : sDa) + (b * kM + i) * 4, t < qend ? src + t : src, t < qend);
    }
  };
  load_tile<kD, kWgBM, kWgThreads>(sK, a.k + g * kD, ks, j0, a.T);
  load_tile<kD, kWgBM, kWgThreads>(sV, a.v + g * kD, ks, j0, a.T);
  if (total > 0) issue(0);
  mma::cp_async_commit();
  const float sl2 = a.scale * kLog2e;
  float dk[kD / 8][4] = {}, dv[kD / 8][4] = {};
  // No branch that a warpgroup might take apart may sit between a wgmma issue and its wait (ptxas
  // would serialize every wgmma, C7518): thread 0's counter traffic is predicated PTX, the spin
  // happens after the step's last wait, and no warpgroup skips a step (masked P is 0).
  const int* pending = nullptr;  // dQ counter this CTA still has to advance (deterministic)
  const bool t0 = threadIdx.x == 0;
  for (int it = 0; it < total; ++it) {
    const int64_t hd = h0 + it % hpc;
    const int q0 = static_cast<int>(j0) + (it / hpc) * kM;
    const int* sem = a.sems + hd * nqt + q0 / kM;
    mma::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();  // also: every thread's dQ adds of the previous step precede the counter advance
    const int jlo = a.deterministic ? a.jb_lo[q0 / kM] : 0;  // loaded early, used after the GEMMs
    if (it + 1 < total) issue(it + 1);
    mma::cp_async_commit();
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
    const int srow = 64 * wg + (warp & 3) * 16 + (lane >> 2);  // this thread's first dS^T row (key)
    wg_wait<1>();  // S^T is ready: P^T and dV += P^T dO overlap the dP^T GEMM
    fence_acc(s);
    const bool full = q0 >= wr_hi && q0 + kM <= wr_end_lo;
#pragma unroll
    for (int n = 0; n < kM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * (lane & 3) + (e & 1);
        const int qi = q0 + c;
        const int hh = e >> 1;
        float p = exp2f(fmaf(s[n][e], sl2, -L[c] * kLog2e));
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
    // dS^T into shared memory for the dQ GEMM: pa[kk][x] holds row srow + 8 (x & 1), query chunk 2 kk + (x >> 1).
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        st_shared_b32(sS + sw_off<kWgBM>(srow + 8 * (x & 1), 2 * kk + (x >> 1)) + 4 * (lane & 3), pa[kk][x]);
    fence_async_smem();
    // Release the previous step's dQ adds, issued a step ago, so the fence rarely waits on them.
    if (a.deterministic) red_release_gpu_if(t0 && pending != nullptr, pending);
    __syncthreads();  // both halves of dS^T are written
    // dQ (64 queries) = dS (64 x 128 keys) K: warpgroup wg owns columns 64 wg .. (d 64: both compute all, wg 0 adds).
    float dq[8][4];
    const uint32_t bK = sK + (kD == 128 ? wg * kWgBM * 128 : 0);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kWgBM / 16; ++kk)
      wgmma_ss_tt(dq, desc_mn<kWgBM>(sS, 16 * kk), desc_mn<kWgBM>(bK, 16 * kk), kk);
    wg_commit();
    // The counter poll's latency hides behind the dQ GEMM; usually it already shows every predecessor.
    const int seen = a.deterministic ? ld_acquire_gpu_if(t0, sem) : 0;
    wg_wait0();
    fence_acc(dk);
    fence_acc(dv);
    fence_acc(dq);
    // Key blocks adding into query tile q0 / kM run from jb_lo (first row's document start) to the
    // diagonal; this block adds after those before it (the first one stores).
    const bool first = a.deterministic && w.jb == jlo;
    if (a.deterministic) {
      const int target = static_cast<int>(w.jb) - jlo;
      if (t0 && seen < target) {
        // A bounded spin turns a scheduling bug into a launch error instead of a hang (~30 s).
        for (int64_t spins = 0; ld_acquire_gpu_if(true, sem) < target;)
          if (++spins > (int64_t{1} << 26)) __trap();
      }
      __syncthreads();
    }
    if (kD == 128 || wg == 0) {
      float* base = a.dq_acc + hd * a.T * kD + 64 * wg + 2 * (lane & 3);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = q0 + (warp & 3) * 16 + (lane >> 2) + 8 * hh;
        if (r >= a.T) continue;
        float* row = base + static_cast<int64_t>(r) * kD;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          const float2 v = make_float2(dq[n][2 * hh], dq[n][2 * hh + 1]);
          if (first)
            *reinterpret_cast<float2*>(row + n * 8) = v;
          else
            atomicAdd(reinterpret_cast<float2*>(row + n * 8), v);
        }
      }
    }
    pending = sem;
  }
  __syncthreads();
  if (a.deterministic) red_release_gpu_if(t0 && pending != nullptr, pending);
  float* pk = a.part_k + w.split * a.T * a.nkv * kD;
  float* pv = a.part_v + w.split * a.T * a.nkv * kD;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (key[hh] >= a.T) continue;
    const int64_t base = (static_cast<int64_t>(key[hh]) * a.nkv + g) * kD + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      *reinterpret_cast<float2*>(pk + base + dt * 8) = make_float2(dk[dt][2 * hh] * a.scale, dk[dt][2 * hh + 1] * a.scale);
      *reinterpret_cast<float2*>(pv + base + dt * 8) = make_float2(dv[dt][2 * hh], dv[dt][2 * hh + 1]);
    }
  }
#endif
}

// D[h, t] = dO[t, h] . O[t, h] (one warp per row, grid-stride), the dQ counters and the CTA ticket
// set to 0, jb_lo[i] = first key block adding into 64-query tile i, and (non-deterministic mode)
// dq_acc zeroed.
template <int kD>
__global__ void attn_bwd_prep_kernel(FlashArgs a, float* __restrict__ dsum, int* __restrict__ jb_lo, int64_t ncounters,
                                     int zero_dq) {
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5); w < a.T * a.nh;
       w += nwarps) {
    const int64_t t = w / a.nh, h = w - t * a.nh;
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
    if (lane == 0) dsum[h * a.T + t] = s;
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
  const int64_t n_kv = a.T * a.nkv * kD / 4, n_q = a.T * a.nh * kD / 4;
  const float4* pk = reinterpret_cast<const float4*>(a.part_k);
  const float4* pv = reinterpret_cast<const float4*>(a.part_v);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_kv + n_q;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < n_kv) {
      float4 sk = pk[i], sv = pv[i];
      for (int s = 1; s < splits; ++s) {
        const float4 xk = pk[s * n_kv + i], xv = pv[s * n_kv + i];
        sk = make_float4(sk.x + xk.x, sk.y + xk.y, sk.z + xk.z, sk.w + xk.w);
        sv = make_float4(sv.x + xv.x, sv.y + xv.y, sv.z + xv.z, sv.w + xv.w);
      }
      uint2 ok, ov;
      ok.x = pack_bf16(sk.x, sk.y);
      ok.y = pack_bf16(sk.z, sk.w);
      ov.x = pack_bf16(sv.x, sv.y);
      ov.y = pack_bf16(sv.z, sv.w);
      reinterpret_cast<uint2*>(dk)[i] = ok;
      reinterpret_cast<uint2*>(dv)[i] = ov;
    } else {
      const int64_t o = (i - n_kv) * 4;  // element index in dq [T][nh][kD]
      const int64_t c = o % kD, th = o / kD, t = th / a.nh, h = th - t * a.nh;
      const float4 x = *reinterpret_cast<const float4*>(a.dq_acc + (h * a.T + t) * kD + c);
      uint2 r;
      r.x = pack_bf16(x.x * a.scale, x.y * a.scale);
      r.y = pack_bf16(x.z * a.scale, x.w * a.scale);
      *reinterpret_cast<uint2*>(a.dq + o) = r;
    }
  }
}

}  // namespace moetrain::cuda::flash
