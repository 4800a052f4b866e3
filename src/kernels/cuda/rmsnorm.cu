// CUDA RMSNorm over the last dim: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), fp32 math.
// Backward (xhat = x * rstd, g = dy * w): dx = rstd * (g - xhat * mean(g * xhat)), one warp per
// row; dw += sum over rows of dy * xhat, as a deterministic two-pass column reduction in fp32
// (fixed chunks of 32 rows, then the chunk partials added in a fixed tree): no atomics.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/need_rows.cuh"

namespace moetrain::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int64_t kChunkRows = 32;             // dw: rows per chunk (short serial loops)
constexpr int64_t kMaxPartials = int64_t{4} << 20;  // dw: chunk partials held at most (16 MB of f32)
// The vector backward's rows per block: at least 16 (two per warp), at most about 512 blocks. The
// planner's rmsnorm_bwd_scratch (plan/mem_trace.cpp) sizes the partials [blocks, D] the same way.
int64_t rmsnorm_bwd_rows_per_block(int64_t R) {
  const int64_t per = (R + 511) / 512;
  return std::max<int64_t>(16, (per + kRowsPerBlock - 1) / kRowsPerBlock * kRowsPerBlock);
}

template <typename X, typename W>
__global__ void rmsnorm_fwd_kernel(const X* __restrict__ x, const W* __restrict__ w, float eps,
                                   X* __restrict__ y, float* __restrict__ rstd, int64_t R, int64_t D) {
  pdl_wait();
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const X* xr = x + r * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[r] = rs;
  X* yr = y + r * D;
  for (int64_t i = lane; i < D; i += 32) yr[i] = from_f<X>(to_f(xr[i]) * rs * to_f(w[i]));
}

template <typename X, typename W, typename G>
__global__ void rmsnorm_bwd_dx_kernel(const X* __restrict__ x, const W* __restrict__ w,
                                      const float* __restrict__ rstd, const G* __restrict__ dy,
                                      X* __restrict__ dx, int64_t R, int64_t D) {
  pdl_wait();
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const X* xr = x + r * D;
  const G* gr = dy + r * D;
  const float rs = rstd[r];
  float dot = 0.0f;
  for (int64_t i = lane; i < D; i += 32) dot += to_f(gr[i]) * to_f(w[i]) * to_f(xr[i]) * rs;
  const float mean_dot = warp_sum(dot) / static_cast<float>(D);
  X* dr = dx + r * D;
  for (int64_t i = lane; i < D; i += 32) {
    const float xhat = to_f(xr[i]) * rs;
    dr[i] = from_f<X>(rs * (to_f(gr[i]) * to_f(w[i]) - xhat * mean_dot));
  }
}

// partial[c, j] = sum over rows of chunk c of dy[r, j] * x[r, j] * rstd[r]
template <typename X, typename G>
__global__ void rmsnorm_dw_partial_kernel(const X* __restrict__ x, const float* __restrict__ rstd,
                                          const G* __restrict__ dy, float* __restrict__ partial, int64_t R,
                                          int64_t D, int64_t rows_per_chunk) {
  pdl_wait();
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (j >= D) return;
  const int64_t r0 = c * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f(dy[r * D + j]) * to_f(x[r * D + j]) * rstd[r];
  partial[c * D + j] = acc;
}

// out[j] += sum over chunks of partial[c, j]: a 32 x 32 block per 32 columns; thread (tx, ty) sums
// chunks ty, ty + 32, ... of column tx, then row 0 adds the 32 sums in ty order (fixed: deterministic).
__global__ void column_sum_add_kernel(const float* __restrict__ partial, int64_t chunks, int64_t D,
                                      float* __restrict__ out) {
  pdl_wait();
  __shared__ float sums[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = blockIdx.x * 32 + tx;
  float acc = 0.0f;
  if (j < D)
    for (int64_t c = ty; c < chunks; c += 32) acc += partial[c * D + j];
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && j < D) {
    float t = 0.0f;
    for (int k = 0; k < 32; ++k) t += sums[k][tx];
    out[j] += t;
  }
}

// ---- bf16 rows with D = 32 * EPL (EPL 4 .. 64: head_dim 128, hidden 1024 / 2048): one warp per row,
// each lane holding EPL columns in registers, read and written as 16-byte (or 8-byte) vectors.
// The scalar kernels above read 2 bytes per thread and read x and dy twice in backward (once for
// dx, once for the dw partials); these read each once. Backward also adds dx into the output when
// asked (the residual stream's gradient), which saves the separate add_.
template <int EPL>
struct Lanes {
  static constexpr int kVec = EPL >= 8 ? 8 : EPL;  // elements per vector
  static constexpr int kNV = EPL / kVec;           // vectors per lane
  __device__ static int col(int j, int lane) { return (j * 32 + lane) * kVec; }
  // Vector j of a bf16 row (one 16- or 8-byte load), widened into f[0, kVec).
  __device__ static void load_vec(const __nv_bfloat16* row, int lane, int j, float* f) {
    const __nv_bfloat16* p = row + col(j, lane);
    uint32_t w[kVec / 2];
    if constexpr (kVec == 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(p);
      w[0] = q.x, w[1] = q.y;
    }
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  __device__ static void load(const __nv_bfloat16* row, int lane, float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j) load_vec(row, lane, j, f + j * kVec);
  }
  __device__ static void store(__nv_bfloat16* row, int lane, const float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      uint32_t w[kVec / 2];
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[j * kVec + 2 * i], f[j * kVec + 2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
      __nv_bfloat16* p = row + col(j, lane);
      if constexpr (kVec == 8) *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
      else *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    }
  }
  // The weights of vector j only (kVec floats), in 16-byte loads.
  template <typename W>
  __device__ static void load_w_vec(const W* w, int lane, int j, float (&f)[kVec]) {
    const W* p = w + col(j, lane);
    if constexpr (std::is_same_v<W, __nv_bfloat16>) {
      load_vec(w, lane, j, f);
    } else if constexpr (std::is_same_v<W, float> && kVec == 8) {
      const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
      f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) f[i] = to_f(p[i]);
    }
  }
  template <typename W>
  __device__ static void load_w(const W* w, int lane, float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j)
