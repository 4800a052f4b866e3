// Hopper expert dW GEMM with AdamW in its epilogue: g[e] = dy_e^T x_e (+ prior), rounded to the grad
// dtype, then the AdamW update of master / m / v (/ compute copy) from g, without writing g. It is
// gmm_ws_dw_kernel (grouped_gemm_ws_dw.cuh: same mainloop, staged tile and sums of squares) with the
// AdamWEpilogue policy: the 256 consumer threads walk the staged tile row-major in 16-byte vectors,
// bit-identical to dispatch_dw followed by adamw_kernel.
#pragma once
#include <cuda.h>

#include <cstdlib>
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
__device__ __forceinline__ void store8s_bits(uint16_t* p, const uint16_t (&b)[8]) { st16s(p, ad::pack8_bits(b)); }

// New m, v, w of 8 consecutive elements from flat index i0 (a multiple of 8): the vector body of
// adamw_kernel, the same operations in the same order. kZeros: am::update8's fast path for exact zeros
// and tiny first moments (the experts without rows, whose moments are often 0 or decayed).
template <typename W, typename MT, typename VT, bool kZeros = false>
__device__ __forceinline__ void apply8(const AdamWParams& a, int64_t i0, const float (&g)[8], float (&w)[8],
                                       float (&m)[8], float (&v)[8]) {
  uint32_t rnd[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (std::is_same_v<W, uint16_t> && a.sr) {
    const Philox4 r = philox4x32(a.key, a.counter, static_cast<uint64_t>(i0) >> 3);
#pragma unroll
    for (int j = 0; j < 8; ++j) rnd[j] = am::random_half(r, j);
  }
  uint16_t wb[8];
  am::update8<kZeros>(a.k, g, m, v, w);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (std::is_same_v<W, uint16_t>) {
      wb[j] = a.sr ? am::bf16_stochastic(w[j], rnd[j]) : am::bf16_rne(w[j]);
      w[j] = am::bf16_to_f32(wb[j]);
    }
  }
  store8s(static_cast<MT*>(a.m) + i0, m);
  store8s(static_cast<VT*>(a.v) + i0, v);
  if constexpr (std::is_same_v<W, uint16_t>) store8s_bits(static_cast<W*>(a.w) + i0, wb);
  else store8s(static_cast<W*>(a.w) + i0, w);
  if (a.comp) store8s(a.comp + i0, w);
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

template <int BN, typename W, typename MT, typename VT, int U>
__device__ __forceinline__ void fetch_batch(const AdamWParams& a, const WalkGeom& g, int first, Batch<W, MT, VT, U>& q) {
  constexpr int kVR = BN / 8;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int idx = first + 256 * u, c = idx % kVR;
    if (idx < g.nvec && c < g.nvr) {
      const int64_t gi = g.gbase + static_cast<int64_t>(idx / kVR) * g.cj + c * 8;
      q.w[u] = ld8g(static_cast<const W*>(a.w) + gi);
      q.m[u] = ld8g(static_cast<const MT*>(a.m) + gi);
      q.v[u] = ld8g(static_cast<const VT*>(a.v) + gi);
    }
  }
}

// AdamW of the batch's vectors from their staged g (the tile row-major at kPitch bytes per row).
template <int BN, typename GT, int kPitch, typename W, typename MT, typename VT, int U>
__device__ __forceinline__ void apply_batch(const AdamWParams& a, const unsigned char* tile, const WalkGeom& g,
                                            int first, const Batch<W, MT, VT, U>& q) {
  constexpr int kVR = BN / 8;
  using GS = GStore<GT>;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int idx = first + 256 * u, c = idx % kVR;
    if (idx >= g.nvec || c >= g.nvr) continue;
    float gf[8], wf[8], mf[8], vf[8];
    widen8(ld8(reinterpret_cast<const GS*>(tile + (idx / kVR) * kPitch) + c * 8), gf);
    widen8(q.w[u], wf);
    widen8(q.m[u], mf);
    widen8(q.v[u], vf);
    apply8<W, MT, VT>(a, g.gbase + static_cast<int64_t>(idx / kVR) * g.cj + c * 8, gf, wf, mf, vf);
  }
}

