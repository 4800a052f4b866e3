// Hopper expert dW GEMM with AdamW in its epilogue: g[e] = dy_e^T x_e (+ prior), rounded to the grad
// dtype, then the AdamW update of master / m / v (/ compute copy) from g, without writing g. It is
// gmm_ws_dw_kernel (grouped_gemm_ws_dw.cuh: same mainloop, staged tile and sums of squares) with the
// AdamWEpilogue policy: the 256 consumer threads walk the staged tile row-major in 16-byte vectors,
// bit-identical to dispatch_dw followed by adamw_kernel.
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
};

namespace dwa {

namespace ad = adamw_detail;
namespace am = adamw_math;

// The walk touches each w, m, v word once (read, then written): its global loads and stores carry the
// streaming hint (.cs: evict first in L1 and L2), so that the 12 bytes per parameter passing through
// L2 push out fewer of the dy / x slabs that the mainloop's TMA loads re-read across column tiles.
__device__ __forceinline__ void st16s(void* p, const uint4& u) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w));
}
__device__ __forceinline__ void store8s(float* p, const float (&x)[8]) {
  st16s(p, make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3])));
  st16s(p + 4, make_uint4(__float_as_uint(x[4]), __float_as_uint(x[5]), __float_as_uint(x[6]), __float_as_uint(x[7])));
}
__device__ __forceinline__ void store8s(uint16_t* p, const float (&x)[8]) { st16s(p, ad::narrow8_bits(x)); }

// New m, v, w of 8 consecutive elements from flat index i0 (a multiple of 8): the vector body of
// adamw_kernel, the same operations in the same order. kFast: am::update8's kFastWalk (the launch
// checked am::fast_walk_ok). kZeros: am::update8's fast path for exact zeros
// and tiny first moments (the experts without rows, whose moments are often 0 or decayed).
template <typename W, typename MT, typename VT, bool kZeros = false, bool kFast = false>
__device__ __forceinline__ void apply8(const AdamWParams& a, int64_t i0, const float (&g)[8], float (&w)[8],
                                       float (&m)[8], float (&v)[8]) {
  am::update8<kZeros, kFast>(a.k, g, m, v, w);
  store8s(static_cast<MT*>(a.m) + i0, m);
  store8s(static_cast<VT*>(a.v) + i0, v);
  if constexpr (std::is_same_v<W, uint16_t>) {
    const uint4 b = ad::round8_bits(w, a.sr != 0, a.key, a.counter, i0);  // two weights a word
    st16s(static_cast<W*>(a.w) + i0, b);
    if (a.comp) {
      ad::widen8_bits(b, w);
      store8s(a.comp + i0, w);
    }
  } else {
    store8s(static_cast<W*>(a.w) + i0, w);
    if (a.comp) store8s(a.comp + i0, w);
  }
}