#pragma unroll
      for (int i = 0; i < kVec; ++i) f[j * kVec + i] = to_f(w[col(j, lane) + i]);
  }
};

// RoPE for the fused q/k path (D = 128): cos and sin of the block's tokens, computed once per block
// with the CPU's recipe (angle = float(pos) * inv_freq in fp32, cos/sin in double, then float).
constexpr int kRopeHalf = 64;
constexpr int kRopeMaxTokens = 72;  // tokens one block's rows may span: 36 KB of table
struct InvFreq64 {
  float v[kRopeHalf];
};
template <bool kRope>
struct RopeTable {
  float cs[1][1], sn[1][1];
};
template <>
struct RopeTable<true> {
  float cs[kRopeMaxTokens][kRopeHalf], sn[kRopeMaxTokens][kRopeHalf];
};
struct RopeArgs {
  const int32_t* pos = nullptr;
  InvFreq64 inv{};
  int64_t heads = 1;
  float sign = 1.0f;  // +1 forward, -1 backward (the inverse rotation)
  // Token strides (elements) of x, dy and dx when they are column blocks of a wider matrix (the
  // fused q|k|v projection); 0: rows packed, heads * D apart. Forward's y is always packed.
  int64_t x_row = 0, dy_row = 0, dx_row = 0;
};
// Token and head of a warp's rows r, r + kRowsPerBlock, ... (row r is token r / heads, head
// r % heads), stepped without a divide per row: a 64-bit divide by a runtime value is a long emulated
// sequence, and these kernels are bound by instruction issue. Without RoPE a row is just r.
template <bool kRope>
struct RowCursor {
  int64_t t = 0, h = 0;
  __device__ __forceinline__ RowCursor(int64_t r, int64_t heads) {
    if constexpr (kRope) t = r / heads, h = r - t * heads;
  }
  __device__ __forceinline__ void next(int64_t heads) {
    if constexpr (kRope) {
      h += kRowsPerBlock;
      while (h >= heads) h -= heads, ++t;
    }
  }
  // Element offset of row r in a tensor whose tokens are `tok` apart (0: packed rows of D).
  __device__ __forceinline__ int64_t offset(int64_t r, int64_t tok, int D) const {
    if constexpr (kRope)
      if (tok != 0) return t * tok + h * D;
    return r * D;
  }
};
template <bool kRope>
__device__ void fill_rope_table(RopeTable<kRope>& tab, const RopeArgs& ra, int64_t t0, int64_t tokens) {
  if constexpr (kRope) {
    for (int64_t e = threadIdx.x; e < tokens * kRopeHalf; e += blockDim.x) {
      const int64_t lt = e / kRopeHalf, i = e - lt * kRopeHalf;
      const float angle = static_cast<float>(ra.pos[t0 + lt]) * ra.inv.v[i];
      tab.cs[lt][i] = static_cast<float>(cos(static_cast<double>(angle)));
      tab.sn[lt][i] = ra.sign * static_cast<float>(sin(static_cast<double>(angle)));
    }
    __syncthreads();
  }
}
// Rotates a D = 128 row held as 4 columns per lane (lane L: 4L..4L+3; its pair is lane L ^ 16), with
// the rope kernel's rounding-free float ops, each rounded to nearest (no contraction), as the CPU.
template <bool kRope>
__device__ __forceinline__ void rotate_row(const RopeTable<kRope>& tab, int64_t lt, int lane, float (&v)[4]) {
  if constexpr (kRope) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, v[j], 16);
      const int i = (4 * lane + j) & (kRopeHalf - 1);
      const float c = tab.cs[lt][i], sn = tab.sn[lt][i];
      v[j] = lane < 16 ? __fsub_rn(__fmul_rn(v[j], c), __fmul_rn(other, sn))
                       : __fadd_rn(__fmul_rn(v[j], c), __fmul_rn(other, sn));
    }
  }
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Rows [c * rows_per_block, ...) of block c, warp k taking rows k, k + 8, ....
// The body takes its block index, like the q/k norm + RoPE bodies below, which the pair kernels call.
template <int EPL, typename W>
__device__ __forceinline__ void rmsnorm_fwd_rows1(const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, float eps,
                                                  __nv_bfloat16* __restrict__ y, float* __restrict__ rstd, int64_t R,
                                                  int64_t rows_per_block, __nv_bfloat16* __restrict__ xcopy,
                                                  int64_t block) {
  using L = Lanes<EPL>;
  constexpr int D = 32 * EPL;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = block * rows_per_block, r1 = min(R, r0 + rows_per_block);
  // Long rows (EPL >= 32) read a lane's weights where they are used: held in registers across the
  // row's load and reduction they took D = 2048 to 148 registers, one block (8 warps) per SM.
  constexpr bool kWLate = EPL >= 32;
  float wf[kWLate ? 1 : EPL];
  if constexpr (!kWLate) L::load_w(w, lane, wf);
  for (int64_t r = r0 + warp; r < r1; r += kRowsPerBlock) {
    float v[EPL];
    L::load(x + r * D, lane, v);
    if (xcopy) L::store(xcopy + r * D, lane, v);  // bf16 -> f32 -> bf16: the same bits
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
    if (lane == 0) rstd[r] = rs;
    if constexpr (kWLate) {
#pragma unroll
      for (int j = 0; j < L::kNV; ++j) {
        float wj[L::kVec];
        L::load_w_vec(w, lane, j, wj);
#pragma unroll
        for (int i = 0; i < L::kVec; ++i) v[j * L::kVec + i] = v[j * L::kVec + i] * rs * wj[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < EPL; ++i) v[i] = v[i] * rs * wf[i];
    }
    L::store(y + r * D, lane, v);
  }
}

// ---- q/k norm + RoPE forward (D = 128): y = rope(bf16(rmsnorm(x))), the normed value rounded as
// rmsnorm_forward stores it, two rows a warp. Lane s of half h (lanes 16h .. 16h + 15) holds the
// columns that lanes s and s + 16 hold in the one-row-a-warp layout (rmsnorm_bwd_rows, and this
// forward until round 30): a = [4s, 4s + 4) and b = a + 64, each the other's RoPE partner. A row's
// values come from the same operations in the same order as in that layout: a lane's two partial
// sums are its tree's first step (offset 16), the steps 8, 4, 2, 1 stay inside the half, and the
// rotation needs no shuffle. So the bits are the same, and a warp's per-row work (the shuffles, the
// square root and divide, the cursor, the rstd store) serves two rows: the q and k pair call went
// from 50 to 35 us at T 4096 on an H100 (docs/performance.md, round 30). Half h of warp k takes rows
// r0 + 2k + h, then every 16th.
template <typename W>
__device__ __forceinline__ void norm_rope_fwd_rows2(const __nv_bfloat16* __restrict__ x, const W* __restrict__ w,
                                                    float eps, __nv_bfloat16* __restrict__ y,
                                                    float* __restrict__ rstd, int64_t R, int64_t rows_per_block,
                                                    const RopeArgs& ra, __nv_bfloat16* __restrict__ xcopy,
                                                    int64_t block) {
  using L = Lanes<4>;
  constexpr int D = 128;
  __shared__ RopeTable<true> tab;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = lane >> 4, s = lane & 15;
  const int64_t r0 = block * rows_per_block, r1 = min(R, r0 + rows_per_block);
  const int64_t t0 = r0 / ra.heads;
  fill_rope_table<true>(tab, ra, t0, (r1 - 1) / ra.heads - t0 + 1);
  float wa[4], wb[4];
  L::load_w(w, s, wa);
  L::load_w(w, s + 16, wb);
  const int64_t first = r0 + 2 * warp;  // half 0's row; half 1's is the next
  RowCursor<true> rc(first + half, ra.heads);
  for (int64_t rp = first; rp < r1; rp += 2 * kRowsPerBlock, rc.next(ra.heads), rc.next(ra.heads)) {
    const int64_t r = rp + half;
    const bool on = r < r1;  // both halves run every step: the shuffles take all 32 lanes
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (on) {
      const __nv_bfloat16* xr = x + rc.offset(r, ra.x_row, D);
      L::load_vec(xr, s, 0, a);
      L::load_vec(xr, s + 16, 0, b);
      if (xcopy) L::store(xcopy + r * D, s, a), L::store(xcopy + r * D, s + 16, b);
    }
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) sa += a[i] * a[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) sb += b[i] * b[i];
    float ss = sa + sb;
    for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
    if (on && s == 0) rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = round_bf16(a[i] * rs * wa[i]), b[i] = round_bf16(b[i] * rs * wb[i]);
    const int64_t lt = on ? rc.t - t0 : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float c = tab.cs[lt][4 * s + j], sn = tab.sn[lt][4 * s + j];
      const float na = __fsub_rn(__fmul_rn(a[j], c), __fmul_rn(b[j], sn));
      b[j] = __fadd_rn(__fmul_rn(b[j], c), __fmul_rn(a[j], sn));
      a[j] = na;
    }
    if (on) L::store(y + r * D, s, a), L::store(y + r * D, s + 16, b);
  }
}

