// Hopper warp-specialized expert dW GEMM: dw[e] (M x K) (+)= dy_e^T x_e, bf16 in, fp32 accumulate.
// A producer thread issues TMA copies (128B swizzle, MN-major 64-wide blocks) of dy and x k-slabs
// into an mbarrier ring; two consumer warpgroups run wgmma on a 128 x BN tile, zero the rows of the
// next expert that the expert's last slab over-reads, and write the tile through a shared staging
// tile with per-row bulk copies (= or +=, f32 or bf16) plus the tile's sum of squares. Included by
// grouped_gemm_ws.cu (and the standalone harness); same contract as grouped_gemm_wgmma_dw.
#pragma once
#include <cuda.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"

namespace moetrain::cuda::gwd {

using bf16 = __nv_bfloat16;
constexpr int kBM = 128, kMaxE = 1024, kThreads = 384;

// Shared memory: kStages x (A: 2 blocks | B: BN / 64 blocks, each BK k rows x 128 B), the staging
// tile (128 rows at kPitch bytes), barriers full[kS], empty[kS], obar, offsets [E+1], 8 doubles.
template <int BN, typename DwT, int BK>
struct Cfg {
  static constexpr int kBlock = BK * 128;
  static constexpr int kABytes = 2 * kBlock;
  static constexpr int kStageBytes = kABytes + (BN / 64) * kBlock;
  static constexpr int kPitch = BN * static_cast<int>(sizeof(DwT)) + (sizeof(DwT) == 4 ? 32 : 16);
  static constexpr int kOutBytes = kBM * kPitch;
  static constexpr int kOffOff = kOutBytes + 256;
  static constexpr int kRedOff = kOffOff + ((kMaxE + 1) * 4 + 7) / 8 * 8;
  static constexpr int kFixed = 1024 + kRedOff + 8 * 8;
  static constexpr int kFit = (227 * 1024 - kFixed) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;
  static_assert(kStages >= 2, "dW tile does not fit in shared memory");
  static_assert((2 * kStages + 1) * 8 <= 256, "barrier space");
  static constexpr int kSmem = kFixed + kStages * kStageBytes;
};

struct Params {
  const int32_t* off;
  void* c;     // dw [E, ci, cj]
  double* ss;  // per-tile sums of squares, or null
  int E, nmt, ncol;
  int64_t ci, cj;  // M, K
  int accumulate;
};

struct Tile {
  int e, ksteps;
  int64_t i0, j0, lo, hi;  // j0: column tile index
};

template <int BN, int BK>
__device__ __forceinline__ Tile decode(const Params& p, const int32_t* s_off, int64_t t) {
  Tile x;
  const int64_t per_e = static_cast<int64_t>(p.nmt) * p.ncol;
  x.e = static_cast<int>(t / per_e);
  const int64_t rem = t - x.e * per_e;
  const int mt = static_cast<int>(rem / p.ncol);
  x.i0 = static_cast<int64_t>(mt) * kBM;
  x.j0 = rem - static_cast<int64_t>(mt) * p.ncol;
  x.lo = s_off[x.e];
  x.hi = s_off[x.e + 1];
  x.ksteps = x.hi > x.lo ? static_cast<int>((x.hi - x.lo + BK - 1) / BK) : 0;
  return x;
}

__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* m, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(bar)
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

// Threads 0..127: producer warpgroup (thread 0 issues the copies). 128..383: consumers; consumer
// thread c < 128 owns staging row c for every bulk copy. map_a: dy [N, M], map_b: x [N, K], boxes
// 64 columns x BK rows.
template <int BN, typename DwT, int BK>
__global__ void __launch_bounds__(kThreads, 1)
    gmm_ws_dw_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const Params p) {
#if MT_WGMMA_ENABLED
  using C = Cfg<BN, DwT, BK>;
  constexpr int kS = C::kStages, kNB = 2 + BN / 64;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* out_p = smem_raw + (base - raw) + kS * C::kStageBytes;
  const uint32_t sout = base + kS * C::kStageBytes;
  const uint32_t full0 = sout + C::kOutBytes, empty0 = full0 + 8 * kS, obar = empty0 + 8 * kS;
  int32_t* s_off = reinterpret_cast<int32_t*>(out_p + C::kOffOff);
  double* s_red = reinterpret_cast<double*>(out_p + C::kRedOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= p.E; i += kThreads) s_off[i] = p.off[i];
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(full0 + 8 * s, 1);
      wg::mbar_init(empty0 + 8 * s, 8);
    }
    wg::mbar_init(obar, kBM);
    wg::fence_mbar_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(p.E) * p.nmt * p.ncol, stride = gridDim.x;
  auto seek = [&](int64_t t) {  // first tile at or after t (step = grid) whose expert has rows
    while (t < total && decode<BN, BK>(p, s_off, t).ksteps == 0) t += stride;
    return t;
  };
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
        const Tile x = decode<BN, BK>(p, s_off, t);
        // Boxes wholly past the last column are skipped (their outputs are never stored).
        int na = 0, nb = 0;
        for (int b = 0; b < 2; ++b) na += x.i0 + 64 * b < p.ci;
        for (int b = 0; b < BN / 64; ++b) nb += x.j0 * BN + 64 * b < p.cj;
        const uint32_t bytes = static_cast<uint32_t>((na + nb) * C::kBlock);
        for (int k = 0; k < x.ksteps; ++k) {
          wg::mbar_wait(empty0 + 8 * stage, phase ^ 1u);
          const uint32_t full = full0 + 8 * stage, sa = base + stage * C::kStageBytes;
          const int r = static_cast<int>(x.lo) + k * BK;
          wg::mbar_arrive_tx(full, bytes);
          for (int b = 0; b < na; ++b) tma_2d(sa + b * C::kBlock, &map_a, static_cast<int>(x.i0) + 64 * b, r, full);
          for (int b = 0; b < nb; ++b)
            tma_2d(sa + C::kABytes + b * C::kBlock, &map_b, static_cast<int>(x.j0) * BN + 64 * b, r, full);
          if (++stage == kS) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
    __syncwarp();
    return;
  }
  // ---- consumers ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int ctid = tid - 128, cw = ctid >> 7, lane = tid & 31, warp = ctid >> 5;
  const int frow = (warp >> 2) * 64 + (warp & 3) * 16 + (lane >> 2), fcol = 2 * (lane & 3);
  DwT* const dw = static_cast<DwT*>(p.c);
  auto row_ptr = [&](const Tile& x) { return dw + (x.e * p.ci + x.i0 + ctid) * p.cj + x.j0 * BN; };
  auto row_bytes = [&](const Tile& x) -> uint32_t {
    if (x.i0 + ctid >= p.ci) return 0;
    const int64_t cols = p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN;
    return static_cast<uint32_t>(cols * static_cast<int64_t>(sizeof(DwT)));
  };
  int stage = 0;
  uint32_t phase = 0, ophase = 0;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
    const Tile x = decode<BN, BK>(p, s_off, t);
    if (p.accumulate && ctid < kBM) {  // old dw rows of this tile -> staging tile (overlaps the mainloop)
      wg::bulk_wait_read();            // the previous tile's store has left the staging row
      const uint32_t nb = row_bytes(x);
      if (nb) {
        wg::mbar_arrive_tx(obar, nb);
        wg::bulk_load(sout + ctid * C::kPitch, row_ptr(x), nb, obar);
      } else {
        wg::mbar_arrive(obar);
      }
    }
    int prev = -1;
    for (int k = 0; k < x.ksteps; ++k) {
      wg::mbar_wait(full0 + 8 * stage, phase);
      const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
      const int valid = static_cast<int>(x.hi - x.lo) - k * BK;
      if (valid < BK) {  // rows [valid, BK) of the slab belong to the next expert (or are past N): zero
        const int chunks = kNB * (BK - valid) * 8;
        for (int c = ctid; c < chunks; c += 256) {
          const int blk = c / ((BK - valid) * 8), rr = c - blk * (BK - valid) * 8;
          const uint32_t a = sa + blk * C::kBlock + (valid + (rr >> 3)) * 128 + (rr & 7) * 16;
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
        }
        wg::fence_proxy_async();
        consumers_sync();
      }
      wg::fence_regs(acc);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint64_t da = wg::smem_desc(sa + cw * C::kBlock + kk * 2048, C::kBlock, 1024);
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
      if (++stage == kS) {
        stage = 0;
        phase ^= 1u;
      }
    }
    wg::wgmma_wait<0>();
    wg::fence_regs(acc);
    arrive_lane0(empty0 + 8 * prev, lane);
    // ---- epilogue ----
    if (p.accumulate) {
      wg::mbar_wait(obar, ophase);
      ophase ^= 1u;
    } else {
      if (ctid < kBM) wg::bulk_wait_read();
      consumers_sync();
    }
    double ss = 0.0;
    const int64_t col0 = x.j0 * BN + fcol;
    const bool row_in[2] = {x.i0 + frow < p.ci, x.i0 + frow + 8 < p.ci};
    if constexpr (sizeof(DwT) == 4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned char* rp = out_p + (frow + 8 * h) * C::kPitch;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          float2* q = reinterpret_cast<float2*>(rp + (fcol + 8 * j) * 4);
          float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
          if (p.accumulate) {
            const float2 o = *q;
            v0 = o.x + v0;
            v1 = o.y + v1;
          }
          *q = make_float2(v0, v1);
          if (p.ss && row_in[h] && col0 + 8 * j < p.cj)
            ss += static_cast<double>(v0) * v0 + static_cast<double>(v1) * v1;
        }
      }
    } else {
      const int q = lane >> 3;
      const uint32_t rowaddr =
          sout + ((warp >> 2) * 64 + (warp & 3) * 16 + ((q & 1) << 3) + (lane & 7)) * C::kPitch + (q >> 1) * 16;
#pragma unroll
      for (int j = 0; j < BN / 8; j += 2) {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = acc[4 * j + i];
        if (p.accumulate) {
          uint32_t o[4];
          mma::ldmatrix_x4(o, rowaddr + j * 16);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o[i]));
            v[2 * i] = f.x + v[2 * i];
            v[2 * i + 1] = f.y + v[2 * i + 1];
          }
        }
        const uint32_t w[4] = {mma::pack_bf16(v[0], v[1]), mma::pack_bf16(v[2], v[3]), mma::pack_bf16(v[4], v[5]),
                               mma::pack_bf16(v[6], v[7])};
        wg::stmatrix_x4(rowaddr + j * 16, w[0], w[1], w[2], w[3]);
        if (p.ss) {  // w[i]: row frow + 8 (i & 1), column block j + (i >> 1)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (!row_in[i & 1] || col0 + 8 * (j + (i >> 1)) >= p.cj) continue;
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
            ss += static_cast<double>(f.x) * f.x + static_cast<double>(f.y) * f.y;
          }
        }
      }
    }
    if (p.ss) {
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) s_red[warp] = ss;
    }
    wg::fence_proxy_async();
    consumers_sync();
    if (p.ss && ctid == 0) {  // warp order: deterministic; s_red is next written after a later barrier
      double s = 0.0;
#pragma unroll
      for (int w = 0; w < 8; ++w) s += s_red[w];
      p.ss[t] = s;
    }
    if (ctid < kBM) {
      const uint32_t nb = row_bytes(x);
      if (nb) wg::bulk_store(row_ptr(x), sout + ctid * C::kPitch, nb);
      wg::bulk_commit();
    }
  }
  if (p.ss) {  // tiles of experts without rows: the old dw's squares (+=), or 0
    consumers_sync();  // thread 0 has read s_red for the last tile
    for (int64_t t = blockIdx.x; t < total; t += stride) {
      const Tile x = decode<BN, BK>(p, s_off, t);
      if (x.ksteps) continue;
      double ss = 0.0;
      if (p.accumulate) {
        const DwT* src = dw + (x.e * p.ci + x.i0) * p.cj + x.j0 * BN;
        const int64_t rows = p.ci - x.i0 < kBM ? p.ci - x.i0 : kBM;
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
        double s = 0.0;
#pragma unroll
        for (int w = 0; w < 8; ++w) s += s_red[w];
        p.ss[t] = s;
      }
      consumers_sync();
    }
  }
  if (!p.accumulate) {  // experts with no rows: dw[e] = 0
    const int64_t vecs = p.ci * p.cj * static_cast<int64_t>(sizeof(DwT)) / 16;
    for (int e = 0; e < p.E; ++e) {
      if (s_off[e + 1] > s_off[e]) continue;
      uint4* c = reinterpret_cast<uint4*>(dw + static_cast<int64_t>(e) * p.ci * p.cj);
      for (int64_t v = static_cast<int64_t>(blockIdx.x) * 256 + ctid; v < vecs; v += stride * 256)
        c[v] = make_uint4(0, 0, 0, 0);
    }
  }
  if (ctid < kBM) wg::bulk_wait_all();
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

