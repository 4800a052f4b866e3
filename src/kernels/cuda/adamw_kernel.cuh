// The AdamW CUDA kernel, templated on the storage types of weights, grad, m, v and the compute
// copy (float, or uint16_t holding bf16 bits, the CPU twin's representation), so elementwise.cu
// and the standalone benchmark (bench/standalone/adamw_precision.cu) share it. Per-element math
// and rounding: kernels/adamw_math.h, bit-identical to the CPU twin.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/adamw_math.h"
#include "kernels/cuda/pdl.cuh"

namespace moetrain::cuda::adamw_detail {

namespace am = adamw_math;

// Storage types: float, or uint16_t holding bf16 bits (the CPU twin's representation, so the
// rounding code in kernels/adamw_math.h is shared verbatim).
__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const uint16_t* p, int64_t i) { return am::bf16_to_f32(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void st(uint16_t* p, int64_t i, float x) { p[i] = am::bf16_rne(x); }

// 8 consecutive elements, 16-byte aligned: two float4 or one uint4.
__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void widen8_bits(const uint4& u, float (&x)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[2 * j] = am::bits_float(w[j] << 16);
    x[2 * j + 1] = am::bits_float(w[j] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 narrow8_bits(const float (&x)[8]) {
  return make_uint4(am::bf16x2_rne(x[0], x[1]), am::bf16x2_rne(x[2], x[3]), am::bf16x2_rne(x[4], x[5]),
                    am::bf16x2_rne(x[6], x[7]));
}

__device__ __forceinline__ void load8(const uint16_t* p, float (&x)[8]) {
  widen8_bits(*reinterpret_cast<const uint4*>(p), x);
}
// load8, and the OR of the 8 stored values' bits: 0 when all of them are +0.
__device__ __forceinline__ uint32_t load8_or(const float* p, float (&x)[8]) {
  load8(p, x);
  uint32_t o = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) o |= __float_as_uint(x[j]);
  return o;
}
__device__ __forceinline__ uint32_t load8_or(const uint16_t* p, float (&x)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  widen8_bits(u, x);
  return u.x | u.y | u.z | u.w;
}
// One 16-byte store. (A uint4 assignment can reach the PTX as four st.global.u32: nvcc split the
// bf16 stores of the fused dW + AdamW walk that way, four times the store instructions and L2 sectors.)
// No memory clobber: the kernels here never read back what they store, and the compiler may keep
// moving the walk's other loads across these stores.
__device__ __forceinline__ void st16(void* p, const uint4& u) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w));
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  st16(p, make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3])));
  st16(p + 4, make_uint4(__float_as_uint(x[4]), __float_as_uint(x[5]), __float_as_uint(x[6]), __float_as_uint(x[7])));
}
__device__ __forceinline__ uint4 pack8_bits(const uint16_t (&b)[8]) {
  return make_uint4(b[0] | (static_cast<uint32_t>(b[1]) << 16), b[2] | (static_cast<uint32_t>(b[3]) << 16),
                    b[4] | (static_cast<uint32_t>(b[5]) << 16), b[6] | (static_cast<uint32_t>(b[7]) << 16));
}
__device__ __forceinline__ void store8_bits(uint16_t* p, const uint16_t (&b)[8]) {
  st16(p, pack8_bits(b));
}
__device__ __forceinline__ void store8(uint16_t* p, const float (&x)[8]) {
  st16(p, narrow8_bits(x));
}

// The 8 new weights from i0 as stored bf16, two to a word: bf16_stochastic's bits with the random
// half-words of sr_bits(key, counter, i0 / 8) (element 2i: the low half of word i, 2i + 1: its high
// half) when sr, else bf16_rne's (one cvt.rn.bf16x2 a pair). Stochastic rounding keeps the high halves
// of a pair's two sums with one byte permute, and tests the vector for a NaN weight once (bf16_stochastic
// stores 0x7fff for it) instead of selecting per weight.
__device__ __forceinline__ uint4 round8_bits(const float (&x)[8], bool sr, uint64_t key, uint64_t counter, int64_t i0) {
  uint32_t b[4];
  if (sr) {
    const Philox4 r = am::sr_bits(key, counter, static_cast<uint64_t>(i0) >> 3);
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = __float_as_uint(x[2 * i]) + (r.v[i] & 0xffffu);
      const uint32_t hi = __float_as_uint(x[2 * i + 1]) + (r.v[i] >> 16);
      b[i] = __byte_perm(lo, hi, 0x7632);
      nan |= (x[2 * i] != x[2 * i]) | (x[2 * i + 1] != x[2 * i + 1]);
    }
    if (nan) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (x[2 * i] != x[2 * i]) b[i] = (b[i] & 0xffff0000u) | 0x7fffu;
        if (x[2 * i + 1] != x[2 * i + 1]) b[i] = (b[i] & 0xffffu) | 0x7fff0000u;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = am::bf16x2_rne(x[2 * i], x[2 * i + 1]);
  }
  return make_uint4(b[0], b[1], b[2], b[3]);
}

// New weight -> stored weight (and its f32 value for the compute copy).
template <typename W>
__device__ __forceinline__ float store_weight(W* w, int64_t i, float x, bool sr, uint32_t random) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    const uint16_t b = sr ? am::bf16_stochastic(x, random) : am::bf16_rne(x);
    w[i] = b;
    return am::bf16_to_f32(b);
  } else {
    w[i] = x;
    return x;
  }
}