// Epilogue policy of dispatch_dw_adamw (gmm_ws_dw_kernel): the consumers walk each staged g tile,
// nothing is stored; experts without rows get the update from g = prior (or 0). Each consumer
// thread keeps U vectors' w, m, v loads in flight ahead of the ones it updates: the first batch is
// fetched around the mainloop (before it when kEarly), each next one before the current is applied.
template <typename W, typename MT, typename VT, int U, bool Early = false>
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
      apply_batch<BN, GT, kPitch, W, MT, VT, U>(a, tile, g, b, q);
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
    auto in = [&](int idx) { return idx < g.nvec && idx % kVR < g.nvr; };
    auto at = [&](int idx) { return g.gbase + static_cast<int64_t>(idx / kVR) * g.cj + (idx % kVR) * 8; };
    auto fetch_prior = [&](int first, Raw8<GS> (&r)[U]) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (prior && in(first + 256 * u)) r[u] = ld8g(prior + at(first + 256 * u));
    };
    Raw8<GS> pc[U];
    if (!ahead) fetch_batch<BN, W, MT, VT, U>(a, g, ctid, q);
    fetch_prior(ctid, pc);
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
        apply8<W, MT, VT, true>(a, at(idx), gf, wf, mf, vf);
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

// ---- walker kernel: the walk on its own warpgroups, under the next piece's mainloop -----------------
// gmm_ws_dw_walk_kernel (all-bf16 state, no prior): 512 threads. Warpgroup 0: thread 0 issues the TMA
// loads (24 registers). Warpgroup 1 (the consumer, 232 registers): the 128 x 256 tiles of dispatch_dw
// as two 128 x 128 pieces, each two m64n128 accumulators; it stages a piece (bf16) into one of two
// buffers. Warpgroups 2-3 (the walkers, 128 registers, 2 vectors in flight per thread): AdamW of each
// staged piece, and of the pieces of experts without rows (g = 0), in the consumer's order. So the
// walk, which moves the 12 bytes per parameter, no longer stops for the mainloop and the staging.
// The per-tile sums of squares keep dispatch_dw's bits: a consumer thread carries its two SumSq4
// chains (rows 64 h + ...) from piece 0 into piece 1, which is the order of stage_tile over 256
// columns, and ends them as consumer warp 4 h + w of the two-warpgroup kernel would.
#ifndef MT_WALK_CONS_REGS
#define MT_WALK_CONS_REGS 184
#endif
#ifndef MT_WALK_CONS64_REGS
#define MT_WALK_CONS64_REGS 128
#endif
#ifndef MT_WALK_ROWS
#define MT_WALK_ROWS 64
#endif
constexpr int kWalkThreads = 512, kWalkConsRegs = MT_WALK_ROWS == 64 ? MT_WALK_CONS64_REGS : MT_WALK_CONS_REGS, kWalkPieceN = 128;
// rows of a piece: 128 (two m64n128 accumulators, 2 pieces per tile) or 64 (one, 4 pieces per tile)
constexpr int kWalkRows = MT_WALK_ROWS, kWalkPieces = 256 / kWalkPieceN * (kBM / kWalkRows);
constexpr int kWalkWalkRegs = (65536 - 128 * 24 - 128 * kWalkConsRegs) / 256 / 8 * 8;