// RMSNorm rows, or (kRope, D = 128) q/k norm + RoPE rows.
template <int EPL, typename W, bool kRope>
__device__ __forceinline__ void rmsnorm_fwd_rows(const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, float eps,
                                                 __nv_bfloat16* __restrict__ y, float* __restrict__ rstd, int64_t R,
                                                 int64_t rows_per_block, const RopeArgs& ra,
                                                 __nv_bfloat16* __restrict__ xcopy, int64_t block) {
  if constexpr (kRope) {
    static_assert(EPL == 4, "RoPE rows are D = 128");
    norm_rope_fwd_rows2<W>(x, w, eps, y, rstd, R, rows_per_block, ra, xcopy, block);
  } else {
    rmsnorm_fwd_rows1<EPL, W>(x, w, eps, y, rstd, R, rows_per_block, xcopy, block);
  }
}
template <int EPL, typename W, bool kRope>
__global__ void __launch_bounds__(32 * kRowsPerBlock) rmsnorm_fwd_vec_kernel(
    const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, float eps, __nv_bfloat16* __restrict__ y,
    float* __restrict__ rstd, int64_t R, int64_t rows_per_block, RopeArgs ra, __nv_bfloat16* __restrict__ xcopy) {
  pdl_wait();
  rmsnorm_fwd_rows<EPL, W, kRope>(x, w, eps, y, rstd, R, rows_per_block, ra, xcopy, blockIdx.x);
}

