// Shared pieces of the two standalone expert-dW harnesses (gemm_ws_dw.cu, gemm_ws_dw_adamw.cu): a
// counter hash for reproducible random inputs, and a routed problem (x [N, K], dy [N, M] in bf16,
// offsets [E+1] on the device; rows past offsets[E] are NaN, so a kernel that reads them fails).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"

__device__ __forceinline__ uint64_t mix(uint64_t i, uint64_t seed) {
  uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
  z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
  z = (z ^ (z >> 29)) * 0xC4CEB9FE1A85EC53ull;
  return z ^ (z >> 32);
}
__device__ __forceinline__ float unit(uint64_t i, uint64_t seed) {  // uniform in [-1, 1)
  return static_cast<float>(mix(i, seed) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}
// p[i] = unit(i, seed) * scale in bf16 (round to nearest even), NaN from index nan_from on.
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale, int64_t nan_from) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = i >= nan_from ? __float2bfloat16_rn(NAN) : __float2bfloat16_rn(unit(i, seed) * scale);
}

struct Prob {
  const char* tag;
  int E;
  int64_t N, K, M;
  std::vector<int32_t> off;
  __nv_bfloat16 *x = nullptr, *dy = nullptr;
  int32_t* doff = nullptr;
};

// Expert e gets counts[e] rows (in order); N >= their sum.
inline Prob make(const char* tag, const std::vector<int64_t>& counts, int64_t N, int64_t K, int64_t M) {
  Prob p{tag, (int)counts.size(), N, K, M};
  p.off.assign(p.E + 1, 0);
  for (int e = 0; e < p.E; ++e) p.off[e + 1] = p.off[e] + (int32_t)counts[e];
  if (p.off[p.E] > N) {
    std::fprintf(stderr, "bad problem %s\n", tag);
    std::exit(2);
  }
  MT_CUDA_CHECK(cudaMalloc(&p.x, N * K * 2 + 16));
  MT_CUDA_CHECK(cudaMalloc(&p.dy, N * M * 2 + 16));
  MT_CUDA_CHECK(cudaMalloc(&p.doff, (p.E + 1) * 4));
  MT_CUDA_CHECK(cudaMemcpy(p.doff, p.off.data(), (p.E + 1) * 4, cudaMemcpyHostToDevice));
  fill_bf16<<<1024, 256>>>(p.x, N * K, 11, 1.0f, (int64_t)p.off[p.E] * K);
  fill_bf16<<<1024, 256>>>(p.dy, N * M, 12, 1.0f, (int64_t)p.off[p.E] * M);
  MT_CUDA_CHECK(cudaGetLastError());
  return p;
}
inline void release(Prob& p) {
  MT_CUDA_CHECK(cudaFree(p.x));
  MT_CUDA_CHECK(cudaFree(p.dy));
  MT_CUDA_CHECK(cudaFree(p.doff));
}

// Rows per expert when T tokens each pick topk distinct experts of E at random.
inline std::vector<int64_t> routed(int64_t T, int topk, int E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> counts(E, 0);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int i = 0; i < topk; ++i) {
      std::swap(perm[i], perm[i + (int)(rng() % (E - i))]);
      ++counts[perm[i]];
    }
  }
  return counts;
}