// Chunk c of the update: elements 8c .. 8c + 7 (kVec: every pointer 16-byte aligned; a partial
// last chunk takes the scalar path) or element c. One Philox call gives the 8 random half-words of
// a chunk.
template <typename W, typename G, typename M, typename V, typename C, bool kVec>
__device__ __forceinline__ void adamw_chunk(W* __restrict__ w, const G* __restrict__ g, M* __restrict__ m,
                                            V* __restrict__ v, C* __restrict__ comp, int64_t n, const am::Consts& k,
                                            bool sr, uint64_t key, uint64_t counter, int64_t c) {
  constexpr int kPer = kVec ? 8 : 1;
  const int64_t i0 = c * kPer;
  if (kVec && i0 + 8 <= n) {
    float wf[8], gf[8], mf[8], vf[8];
    load8(w + i0, wf);
    const uint32_t nonzero = load8_or(g + i0, gf) | load8_or(m + i0, mf) | load8_or(v + i0, vf);
    if (nonzero) {
#pragma unroll
      for (int j = 0; j < 8; ++j) am::update(k, gf[j], mf[j], vf[j], wf[j]);  // (update8 measured 3% slower here)
    } else {
      // Gradient, m and v all +0 (an embedding row that no token has touched): update() with its
      // m, v and quotient taken from the constants (make_consts), without the square root and divide,
      // whose slow paths a zero takes.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mf[j] = k.zero_m, vf[j] = k.zero_v;
        wf[j] = am::sub(wf[j], am::mul(k.lr, am::add(k.zero_q, am::mul(k.wd, wf[j]))));
      }
    }
    store8(m + i0, mf);
    store8(v + i0, vf);
    if constexpr (std::is_same_v<W, uint16_t>) {
      const uint4 b = round8_bits(wf, sr, key, counter, i0);
      st16(w + i0, b);
      if (comp) {
        widen8_bits(b, wf);
        store8(comp + i0, wf);
      }
    } else {
      store8(w + i0, wf);
      if (comp) store8(comp + i0, wf);
    }
  } else {
    const int64_t end = i0 + kPer < n ? i0 + kPer : n;
    for (int64_t i = i0; i < end; ++i) {
      float mi = ld(m, i), vi = ld(v, i), wi = ld(w, i);
      am::update(k, ld(g, i), mi, vi, wi);
      st(m, i, mi);
      st(v, i, vi);
      const uint32_t r = std::is_same_v<W, uint16_t> && sr ? am::random_word(key, counter, static_cast<uint64_t>(i)) : 0u;
      const float stored = store_weight(w, i, wi, sr, r);
      if (comp) st(comp, i, stored);
    }
  }
}

// One tensor: a grid-stride loop over its chunks.
template <typename W, typename G, typename M, typename V, typename C, bool kVec>
__global__ void adamw_kernel(W* __restrict__ w, const G* __restrict__ g, M* __restrict__ m, V* __restrict__ v,
                             C* __restrict__ comp, int64_t n, am::Consts k, bool sr, uint64_t key, uint64_t counter) {
  pdl_wait();
  const int64_t chunks = kVec ? (n + 7) / 8 : n;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x)
    adamw_chunk<W, G, M, V, C, kVec>(w, g, m, v, comp, n, k, sr, key, counter, c);
}

// Several tensors of one storage-type combination in one launch (adamw_step_many): their chunks are
// numbered one after another (job j owns chunks start[j] .. start[j + 1] - 1) and the grid strides
// over all of them, each chunk computed as adamw_kernel computes it, so the bits are the same. The
// batch travels as the kernel parameter (under the 4 KB limit).
struct MultiJob {
  void* w;
  const void* g;
  void* m;
  void* v;
  void* comp;  // null: no compute copy
  int64_t n;
  am::Consts k;
  uint64_t key, counter;
  int sr, vec;
};
constexpr int kMultiJobs = 24;
struct MultiBatch {
  MultiJob job[kMultiJobs];
  int64_t start[kMultiJobs + 1];
  int njobs;
};
static_assert(sizeof(MultiBatch) <= 4000, "a MultiBatch must fit the 4 KB kernel parameter space");

template <typename W, typename G, typename M, typename V, typename C>
__global__ void adamw_multi_kernel(const __grid_constant__ MultiBatch b) {
  pdl_wait();
  const int64_t total = b.start[b.njobs];
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < total; c += (int64_t)gridDim.x * blockDim.x) {
    int lo = 0, hi = b.njobs - 1;  // the last job whose first chunk is at most c
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (b.start[mid] <= c) lo = mid; else hi = mid - 1;
    }
    const MultiJob& j = b.job[lo];
    W* w = static_cast<W*>(j.w);
    const G* g = static_cast<const G*>(j.g);
    M* m = static_cast<M*>(j.m);
    V* v = static_cast<V*>(j.v);
    C* comp = static_cast<C*>(j.comp);
    const int64_t lc = c - b.start[lo];
    if (j.vec) adamw_chunk<W, G, M, V, C, true>(w, g, m, v, comp, j.n, j.k, j.sr != 0, j.key, j.counter, lc);
    else adamw_chunk<W, G, M, V, C, false>(w, g, m, v, comp, j.n, j.k, j.sr != 0, j.key, j.counter, lc);
  }
}

}  // namespace moetrain::cuda::adamw_detail
