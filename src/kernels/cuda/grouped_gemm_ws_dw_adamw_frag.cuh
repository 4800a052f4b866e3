// Hopper expert dW GEMM with AdamW applied to the accumulator fragments (all-bf16 state, no prior
// gradient, no compute copy): the "fragment walk". Same tiles, mainloop and producer as
// gmm_ws_dw_kernel (grouped_gemm_ws_dw.cuh), but instead of staging g in shared memory and walking
// it with w, m, v loads held in registers, a loader warp streams each tile's w, m and v through a
// ring of shared-memory chunks with TMA (3-D maps [E, M, K], so rows past an expert are clipped by
// the hardware), the consumers read them with ldmatrix in the wgmma accumulator layout, update in
// registers, write the new words back with stmatrix, and the loader stores each chunk with TMA.
// No consumer register holds a load in flight, and the loads of the next chunks (and of the next
// tile, under its mainloop) need no consumer instructions.
// Bits: identical to dispatch_dw followed by adamw_kernel (and to dispatch_dw_adamw's walk):
// the same per-element operations, the same stochastic-rounding stream (one Philox call per 8
// consecutive elements, shared by the 4 lanes of a quad that hold them) and the same per-tile sums
// of squares (stage_tile's groups and chains, in the same order).
#pragma once
#include <cuda.h>

#include <utility>

#include "kernels/cuda/grouped_gemm_ws_dw.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw_adamw.cuh"

namespace moetrain::cuda::gwd::dwf {

namespace am = adamw_math;

// 128 x 256 tiles (dispatch_dw's bf16 tiling, so the per-tile sums match) with BK-row slabs in S
// stages; the ring holds NB chunks of 128 rows x CC columns of w, m and v (TMA swizzle of the row
// length: 64 bytes for CC 32, 32 bytes for CC 16).
template <int CC, int NB, int BK, int S, int BN = 256, int CTAS = 1>
struct Cfg {
  static constexpr int kBN = BN, kCTAs = CTAS;
  // 1 CTA per SM: 384 threads (warpgroup 0: producer warp, ring warp, 2 idle; then 2 consumer
  // warpgroups, setmaxnreg split). 2 per SM: 288 threads (2 consumer warpgroups, then one warp whose
  // lane 0 is the producer and lane 16 the ring), no split (112 registers each).
  static constexpr int kThreads = CTAS == 1 ? 384 : 288;
  static constexpr int kCC = CC, kNB = NB, kBK = BK, kChunks = kBN / CC, kPairs = CC / 16;
  static constexpr int kBlock = BK * 128;
  static constexpr int kABytes = 2 * kBlock;
  static constexpr int kStageBytes = kABytes + (kBN / 64) * kBlock;
  static constexpr int kStages = S;
  static constexpr int kRowBytes = 2 * CC;
  static constexpr int kArr = kBM * kRowBytes;  // one tensor's part of a chunk
  static constexpr int kBuf = 3 * kArr;         // w, m, v
  static constexpr int kRingOff = kStages * kStageBytes;
  static constexpr int kBarOff = kRingOff + kNB * kBuf;
  static constexpr int kOffOff = kBarOff + 256;
  static constexpr int kRedOff = kOffOff + ((kMaxE + 1) * 4 + 7) / 8 * 8;
  static constexpr int kSmem = 1024 + kRedOff + 24 * 8;
  static_assert(CC == 16 || CC == 32, "chunk width");
  static_assert(kSmem * CTAS <= 227 * 1024, "fragment-walk kernel does not fit in shared memory");
  static_assert((2 * kStages + 2 * kNB) * 8 <= 256, "barrier space");
  // registers per thread at launch (__launch_bounds__(384, CTAS)), then the setmaxnreg split
  static constexpr int kStoreRegs = 40, kConsumerRegs = 232;
  static_assert(128 * kStoreRegs + 256 * kConsumerRegs <= 168 * 384, "register split");
};

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* m, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* m, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(m)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// v[k] for a lane-dependent k in 0..3 (two selects deep, no local memory)
__device__ __forceinline__ uint32_t pick4(const uint32_t (&v)[4], int k) {
  const uint32_t lo = (k & 1) ? v[1] : v[0], hi = (k & 1) ? v[3] : v[2];
  return (k & 2) ? hi : lo;
}

// Byte offset, in one tensor's 128 x CC chunk, of 16-byte unit u of row r: TMA's swizzle of the row
// length (rows of 2 CC bytes; 128 / (2 CC) rows per 128-byte line) XORs u with the line index.
template <class C>
__device__ __forceinline__ uint32_t chunk_off(int r, int u) {
  constexpr int kLine = 128 / C::kRowBytes, kUnits = C::kRowBytes / 16;
  return static_cast<uint32_t>(r * C::kRowBytes + 16 * (u ^ ((r / kLine) % kUnits)));
}

// The tile's g as packed bf16 pairs, gw[k] = bf16(acc[2 k]) | bf16(acc[2 k + 1]) << 16 (what
// stage_tile stores), and, with ss, the sums of squares of those values in stage_tile's groups,
// chains and order (its bf16 branch).
template <int kBN>
__device__ __forceinline__ void pack_tile(const float (&acc)[kBN / 2], uint32_t (&gw)[kBN / 4], int lane,
                                          bool row_in0, bool row_in1, int ncols, wg::SumSq4& sq, bool with_ss) {
  const int fcol = 2 * (lane & 3);
#pragma unroll
  for (int k = 0; k < kBN / 4; ++k) gw[k] = mma::pack_bf16(acc[2 * k], acc[2 * k + 1]);
  if (!with_ss) return;
#pragma unroll
  for (int j = 0; j < kBN / 8; j += 2) {  // gw[2 j + i]: row frow + 8 (i & 1), column block j + (i >> 1)
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool in = ((i & 1) ? row_in1 : row_in0) && fcol + 8 * (j + (i >> 1)) < ncols;
      f[2 * i] = in ? __uint_as_float(gw[2 * j + i] << 16) : 0.0f;
      f[2 * i + 1] = in ? __uint_as_float(gw[2 * j + i] & 0xffff0000u) : 0.0f;
    }
    const int c2 = 2 * ((j >> 1) & 1);
    sq.add4(c2, f[0], f[1], f[4], f[5]);
    sq.add4(c2 + 1, f[2], f[3], f[6], f[7]);
  }
}

