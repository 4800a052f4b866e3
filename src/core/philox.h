// Philox4x32 counter-based RNG (Salmon et al., SC'11), 10 rounds unless a caller names fewer.
// Stateless: the same (key, counter) always gives the same four 32-bit words, on the CPU and in CUDA
// kernels, which makes random streams reproducible per step and per rank no matter how work is split.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif

namespace moetrain {

struct Philox4 {
  uint32_t v[4];
};

// kRounds rounds: 10 is the generator's default (philox4x32 below); the authors found 7 the fewest
// that pass TestU01's BigCrush, and stochastic rounding uses 7 (adamw_math::kSrRounds).
template <int kRounds>
MT_HD Philox4 philox4x32_rounds(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  static_assert(kRounds >= 1 && kRounds <= 16, "Philox4x32 rounds");
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < kRounds; ++r) {
#if defined(__CUDA_ARCH__)
    // The same products as 32-bit halves: nvcc lowered the 64-bit form to IMAD.WIDE plus an add of
    // zero to the high word, two instructions per round more (the fused expert update with stochastic
    // rounding, gate_up, was 1.5-3.5% slower; docs/performance.md, round 19).
    const uint32_t h0 = __umulhi(0xD2511F53u, c0), l0 = 0xD2511F53u * c0;
    const uint32_t h1 = __umulhi(0xCD9E8D57u, c2), l1 = 0xCD9E8D57u * c2;
#else
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t h0 = static_cast<uint32_t>(p0 >> 32), l0 = static_cast<uint32_t>(p0);
    const uint32_t h1 = static_cast<uint32_t>(p1 >> 32), l1 = static_cast<uint32_t>(p1);
#endif
    const uint32_t n0 = h1 ^ c1 ^ k0, n1 = l1, n2 = h0 ^ c3 ^ k1, n3 = l0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

MT_HD Philox4 philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  return philox4x32_rounds<10>(key, counter_hi, counter_lo);
}

// Uniform in (0, 1], from the top 24 bits.
MT_HD float philox_uniform(uint32_t x) { return (static_cast<float>(x >> 8) + 1.0f) * (1.0f / 16777216.0f); }

// Two standard normals by Box-Muller from one Philox call's first two words.
MT_HD void philox_normal2(const Philox4& r, float* a, float* b) {
  float u1 = philox_uniform(r.v[0]), u2 = philox_uniform(r.v[1]);
  float rad = sqrtf(-2.0f * logf(u1));
  float th = 6.283185307179586f * u2;
  *a = rad * cosf(th);
  *b = rad * sinf(th);
}

}  // namespace moetrain