// Same rows; dx as the scalar kernel (+ the old dx when accumulate), and partial[c, :] = sum over the
// block's rows of dy * x * rstd, the 8 warps' register sums added in a fixed tree through shared
// memory (deterministic). kRope (D = 128): dy is first rotated back and rounded, as rope_backward
// stores it. dx may alias dy: a warp reads its row before writing it.
template <int EPL, typename W, bool kRope>
__device__ __forceinline__ void rmsnorm_bwd_rows(const __nv_bfloat16* __restrict__ x, const W* __restrict__ w,
                                                 const float* __restrict__ rstd, const __nv_bfloat16* dy,
                                                 __nv_bfloat16* dx, bool accumulate, int64_t R, int64_t rows_per_block,
                                                 float* __restrict__ partial, const RopeArgs& ra, int64_t block) {
  using L = Lanes<EPL>;
  constexpr int D = 32 * EPL;
  __shared__ float sums[kRowsPerBlock / 2][D];  // 32 KB at D = 2048
  __shared__ RopeTable<kRope> tab;
  // At D = 2048 a lane's weights, its dw sums and the row's x and dy (4 x 64 floats) did not fit in
  // 255 registers (316 B of spills): the weights are read from shared memory there instead.
  constexpr bool kWShared = EPL >= 64;
  __shared__ float sw[kWShared ? D : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = block * rows_per_block, r1 = min(R, r0 + rows_per_block);
  const int64_t t0 = r0 / ra.heads;
  fill_rope_table<kRope>(tab, ra, t0, (r1 - 1) / ra.heads - t0 + 1);
  float wr[kWShared ? 1 : EPL], acc[EPL];
  if constexpr (kWShared) {
    for (int c = threadIdx.x; c < D; c += 32 * kRowsPerBlock) sw[c] = static_cast<float>(w[c]);
    __syncthreads();
  } else {
    L::load_w(w, lane, wr);
  }
  auto wf = [&](int i) -> float {
    if constexpr (kWShared) return sw[L::col(i / L::kVec, lane) + i % L::kVec];
    else return wr[i];
  };
#pragma unroll
  for (int i = 0; i < EPL; ++i) acc[i] = 0.0f;
  RowCursor<kRope> rc(r0 + warp, ra.heads);
  for (int64_t r = r0 + warp; r < r1; r += kRowsPerBlock, rc.next(ra.heads)) {
    float xv[EPL], g[EPL];
    L::load(x + rc.offset(r, ra.x_row, D), lane, xv);
    L::load(dy + rc.offset(r, ra.dy_row, D), lane, g);
    if constexpr (kRope) {
      rotate_row<kRope>(tab, rc.t - t0, lane, reinterpret_cast<float(&)[4]>(g));
#pragma unroll
      for (int i = 0; i < EPL; ++i) g[i] = round_bf16(g[i]);
    }
    const float rs = rstd[r];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) dot += g[i] * wf(i) * xv[i] * rs;
    const float mean_dot = warp_sum(dot) / static_cast<float>(D);
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      acc[i] += g[i] * xv[i] * rs;
      const float xhat = xv[i] * rs;
      g[i] = rs * (g[i] * wf(i) - xhat * mean_dot);
    }
    const int64_t dxo = rc.offset(r, ra.dx_row, D);
    if (accumulate) {
      L::load(dx + dxo, lane, xv);
#pragma unroll
      for (int i = 0; i < EPL; ++i) g[i] += xv[i];
    }
    L::store(dx + dxo, lane, g);
  }
  // Warps h..2h-1 hand their sums to warps 0..h-1, for h = 4, 2, 1: a fixed tree.
  for (int h = kRowsPerBlock / 2; h >= 1; h /= 2) {
    if (warp >= h && warp < 2 * h)
#pragma unroll
      for (int j = 0; j < L::kNV; ++j)
#pragma unroll
        for (int i = 0; i < L::kVec; ++i) sums[warp - h][L::col(j, lane) + i] = acc[j * L::kVec + i];
    __syncthreads();
    if (warp < h)
#pragma unroll
      for (int j = 0; j < L::kNV; ++j)
#pragma unroll
        for (int i = 0; i < L::kVec; ++i) acc[j * L::kVec + i] += sums[warp][L::col(j, lane) + i];
    __syncthreads();
  }
  if (warp == 0) {
    float* out = partial + block * (int64_t)D;
#pragma unroll
    for (int j = 0; j < L::kNV; ++j)
#pragma unroll
      for (int i = 0; i < L::kVec; ++i) out[L::col(j, lane) + i] = acc[j * L::kVec + i];
  }
}
template <int EPL, typename W, bool kRope>
__global__ void __launch_bounds__(32 * kRowsPerBlock) rmsnorm_bwd_vec_kernel(
    const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, const float* __restrict__ rstd,
    const __nv_bfloat16* dy, __nv_bfloat16* dx, bool accumulate, int64_t R, int64_t rows_per_block,
    float* __restrict__ partial, RopeArgs ra) {
  pdl_wait();
  rmsnorm_bwd_rows<EPL, W, kRope>(x, w, rstd, dy, dx, accumulate, R, rows_per_block, partial, ra, blockIdx.x);
}

