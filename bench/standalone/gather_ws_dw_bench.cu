// Round 21 experiment (reverted): the ws dW kernel (bf16 dw, 128 x 256 tiles) reading x through a row
// index (cp.async: warp 0 beside the store warps, or all 4 producer warps with no stores), against
// the kernel on pre-gathered rows: bits and time. Build (repo root):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ibench/standalone/gemm_stub -Isrc \
//     bench/standalone/gather_ws_dw_bench.cu -o gather_ws_dw_bench && ./gather_ws_dw_bench 20
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>
#include "core/context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw.cuh"
using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace gwd = moetrain::cuda::gwd;
#define CK(x) MT_CUDA_CHECK(x)
__global__ void fill_k(bf16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
    z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull; z ^= z >> 29;
    p[i] = __float2bfloat16_rn(((float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f));
  }
}
__global__ void gather_k(const bf16* x, const int32_t* src, int64_t N, int64_t K, bf16* xp) {
  const int64_t v = K / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * v; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / v, c = i % v;
    reinterpret_cast<uint4*>(xp)[i] = reinterpret_cast<const uint4*>(x + (int64_t)src[r] * K)[c];
  }
}
template <typename F> double med(F fn, int reps) {
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) { CK(cudaEventRecord(a)); fn(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms); }
  std::sort(t.begin(), t.end()); return t[t.size() / 2];
}
int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 20;
  Context ctx; cudaDeviceProp prop{}; CK(cudaGetDeviceProperties(&prop, 0));
  ctx.facts_.sm_count = prop.multiProcessorCount; ctx.facts_.cc_major = prop.major; ctx.facts_.cc_minor = prop.minor;
  const int64_t T = 4096; const int topk = 8, E = 128; const int64_t N = T * topk;
  int fails = 0;
  for (int skew = 0; skew < 3; ++skew) {
    std::mt19937 g(7 + skew);
    std::vector<std::vector<int32_t>> rows_of(E);
    if (skew == 0) {
      for (int t = 0; t < T; ++t) { std::vector<int> ex(E); for (int e = 0; e < E; ++e) ex[e] = e; std::shuffle(ex.begin(), ex.end(), g); for (int k = 0; k < topk; ++k) rows_of[ex[k]].push_back(t); }
    } else if (skew == 1) {
      for (int e = 0; e < 4; ++e) for (int t = 0; t < T; ++t) rows_of[e].push_back(t);
      for (int e = 4; e < 68; ++e) for (int i = 0; i < 256; ++i) rows_of[e].push_back((int32_t)(g() % T));
    } else {  // uneven edges: odd counts
      int64_t left = N;
      for (int e = 0; e < E && left > 0; ++e) { int c = (int)std::min<int64_t>(left, (e * 37) % 511 + (e % 3 == 0 ? 0 : 1)); for (int i = 0; i < c; ++i) rows_of[e].push_back((int32_t)(g() % T)); left -= c; }
    }
    std::vector<int32_t> off(E + 1, 0), src; for (int e = 0; e < E; ++e) { off[e + 1] = off[e] + (int)rows_of[e].size(); for (int t : rows_of[e]) src.push_back(t); }
    const int64_t Nr = off[E];
    int32_t *doff, *dsrc; CK(cudaMalloc(&doff, (E + 1) * 4)); CK(cudaMalloc(&dsrc, std::max<int64_t>(Nr, 1) * 4));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsrc, src.data(), Nr * 4, cudaMemcpyHostToDevice));
    struct Shape { const char* name; int64_t K, M; } shapes[] = {{"gate_up dW", 2048, 1536}, {"down-like dW (K 768)", 768, 2048}};
    for (auto& s : shapes) {
      bf16 *x, *xp, *dy, *w1, *w2;
      CK(cudaMalloc(&x, T * s.K * 2)); CK(cudaMalloc(&xp, std::max<int64_t>(Nr, 1) * s.K * 2)); CK(cudaMalloc(&dy, std::max<int64_t>(Nr, 1) * s.M * 2));
      const int64_t nw = (int64_t)E * s.M * s.K;
      CK(cudaMalloc(&w1, nw * 2)); CK(cudaMalloc(&w2, nw * 2));
      fill_k<<<1024, 256>>>(x, T * s.K, 11); fill_k<<<1024, 256>>>(dy, Nr * s.M, 12);
      auto gat = [&] { gather_k<<<1024, 256>>>(x, dsrc, Nr, s.K, xp); };
      auto plain = [&] { gwd::dispatch_dw(ctx, xp, dy, doff, E, Nr, s.K, s.M, w1, true, false, nullptr, 0); };
      auto gathered = [&] { gwd::dispatch_dw_gather(ctx, x, T, dsrc, dy, doff, E, Nr, s.K, s.M, w2); };
      gat(); plain(); CK(cudaMemset(w2, 0xFF, nw * 2)); gathered(); CK(cudaDeviceSynchronize());
      std::vector<uint16_t> a(nw), b(nw);
      CK(cudaMemcpy(a.data(), w1, nw * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), w2, nw * 2, cudaMemcpyDeviceToHost));
      int64_t diff = 0; for (int64_t i = 0; i < nw; ++i) diff += a[i] != b[i];
      if (diff) ++fails;
      const double tg = med(gat, reps), tp = med(plain, reps), tq = med(gathered, reps), tp2 = med(plain, reps), tq2 = med(gathered, reps);
      std::printf("| %s | %-20s | bits %s (%lld differ) | gather kernel %.3f | plain dW %.3f, %.3f | gathered dW %.3f, %.3f |\n",
                  skew == 0 ? "even" : skew == 1 ? "proxy skew" : "uneven", s.name, diff ? "DIFFER" : "equal", (long long)diff, tg, tp, tp2, tq, tq2);
      auto ns_plain = [&] { gwd::dispatch_dw_nostore(ctx, xp, dy, doff, E, Nr, s.K, s.M, w1); };
      auto ns_gath = [&] { gwd::dispatch_dw_gather<gwd::NoStoreEpilogue>(ctx, x, T, dsrc, dy, doff, E, Nr, s.K, s.M, w2); };
      const double a1 = med(ns_plain, reps), b1 = med(ns_gath, reps), a2 = med(ns_plain, reps), b2 = med(ns_gath, reps);
      std::printf("|   no stores (solo)    | plain %.3f, %.3f | gathered, 4 warps %.3f, %.3f |\n", a1, a2, b1, b2);
      CK(cudaFree(x)); CK(cudaFree(xp)); CK(cudaFree(dy)); CK(cudaFree(w1)); CK(cudaFree(w2));
    }
    CK(cudaFree(doff)); CK(cudaFree(dsrc));
  }
  std::printf("%s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}