// x [N, K], dy [N, M]; dw [E, M, K]; per-tile partials of the sum of squares into `partial` (or null).
template <int BN, typename DwT, int BK>
void launch_dw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
               int64_t M, void* dw, bool accumulate, double* partial) {
  using C = Cfg<BN, DwT, BK>;
  Params p{};
  p.off = off;
  p.c = dw;
  p.ss = partial;
  p.E = E;
  p.ci = M;
  p.cj = K;
  p.ncol = static_cast<int>((K + BN - 1) / BN);
  p.nmt = static_cast<int>((M + kBM - 1) / kBM);
  p.accumulate = accumulate ? 1 : 0;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, BK), mb = dw_map(x, N > 0 ? N : 1, K, BK);
  auto kernel = gmm_ws_dw_kernel<BN, DwT, BK>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const int64_t bound = static_cast<int64_t>(E) * p.nmt * p.ncol, sms = dw_sm_count(ctx);
  const int64_t grid = bound < sms ? (bound > 0 ? bound : 1) : sms;
  kernel<<<static_cast<unsigned>(grid), kThreads, C::kSmem, stream_of(ctx)>>>(ma, mb, p);
  check_launch("grouped_matmul_backward");
}

// Per-tile partials of the sum of squares that dispatch_dw writes (size of the `partial` buffer).
inline int64_t dw_tiles(int E, int64_t K, int64_t M, bool dw_bf16) {
  const int bn = dw_bf16 ? 256 : 128;
  return static_cast<int64_t>(E) * ((M + kBM - 1) / kBM) * ((K + bn - 1) / bn);
}
// Same contract as grouped_gemm_wgmma_dw. variant (benchmark knob): 0 = default (measured fastest on
// H100, docs/design/kernels.md: bf16 128x256 tiles with 64-row slabs, 3 stages; f32 128x128 with
// 32-row slabs, 8 stages), 1 = the other slab depth (bf16 32 rows / 6 stages, f32 64 / 4).
inline void dispatch_dw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
                        int64_t M, void* dw, bool dw_bf16, bool accumulate, double* partial, int variant) {
  if (dw_bf16) {
    if (variant == 1) launch_dw<256, bf16, 32>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<256, bf16, 64>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  } else {
    if (variant == 1) launch_dw<128, float, 64>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
    else launch_dw<128, float, 32>(ctx, x, dy, off, E, N, K, M, dw, accumulate, partial);
  }
}

}  // namespace moetrain::cuda::gwd