template <int BK>
struct WalkCfg {
  static constexpr int kBlock = BK * 128;     // one box: 64 columns x BK rows, bf16
  static constexpr int kABytes = kWalkRows / 64 * kBlock;  // dy: the piece's rows of the output
  static constexpr int kStageBytes = kABytes + 2 * kBlock;  // + x: the piece's 128 columns (2 boxes)
  static constexpr int kPitch = kWalkPieceN * 2 + 16;       // staged piece row: 256 B + 16 (conflict-free)
  static constexpr int kPieceBytes = kWalkRows * kPitch;
  static constexpr int kBarOff = 2 * kPieceBytes;  // 256 B of mbarriers after the two piece buffers
  static constexpr int kOffOff = kBarOff + 256;
  static constexpr int kRedOff = kOffOff + ((kMaxE + 1) * 4 + 7) / 8 * 8;
  static constexpr int kFixed = 1024 + kRedOff + 16 * 8;
  static constexpr int kFit = (227 * 1024 - kFixed) / kStageBytes;
  static constexpr int kStages = kFit < 8 ? kFit : 8;
  static_assert(kStages >= 2, "walker kernel: the ring does not fit");
  static_assert((2 * kStages + 4) * 8 <= 256, "barrier space");
  static constexpr int kSmem = kFixed + kStages * kStageBytes;
  static_assert(128 * 24 + 128 * kWalkConsRegs + 256 * kWalkWalkRegs <= 65536, "register split");
};

// Piece pi of tile x: its row half (0 with 128-row pieces) and column half.
__device__ __forceinline__ int piece_h(int pi) { return kWalkRows == 128 ? 0 : pi >> 1; }
__device__ __forceinline__ int piece_c(int pi) { return kWalkRows == 128 ? pi : pi & 1; }
// Whether piece pi of tile x has rows and columns in the output.
__device__ __forceinline__ bool piece_in(const Params& p, const Tile& x, int pi) {
  return x.i0 + kWalkRows * piece_h(pi) < p.ci && x.j0 * 256 + piece_c(pi) * kWalkPieceN < p.cj;
}
// Where piece pi's walk goes (as walk_geom for a kWalkRows x 128 tile).
__device__ __forceinline__ WalkGeom piece_geom(const Params& p, const Tile& x, int pi) {
  const int64_t r0 = x.i0 + kWalkRows * piece_h(pi), c0 = x.j0 * 256 + piece_c(pi) * kWalkPieceN;
  const int rows = static_cast<int>(p.ci - r0 < kWalkRows ? p.ci - r0 : kWalkRows);
  const int nvr = static_cast<int>((p.cj - c0 < kWalkPieceN ? p.cj - c0 : kWalkPieceN) / 8);
  return {(x.e * p.ci + r0) * p.cj + c0, p.cj, rows * (kWalkPieceN / 8), nvr};
}

// The walkers' AdamW of one piece (g staged at `tile` at kPitch bytes per row, or g = 0 when tile
// is null), U vectors in flight: q holds the piece's first batch; during its last batch the first
// batch of the next piece (geometry nx, when has_next) is fetched into q. Returns whether it was.
template <typename W, typename MT, typename VT, int U, int kPitch>
__device__ __forceinline__ bool walk_piece(const AdamWParams& a, const WalkGeom& g, const unsigned char* tile, int tid,
                                           Batch<W, MT, VT, U>& q, bool has_next, const WalkGeom& nx) {
  constexpr int kVR = kWalkPieceN / 8;
  bool ahead = false;
#pragma unroll 1
  for (int b = tid; b < g.nvec; b += 256 * U) {
    Batch<W, MT, VT, U> next;
    if (b + 256 * U < g.nvec) {
      fetch_batch<kWalkPieceN, W, MT, VT, U>(a, g, b + 256 * U, next);
    } else if (has_next) {
      fetch_batch<kWalkPieceN, W, MT, VT, U>(a, nx, tid, next);
      ahead = true;
    }
    if (tile) {
      apply_batch<kWalkPieceN, __nv_bfloat16, kPitch, W, MT, VT, U>(a, tile, g, b, q);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int idx = b + 256 * u, c = idx % kVR;
        if (idx >= g.nvec || c >= g.nvr) continue;
        float gf[8] = {0, 0, 0, 0, 0, 0, 0, 0}, wf[8], mf[8], vf[8];
        widen8(q.w[u], wf);
        widen8(q.m[u], mf);
        widen8(q.v[u], vf);
        apply8<W, MT, VT, true>(a, g.gbase + static_cast<int64_t>(idx / kVR) * g.cj + c * 8, gf, wf, mf, vf);
      }
    }
    q = next;
  }
  return ahead;
}