// Whether a vector of an expert without rows wants apply8's kZeros path: an exact 0 or a first moment
// so small that m / bc1 could leave div_fast's range (|m| < 2^-61; with g = 0 the new |m / bc1| is at
// least 0.9 |m|), or a second moment near sqrt_fast's lower end (v < 2^-98). kZeros' selects cost
// about 12 instructions an element, so an idle expert that has had rows before (ordinary moments)
// takes the cheaper path. Both paths give update()'s bits (update8), so this only picks the faster
// one; an element either misjudges is redone exactly by update8's own range tests.
__device__ __forceinline__ bool wants_zeros(const float (&m)[8], const float (&v)[8]) {
  bool quiet = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) quiet |= !(v[j] >= 0x1p-98f) | (fabsf(m[j]) < 0x1p-61f);
  return quiet;
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
// The same from global memory with the streaming hint (ld.global.cs).
template <typename T>
__device__ __forceinline__ Raw8<T> ld8g(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); ++i) r.q[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
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

// Storage type of the staged g tile: bf16 bits or float.
template <typename GT>
using GStore = std::conditional_t<std::is_same_v<GT, float>, float, uint16_t>;

// Where a tile's walk goes: 8-element vectors idx = 0 .. nvec - 1 of the staged tile, row-major,
// BN / 8 per staged row, of which the first nvr are real columns; vector idx updates the elements
// from gbase + (idx / (BN / 8)) * cj + (idx % (BN / 8)) * 8.
struct WalkGeom {
  int64_t gbase, cj;
  int nvec, nvr;
};
template <int BN>
__device__ __forceinline__ WalkGeom walk_geom(const Params& p, const Tile& x) {
  const int rows = static_cast<int>(p.ci - x.i0 < kBM ? p.ci - x.i0 : kBM);
  const int nvr = static_cast<int>((p.cj - x.j0 * BN < BN ? p.cj - x.j0 * BN : BN) / 8);
  return {(x.e * p.ci + x.i0) * p.cj + x.j0 * BN, p.cj, rows * (BN / 8), nvr};
}

// The raw w, m, v words of U vectors (first + 256 u) a consumer thread loads ahead of their g.
template <typename W, typename MT, typename VT, int U>
struct Batch {
  Raw8<W> w[U];
  Raw8<MT> m[U];
  Raw8<VT> v[U];
};

// Vector first + 256 u sits 256 / (BN / 8) staged rows below vector first, in the same column: one
// column test and one base offset serve a batch (first >= 0, so the divisions are unsigned shifts).
template <int BN>
struct BatchAt {
  static constexpr int kVR = BN / 8, kRowStep = 256 / kVR;
  static_assert(256 % kVR == 0, "a batch's vectors share a column");
  int row, col;  // of vector first
  __device__ __forceinline__ explicit BatchAt(int first)
      : row(static_cast<int>(static_cast<unsigned>(first) / kVR)),
        col(static_cast<int>(static_cast<unsigned>(first) % kVR)) {}
  __device__ __forceinline__ int64_t elem(const WalkGeom& g) const {
    return g.gbase + static_cast<int64_t>(row) * g.cj + col * 8;
  }
};

template <int BN, typename W, typename MT, typename VT, int U>
__device__ __forceinline__ void fetch_batch(const AdamWParams& a, const WalkGeom& g, int first, Batch<W, MT, VT, U>& q) {
  const BatchAt<BN> at(first);
  if (at.col >= g.nvr) return;
  const int64_t base = at.elem(g), step = static_cast<int64_t>(BatchAt<BN>::kRowStep) * g.cj;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (first + 256 * u < g.nvec) {
      const int64_t gi = base + u * step;
      q.w[u] = ld8g(static_cast<const W*>(a.w) + gi);
      q.m[u] = ld8g(static_cast<const MT*>(a.m) + gi);
      q.v[u] = ld8g(static_cast<const VT*>(a.v) + gi);
    }
  }
}

// AdamW of the batch's vectors from their staged g (the tile row-major at kPitch bytes per row).
template <int BN, typename GT, int kPitch, typename W, typename MT, typename VT, int U, bool kFast = false>
__device__ __forceinline__ void apply_batch(const AdamWParams& a, const unsigned char* tile, const WalkGeom& g,
                                            int first, const Batch<W, MT, VT, U>& q) {
  using GS = GStore<GT>;
  const BatchAt<BN> at(first);
  if (at.col >= g.nvr) return;
  const int64_t base = at.elem(g), step = static_cast<int64_t>(BatchAt<BN>::kRowStep) * g.cj;
  const GS* gs = reinterpret_cast<const GS*>(tile + at.row * kPitch) + at.col * 8;
  static_assert(kPitch % sizeof(GS) == 0, "staged rows hold whole elements");
  constexpr int kGStep = BatchAt<BN>::kRowStep * kPitch / static_cast<int>(sizeof(GS));
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (first + 256 * u >= g.nvec) continue;
    float gf[8], wf[8], mf[8], vf[8];
    widen8(ld8(gs + u * kGStep), gf);
    widen8(q.w[u], wf);
    widen8(q.m[u], mf);
    widen8(q.v[u], vf);
    apply8<W, MT, VT, false, kFast>(a, base + u * step, gf, wf, mf, vf);
  }
}

