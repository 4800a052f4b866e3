// median_event_ms: the standalone benchmarks' timing (adamw_precision.cu, adamw_multi.cu): fn run 3
// times to warm up, then 10 times between CUDA events on the default stream; the mean of the two
// middle samples, in ms. Exits on a CUDA error left by fn.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

inline float median_event_ms(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "median_event_ms: %s\n", cudaGetErrorString(e));
    std::exit(1);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return 0.5f * (t[4] + t[5]);
}