// One consumer warp, column blocks j and j + 1 of the tile (j = 4 c + 2 H: pair H of chunk c, in
// ring buffer `buf`), g in gw[0..3]: the four 8 x 8 matrices i = (rows 16 warp + 8 (i & 1) ..,
// column block j + (i >> 1)) of w, m and v come in with ldmatrix, in the fragment layout of g (rows
// lane / 4, columns 2 (lane % 4) + {0, 1}), are updated in registers and written back in place.
template <class C, int H>
__device__ __forceinline__ void update_pair(const AdamWParams& a, const uint32_t* gw, uint32_t buf, int c, int warp,
                                            int lane, int64_t gbase, int64_t cj) {
  const int q = lane >> 3, rr = lane & 7, row = 16 * warp + 8 * (q & 1) + rr;
  const uint32_t addr = buf + chunk_off<C>(row, 2 * H + (q >> 1));
  uint32_t wr[4], mr[4], vr[4];
  ldsm_x4(wr, addr);
  ldsm_x4(mr, addr + C::kArr);
  ldsm_x4(vr, addr + 2 * C::kArr);
  // stochastic rounding: lane q of a quad draws the Philox words of matrix q's 8-element vector;
  // every lane needs word (lane & 3) of each (its two columns' halves, adamw_math::random_half)
  uint32_t rw[4] = {0, 0, 0, 0};
  if (a.sr) {
    const int ql = lane & 3, frow = 16 * warp + (lane >> 2), j = 2 * (C::kPairs * c + H);
    const int64_t i0 = gbase + static_cast<int64_t>(frow + 8 * (ql & 1)) * cj + 8 * (j + (ql >> 1));
    const Philox4 r = philox4x32(a.key, a.counter, static_cast<uint64_t>(i0) >> 3);
    const uint32_t words[4] = {r.v[0], r.v[1], r.v[2], r.v[3]};
    uint32_t got[4];  // got[s]: word ql of matrix ql ^ s
#pragma unroll
    for (int s = 0; s < 4; ++s)
      got[s] = __shfl_sync(0xffffffffu, pick4(words, ql ^ s), (lane & ~3) | (ql ^ s));
#pragma unroll
    for (int i = 0; i < 4; ++i) rw[i] = pick4(got, ql ^ i);
  }
  // the 8 elements in one update_n (its square roots and divides interleaved)
  float gf[8], wf[8], mf[8], vf[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    gf[2 * i] = am::bits_float(gw[i] << 16), gf[2 * i + 1] = am::bits_float(gw[i] & 0xffff0000u);
    wf[2 * i] = am::bits_float(wr[i] << 16), wf[2 * i + 1] = am::bits_float(wr[i] & 0xffff0000u);
    mf[2 * i] = am::bits_float(mr[i] << 16), mf[2 * i + 1] = am::bits_float(mr[i] & 0xffff0000u);
    vf[2 * i] = am::bits_float(vr[i] << 16), vf[2 * i + 1] = am::bits_float(vr[i] & 0xffff0000u);
  }
  am::update_n<8>(a.k, gf, mf, vf, wf);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t lo, hi;
    if (a.sr) {
      lo = am::bf16_stochastic(wf[2 * i], rw[i]);
      hi = am::bf16_stochastic(wf[2 * i + 1], rw[i] >> 16);
    } else {
      lo = am::bf16_rne(wf[2 * i]);
      hi = am::bf16_rne(wf[2 * i + 1]);
    }
    wr[i] = lo | (hi << 16);
    mr[i] = am::bf16x2_rne(mf[2 * i], mf[2 * i + 1]);
    vr[i] = am::bf16x2_rne(vf[2 * i], vf[2 * i + 1]);
  }
  wg::stmatrix_x4(addr, wr[0], wr[1], wr[2], wr[3]);
  wg::stmatrix_x4(addr + C::kArr, mr[0], mr[1], mr[2], mr[3]);
  wg::stmatrix_x4(addr + 2 * C::kArr, vr[0], vr[1], vr[2], vr[3]);
}