// Epilogue policy of dispatch_dw_adamw (gmm_ws_dw_kernel): the consumers walk each staged g tile,
// nothing is stored; experts without rows get the update from g = prior (or 0). Each consumer
// thread keeps U vectors' w, m, v loads in flight ahead of the ones it updates: the first batch is
// fetched around the mainloop (before it when kEarly), each next one before the current is applied.
template <typename W, typename MT, typename VT, int U, bool Early = false, bool Fast = false>
struct AdamWEpilogue {
  // kWalkEmpty with bf16 state only: with f32 state the extra per-tile path made the whole kernel
  // 1.85x slower on the H100 (gate_up 4.15 -> 7.71 ms, not understood yet), so f32 keeps the tail.
  static constexpr bool kStore = false, kWalk = true, kEarly = Early, kWalkEmpty = sizeof(W) == 2;
  using Pending = Batch<W, MT, VT, U>;
  AdamWParams a;
  template <int BN>
  __device__ void fetch(const Params& p, const Tile& x, int ctid, Pending& q) const {
    fetch_batch<BN, W, MT, VT, U>(a, walk_geom<BN>(p, x), ctid, q);
  }
  template <int BN, typename GT, int kPitch>
  __device__ void walk(const Params& p, const Tile& x, const unsigned char* tile, int ctid, Pending& q) const {
    const WalkGeom g = walk_geom<BN>(p, x);
#pragma unroll 1
    for (int b = ctid; b < g.nvec; b += 256 * U) {
      Pending next;
      if (b + 256 * U < g.nvec) fetch_batch<BN, W, MT, VT, U>(a, g, b + 256 * U, next);
      apply_batch<BN, GT, kPitch, W, MT, VT, U, Fast>(a, tile, g, b, q);
      q = next;
    }
  }
  // A tile of an expert without rows (an untrained router leaves half of them idle in deeper
  // layers): g = prior or 0, the same vectors and order as walk(), U vectors' loads in flight. The
  // consumers visit these tiles in their own tile sequence (kWalkEmpty), which spreads them evenly.
  // q: the tile's first w, m, v batch when `ahead` (the previous idle tile fetched it), else fetched
  // here. nxt: the consumer's next tile; when it is idle too (has_next), its first batch is fetched
  // during this tile's last batch, into q, and the return value says so. That keeps loads in flight
  // across a run of idle tiles instead of waiting for each tile's first batch.
  template <int BN, typename GT>
  __device__ __forceinline__ bool walk_empty(const Params& p, const Tile& x, int ctid, Pending& q, bool ahead,
                                             bool has_next, const Tile nxt) const {
    using GS = GStore<GT>;
    constexpr int kVR = BN / 8;
    const WalkGeom g = walk_geom<BN>(p, x);
    const GS* prior = p.accumulate ? static_cast<const GS*>(p.c) : nullptr;
    // (idx >= 0: unsigned divisions are shifts)
    auto in = [&](int idx) { return idx < g.nvec && static_cast<int>(static_cast<unsigned>(idx) % kVR) < g.nvr; };
    auto at = [&](int idx) {
      const unsigned u = static_cast<unsigned>(idx);
      return g.gbase + static_cast<int64_t>(u / kVR) * g.cj + static_cast<int64_t>(u % kVR) * 8;
    };
    auto fetch_prior = [&](int first, Raw8<GS> (&r)[U]) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (prior && in(first + 256 * u)) r[u] = ld8g(prior + at(first + 256 * u));
    };
    Raw8<GS> pc[U];
    if (!ahead) fetch_batch<BN, W, MT, VT, U>(a, g, ctid, q);
    fetch_prior(ctid, pc);
    // One path for the whole tile, chosen by a warp vote on each thread's first vector: an expert's
    // moments are alike across its tile (all zero before its first row, then ordinary, decaying
    // together while it stays idle), and a vote per vector cost about 2 instructions an element.
    // Lanes that disagree would otherwise run both paths, slower than the selects alone.
    bool zeros = false;
    if (in(ctid)) {
      float mf[8], vf[8];
      widen8(q.m[0], mf);
      widen8(q.v[0], vf);
      zeros = wants_zeros(mf, vf);
    }
    zeros = __any_sync(__activemask(), zeros);
    bool next_ahead = false;
#pragma unroll 1
    for (int b = ctid; b < g.nvec; b += 256 * U) {
      Pending next;
      Raw8<GS> pn[U];
      if (b + 256 * U < g.nvec) {
        fetch_batch<BN, W, MT, VT, U>(a, g, b + 256 * U, next);
        fetch_prior(b + 256 * U, pn);
      } else if (has_next) {
        fetch_batch<BN, W, MT, VT, U>(a, walk_geom<BN>(p, nxt), ctid, next);
        next_ahead = true;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int idx = b + 256 * u;
        if (!in(idx)) continue;
        float gf[8], wf[8], mf[8], vf[8];
        if (prior) {
          widen8(pc[u], gf);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) gf[j] = 0.0f;
        }
        widen8(q.w[u], wf);
        widen8(q.m[u], mf);
        widen8(q.v[u], vf);
        if (zeros) apply8<W, MT, VT, true>(a, at(idx), gf, wf, mf, vf);
        else apply8<W, MT, VT, false, Fast>(a, at(idx), gf, wf, mf, vf);
      }
      q = next;
#pragma unroll
      for (int u = 0; u < U; ++u) pc[u] = pn[u];
    }
    return next_ahead;
  }
  // Experts without rows when !kWalkEmpty (f32 state): after the main loop, every CTA takes a
  // grid-strided share of each one's vectors, U of them in flight ahead of the ones being updated.
  template <typename GT>
  __device__ void empty_experts(const Params& p, const int32_t* s_off, int ctid) const {
    if constexpr (kWalkEmpty) return;  // walk_empty did them
    using GS = GStore<GT>;
    struct Flat {
      Raw8<W> w[U];
      Raw8<MT> m[U];
      Raw8<VT> v[U];
      Raw8<GS> g[U];
    };
    const int64_t vecs = p.ci * p.cj / 8, stride = gridDim.x * 256ll;
    const GS* prior = p.accumulate ? static_cast<const GS*>(p.c) : nullptr;
    auto fetch = [&](int64_t e0, int64_t vi, Flat& q) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (vi + u * stride >= vecs) continue;
        const int64_t i0 = e0 + (vi + u * stride) * 8;
        q.w[u] = ld8g(static_cast<const W*>(a.w) + i0);
        q.m[u] = ld8g(static_cast<const MT*>(a.m) + i0);
        q.v[u] = ld8g(static_cast<const VT*>(a.v) + i0);
        if (prior) q.g[u] = ld8g(prior + i0);
      }
    };
    for (int e = 0; e < p.E; ++e) {
      if (s_off[e + 1] > s_off[e]) continue;
      const int64_t e0 = static_cast<int64_t>(e) * p.ci * p.cj;
      const int64_t first = static_cast<int64_t>(blockIdx.x) * 256 + ctid;
      Flat cur;
      fetch(e0, first, cur);
#pragma unroll 1
      for (int64_t vi = first; vi < vecs; vi += U * stride) {
        Flat next;
        if (vi + U * stride < vecs) fetch(e0, vi + U * stride, next);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (vi + u * stride >= vecs) continue;
          float gf[8], wf[8], mf[8], vf[8];
          if (prior) {
            widen8(cur.g[u], gf);
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) gf[j] = 0.0f;
          }
          widen8(cur.w[u], wf);
          widen8(cur.m[u], mf);
          widen8(cur.v[u], vf);
          apply8<W, MT, VT, true>(a, e0 + (vi + u * stride) * 8, gf, wf, mf, vf);
        }
        cur = next;
      }
    }
  }
};