// Whether the phase of `bar` with this parity has completed (no waiting).
__device__ __forceinline__ bool mbar_done(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

__device__ __forceinline__ void walk_cons_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// The consumer's mainloop of one 128 x 128 piece: acc0 / acc1 = rows 0-63 / 64-127 of dy_e^T x_e.
// As mainloop() for one warpgroup: rows past the expert in the last slab are zeroed first.
template <class C, int BK>
__device__ __forceinline__ void walk_mainloop(float (&acc0)[64], float (&acc1)[64], const Tile& x, uint32_t base,
                                              uint32_t full0, uint32_t empty0, int& stage, uint32_t& phase, int ctid,
                                              int lane, uint32_t busy_bar, uint32_t busy_parity, int pace_ns) {
  int prev = -1;
  for (int k = 0; k < x.ksteps; ++k) {
    wg::mbar_wait(full0 + 8 * stage, phase);
    const uint32_t sa = base + stage * C::kStageBytes, sb = sa + C::kABytes;
    const int valid = static_cast<int>(x.hi - x.lo) - k * BK;
    if (valid < BK) {
      const int chunks = (C::kStageBytes / C::kBlock) * (BK - valid) * 8;
      for (int c = ctid; c < chunks; c += 128) {
        const int blk = c / ((BK - valid) * 8), rr = c - blk * (BK - valid) * 8;
        const uint32_t a = sa + blk * C::kBlock + (valid + (rr >> 3)) * 128 + (rr & 7) * 16;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
      }
      wg::fence_proxy_async();
      walk_cons_sync();
    }
    wg::fence_regs(acc0);
    if constexpr (kWalkRows == 128) wg::fence_regs(acc1);
    wg::wgmma_fence();
#ifndef MT_WALK_NOCOMP
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint64_t db = wg::smem_desc(sb + kk * 2048, C::kBlock, 1024);
      const int sd = (k > 0 || kk > 0) ? 1 : 0;
      wg::wgmma_bf16<128, 1, 1>(acc0, wg::smem_desc(sa + kk * 2048, C::kBlock, 1024), db, sd);
      if constexpr (kWalkRows == 128)
        wg::wgmma_bf16<128, 1, 1>(acc1, wg::smem_desc(sa + C::kBlock + kk * 2048, C::kBlock, 1024), db, sd);
    }
#else
    (void)sb;
    for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
#endif
    wg::wgmma_commit();
    // pacing: while the walkers are still on the previous piece, this one is not needed yet; its
    // wgmma and loads are spread out instead of taking shared memory and L2 in bursts
    if (pace_ns > 0 && !mbar_done(busy_bar, busy_parity)) __nanosleep(pace_ns);
    if (prev >= 0) {
      wg::wgmma_wait<1>();
      wg::fence_regs(acc0);
      if constexpr (kWalkRows == 128) wg::fence_regs(acc1);
      arrive_lane0(empty0 + 8 * prev, lane);
    }
    prev = stage;
    if (++stage == C::kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  wg::wgmma_wait<0>();
  wg::fence_regs(acc0);
  if constexpr (kWalkRows == 128) wg::fence_regs(acc1);
  arrive_lane0(empty0 + 8 * prev, lane);
}

template <int BK, typename W, typename MT, typename VT, int U>
__global__ void __launch_bounds__(kWalkThreads, 1)
    gmm_ws_dw_walk_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                          const Params p, const AdamWParams a, const int pace_ns) {
#if MT_WGMMA_ENABLED
  using C = WalkCfg<BK>;
  constexpr int kS = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = mma::smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* bufs_p = smem_raw + (base - raw) + kS * C::kStageBytes;
  const uint32_t bufs = base + kS * C::kStageBytes;
  const uint32_t full0 = bufs + C::kBarOff, empty0 = full0 + 8 * kS, pfull0 = empty0 + 8 * kS, pempty0 = pfull0 + 16;
  int32_t* s_off = reinterpret_cast<int32_t*>(bufs_p + C::kOffOff);
  double* s_red = reinterpret_cast<double*>(bufs_p + C::kRedOff);
  const int tid = threadIdx.x;
  for (int i = tid; i <= p.E; i += kWalkThreads) s_off[i] = p.off[i];
#ifdef MT_WALK_NOLOAD
  for (int i = tid; i < kS * C::kStageBytes / 16; i += kWalkThreads)
    reinterpret_cast<uint4*>(smem_raw + (base - raw))[i] = make_uint4(0, 0, 0, 0);
#endif
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      wg::mbar_init(full0 + 8 * s, 1);
      wg::mbar_init(empty0 + 8 * s, 4);
    }
    for (int b = 0; b < 2; ++b) {
      wg::mbar_init(pfull0 + 8 * b, 128);
      wg::mbar_init(pempty0 + 8 * b, 256);
    }
    wg::fence_mbar_init();
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
  }
  __syncthreads();
  const int64_t total = static_cast<int64_t>(p.E) * p.nmt * p.ncol, stride = gridDim.x;
  const int wgi = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (wgi == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid != 0) return;
    // ---- producer: each active piece's k-slabs (dy: 2 boxes, x: the piece's 2 boxes) ----
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < total; t += stride) {
      const Tile x = decode<256, BK>(p, s_off, t);
      if (x.ksteps == 0) continue;
#ifdef MT_WALK_NOMAIN
      continue;
#endif
      for (int pi = 0; pi < kWalkPieces; ++pi) {
        if (!piece_in(p, x, pi)) continue;
        const int row0 = static_cast<int>(x.i0) + kWalkRows * piece_h(pi);
        const int col0 = static_cast<int>(x.j0) * 256 + piece_c(pi) * kWalkPieceN;
        int na = 0, nb = 0;
        for (int b = 0; b < kWalkRows / 64; ++b) na += row0 + 64 * b < p.ci;
        for (int b = 0; b < 2; ++b) nb += col0 + 64 * b < p.cj;
        const uint32_t bytes = static_cast<uint32_t>((na + nb) * C::kBlock);
        for (int k = 0; k < x.ksteps; ++k) {
          wg::mbar_wait_idle(empty0 + 8 * stage, phase ^ 1u);
          const uint32_t full = full0 + 8 * stage, sa = base + stage * C::kStageBytes;
          const int r = static_cast<int>(x.lo) + k * BK;
#ifdef MT_WALK_NOLOAD
          (void)bytes; (void)sa; (void)r; (void)nb;
          wg::mbar_arrive(full);
#else
          wg::mbar_arrive_tx(full, bytes);
          for (int b = 0; b < na; ++b) tma_2d(sa + b * C::kBlock, &map_a, row0 + 64 * b, r, full);
          for (int b = 0; b < nb; ++b) tma_2d(sa + C::kABytes + b * C::kBlock, &map_b, col0 + 64 * b, r, full);
#endif
          if (++stage == kS) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
    return;
  }
  if (wgi == 1) {
    // ---- consumer ----
    if constexpr (kWalkConsRegs > 128) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWalkConsRegs) : "memory");
    else if constexpr (kWalkConsRegs < 128) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWalkConsRegs) : "memory");
    const int ctid = tid - 128, lane = tid & 31, w = ctid >> 5;
    int stage = 0;
    uint32_t phase = 0, it = 0, cit = 0;
    float acc0[64], acc1[64];
    for (int64_t t = blockIdx.x; t < total; t += stride) {
      const Tile x = decode<256, BK>(p, s_off, t);
      if (x.ksteps == 0) {
        if (p.ss && ctid == 0) p.ss[t] = 0.0;  // no rows, no prior: g = 0
        continue;
      }
      const int nrows = static_cast<int>(p.ci - x.i0 < kBM ? p.ci - x.i0 : kBM);
      const int ncols = static_cast<int>(p.cj - x.j0 * 256 < 256 ? p.cj - x.j0 * 256 : 256);
      wg::SumSq4 sq[2];
      for (int pi = 0; pi < kWalkPieces; ++pi) {
        if (!piece_in(p, x, pi)) continue;
#ifdef MT_WALK_NOMAIN
        for (int i = 0; i < 64; ++i) acc0[i] = acc1[i] = 0.0f;
#else
        {
          // piece it - 1 went to buffer (it - 1) & 1; the walkers release it with phase ((it - 1) >> 1) & 1
          const uint32_t pb = (it - 1) & 1u, pu = (it - 1) >> 1;
          walk_mainloop<C, BK>(acc0, acc1, x, base, full0, empty0, stage, phase, ctid, lane, pempty0 + 8 * pb, pu & 1u,
                               it > 0 ? pace_ns : 0);
        }
#endif
        const uint32_t b = it & 1u, use = it >> 1;
        ++it;
        wg::mbar_wait(pempty0 + 8 * b, (use & 1u) ^ 1u);  // the walkers are done with this buffer
        const uint32_t sbuf = bufs + b * C::kPieceBytes;
        const int pc = ncols - piece_c(pi) * kWalkPieceN;  // columns of this piece in the output (> 0)
        // one row half of the tile: fragment acc, the warp's rows at 16 aw in the buffer, and the
        // tile's consumer warp 4 h + w for the edge tests and the sums
        auto stage_half = [&](float(&acc)[64], int h, int aw, wg::SumSq4& sqh) {
          const int frow = 16 * (4 * h + w) + (lane >> 2);
          const bool row_in[2] = {frow < nrows, frow + 8 < nrows};
          // kAllIn as stage_tile decides it for the whole 256-wide tile: every value of the thread inside
          const bool all_in = p.ss && row_in[0] && row_in[1] && ncols >= 256;
          if (all_in)
            stage_bf16<kWalkPieceN, C::kPitch, true>(acc, false, sbuf, lane, aw, sqh, true, row_in, pc);
          else
            stage_bf16<kWalkPieceN, C::kPitch, false>(acc, false, sbuf, lane, aw, sqh, p.ss != nullptr, row_in, pc);
        };
        if constexpr (kWalkRows == 128) {
          stage_half(acc0, 0, w, sq[0]);
          stage_half(acc1, 1, 4 + w, sq[1]);
        } else if (piece_h(pi) == 0) {
          stage_half(acc0, 0, w, sq[0]);
        } else {
          stage_half(acc0, 1, w, sq[1]);
        }
        wg::mbar_arrive(pfull0 + 8 * b);
      }
      if (p.ss) {  // the warp sums of rows 64 h + 16 w .., then thread 0 adds the 8 in warp order
        double* red = s_red + 8 * (cit++ & 1u);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          double ss = sq[h].total();
          for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
          if (lane == 0) red[4 * h + w] = ss;
        }
        walk_cons_sync();
        if (ctid == 0) {
          double s = 0.0;
#pragma unroll
          for (int k = 0; k < 8; ++k) s += red[k];
          p.ss[t] = s;
        }
      }
    }
    return;
  }
  // ---- walkers: every piece of the CTA's tiles, in the consumer's order ----
  if constexpr (kWalkWalkRegs > 128) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWalkWalkRegs) : "memory");
  const int wtid = tid - 256;
  Batch<W, MT, VT, U> q;
  uint32_t it = 0;
  // the CTA's pieces in order: (tile t, piece c) for t = blockIdx.x + k stride, c = 0, 1 (in the output)
  int64_t t = blockIdx.x;
  int c = 0;
  auto valid = [&](int64_t tt, int cc) { return tt < total && piece_in(p, decode<256, BK>(p, s_off, tt), cc); };
  auto advance = [&](int64_t& tt, int& cc) {
    do {
      if (++cc == kWalkPieces) {
        cc = 0;
        tt += stride;
      }
    } while (tt < total && !valid(tt, cc));
  };
  if (t < total && !valid(t, c)) advance(t, c);
  bool ahead = false;
  while (t < total) {
    const Tile x = decode<256, BK>(p, s_off, t);
    const WalkGeom g = piece_geom(p, x, c);
    int64_t tn = t;
    int cn = c;
    advance(tn, cn);
    const bool has_next = tn < total;
    const WalkGeom gn = has_next ? piece_geom(p, decode<256, BK>(p, s_off, tn), cn) : g;
    if (!ahead) fetch_batch<kWalkPieceN, W, MT, VT, U>(a, g, wtid, q);
    if (x.ksteps == 0) {
      ahead = walk_piece<W, MT, VT, U, C::kPitch>(a, g, nullptr, wtid, q, has_next, gn);
    } else {
      const uint32_t b = it & 1u, use = it >> 1;
      ++it;
      wg::mbar_wait(pfull0 + 8 * b, use & 1u);
      ahead = walk_piece<W, MT, VT, U, C::kPitch>(a, g, bufs_p + b * C::kPieceBytes, wtid, q, has_next, gn);
      wg::mbar_arrive(pempty0 + 8 * b);
    }
    t = tn;
    c = cn;
  }