// The tile's chunks for one consumer warp, in order: wait for a chunk's w, m, v, update, write back,
// release it to the loader. A rolled loop over 64-column steps (the unrolled walk was 330 KB of
// code, and its instruction-cache misses made the kernel 4x slower); gw is shifted by 16 words per
// step so that the loop body indexes it statically. n: the CTA's running chunk count (the loader's).
template <class C>
__device__ __forceinline__ void walk_tile(const AdamWParams& a, uint32_t (&gw)[C::kBN / 4], uint32_t ring,
                                          uint32_t rfull0, uint32_t rdone0, uint32_t& n, int warp, int lane,
                                          int64_t gbase, int64_t cj, int ncols) {
  constexpr int kPerStep = 64 / C::kCC;
#pragma unroll 1
  for (int c0 = 0; c0 * C::kCC < ncols; c0 += kPerStep) {
#pragma unroll
    for (int cc = 0; cc < kPerStep; ++cc) {
      const int c = c0 + cc;
      if (c * C::kCC < ncols) {  // chunks past the last column: the loader skips them too
        const uint32_t b = n % C::kNB, buf = ring + b * C::kBuf;
        wg::mbar_wait(rfull0 + 8 * b, (n / C::kNB) & 1u);
#pragma unroll
        for (int h = 0; h < C::kPairs; ++h) {
          if (h == 0) update_pair<C, 0>(a, gw + 4 * (cc * C::kPairs), buf, c, warp, lane, gbase, cj);
          else update_pair<C, 1>(a, gw + 4 * (cc * C::kPairs + 1), buf, c, warp, lane, gbase, cj);
        }
        wg::fence_proxy_async();  // the stmatrix writes, before the loader's TMA store reads them
        __syncwarp();
        if (lane == 0) wg::mbar_arrive(rdone0 + 8 * b);
        ++n;
      }
    }
#pragma unroll
    for (int k = 0; k < C::kBN / 4 - 16; ++k) gw[k] = gw[k + 16];
  }
}

