// Hopper expert dW GEMM with AdamW in its epilogue: g[e] = dy_e^T x_e (+ prior), rounded to the grad
// dtype, then the AdamW update of master / m / v (/ compute copy) from g, without writing g. Same
// TMA + wgmma mainloop and the same staged, rounded tile as grouped_gemm_ws_dw.cuh (so g and the
// per-tile sums of squares have its bits); the 256 consumer threads then walk the staged tile
// row-major in 16-byte vectors, bit-identical to dispatch_dw followed by adamw_kernel.
#pragma once
#include <cuda.h>

#include <type_traits>

#include "kernels/adamw_math.h"
#include "kernels/cuda/adamw_kernel.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw.cuh"

namespace moetrain::cuda::gwd {

// What dispatch_dw_adamw updates. Every tensor is [E, M, K] row-major and 16-byte aligned.
//   master:   the weights, f32 or bf16, read and written (may be the bf16 expert weight the dx GEMM
//             read earlier on the same stream).
//   m, v:     AdamW moments, f32 or bf16 each (stored with round to nearest even).
//   compute:  optional copy receiving the stored new weight (bf16 only), or null.
//   grad_bf16: the dtype g is rounded to (what dispatch_dw's dw_bf16 would store).
//   prior:    optional gradient of earlier micro-batches (grad dtype), only read: g = prior + dy^T x
//             formed in f32, rounded once (dispatch_dw's accumulate). Null: g = dy^T x.
//   k, sr, key, counter: as ops::adamw_step (adamw_math::Consts; bf16 master: stochastic rounding
//             with adamw_math::random_word(key, counter, i) for flat element index i, or RNE).
// Supported (else dispatch_dw_adamw returns false): {grad, master, m, v} all bf16; all f32; grad
// bf16 with f32 master/m/v; compute null or bf16 in each.
struct DwAdamWArgs {
  void* master = nullptr;
  bool master_bf16 = false;
  void* m = nullptr;
  bool m_bf16 = false;
  void* v = nullptr;
  bool v_bf16 = false;
  void* compute = nullptr;
  bool compute_bf16 = true;
  bool grad_bf16 = false;
  const void* prior = nullptr;
  adamw_math::Consts k{};
  bool sr = false;
  uint64_t key = 0, counter = 0;
};

// Device-side view of DwAdamWArgs (storage: float, or uint16_t holding bf16 bits).
struct AdamWParams {
  void *w, *m, *v;
  uint16_t* comp;
  adamw_math::Consts k;
  uint64_t key, counter;
  int sr;
  int prefetch;  // 0: none; 1: consumer thread 0 prefetches the tile's w/m/v into L2 as its mainloop
                 // starts; 2: the producer does, when it starts the tile's copies (runs ahead)
};

namespace dwa {

namespace ad = adamw_detail;
namespace am = adamw_math;

// New m, v, w of 8 consecutive elements from flat index i0 (a multiple of 8): the vector body of
// adamw_kernel, the same operations in the same order.
template <typename W, typename MT, typename VT>
__device__ __forceinline__ void apply8(const AdamWParams& a, int64_t i0, const float (&g)[8], float (&w)[8],
                                       float (&m)[8], float (&v)[8]) {
  uint32_t rnd[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (std::is_same_v<W, uint16_t> && a.sr) {
    const Philox4 r = philox4x32(a.key, a.counter, static_cast<uint64_t>(i0) >> 3);
#pragma unroll
    for (int j = 0; j < 8; ++j) rnd[j] = am::random_half(r, j);
  }
  uint16_t wb[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    am::update(a.k, g[j], m[j], v[j], w[j]);
    if constexpr (std::is_same_v<W, uint16_t>) {
      wb[j] = a.sr ? am::bf16_stochastic(w[j], rnd[j]) : am::bf16_rne(w[j]);
      w[j] = am::bf16_to_f32(wb[j]);
    }
  }
  ad::store8(static_cast<MT*>(a.m) + i0, m);
  ad::store8(static_cast<VT*>(a.v) + i0, v);
  if constexpr (std::is_same_v<W, uint16_t>) ad::store8_bits(static_cast<W*>(a.w) + i0, wb);
  else ad::store8(static_cast<W*>(a.w) + i0, w);
  if (a.comp) ad::store8(a.comp + i0, w);
}

// 8 consecutive stored elements as raw 16-byte words (1 for bf16 bits, 2 for f32): the walk keeps
// these in flight (fewer registers than widened floats), then widens them exactly as ad::load8.
template <typename T>
struct Raw8 {
  uint4 q[sizeof(T) / 2];
};
template <typename T>
__device__ __forceinline__ Raw8<T> ld8(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); ++i) r.q[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}
template <typename T>
__device__ __forceinline__ void widen8(const Raw8<T>& r, float (&x)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint32_t w[4] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[2 * j] = am::bits_float(w[j] << 16);
      x[2 * j + 1] = am::bits_float(w[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      x[4 * i] = am::bits_float(r.q[i].x);
      x[4 * i + 1] = am::bits_float(r.q[i].y);
      x[4 * i + 2] = am::bits_float(r.q[i].z);
      x[4 * i + 3] = am::bits_float(r.q[i].w);
    }
  }
}

__device__ __forceinline__ void prefetch_2d(const CUtensorMap* m, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(m)),
               "r"(c0), "r"(c1)
               : "memory");
}