#endif
}

// The walker kernel on every SM. x [N, K], dy [N, M]. all-bf16 state, no prior.
template <int BK, int U>
void launch_walk(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K,
                 int64_t M, const DwAdamWArgs& args, double* partial) {
  using C = WalkCfg<BK>;
  using u16 = uint16_t;
  const Params p = dw_params<256>(off, E, K, M, nullptr, false, partial);
  AdamWParams a{};
  a.w = args.master;
  a.m = args.m;
  a.v = args.v;
  a.comp = static_cast<uint16_t*>(args.compute);
  a.k = args.k;
  a.key = args.key;
  a.counter = args.counter;
  a.sr = args.sr ? 1 : 0;
  const CUtensorMap ma = dw_map(dy, N > 0 ? N : 1, M, BK), mb = dw_map(x, N > 0 ? N : 1, K, BK);
  auto kernel = gmm_ws_dw_walk_kernel<BK, u16, u16, u16, U>;
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const char* pe = std::getenv("MT_WALK_PACE_NS");
  const int pace = pe ? std::atoi(pe) : 0;
  kernel<<<static_cast<unsigned>(dw_sm_count(ctx)), kWalkThreads, C::kSmem, stream_of(ctx)>>>(ma, mb, p, a, pace);
  check_launch("grouped_matmul_backward_adamw");
}