// The kernel. Warp 0 lane 0: produce() (dy / x slabs). Warp 1 lane 0: the ring (loads chunk n once
// chunk n - kNB's buffer has been stored; stores a chunk once the 8 consumer warps released it).
// Warps 2-3 return. Consumers: as gmm_ws_dw_kernel with the AdamW policy (kWalkEmpty: they also
// update the tiles of experts without rows, with AdamWEpilogue::walk_empty), walking each tile's
// fragments chunk by chunk instead of staging it.
template <class C>
__global__ void __launch_bounds__(C::kThreads) __maxnreg__(C::kCTAs == 1 ? 168 : 112)
    gmm_dw_adamw_frag_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                             const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_m,
                             const __grid_constant__ CUtensorMap map_v, const Params p, const AdamWParams a) {
#if MT_WGMMA_ENABLED
  constexpr int kS = C::kStages, kNB = C::kNB, kBK = C::kBK, kCC = C::kCC, kChunks = C::kChunks, kBN = C::kBN;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* base_p = smem_raw + (base - raw);
  const uint32_t ring = base + C::kRingOff;
  const uint32_t full0 = base + C::kBarOff, empty0 = full0 + 8 * kS, rfull0 = empty0 + 8 * kS, rdone0 = rfull0 + 8 * kNB;
  int32_t* s_off = reinterpret_cast<int32_t*>(base_p + C::kOffOff);
  double* s_red = reinterpret_cast<double*>(base_p + C::kRedOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= p.E; i += C::kThreads) s_off[i] = p.off[i];
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(full0 + 8 * s, 1);
      wg::mbar_init(empty0 + 8 * s, 8);
    }
    for (int s = 0; s < kNB; ++s) {
      wg::mbar_init(rfull0 + 8 * s, 1);
      wg::mbar_init(rdone0 + 8 * s, 8);
    }
    wg::fence_mbar_init();
    auto prefetch = [](const CUtensorMap* m) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
    };
    prefetch(&map_a);
    prefetch(&map_b);
    prefetch(&map_w);
    prefetch(&map_m);
    prefetch(&map_v);
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(p.E) * p.nmt * p.ncol, stride = gridDim.x;
  auto seek = [&](int64_t t) {  // first tile at or after t (step = grid) whose expert has rows
    while (t < total && decode<kBN, kBK>(p, s_off, t).ksteps == 0) t += stride;
    return t;
  };
  auto ncols_of = [&](const Tile& x) {
    return static_cast<int>(p.cj - x.j0 * kBN < kBN ? p.cj - x.j0 * kBN : kBN);
  };
  constexpr bool kSplit = C::kCTAs == 1;
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (kSplit ? wgi == 0 : wgi == 2) {
    if constexpr (kSplit) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kStoreRegs));
    const int w0 = __shfl_sync(0xffffffffu, tid / 32, 0);
    const int lp = kSplit ? 0 : 256, lr = kSplit ? 32 : 272;  // the producer and ring threads
    if (w0 == lp / 32 && tid == lp) produce<C, kBN, kBK>(&map_a, &map_b, p, s_off, base, full0, empty0, total, stride, seek);
    if (w0 == lr / 32) {  // ---- the ring of w, m, v chunks ----
      if (tid == lr) {
        int cx[kNB] = {}, cy[kNB] = {}, ce[kNB] = {};  // where each buffer's chunk goes back to
        auto store = [&](uint32_t b) {
          const uint32_t buf = ring + b * C::kBuf;
          tma_store_3d(&map_w, buf, cx[b], cy[b], ce[b]);
          tma_store_3d(&map_m, buf + C::kArr, cx[b], cy[b], ce[b]);
          tma_store_3d(&map_v, buf + 2 * C::kArr, cx[b], cy[b], ce[b]);
          wg::bulk_commit();
        };
        uint32_t n = 0;
        for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
          const Tile x = decode<kBN, kBK>(p, s_off, t);
          const int ncols = ncols_of(x);
          for (int c = 0; c < kChunks && c * kCC < ncols; ++c, ++n) {
            const uint32_t b = n % kNB, buf = ring + b * C::kBuf;
            if (n >= kNB) {
              wg::mbar_wait(rdone0 + 8 * b, ((n / kNB) - 1u) & 1u);  // on the critical path: no sleeping
              store(b);
              wg::bulk_wait_read();  // the store has read the buffer
            }
            cx[b] = static_cast<int>(x.j0) * kBN + c * kCC;
            cy[b] = static_cast<int>(x.i0);
            ce[b] = x.e;
            wg::mbar_arrive_tx(rfull0 + 8 * b, static_cast<uint32_t>(C::kBuf));
            tma_load_3d(buf, &map_w, cx[b], cy[b], ce[b], rfull0 + 8 * b);
            tma_load_3d(buf + C::kArr, &map_m, cx[b], cy[b], ce[b], rfull0 + 8 * b);
            tma_load_3d(buf + 2 * C::kArr, &map_v, cx[b], cy[b], ce[b], rfull0 + 8 * b);
          }
        }
        for (uint32_t k = n >= kNB ? n - kNB : 0; k < n; ++k) {
          const uint32_t b = k % kNB;
          wg::mbar_wait(rdone0 + 8 * b, (k / kNB) & 1u);
          store(b);
        }
        wg::bulk_wait_all();
      }
      __syncwarp();
    }
    return;
  }
  // ---- consumers ----
  if constexpr (kSplit) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  const int ctid = kSplit ? tid - 128 : tid, cw = ctid >> 7, lane = tid & 31, warp = ctid >> 5;
  int stage = 0;
  uint32_t phase = 0, cit = 0, n = 0;
  float acc[kBN / 2];
  const dwa::AdamWEpilogue<uint16_t, uint16_t, uint16_t, 2, true> empty_walk{a};
  for (int64_t t = blockIdx.x; t < total; t += stride) {
    const Tile x = decode<kBN, kBK>(p, s_off, t);
    if (x.ksteps == 0) {
      empty_walk.template walk_empty<kBN, bf16>(p, x, ctid);
      continue;
    }
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
    mainloop<C, kBN, kBK>(acc, x, base, full0, empty0, stage, phase, ctid, cw, lane);
    const int nrows = static_cast<int>(p.ci - x.i0 < kBM ? p.ci - x.i0 : kBM);
    const int ncols = ncols_of(x);
    const int frow = 16 * warp + (lane >> 2);
    const int64_t gbase = (x.e * p.ci + x.i0) * p.cj + x.j0 * kBN;
    wg::SumSq4 sq;
    uint32_t gw[kBN / 4];
    pack_tile<kBN>(acc, gw, lane, frow < nrows, frow + 8 < nrows, ncols, sq, p.ss != nullptr);
    walk_tile<C>(a, gw, ring, rfull0, rdone0, n, warp, lane, gbase, p.cj, ncols);
    if (p.ss) {  // the 8 warp sums, added by consumer thread 0 in warp order (as the store thread does)
      double* red = s_red + 8 + 8 * (cit++ & 1u);
      double ss = sq.total();
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) red[warp] = ss;
      consumers_sync();
      if (ctid == 0) {
        double s = 0.0;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += red[w];
        p.ss[t] = s;
      }
    }
  }
  if (p.ss) empty_tile_sums<kBN, bf16, kBK>(p, s_off, s_red, ctid, lane, warp, total, stride);
