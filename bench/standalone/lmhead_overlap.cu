// Does a loss-head chunk's lm_head gradient GEMM (dW [V, H] f32 += dlogits^T h: bound by the
// read-modify-write of dW at small chunks) hide beside the chunk's dh GEMM (dh = dlogits W: bound by
// FLOPs) when the two run on two streams? Both only read the chunk's dlogits, so the loss head could
// issue them concurrently without a second chunk buffer. cuBLAS as ops::matmul calls it.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a bench/standalone/lmhead_overlap.cu -lcublas -o lmhead_overlap
// Usage: lmhead_overlap [reps]. Each size also runs the pair with cublasSetSmCountTarget splits (dW on
// the side stream gets sw SMs, dh the rest): round 15, docs/performance.md.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CB(x)                                                                  \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      std::printf("cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

using bf16 = __nv_bfloat16;

__global__ void fill(bf16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(scale * ((float)(h & 0xffffff) / 16777216.0f - 0.5f));
  }
}

template <class F>
float median_ms(F f, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, 0));
    f();
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t V = 151936, H = 2048, nmax = 4096;
  bf16 *w, *x, *dl, *dh;
  float* dw;
  CK(cudaMalloc(&w, V * H * 2));
  CK(cudaMalloc(&x, nmax * H * 2));
  CK(cudaMalloc(&dl, nmax * V * 2));
  CK(cudaMalloc(&dh, nmax * H * 2));
  CK(cudaMalloc(&dw, V * H * 4));
  fill<<<2048, 256>>>(w, V * H, 1, 0.04f);
  fill<<<2048, 256>>>(x, nmax * H, 2, 2.0f);
  fill<<<2048, 256>>>(dl, nmax * V, 3, 1e-4f);
  CK(cudaMemset(dw, 0, V * H * 4));
  CK(cudaDeviceSynchronize());
  // the legacy default stream is the main stream (as the timing events); side is non-blocking
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  cublasHandle_t h0, h1;
  CB(cublasCreate(&h0));
  CB(cublasCreate(&h1));
  CB(cublasSetStream(h1, side));
  const float one = 1.0f, zero = 0.0f;
  std::printf("| rows | dh alone | dW += alone | serial | two streams | saved |\n|---|---|---|---|---|---|\n");
  for (int64_t n : {820, 1366, 2048, 4096}) {
    auto dh_gemm = [&](cublasHandle_t h) {  // col-major dh^T [H, n] = W^T [H, V] x dl^T [V, n]
      CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)n, (int)V, &one, w, CUDA_R_16BF, (int)H, dl,
                      CUDA_R_16BF, (int)V, &zero, dh, CUDA_R_16BF, (int)H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    auto dw_gemm = [&](cublasHandle_t h) {  // col-major dw^T [H, V] += x^T [H, n] x dl [n, V]
      CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, (int)H, (int)V, (int)n, &one, x, CUDA_R_16BF, (int)H, dl,
                      CUDA_R_16BF, (int)V, &one, dw, CUDA_R_32F, (int)H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    CB(cublasSetSmCountTarget(h0, 0));
    CB(cublasSetSmCountTarget(h1, 0));
    const float a = median_ms([&] { dh_gemm(h0); }, reps);
    const float b = median_ms([&] { dw_gemm(h0); }, reps);
    const float s = median_ms([&] { dh_gemm(h0); dw_gemm(h0); }, reps);
    auto both = [&] {
      CK(cudaEventRecord(fork, 0));
      CK(cudaStreamWaitEvent(side, fork, 0));
      dw_gemm(h1);
      dh_gemm(h0);
      CK(cudaEventRecord(join, side));
      CK(cudaStreamWaitEvent(0, join, 0));
    };
    const float c = median_ms(both, reps);
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.3f |\n", (long long)n, a, b, s, c, s - c);
    // The same pair with each handle's SM count target set (cublasSetSmCountTarget): dW on `side`
    // gets sw SMs, dh on the main stream the rest, so that the dW, bound by its read-modify-write,
    // could run beside the FLOP-bound dh. Each GEMM is first timed alone at its share.
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int sw : {33, 44, 52, 66, 80}) {
      CB(cublasSetSmCountTarget(h0, sw));
      const float dwa = median_ms([&] { dw_gemm(h0); }, reps);
      CB(cublasSetSmCountTarget(h0, sms - sw));
      const float dha = median_ms([&] { dh_gemm(h0); }, reps);
      CB(cublasSetSmCountTarget(h1, sw));
      const float cc = median_ms(both, reps);
      std::printf("|   sm split dW %d / dh %d | dh %.3f | dW %.3f | | %.3f | %.3f |\n", sw, sms - sw, dha, dwa, cc, s - cc);
    }
  }
  return 0;
}