// ---- q and k in one grid (norm_rope_*_qk): blocks [0, a.blocks) run tensor a (q), the rest tensor
// b (k), each exactly as its own launch would. The k calls are short (4 heads: a few rows a warp) and
// bound by latency; here their blocks start as soon as an SM has room, with no launch of their own
// (about 8 us a layer on an H100; most k blocks still wait for q blocks to leave, 6 fit an SM).
template <typename W>
struct NormRopeJob {
  const __nv_bfloat16* x;
  const W* w;
  const float* rstd_in;      // backward
  const __nv_bfloat16* dy;   // backward
  __nv_bfloat16* out;        // forward y, backward dx
  float* rstd_out;           // forward
  float* partial;            // backward: [blocks, 128] dw partials
  int64_t R, rows_per_block, blocks;
  RopeArgs ra;
};
template <typename W>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    norm_rope_fwd_pair_kernel(const __grid_constant__ NormRopeJob<W> a, const __grid_constant__ NormRopeJob<W> b,
                              float eps) {
  pdl_wait();
  if (blockIdx.x < a.blocks)
    rmsnorm_fwd_rows<4, W, true>(a.x, a.w, eps, a.out, a.rstd_out, a.R, a.rows_per_block, a.ra, nullptr, blockIdx.x);
  else
    rmsnorm_fwd_rows<4, W, true>(b.x, b.w, eps, b.out, b.rstd_out, b.R, b.rows_per_block, b.ra, nullptr,
                                 blockIdx.x - a.blocks);
}
template <typename W>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    norm_rope_bwd_pair_kernel(const __grid_constant__ NormRopeJob<W> a, const __grid_constant__ NormRopeJob<W> b) {
  pdl_wait();
  if (blockIdx.x < a.blocks)
    rmsnorm_bwd_rows<4, W, true>(a.x, a.w, a.rstd_in, a.dy, a.out, false, a.R, a.rows_per_block, a.partial, a.ra,
                                 blockIdx.x);
  else
    rmsnorm_bwd_rows<4, W, true>(b.x, b.w, b.rstd_in, b.dy, b.out, false, b.R, b.rows_per_block, b.partial, b.ra,
                                 blockIdx.x - a.blocks);
}