#endif
}

// [E, M, K] bf16 (uint16 bits), box cc columns x 128 rows x 1 expert, swizzled by the row length
// (2 cc bytes), zero fill.
inline CUtensorMap state_map(const void* ptr, int E, int64_t M, int64_t K, int cc) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(M), static_cast<cuuint64_t>(E)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(K) * 2, static_cast<cuuint64_t>(M * K) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(cc), kBM, 1}, estr[3] = {1, 1, 1};
  const CUresult r = dw_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(ptr), dims, strides, box,
                                  estr, CU_TENSOR_MAP_INTERLEAVE_NONE, cc == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "[grouped_gemm_ws] cuTensorMapEncodeTiled (AdamW state) failed with error {}",
           static_cast<int>(r));
  return m;
}

// Whether the fragment walk takes this problem (on top of dw_adamw_supported).
inline bool supported(const DwAdamWArgs& a) {
  return a.grad_bf16 && a.master_bf16 && a.m_bf16 && a.v_bf16 && a.prior == nullptr && a.compute == nullptr;
}

template <class C>
void launch_cfg(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
                const DwAdamWArgs& args, double* partial) {
  const Params p = dw_params<C::kBN>(off, E, K, M, nullptr, false, partial);
  AdamWParams a{};
  a.w = args.master;
  a.m = args.m;
  a.v = args.v;
  a.comp = nullptr;
  a.k = args.k;
  a.key = args.key;
  a.counter = args.counter;
  a.sr = args.sr ? 1 : 0;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, C::kBK), mb = dw_map(x, N > 0 ? N : 1, K, C::kBK);
  const CUtensorMap mw = state_map(args.master, E, M, K, C::kCC), mm = state_map(args.m, E, M, K, C::kCC),
                    mv = state_map(args.v, E, M, K, C::kCC);
  auto kernel = gmm_dw_adamw_frag_kernel<C>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  if (C::kCTAs > 1) MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  // every CTA takes part in the updates of experts without rows, so the grid is never cut to the tiles
  kernel<<<static_cast<unsigned>(dw_sm_count(ctx) * C::kCTAs), C::kThreads, C::kSmem, stream_of(ctx)>>>(
      ma, mb, mw, mm, mv, p, a);
  check_launch("grouped_matmul_backward_adamw");
}