// Storage type of the staged g tile: bf16 bits or float.
template <typename GT>
using GStore = std::conditional_t<std::is_same_v<GT, float>, float, uint16_t>;

// AdamW of up to U 8-element vectors idx = first + step * u of a staged g tile (row-major, BN / 8
// vectors per staged row of kPitch bytes; rows x nvr of them are real): all global loads first.
template <int BN, typename GT, int kPitch, typename W, typename MT, typename VT, int U>
__device__ __forceinline__ void walk(const AdamWParams& a, const unsigned char* tile, int64_t gbase, int64_t cj,
                                     int rows, int nvr, int first, int step) {
  constexpr int kVR = BN / 8;
  using GS = GStore<GT>;
  const int nvec = rows * kVR;
  Raw8<W> wr[U];
  Raw8<MT> mr[U];
  Raw8<VT> vr[U];
  bool ok[U];
  int64_t gi[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int idx = first + step * u, c = idx % kVR;
    ok[u] = idx < nvec && c < nvr;
    gi[u] = gbase + static_cast<int64_t>(idx / kVR) * cj + c * 8;
    if (ok[u]) {
      wr[u] = ld8(static_cast<const W*>(a.w) + gi[u]);
      mr[u] = ld8(static_cast<const MT*>(a.m) + gi[u]);
      vr[u] = ld8(static_cast<const VT*>(a.v) + gi[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (!ok[u]) continue;
    const int idx = first + step * u;
    float gf[8], wf[8], mf[8], vf[8];
    widen8(ld8(reinterpret_cast<const GS*>(tile + (idx / kVR) * kPitch) + (idx % kVR) * 8), gf);
    widen8(wr[u], wf);
    widen8(mr[u], mf);
    widen8(vr[u], vf);
    apply8<W, MT, VT>(a, gi[u], gf, wf, mf, vf);
  }
}

// Threads 0..127: producer warpgroup (thread 0 issues the copies); 128..383: consumers, as
// gmm_ws_dw_kernel. map_w / map_m / map_v: [E*M, K] views of master / m / v, box BN x 128, used
// only for L2 prefetches. U: vectors per thread in flight in the AdamW walk.
template <int BN, typename GT, int BK, typename W, typename MT, typename VT, int U>
__global__ void __launch_bounds__(kThreads, 1)
    gmm_ws_dw_adamw_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_m,
                           const __grid_constant__ CUtensorMap map_v, const Params p, const AdamWParams a) {
#if MT_WGMMA_ENABLED
  using C = Cfg<BN, GT, BK>;
  using GS = GStore<GT>;
  constexpr int kS = C::kStages, kNB = 2 + BN / 64, kVR = BN / 8;
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
  auto seek = [&](int64_t t) {
    while (t < total && decode<BN, BK>(p, s_off, t).ksteps == 0) t += stride;
    return t;
  };
  auto prefetch_tile = [&](const Tile& x) {
    const int c0 = static_cast<int>(x.j0) * BN, c1 = static_cast<int>(x.e * p.ci + x.i0);
    prefetch_2d(&map_w, c0, c1);
    prefetch_2d(&map_m, c0, c1);
    prefetch_2d(&map_v, c0, c1);
  };
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {  // ---- producer ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
        const Tile x = decode<BN, BK>(p, s_off, t);
        if (a.prefetch == 2) prefetch_tile(x);
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
  const GT* const prior = static_cast<const GT*>(p.c);
  auto row_bytes = [&](const Tile& x) -> uint32_t {
    if (x.i0 + ctid >= p.ci) return 0;
    const int64_t cols = p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN;
    return static_cast<uint32_t>(cols * static_cast<int64_t>(sizeof(GT)));
  };
  int stage = 0;
  uint32_t phase = 0, ophase = 0;
  float acc[BN / 2];
  for (int64_t t = seek(blockIdx.x); t < total; t = seek(t + stride)) {
    const Tile x = decode<BN, BK>(p, s_off, t);
    if (p.accumulate && ctid < kBM) {  // prior rows of this tile -> staging tile (overlaps the mainloop)
      const uint32_t nb = row_bytes(x);
      if (nb) {
        wg::mbar_arrive_tx(obar, nb);
        wg::bulk_load(sout + ctid * C::kPitch, prior + (x.e * p.ci + x.i0 + ctid) * p.cj + x.j0 * BN, nb, obar);
      } else {
        wg::mbar_arrive(obar);
      }
    }
    if (a.prefetch == 1 && ctid == 0) prefetch_tile(x);
    // Zeroed per tile (the first wgmma ignores them) so that they are dead during the AdamW walk.
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    int prev = -1;
    for (int k = 0; k < x.ksteps; ++k) {
      wg::mbar_wait(full0 + 8 * stage, phase);
      const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
      const int valid = static_cast<int>(x.hi - x.lo) - k * BK;
      if (valid < BK) {  // rows [valid, BK) of the slab belong to the next expert (or are past N): zero
        const int chunks = kNB * (BK - valid) * 8;
        for (int c = ctid; c < chunks; c += 256) {
          const int blk = c / ((BK - valid) * 8), rr = c - blk * (BK - valid) * 8;
          const uint32_t ad = sa + blk * C::kBlock + (valid + (rr >> 3)) * 128 + (rr & 7) * 16;
          asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(ad), "r"(0) : "memory");
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
    // ---- stage g (rounded to the grad dtype) and its sum of squares, as gmm_ws_dw_kernel ----
    if (p.accumulate) {
      wg::mbar_wait(obar, ophase);
      ophase ^= 1u;
    }
    double ss = 0.0;
    const int64_t col0 = x.j0 * BN + fcol;
    const bool row_in[2] = {x.i0 + frow < p.ci, x.i0 + frow + 8 < p.ci};
    if constexpr (sizeof(GT) == 4) {
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
        if (p.ss) {
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
    consumers_sync();
    if (p.ss && ctid == 0) {  // warp order: deterministic; s_red is next written after the walk's barrier
      double s = 0.0;
#pragma unroll
      for (int w = 0; w < 8; ++w) s += s_red[w];
      p.ss[t] = s;
    }
    // ---- AdamW over the staged tile: row-major 8-element vectors, U per thread in flight ----
    const int rows = static_cast<int>(p.ci - x.i0 < kBM ? p.ci - x.i0 : kBM);
    const int nvr = static_cast<int>((p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN) / 8);
    const int64_t gbase = (x.e * p.ci + x.i0) * p.cj + x.j0 * BN;
    for (int b = ctid; b < rows * kVR; b += 256 * U)
      walk<BN, GT, C::kPitch, W, MT, VT, U>(a, out_p, gbase, p.cj, rows, nvr, b, 256);
    wg::fence_proxy_async();  // staging reads above, before the next tile's bulk load into it
    consumers_sync();
  }
  // ---- experts without rows: g = prior (or 0); sums of squares as gmm_ws_dw_kernel ----
  if (p.ss) {
    for (int64_t t = blockIdx.x; t < total; t += stride) {
      const Tile x = decode<BN, BK>(p, s_off, t);
      if (x.ksteps) continue;
      double ss = 0.0;
      if (p.accumulate) {
        const GT* src = prior + (x.e * p.ci + x.i0) * p.cj + x.j0 * BN;
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
  const int64_t vecs = p.ci * p.cj / 8;
  for (int e = 0; e < p.E; ++e) {
    if (s_off[e + 1] > s_off[e]) continue;
    const int64_t e0 = static_cast<int64_t>(e) * p.ci * p.cj;
    for (int64_t vi = static_cast<int64_t>(blockIdx.x) * 256 + ctid; vi < vecs; vi += stride * 256) {
      const int64_t i0 = e0 + vi * 8;
      float gf[8], wf[8], mf[8], vf[8];
      if (p.accumulate) {
        ad::load8(reinterpret_cast<const GS*>(prior) + i0, gf);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) gf[j] = 0.0f;
      }
      ad::load8(static_cast<const W*>(a.w) + i0, wf);
      ad::load8(static_cast<const MT*>(a.m) + i0, mf);
      ad::load8(static_cast<const VT*>(a.v) + i0, vf);
      apply8<W, MT, VT>(a, i0, gf, wf, mf, vf);
    }
  }
#endif
}

// [rows, cols] f32 or bf16 row-major, box `box_cols` x 128 rows, no swizzle (L2 prefetch only).
inline CUtensorMap prefetch_map(const void* ptr, int64_t rows, int64_t cols, bool is_bf16, int box_cols) {
  CUtensorMap m;
  const int es = is_bf16 ? 2 : 4;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * es};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(kBM)}, estr[2] = {1, 1};
  const CUresult r = dw_encoder()(&m, is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                                  const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MT_CHECK(r == CUDA_SUCCESS, "[grouped_gemm_ws] cuTensorMapEncodeTiled (prefetch map) failed with error {}",
           static_cast<int>(r));
  return m;
}

template <int BN, typename GT, int BK, typename W, typename MT, typename VT, int U>
void launch(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
            const DwAdamWArgs& args, double* partial, int prefetch) {
  using C = Cfg<BN, GT, BK>;
  Params p{};
  p.off = off;
  p.c = const_cast<void*>(args.prior);
  p.ss = partial;
  p.E = E;
  p.ci = M;
  p.cj = K;
  p.ncol = static_cast<int>((K + BN - 1) / BN);
  p.nmt = static_cast<int>((M + kBM - 1) / kBM);
  p.accumulate = args.prior ? 1 : 0;
  AdamWParams a{};
  a.w = args.master;
  a.m = args.m;
  a.v = args.v;
  a.comp = static_cast<uint16_t*>(args.compute);
  a.k = args.k;
  a.key = args.key;
  a.counter = args.counter;
  a.sr = args.sr ? 1 : 0;
  a.prefetch = prefetch;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, BK), mb = dw_map(x, N > 0 ? N : 1, K, BK);
  const int64_t rows = static_cast<int64_t>(E) * M;
  const CUtensorMap mw = prefetch_map(args.master, rows, K, std::is_same_v<W, uint16_t>, BN);
  const CUtensorMap mm = prefetch_map(args.m, rows, K, std::is_same_v<MT, uint16_t>, BN);
  const CUtensorMap mv = prefetch_map(args.v, rows, K, std::is_same_v<VT, uint16_t>, BN);
  auto kernel = gmm_ws_dw_adamw_kernel<BN, GT, BK, W, MT, VT, U>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const int64_t sms = dw_sm_count(ctx);
  kernel<<<static_cast<unsigned>(sms), kThreads, C::kSmem, stream_of(ctx)>>>(ma, mb, mw, mm, mv, p, a);
  check_launch("grouped_matmul_backward_adamw");
}

inline bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

}  // namespace dwa

// Size of the per-tile sum-of-squares buffer dispatch_dw_adamw writes (dispatch_dw's tiling).
inline int64_t dw_adamw_tiles(int E, int64_t K, int64_t M, bool grad_bf16) { return dw_tiles(E, K, M, grad_bf16); }

// Whether dispatch_dw_adamw takes this problem (else the caller runs dispatch_dw + adamw).
inline bool dw_adamw_supported(const Context& ctx, int E, int64_t N, int64_t K, int64_t M, const DwAdamWArgs& a) {
  const bool all_bf16 = a.grad_bf16 && a.master_bf16 && a.m_bf16 && a.v_bf16;
  const bool all_f32 = !a.master_bf16 && !a.m_bf16 && !a.v_bf16;  // grad f32 or bf16
  return ctx.facts().cc_major == 9 && ctx.facts().cc_minor == 0 && (all_bf16 || all_f32) &&
         (a.compute == nullptr || a.compute_bf16) && E >= 1 && E <= kMaxE && N >= 0 && N < (int64_t(1) << 31) &&
         K > 0 && M > 0 && K % 8 == 0 && M % 8 == 0 && static_cast<int64_t>(E) * M < (int64_t(1) << 31) &&
         a.master && a.m && a.v && dwa::aligned16(a.master) && dwa::aligned16(a.m) && dwa::aligned16(a.v) &&
         dwa::aligned16(a.compute) && dwa::aligned16(a.prior);
}

// dW of the experts (as dispatch_dw: x [N, K], dy [N, M], offsets [E+1] on the device) and the AdamW
// update of the [E, M, K] expert tensors from it, bit-identical to dispatch_dw(..., grad, grad_bf16,
// prior != null, partial, 0) followed by adamw_kernel over the stored grad. partial (or null): per-tile
// fp64 sums of squares of the stored-dtype g, dw_adamw_tiles entries, the same values as dispatch_dw's.
// Returns false (launching nothing) when dw_adamw_supported is false. variant (benchmark knob): L2
// prefetch mode (0 none, the fastest measured; 1 consumer, 2 producer) + 4 x the other walk depth
// (default: 2 vectors per thread in flight, measured fastest on H100; other: 4 for all-bf16, 1 for f32).
inline bool dispatch_dw_adamw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N,
                              int64_t K, int64_t M, const DwAdamWArgs& a, double* partial, int variant = 0) {
  if (!dw_adamw_supported(ctx, E, N, K, M, a)) return false;
  const int pf = variant & 3, alt = (variant >> 2) & 1;
  using u16 = uint16_t;
  if (a.grad_bf16 && a.master_bf16) {
    if (alt) dwa::launch<256, bf16, 64, u16, u16, u16, 4>(ctx, x, dy, off, E, N, K, M, a, partial, pf);
    else dwa::launch<256, bf16, 64, u16, u16, u16, 2>(ctx, x, dy, off, E, N, K, M, a, partial, pf);
  } else if (a.grad_bf16) {
    dwa::launch<256, bf16, 64, float, float, float, 2>(ctx, x, dy, off, E, N, K, M, a, partial, pf);
  } else {
    if (alt) dwa::launch<128, float, 32, float, float, float, 1>(ctx, x, dy, off, E, N, K, M, a, partial, pf);
    else dwa::launch<128, float, 32, float, float, float, 2>(ctx, x, dy, off, E, N, K, M, a, partial, pf);
  }
  return true;
}

}  // namespace moetrain::cuda::gwd