template <int BN, typename GT, int BK, typename W, typename MT, typename VT, int U, bool Early = false>
void launch(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
            const DwAdamWArgs& args, double* partial) {
  const Params p = dw_params<BN>(off, E, K, M, const_cast<void*>(args.prior), args.prior != nullptr, partial);
  AdamWEpilogue<W, MT, VT, U, Early> epi{};
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
// Returns false (launching nothing) when dw_adamw_supported is false. variant (benchmark knob): bit 2
// (4) = the other walk depth (default: 2 vectors per thread in flight, measured fastest on H100;
// other: 4 for all-bf16, 1 for f32); bit 3 (8) = fetch a tile's first w, m, v after its mainloop
// instead of before it (measured 2-4% slower). Bits 0-1 (removed L2 prefetch modes) are ignored.
inline bool dispatch_dw_adamw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N,
                              int64_t K, int64_t M, const DwAdamWArgs& a, double* partial, int variant = 0) {
  if (!dw_adamw_supported(ctx, E, N, K, M, a)) return false;
  const int alt = (variant >> 2) & 1, early = !((variant >> 3) & 1);
  using u16 = uint16_t;
  if (a.grad_bf16 && a.master_bf16 && a.prior == nullptr && ((variant >> 4) & 1)) {
#ifndef MT_WALK_ALT_U
#define MT_WALK_ALT_U 4
#endif
    if (alt) dwa::launch_walk<64, MT_WALK_ALT_U>(ctx, x, dy, off, E, N, K, M, a, partial);
    else dwa::launch_walk<64, 2>(ctx, x, dy, off, E, N, K, M, a, partial);
  } else if (a.grad_bf16 && a.master_bf16) {
    if (alt && early) dwa::launch<256, bf16, 64, u16, u16, u16, 4, true>(ctx, x, dy, off, E, N, K, M, a, partial);
    else if (alt) dwa::launch<256, bf16, 64, u16, u16, u16, 4>(ctx, x, dy, off, E, N, K, M, a, partial);
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
