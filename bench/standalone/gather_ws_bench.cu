// Round 21 experiment (reverted): the ws grouped GEMM (fwd and dx) reading its A rows through a row
// index (the MoE permutation fused into the loads; cp.async by the 128 producer threads with the
// 128B swizzle by hand), bitwise against the kernel on pre-gathered rows and timed beside it and the
// gather kernel it would replace. Build (repo root):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ibench/standalone/gemm_stub -Isrc \
//     -c src/kernels/cuda/grouped_gemm_ws.cu -o gws.o
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ibench/standalone/gemm_stub -Isrc \
//     bench/standalone/gather_ws_bench.cu gws.o -o gather_ws_bench && ./gather_ws_bench 20
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>
#include "core/context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"
using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace moetrain::cuda {
void grouped_gemm_ws_forward_gather(Context& ctx, const __nv_bfloat16* x, int64_t T, const int32_t* src,
                                    const __nv_bfloat16* w, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
                                    __nv_bfloat16* y);
void grouped_gemm_ws_dx_gather(Context& ctx, const __nv_bfloat16* dy, int64_t T, const int32_t* src,
                               const __nv_bfloat16* w, const int32_t* off, int E, int64_t N, int64_t K, int64_t M,
                               __nv_bfloat16* dx);
}
namespace mc = moetrain::cuda;
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
  for (int skew = 0; skew < 2; ++skew) {
    std::mt19937 g(7 + skew);
    std::vector<std::vector<int32_t>> rows_of(E);
    if (!skew) {
      for (int t = 0; t < T; ++t) { std::vector<int> ex(E); for (int e = 0; e < E; ++e) ex[e] = e; std::shuffle(ex.begin(), ex.end(), g); for (int k = 0; k < topk; ++k) rows_of[ex[k]].push_back(t); }
    } else {  // the proxy's routing: 4 experts take every token, 64 take 256, 60 idle
      for (int e = 0; e < 4; ++e) for (int t = 0; t < T; ++t) rows_of[e].push_back(t);
      for (int e = 4; e < 68; ++e) for (int i = 0; i < 256; ++i) rows_of[e].push_back((int32_t)(g() % T));
    }
    std::vector<int32_t> off(E + 1, 0), src; for (int e = 0; e < E; ++e) { off[e + 1] = off[e] + (int)rows_of[e].size(); for (int t : rows_of[e]) src.push_back(t); }
    int32_t *doff, *dsrc; CK(cudaMalloc(&doff, (E + 1) * 4)); CK(cudaMalloc(&dsrc, N * 4));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsrc, src.data(), N * 4, cudaMemcpyHostToDevice));
    struct Shape { const char* name; bool dx; int64_t K, M; } shapes[] = {{"gate_up fwd", false, 2048, 1536}, {"down fwd", false, 768, 2048}, {"down dx", true, 768, 2048}, {"gate_up dx", true, 2048, 1536}};
    for (auto& s : shapes) {
      const int64_t red = s.dx ? s.M : s.K, cols = s.dx ? s.K : s.M;
      bf16 *x, *xp, *w, *y1, *y2;
      CK(cudaMalloc(&x, T * red * 2)); CK(cudaMalloc(&xp, N * red * 2)); CK(cudaMalloc(&w, (int64_t)E * s.M * s.K * 2));
      CK(cudaMalloc(&y1, N * cols * 2)); CK(cudaMalloc(&y2, N * cols * 2));
      fill_k<<<1024, 256>>>(x, T * red, 11); fill_k<<<1024, 256>>>(w, (int64_t)E * s.M * s.K, 12);
      auto gat = [&] { gather_k<<<1024, 256>>>(x, dsrc, N, red, xp); };
      auto plain = [&] { if (s.dx) mc::grouped_gemm_ws_dx(ctx, xp, w, doff, E, N, s.K, s.M, y1, 1); else mc::grouped_gemm_ws_forward(ctx, xp, w, doff, E, N, s.K, s.M, y1, 1); };
      auto gathered = [&] { if (s.dx) mc::grouped_gemm_ws_dx_gather(ctx, x, T, dsrc, w, doff, E, N, s.K, s.M, y2); else mc::grouped_gemm_ws_forward_gather(ctx, x, T, dsrc, w, doff, E, N, s.K, s.M, y2); };
      gat(); plain(); CK(cudaMemset(y2, 0xFF, N * cols * 2)); gathered(); CK(cudaDeviceSynchronize());
      std::vector<uint16_t> a(N * cols), b(N * cols);
      CK(cudaMemcpy(a.data(), y1, N * cols * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), y2, N * cols * 2, cudaMemcpyDeviceToHost));
      int64_t diff = 0; for (int64_t i = 0; i < (int64_t)a.size(); ++i) diff += a[i] != b[i];
      if (diff) ++fails;
      double tg = 0, tp = 0, tq = 0, tp2 = 0, tq2 = 0;
      tg = med(gat, reps); tp = med(plain, reps); tq = med(gathered, reps); tp2 = med(plain, reps); tq2 = med(gathered, reps);
      std::printf("| %s | %-11s | bits %s (%lld differ) | gather kernel %.3f | plain %.3f, %.3f | per-row TMA gather %.3f, %.3f |\n",
                  skew ? "proxy skew" : "even", s.name, diff ? "DIFFER" : "equal", (long long)diff, tg, tp, tp2, tq, tq2);
      CK(cudaFree(x)); CK(cudaFree(xp)); CK(cudaFree(w)); CK(cudaFree(y1)); CK(cudaFree(y2));
    }
    CK(cudaFree(doff)); CK(cudaFree(dsrc));
  }
  std::printf("%s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}
