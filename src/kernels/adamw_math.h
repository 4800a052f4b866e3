// AdamW per-element math and bf16 rounding, shared by the CPU twin (cpu/adamw.cpp) and the CUDA
// kernel (cuda/elementwise.cu) so that both give the same bits: every float operation is an
// explicit IEEE round-to-nearest op (the device side uses __f*_rn intrinsics, which nvcc never
// contracts into FMAs; the host side assumes x86-64 SSE without FMA contraction, the project's
// build). Stochastic rounding draws 16 Philox bits per element, addressed by its index.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/philox.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

namespace moetrain::adamw_math {

#if defined(__CUDA_ARCH__)
MT_HD float mul(float a, float b) { return __fmul_rn(a, b); }
MT_HD float add(float a, float b) { return __fadd_rn(a, b); }
MT_HD float sub(float a, float b) { return __fsub_rn(a, b); }
MT_HD float div(float a, float b) { return __fdiv_rn(a, b); }
MT_HD float sqrt_rn(float a) { return __fsqrt_rn(a); }
MT_HD uint32_t float_bits(float f) { return __float_as_uint(f); }
MT_HD float bits_float(uint32_t u) { return __uint_as_float(u); }
#else
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float div(float a, float b) { return a / b; }
inline float sqrt_rn(float a) { return std::sqrt(a); }
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
#endif

// Step constants, computed once on the host: the bias corrections as 1 / (1 - b1^t) and
// 1 / sqrt(1 - b2^t), in double, then rounded to float (two multiplies per element instead of
// two divides; the per-element math is bound by instruction issue inside the dW GEMM's epilogue).
// zero_m, zero_v, zero_q: what update() forms for an element whose gradient, m and v are all +0 (an
// embedding row that no token has touched yet): its new m and v, and the quotient m' / bc1 / denom.
// They depend on the constants alone, so the GPU's AdamW kernel gives a vector of such elements
// w -= lr * (zero_q + wd * w) without the square root and divide (the same operations on the same
// values, so the same bits).
struct Consts {
  float lr, b1, b2, one_minus_b1, one_minus_b2, eps, wd, inv_bc1, inv_sqrt_bc2, grad_scale;
  float zero_m, zero_v, zero_q;
};
inline Consts make_consts(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                          float grad_scale) {
  Consts k;
  k.lr = lr;
  k.b1 = beta1;
  k.b2 = beta2;
  k.one_minus_b1 = 1.0f - beta1;
  k.one_minus_b2 = 1.0f - beta2;
  k.eps = eps;
  k.wd = weight_decay;
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  k.inv_bc1 = static_cast<float>(1.0 / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.grad_scale = grad_scale;
  // update()'s first steps for grad = m = v = +0, in its order (host arithmetic: the same IEEE
  // round-to-nearest operations as the device's __f*_rn and sqrt / divide).
  const float g0 = mul(0.0f, grad_scale);
  k.zero_m = add(mul(k.b1, 0.0f), mul(k.one_minus_b1, g0));
  k.zero_v = add(mul(k.b2, 0.0f), mul(mul(k.one_minus_b2, g0), g0));
  k.zero_q = div(mul(k.zero_m, k.inv_bc1), add(mul(sqrt_rn(k.zero_v), k.inv_sqrt_bc2), k.eps));
  return k;
}

// Whether update8<..., kFastWalk> may run with these constants: grad_scale exactly 1 (no clipping
// factor: the update in backward), eps in [2^-62, 2^62) and 1 / sqrt(bc2) in [0, 2^12) (every
// practical setting; 2^12 needs 1 - beta2^step < 2^-24). Then g * grad_scale is g (its NaNs too, as far
// as any stored bit goes: every later operation returns the canonical NaN), and for v in
// [2^-101, 2^100) the square root s < 2^50 (correctly rounded, at most 2^50), s / sqrt(bc2) <= 2^62 and
// the denominator s / sqrt(bc2) + eps lies in [2^-62, 2^63]: normal, and inside div_fast's [2^-63, 2^64).
inline bool fast_walk_ok(const Consts& c) {
  return c.grad_scale == 1.0f && c.eps >= 0x1p-62f && c.eps < 0x1p62f && c.inv_sqrt_bc2 >= 0.0f &&
         c.inv_sqrt_bc2 < 0x1p12f;
}

// One element: g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g;
// w -= lr * ((m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd * w), with bc = 1 - b^t applied as the
// host's reciprocals (one divide and one square root per element). m, v and w are f32 in and out
// (the caller widens/rounds its storage); the update uses the fresh f32 m and v, before rounding.
MT_HD void update(const Consts& c, float grad, float& m, float& v, float& w) {
  const float g = mul(grad, c.grad_scale);
  m = add(mul(c.b1, m), mul(c.one_minus_b1, g));
  v = add(mul(c.b2, v), mul(mul(c.one_minus_b2, g), g));
  const float denom = add(mul(sqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  const float upd = add(div(mul(m, c.inv_bc1), denom), mul(c.wd, w));
  w = sub(w, mul(c.lr, upd));
}

#if defined(__CUDACC__)
// ---- device: update() of 8 elements with the square roots and divides inline, without branches ----
// __fsqrt_rn and __fdiv_rn compile to a short fast sequence plus a branch to a slow path for operands
// where that sequence could be inexact; those branches serialised the 8 elements of a vector (no
// overlap of one element's MUFU latency with the next), which bounded the update inside the dW
// GEMM's epilogue (8 warps per SM) by latency. update8 runs the same fast sequences for all 8,
// checks the operand ranges, and redoes an element whose operands fall outside them with update().
// A correctly rounded result is unique, so every element has the bits of update() (and the CPU's).
__device__ __forceinline__ float rsqrt_approx_ftz(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// The range test of the compiler's own sqrt.rn fast path: x in [2^-101, 2^127) (positive, normal).
__device__ __forceinline__ bool sqrt_fast_ok(float x) { return __float_as_uint(x) - 0x0d000000u <= 0x727fffffu; }
// A narrower range, x in [2^-101, 2^100), for update8<..., kFastWalk> (see fast_walk_ok).
__device__ __forceinline__ bool sqrt_fast_ok_narrow(float x) { return __float_as_uint(x) - 0x0d000000u <= 0x647fffffu; }
// sqrt.rn's fast sequence (one Newton step on the MUFU reciprocal square root): exact where sqrt_fast_ok.
__device__ __forceinline__ float sqrt_fast(float x) {
  const float r = rsqrt_approx_ftz(x);
  const float s = __fmul_rn(x, r), h = __fmul_rn(r, 0.5f);
  return __fmaf_rn(__fmaf_rn(-s, s, x), h, s);
}
// The biased exponent field in place (bits 23-30): a range of exponents is a range of these words, so
// a test needs no shift (exponent e in [64, 190] <=> field - (64 << 23) <= (126 << 23), unsigned).
__device__ __forceinline__ uint32_t exp_field(float x) { return __float_as_uint(x) & 0x7f800000u; }
constexpr uint32_t kExp64 = 64u << 23, kExpSpan = 126u << 23;
// A conservative range for div.rn's fast sequence: a and b normal with |a|, |b| in [2^-63, 2^64), so
// the quotient, the reciprocal and the remainder stay far from overflow and underflow.
__device__ __forceinline__ bool div_fast_ok(float a, float b) {
  return exp_field(a) - kExp64 <= kExpSpan && exp_field(b) - kExp64 <= kExpSpan;
}
// div.rn's fast sequence (Newton step on the MUFU reciprocal, then one remainder correction).
__device__ __forceinline__ float div_fast(float a, float b) {
  const float r0 = rcp_approx_ftz(b);
  const float r = __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
  const float q = __fmaf_rn(a, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-b, q, a), q);
}
// update() of 8 independent elements: the same operations in the same order per element.
// kZeros: exact zeros also take the fast sequences. sqrt(+-0) = +-0, and +-0 divided by a positive
// finite denominator is that zero, so both are selected exactly instead of redone. Without it a zero
// v or m (an expert that has not had a row yet: its moments stay exactly 0, step after step) sends
// all 8 elements of a vector through update() one after the other, with the slow paths of the
// IEEE square root and divide. It also keeps tiny numerators (m decayed over many idle steps) on
// the fast path. The selects cost about 12 instructions per element, so only the walks of experts
// without rows use it (they are where the zeros and the decayed moments are).
// kFastWalk (only where fast_walk_ok(c) holds, and not with kZeros): no multiply by grad_scale (it is
// 1), and v is tested against [2^-101, 2^100) instead of sqrt_fast_ok's range, which puts the
// denominator inside div_fast's, so the divide tests only its numerator (about 5 instructions an
// element fewer in all). A v outside the narrower range is redone by update() like any other miss;
// a miss in any element redoes all 8 (every element then has update()'s bits either way), which
// spares the per-element bookkeeping of which ones missed.
template <bool kZeros = false, bool kFastWalk = false>
__device__ __forceinline__ void update8(const Consts& c, const float (&grad)[8], float (&m)[8], float (&v)[8],
                                        float (&w)[8]) {
  constexpr bool kFast = kFastWalk && !kZeros;
  float m0[8], v0[8], w0[8];
  unsigned redo = 0;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    m0[j] = m[j], v0[j] = v[j], w0[j] = w[j];
    const float g = kFast ? grad[j] : mul(grad[j], c.grad_scale);
    m[j] = add(mul(c.b1, m[j]), mul(c.one_minus_b1, g));
    v[j] = add(mul(c.b2, v[j]), mul(mul(c.one_minus_b2, g), g));
    bool ok = kFast ? sqrt_fast_ok_narrow(v[j]) : sqrt_fast_ok(v[j]);
    float s = sqrt_fast(v[j]);
    if constexpr (kZeros) {
      const bool zv = v[j] == 0.0f;
      s = zv ? v[j] : s;
      ok = ok || zv;
    }
    const float denom = add(mul(s, c.inv_sqrt_bc2), c.eps);
    const float a = mul(m[j], c.inv_bc1);
    const float wdw = mul(c.wd, w[j]);
    float q;
    if constexpr (kZeros) {
      // a = 0: q = a, exact when denom is positive and finite (bits in [1, 0x7f7fffff]).
      // 0 < |a| < 2^-63 (an idle expert's m after a few hundred steps of decay): divide a * 2^100
      // (exact, and inside div_fast's range for every such float) and scale back, exact when the
      // scaled quotient is at least 2^-25 (the true one is then a normal float, and rounding commutes
      // with the power of two). A smaller quotient (below 2^-125) cannot change q + wd w when
      // |wd w| >= 2^-90 (it is under a quarter of that sum's ulp): q = 0 gives the same bits.
      const uint32_t ea = exp_field(a), ed = exp_field(denom);
      const bool za = a == 0.0f, tiny = ea < kExp64, d_ok = ed - kExp64 <= kExpSpan;
      const float qd = div_fast(tiny ? mul(a, 0x1p100f) : a, denom);
      const bool big = fabsf(qd) >= 0x1p-25f, absorbed = fabsf(wdw) >= 0x1p-90f;
      if (za) {
        q = a;
        ok = ok && __float_as_uint(denom) - 1u < 0x7f7fffffu;
      } else if (tiny) {
        q = big ? mul(qd, 0x1p-100f) : 0.0f;
        ok = ok && d_ok && (big || absorbed);
      } else {
        q = qd;
        ok = ok && d_ok && ea - kExp64 <= kExpSpan;
      }
    } else {
      q = div_fast(a, denom);
      ok = ok && (kFast ? exp_field(a) - kExp64 <= kExpSpan : div_fast_ok(a, denom));
    }
    if constexpr (kFast) bad = bad || !ok;  // (a predicate OR, instead of a select, shift and OR)
    else redo |= static_cast<unsigned>(!ok) << j;
    w[j] = sub(w[j], mul(c.lr, add(q, wdw)));
  }
  if constexpr (kFast) redo = bad ? 0xffu : 0u;  // a miss is rare here: redo the whole vector
  if (redo) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if ((redo >> j) & 1u) {
        m[j] = m0[j], v[j] = v0[j], w[j] = w0[j];
        update(c, grad[j], m[j], v[j], w[j]);
      }
  }
}
#endif

// f32 -> bf16 bits, round to nearest even; every NaN becomes the canonical quiet NaN 0x7fff. On the
// GPU this is the hardware conversion (cvt.rn.bf16.f32, one instruction instead of six: the update
// inside the dW GEMM's epilogue is bound by instruction issue), which gives exactly these bits.
MT_HD uint16_t bf16_rne(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
#endif
}

// Two of them packed into a word, lo in the low half (one cvt.rn.bf16x2.f32 on the GPU).
MT_HD uint32_t bf16x2_rne(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
#else
  return static_cast<uint32_t>(bf16_rne(lo)) | (static_cast<uint32_t>(bf16_rne(hi)) << 16);
#endif
}

// f32 -> bf16 bits, rounded stochastically: the 16 dropped bits are compared with 16 random bits,
// so x rounds away from zero with probability (dropped bits) / 2^16, unbiased in expectation
// (E[round(x)] = x, exactly for values whose dropped part is a multiple of 2^-16 ulp). NaN and
// infinities round to nearest; a finite value may round to infinity only from the last binade.
MT_HD uint16_t bf16_stochastic(float f, uint32_t random) {
  // NaN: bf16_rne's canonical quiet NaN. Infinities need no test: the 16 random bits never carry out
  // of 0x7f800000's or 0xff800000's low half, so the sum keeps them (one compare per element instead
  // of the exponent test and a second rounding, in the fused update's walk).
  if (f != f) return 0x7fffu;
  return static_cast<uint16_t>((float_bits(f) + (random & 0xffffu)) >> 16);
}

MT_HD float bf16_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// The random words of stochastic rounding come from Philox4x32 with 7 rounds, the fewest with which
// its authors found it passes TestU01's BigCrush (10, the generator's default, is a safety margin for
// general use). Each round is about 6 integer instructions per 8 weights; the fused expert update's walk
// is bound by instruction issue on the H200, where the 3 rounds saved are about 2% of it
// (docs/performance.md, round 32).
constexpr int kSrRounds = 7;
MT_HD Philox4 sr_bits(uint64_t key, uint64_t counter, uint64_t vec) {
  return philox4x32_rounds<kSrRounds>(key, counter, vec);
}
// The 16 random bits of element i of a stream (in the low half; bf16_stochastic reads only those):
// half-word i % 8 of sr_bits(key, counter, i / 8), low half first. One Philox call covers 8
// elements, a 16-byte vector of bf16 weights.
MT_HD uint32_t random_half(const Philox4& r, int j) { return r.v[(j & 7) >> 1] >> ((j & 1) * 16); }
MT_HD uint32_t random_word(uint64_t key, uint64_t counter, uint64_t i) {
  return random_half(sr_bits(key, counter, i >> 3), static_cast<int>(i & 7));
}

}  // namespace moetrain::adamw_math