// shape: 0 = 32-column chunks x 3, 64-row slabs x 3 stages; 1 = 32 x 5, 32-row slabs x 4; 2 = 16 x 10,
// 32 x 4; 3 = 128-wide tiles, 2 CTAs per SM, 16 x 3, 64 x 2 (only without sums of squares: its
// tiles are not dispatch_dw's) (benchmark knob, dispatch_dw_adamw's variant bits 5-6).
inline void launch(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
                   int64_t M, const DwAdamWArgs& args, double* partial, int shape) {
  switch (shape) {
    case 1: launch_cfg<Cfg<32, 5, 32, 4>>(ctx, x, dy, off, E, N, K, M, args, partial); break;
    case 2: launch_cfg<Cfg<16, 10, 32, 4>>(ctx, x, dy, off, E, N, K, M, args, partial); break;
    case 3:
      if (partial) launch_cfg<Cfg<16, 6, 64, 3>>(ctx, x, dy, off, E, N, K, M, args, partial);
      else launch_cfg<Cfg<16, 3, 64, 2, 128, 2>>(ctx, x, dy, off, E, N, K, M, args, partial);
      break;
    default: launch_cfg<Cfg<32, 3, 64, 3>>(ctx, x, dy, off, E, N, K, M, args, partial); break;
  }
}

}  // namespace moetrain::cuda::gwd::dwf