bool rmsnorm_vec_ok(const Tensor& x, const Tensor& w, std::initializer_list<const Tensor*> rows) {
  const int64_t D = x.size(-1);
  if (x.dtype() != DType::kBF16 || (w.dtype() != DType::kBF16 && w.dtype() != DType::kF32)) return false;
  if (D != 128 && D != 256 && D != 512 && D != 1024 && D != 2048) return false;
  for (const Tensor* t : rows)
    if (t->dtype() != DType::kBF16 || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

// Runs body.template operator()<EPL>() for D = 32 * EPL.
template <typename F>
void with_epl(int64_t D, F&& body) {
  switch (D) {
    case 128: body.template operator()<4>(); break;
    case 256: body.template operator()<8>(); break;
    case 512: body.template operator()<16>(); break;
    case 1024: body.template operator()<32>(); break;
    default: body.template operator()<64>(); break;
  }
}

}  // namespace

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd,
                     Tensor* x_copy) {
  const char* op = "rmsnorm_forward";
  need_cuda(x, op, "x");
  need_cuda(w, op, "w");
  need_cuda(y, op, "y");
  need_cuda(rstd, op, "rstd");
  need_dtype(y, x.dtype(), op, "y");
  need_dtype(rstd, DType::kF32, op, "rstd");
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  need_numel(w, D, op, "w");
  need_numel(y, R * D, op, "y");
  need_numel(rstd, R, op, "rstd");
  if (!R) return;
  const unsigned blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
  if (x_copy) need_cuda(*x_copy, op, "x_copy");
  if (rmsnorm_vec_ok(x, w, {&y}) && (!x_copy || rmsnorm_vec_ok(x, w, {x_copy}))) {
    MT_CUDA_DISPATCH(w.dtype(), W, op, with_epl(D, [&]<int EPL>() {
      launch_pdl(rmsnorm_fwd_vec_kernel<EPL, W, false>, blocks, 32 * kRowsPerBlock, 0, stream_of(ctx),
          static_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), eps,
          static_cast<__nv_bfloat16*>(y.data_ptr()), rstd.data<float>(), R, kRowsPerBlock, RopeArgs{},
          x_copy ? static_cast<__nv_bfloat16*>(x_copy->data_ptr()) : nullptr);
    }));
    check_launch(op);
    return;
  }
  if (x_copy) cast(ctx, x, *x_copy);  // the scalar kernel: a plain copy first
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    MT_CUDA_DISPATCH(w.dtype(), W, op,
      launch_pdl(rmsnorm_fwd_kernel<X, W>, blocks, 32 * kRowsPerBlock, 0, stream_of(ctx),
          static_cast<const X*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), eps,
          static_cast<X*>(y.data_ptr()), rstd.data<float>(), R, D)));
  check_launch(op);
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool dx_accumulate) {
  const char* op = "rmsnorm_backward";
  need_cuda(x, op, "x");
  need_cuda(w, op, "w");
  need_cuda(rstd, op, "rstd");
  need_cuda(dy, op, "dy");
  need_cuda(dx, op, "dx");
  need_cuda(dw, op, "dw");
  need_dtype(dx, x.dtype(), op, "dx");
  need_dtype(rstd, DType::kF32, op, "rstd");
  need_dtype(dw, DType::kF32, op, "dw");
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  need_numel(w, D, op, "w");
  need_numel(dw, D, op, "dw");
  need_numel(dy, R * D, op, "dy");
  need_numel(dx, R * D, op, "dx");
  need_numel(rstd, R, op, "rstd");
  if (!R) return;
  cudaStream_t s = stream_of(ctx);
  if (rmsnorm_vec_ok(x, w, {&dy, &dx})) {
    const int64_t rows_per_block = rmsnorm_bwd_rows_per_block(R);
    const int64_t chunks = (R + rows_per_block - 1) / rows_per_block;
    Tensor scratch = device_scratch(ctx, chunks * D * 4);
    float* partial = static_cast<float*>(scratch.data_ptr());
    MT_CUDA_DISPATCH(w.dtype(), W, op, with_epl(D, [&]<int EPL>() {
      launch_pdl(rmsnorm_bwd_vec_kernel<EPL, W, false>, static_cast<unsigned>(chunks), 32 * kRowsPerBlock, 0, s,
          static_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), rstd.data<float>(),
          static_cast<const __nv_bfloat16*>(dy.data_ptr()), static_cast<__nv_bfloat16*>(dx.data_ptr()), dx_accumulate,
          R, rows_per_block, partial, RopeArgs{});
    }));
    launch_pdl(column_sum_add_kernel, static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, s, partial, chunks, D,
                                                                                        dw.data<float>());
    check_launch(op);
    return;
  }
  // The scalar kernels overwrite dx; an accumulating call forms the norm's part first, then adds.
  Tensor part;
  Tensor* dx_out = &dx;
  if (dx_accumulate) {
    part = Tensor::empty(dx.shape(), dx.dtype(), dx.device(), MemCategory::kWorkspace);
    dx_out = &part;
  }
  const unsigned blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
  // Chunks of about kChunkRows rows (many short loops: the q/k norms have R = tokens x heads rows
  // of D = 128), fewer when the partials would pass kMaxPartials.
  int64_t chunks = std::min<int64_t>({(R + kChunkRows - 1) / kChunkRows, std::max<int64_t>(kMaxPartials / D, 1),
                                      int64_t{65535} /* grid.y */});
  const int64_t rows_per_chunk = (R + chunks - 1) / chunks;
  chunks = (R + rows_per_chunk - 1) / rows_per_chunk;
  Tensor scratch = device_scratch(ctx, chunks * D * 4);
  float* partial = static_cast<float*>(scratch.data_ptr());
  const dim3 pgrid(static_cast<unsigned>((D + 127) / 128), static_cast<unsigned>(chunks));
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    MT_CUDA_DISPATCH(dy.dtype(), G, op,
      MT_CUDA_DISPATCH(w.dtype(), W, op,
        launch_pdl(rmsnorm_bwd_dx_kernel<X, W, G>, blocks, 32 * kRowsPerBlock, 0, s,
            static_cast<const X*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), rstd.data<float>(),
            static_cast<const G*>(dy.data_ptr()), static_cast<X*>(dx_out->data_ptr()), R, D));
      launch_pdl(rmsnorm_dw_partial_kernel<X, G>, pgrid, 128, 0, s, static_cast<const X*>(x.data_ptr()), rstd.data<float>(),
                                                      static_cast<const G*>(dy.data_ptr()), partial, R, D,
                                                      rows_per_chunk)));
  launch_pdl(column_sum_add_kernel, static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, s, partial, chunks, D, dw.data<float>());
  check_launch(op);
  if (dx_accumulate) add_(ctx, dx, part, 1.0f);
}