template <int BN, typename GT, int BK, typename W, typename MT, typename VT, int U, bool Early = false,
          bool Fast = false>
void launch(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
            const DwAdamWArgs& args, double* partial) {
  const Params p = dw_params<BN>(off, E, K, M, const_cast<void*>(args.prior), args.prior != nullptr, partial);
  AdamWEpilogue<W, MT, VT, U, Early, Fast> epi{};
  epi.a.w = args.master;
  epi.a.m = args.m;
  epi.a.v = args.v;
  epi.a.comp = static_cast<uint16_t*>(args.compute);
  epi.a.k = args.k;
  epi.a.key = args.key;
  epi.a.counter = args.counter;
  epi.a.sr = args.sr ? 1 : 0;
  // every CTA takes part in the updates of experts without rows, so the grid is never cut to the tiles
  launch_dw_kernel<BN, GT, BK>(ctx, x, dy, N, K, M, p, epi, dw_sm_count(ctx), "grouped_matmul_backward_adamw");
}

inline bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

}  // namespace dwa

// Size of the per-tile sum-of-squares buffer dispatch_dw_adamw writes (its tiles: 256 wide for a bf16
// g, 128 for f32).
inline int64_t dw_adamw_tiles(int E, int64_t K, int64_t M, bool grad_bf16) { return dw_tiles(E, K, M, grad_bf16 ? 256 : 128); }

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
// fp64 sums of squares of the stored-dtype g, dw_adamw_tiles entries: dispatch_dw's values where it tiles
// alike (a bf16 g, or an f32 g with a prior); an f32 g written, dispatch_dw sums per 128 x 256 tile.
// Returns false (launching nothing) when dw_adamw_supported is false. variant (benchmark knob): bit 2
// (4) = the other walk depth (default: 2 vectors per thread in flight, measured fastest on H100;
// other: 4 for all-bf16, 1 for f32); bit 3 (8) = fetch a tile's first w, m, v after its mainloop
// instead of before it (measured 2-4% slower); bit 4 (16) = the full range tests of the divide even
// where adamw_math::fast_walk_ok allows the shorter ones and g unscaled (kFastWalk, the default walk
// of all-bf16 state; with f32 state it spilled 60 bytes; bits 2 and 3 run the full tests too, having no
// fast instantiation). Bits 0-1 (removed L2 prefetch modes) are ignored.
inline bool dispatch_dw_adamw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N,
                              int64_t K, int64_t M, const DwAdamWArgs& a, double* partial, int variant = 0) {
  if (!dw_adamw_supported(ctx, E, N, K, M, a)) return false;
  const int alt = (variant >> 2) & 1, early = !((variant >> 3) & 1);
  const bool fast = !((variant >> 4) & 1) && adamw_math::fast_walk_ok(a.k);
  using u16 = uint16_t;
  if (a.grad_bf16 && a.master_bf16) {
    if (alt && early) dwa::launch<256, bf16, 64, u16, u16, u16, 4, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else if (alt) dwa::launch<256, bf16, 64, u16, u16, u16, 4>(ctx, x, dy, off, E, N, K, M, a, partial);
    else if (early && fast)
      dwa::launch<256, bf16, 64, u16, u16, u16, 2, true, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else if (early) dwa::launch<256, bf16, 64, u16, u16, u16, 2, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else dwa::launch<256, bf16, 64, u16, u16, u16, 2>(ctx, x, dy, off, E, N, K, M, a, partial);
  } else if (a.grad_bf16) {
    if (early) dwa::launch<256, bf16, 64, float, float, float, 2, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else dwa::launch<256, bf16, 64, float, float, float, 2>(ctx, x, dy, off, E, N, K, M, a, partial);
  } else {
    if (alt) dwa::launch<128, float, 32, float, float, float, 1, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else if (early) dwa::launch<128, float, 32, float, float, float, 2, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else dwa::launch<128, float, 32, float, float, float, 2>(ctx, x, dy, off, E, N, K, M, a, partial);
  }
  return true;
}

}  // namespace moetrain::cuda::gwd