// ---- RMSNorm + RoPE (q/k path) -------------------------------------------------------------
namespace {
// The fused kernels: bf16, head dim 128, and the tokens of one block's rows fitting the table.
bool norm_rope_fusable(const Tensor& x, const Tensor& w, const Tensor& out, int64_t rows_per_block) {
  const int64_t heads = x.size(1);
  return x.size(2) == 2 * kRopeHalf && rmsnorm_vec_ok(x, w, {&out}) && heads >= 1 &&
         (rows_per_block + heads - 1) / heads + 1 <= kRopeMaxTokens;
}
bool is_16_aligned(int64_t bytes) { return bytes % 16 == 0; }
int64_t rope_rows(const Tensor& x) { return x.size(0) * x.size(1); }
// Whether norm_rope_forward / norm_rope_backward take the fused kernel (else the pair of ops).
bool fwd_fused(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t R = rope_rows(x);
  return R > 0 && norm_rope_fusable(x, w, y, rmsnorm_bwd_rows_per_block(R)) && is_16_aligned(x.stride(0) * 2);
}
bool bwd_fused(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx) {
  const int64_t R = rope_rows(x);
  return R > 0 && norm_rope_fusable(x, w, dx, rmsnorm_bwd_rows_per_block(R)) && rmsnorm_vec_ok(x, w, {&dy}) &&
         is_16_aligned(x.stride(0) * 2) && is_16_aligned(dy.stride(0) * 2) && is_16_aligned(dx.stride(0) * 2);
}
RopeArgs rope_args(const Tensor& pos, float theta, int64_t heads, float sign) {
  RopeArgs ra;
  ra.pos = pos.data<int32_t>();
  ra.heads = heads;
  ra.sign = sign;
  const int64_t d = 2 * kRopeHalf;  // the same expression as rope.cu and the CPU
  for (int64_t i = 0; i < kRopeHalf; ++i)
    ra.inv.v[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  return ra;
}
template <typename W>
NormRopeJob<W> rope_job(const Tensor& x, const Tensor& w, const Tensor& pos, float theta, float sign) {
  NormRopeJob<W> j{};
  j.x = static_cast<const __nv_bfloat16*>(x.data_ptr());
  j.w = static_cast<const W*>(w.data_ptr());
  j.R = rope_rows(x);
  j.rows_per_block = rmsnorm_bwd_rows_per_block(j.R);
  j.blocks = (j.R + j.rows_per_block - 1) / j.rows_per_block;
  j.ra = rope_args(pos, theta, x.size(1), sign);
  if (!x.is_contiguous()) j.ra.x_row = x.stride(0);
  return j;
}
template <typename W>
NormRopeJob<W> fwd_job(const Tensor& x, const Tensor& w, const Tensor& pos, float theta, Tensor& y, Tensor& rstd) {
  NormRopeJob<W> j = rope_job<W>(x, w, pos, theta, 1.0f);
  j.out = static_cast<__nv_bfloat16*>(y.data_ptr());
  j.rstd_out = rstd.data<float>();
  return j;
}
// The dw partials ([blocks, 128] f32) live in `scratch`, which the caller keeps until column_sum_add ran.
template <typename W>
NormRopeJob<W> bwd_job(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                       float theta, const Tensor& dy, Tensor& dx, Tensor& scratch) {
  NormRopeJob<W> j = rope_job<W>(x, w, pos, theta, -1.0f);
  j.rstd_in = rstd.data<float>();
  j.dy = static_cast<const __nv_bfloat16*>(dy.data_ptr());
  j.out = static_cast<__nv_bfloat16*>(dx.data_ptr());
  if (!dy.is_contiguous()) j.ra.dy_row = dy.stride(0);
  if (!dx.is_contiguous()) j.ra.dx_row = dx.stride(0);
  scratch = device_scratch(ctx, j.blocks * 2 * kRopeHalf * 4);
  j.partial = static_cast<float*>(scratch.data_ptr());
  return j;
}
template <typename W>
void add_dw_partials(cudaStream_t s, const NormRopeJob<W>& j, Tensor& dw) {
  launch_pdl(column_sum_add_kernel, static_cast<unsigned>((2 * kRopeHalf + 31) / 32), dim3(32, 32), 0, s, j.partial,
             j.blocks, int64_t{2 * kRopeHalf}, dw.data<float>());
}
}  // namespace

void norm_rope_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& pos, float theta,
                       Tensor& y, Tensor& rstd) {
  const char* op = "norm_rope_forward";
  need_cuda(pos, op, "pos");
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2), R = T * heads;
  if (!R) return;
  if (!fwd_fused(x, w, y)) {
    // the pair, through a temporary (and a packed copy of a token-strided x)
    const Tensor xp = packed_rows(ctx, x);  // the scalar fallbacks read packed rows
    Tensor xn = Tensor::empty({R, d}, x.dtype(), x.device(), MemCategory::kWorkspace);
    rmsnorm_forward(ctx, xp.view({R, d}), w, eps, xn, rstd);
    rope_forward(ctx, xn.view({T, heads, d}), pos, theta, y);
    return;
  }
  need_cuda(rstd, op, "rstd");
  MT_CUDA_DISPATCH(w.dtype(), W, op, {
    const NormRopeJob<W> j = fwd_job<W>(x, w, pos, theta, y, rstd);
    launch_pdl(rmsnorm_fwd_vec_kernel<4, W, true>, static_cast<unsigned>(j.blocks), 32 * kRowsPerBlock, 0,
               stream_of(ctx), j.x, j.w, eps, j.out, j.rstd_out, j.R, j.rows_per_block, j.ra, nullptr);
  });
  check_launch(op);
}

void norm_rope_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                        float theta, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const char* op = "norm_rope_backward";
  need_cuda(pos, op, "pos");
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2), R = T * heads;
  if (!R) return;
  if (!bwd_fused(x, w, dy, dx)) {
    // the pair, through temporaries (packed copies of a token-strided x, dy or dx)
    const Tensor xp = packed_rows(ctx, x);  // the scalar fallbacks read packed rows
    Tensor dxn = Tensor::empty({T, heads, d}, dy.dtype(), dy.device(), MemCategory::kWorkspace);
    rope_backward(ctx, packed_rows(ctx, dy), pos, theta, dxn);
    Tensor out = packed_like(dx);
    Tensor dxv = out.view({R, d});
    rmsnorm_backward(ctx, xp.view({R, d}), w, rstd, dxn.view({R, d}), dxv, dw, false);
    copy_back(ctx, out, dx);
    return;
  }
  need_cuda(rstd, op, "rstd");
  need_cuda(dw, op, "dw");
  cudaStream_t s = stream_of(ctx);
  Tensor scratch;
  MT_CUDA_DISPATCH(w.dtype(), W, op, {
    const NormRopeJob<W> j = bwd_job<W>(ctx, x, w, rstd, pos, theta, dy, dx, scratch);
    launch_pdl(rmsnorm_bwd_vec_kernel<4, W, true>, static_cast<unsigned>(j.blocks), 32 * kRowsPerBlock, 0, s, j.x,
               j.w, j.rstd_in, j.dy, j.out, false, j.R, j.rows_per_block, j.partial, j.ra);
    add_dw_partials(s, j, dw);
  });
  check_launch(op);
}

// q and k in one grid when both take the fused kernel with one weight dtype; otherwise one after the
// other. Either way each tensor's results are those of its own call.
void norm_rope_forward_qk(Context& ctx, ops::NormRopeFwdIO& q, ops::NormRopeFwdIO& k, float eps, const Tensor& pos,
                          float theta) {
  const char* op = "norm_rope_forward_qk";
  if (!fwd_fused(q.x, q.w, q.y) || !fwd_fused(k.x, k.w, k.y) || q.w.dtype() != k.w.dtype()) {
    norm_rope_forward(ctx, q.x, q.w, eps, pos, theta, q.y, q.rstd);
    norm_rope_forward(ctx, k.x, k.w, eps, pos, theta, k.y, k.rstd);
    return;
  }
  need_cuda(pos, op, "pos");
  need_cuda(q.rstd, op, "q rstd");
  need_cuda(k.rstd, op, "k rstd");
  MT_CUDA_DISPATCH(q.w.dtype(), W, op, {
    const NormRopeJob<W> a = fwd_job<W>(q.x, q.w, pos, theta, q.y, q.rstd);
    const NormRopeJob<W> b = fwd_job<W>(k.x, k.w, pos, theta, k.y, k.rstd);
    launch_pdl(norm_rope_fwd_pair_kernel<W>, static_cast<unsigned>(a.blocks + b.blocks), 32 * kRowsPerBlock, 0,
               stream_of(ctx), a, b, eps);
  });
  check_launch(op);
}

void norm_rope_backward_qk(Context& ctx, ops::NormRopeBwdIO& q, ops::NormRopeBwdIO& k, const Tensor& pos, float theta) {
  const char* op = "norm_rope_backward_qk";
  if (!bwd_fused(q.x, q.w, q.dy, q.dx) || !bwd_fused(k.x, k.w, k.dy, k.dx) || q.w.dtype() != k.w.dtype()) {
    norm_rope_backward(ctx, q.x, q.w, q.rstd, pos, theta, q.dy, q.dx, q.dw);
    norm_rope_backward(ctx, k.x, k.w, k.rstd, pos, theta, k.dy, k.dx, k.dw);
    return;
  }
  need_cuda(pos, op, "pos");
  need_cuda(q.rstd, op, "q rstd");
  need_cuda(q.dw, op, "q dw");
  need_cuda(k.rstd, op, "k rstd");
  need_cuda(k.dw, op, "k dw");
  cudaStream_t s = stream_of(ctx);
  Tensor scratch_q, scratch_k;  // q's partials, then k's (the planner's order)
  MT_CUDA_DISPATCH(q.w.dtype(), W, op, {
    const NormRopeJob<W> a = bwd_job<W>(ctx, q.x, q.w, q.rstd, pos, theta, q.dy, q.dx, scratch_q);
    const NormRopeJob<W> b = bwd_job<W>(ctx, k.x, k.w, k.rstd, pos, theta, k.dy, k.dx, scratch_k);
    launch_pdl(norm_rope_bwd_pair_kernel<W>, static_cast<unsigned>(a.blocks + b.blocks), 32 * kRowsPerBlock, 0, s, a,
               b);
    add_dw_partials(s, a, q.dw);
    add_dw_partials(s, b, k.dw);
  });
  check_launch(op);
}

}  // namespace moetrain::cuda
