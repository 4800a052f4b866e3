// Standalone experiment: can the expert AdamW (memory bound) run beside the expert GEMMs (compute
// bound) on a low-priority stream, and what does each lose? Work A: the grouped GEMM forward and dx
// of one layer's gate_up and down (src/kernels/cuda/grouped_gemm_ws.cu), twice, on a high-priority
// stream with its persistent grid sized to `sms`. Work B: AdamW (all-bf16, stochastic rounding, the
// adamw_math update) over gate_up-sized state on a low-priority stream, either as many short blocks
// or on R SMs held whole (1024 threads + 120 KB of shared memory per block). Prints alone and
// concurrent times. Build / run: bench/standalone/overlap_run.sh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "core/context.h"
#include "kernels/cuda/adamw_kernel.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"

using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace mc = moetrain::cuda;
namespace am = moetrain::adamw_math;
namespace ad = moetrain::cuda::adamw_detail;
#define CK(x) MT_CUDA_CHECK(x)

__global__ void fill_bf16(uint16_t* p, int64_t n, uint32_t seed, float scale, float bias) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
    p[i] = am::bf16_rne(bias + scale * u);
  }
}

// AdamW over n elements (8 per thread-iteration, grid-stride), the adamw_kernel vector body; each
// block holds a whole SM (1024 threads, 64 registers, 120 KB dynamic shared memory it never uses).
__global__ void __launch_bounds__(1024, 1)
    adamw_whole_sm(uint16_t* w, const uint16_t* g, uint16_t* m, uint16_t* v, int64_t n, am::Consts k, uint64_t key,
                   uint64_t counter) {
  const int64_t chunks = n / 8;
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < chunks; c += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i0 = c * 8;
    float wf[8], gf[8], mf[8], vf[8];
    ad::load8(w + i0, wf);
    ad::load8(g + i0, gf);
    ad::load8(m + i0, mf);
    ad::load8(v + i0, vf);
    const moetrain::Philox4 r = moetrain::philox4x32(key, counter, static_cast<uint64_t>(i0) >> 3);
    uint16_t wb[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      am::update(k, gf[j], mf[j], vf[j], wf[j]);
      wb[j] = am::bf16_stochastic(wf[j], am::random_half(r, j));
    }
    ad::store8(m + i0, mf);
    ad::store8(v + i0, vf);
    ad::store8_bits(w + i0, wb);
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs\n", prop.name, sms);
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s_hi, s_lo;
  CK(cudaStreamCreateWithPriority(&s_hi, cudaStreamNonBlocking, hi));
  CK(cudaStreamCreateWithPriority(&s_lo, cudaStreamNonBlocking, lo));
  Context ctx;
  ctx.facts_.cc_major = prop.major;
  ctx.facts_.cc_minor = prop.minor;
  ctx.stream_ = s_hi;

  // Routing of 4096 tokens x top-8 over 128 experts (random), the model's expert shapes.
  const int E = 128;
  const int64_t T = 4096, N = T * 8, H = 2048, I = 768;
  std::vector<int32_t> off(E + 1, 0);
  {
    std::mt19937 rng(42);
    std::vector<int64_t> cnt(E, 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int> ex(E);
      for (int e = 0; e < E; ++e) ex[e] = e;
      std::shuffle(ex.begin(), ex.end(), rng);
      for (int j = 0; j < 8; ++j) ++cnt[ex[j]];
    }
    for (int e = 0; e < E; ++e) off[e + 1] = off[e] + static_cast<int32_t>(cnt[e]);
  }
  int32_t* doff;
  CK(cudaMalloc(&doff, (E + 1) * 4));
  CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
  auto alloc = [](int64_t n, uint32_t seed, float scale, float bias) {
    uint16_t* p;
    CK(cudaMalloc(&p, n * 2));
    fill_bf16<<<4096, 256>>>(p, n, seed, scale, bias);
    CK(cudaGetLastError());
    return p;
  };
  bf16* x = reinterpret_cast<bf16*>(alloc(N * H, 1, 1.0f, 0.0f));
  bf16* wgu = reinterpret_cast<bf16*>(alloc(E * 2 * I * H, 2, 0.05f, 0.0f));
  bf16* y = reinterpret_cast<bf16*>(alloc(N * 2 * I, 3, 1.0f, 0.0f));
  bf16* wd = reinterpret_cast<bf16*>(alloc(E * H * I, 4, 0.05f, 0.0f));
  bf16* h = reinterpret_cast<bf16*>(alloc(N * I, 5, 1.0f, 0.0f));
  bf16* o = reinterpret_cast<bf16*>(alloc(N * H, 6, 1.0f, 0.0f));
  const int64_t n = static_cast<int64_t>(E) * 2 * I * H;  // gate_up's parameters
  uint16_t* aw = alloc(n, 7, 0.02f, 0.0f);
  uint16_t* ag = alloc(n, 8, 0.001f, 0.0f);
  uint16_t* am_ = alloc(n, 9, 0.0001f, 0.0f);
  uint16_t* av = alloc(n, 10, 1e-8f, 1e-8f);
  CK(cudaDeviceSynchronize());
  const am::Consts k = am::make_consts(1e-5f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f);
  const int whole_smem = 120 * 1024;
  CK(cudaFuncSetAttribute(adamw_whole_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, whole_smem));

  auto work_a = [&](int a_sms) {
    ctx.facts_.sm_count = a_sms;
    for (int r = 0; r < 2; ++r) {
      mc::grouped_gemm_ws_forward(ctx, x, wgu, doff, E, N, H, 2 * I, y, 0);
      mc::grouped_gemm_ws_dx(ctx, y, wgu, doff, E, N, H, 2 * I, x, 0);
      mc::grouped_gemm_ws_forward(ctx, h, wd, doff, E, N, I, H, o, 0);
      mc::grouped_gemm_ws_dx(ctx, o, wd, doff, E, N, I, H, h, 0);
    }
  };
  // mode 0: adamw_kernel, short 256-thread blocks (one chunk of 8 per thread, no grid stride);
  // mode 1: adamw_whole_sm on R SMs; mode 2: adamw_kernel, 8 x R persistent 256-thread blocks.
  auto work_b = [&](int mode, int R) {
    if (mode == 0) {
      const int64_t blocks = (n / 8 + 255) / 256;
      ad::adamw_kernel<uint16_t, uint16_t, uint16_t, uint16_t, uint16_t, true>
          <<<static_cast<unsigned>(blocks), 256, 0, s_lo>>>(aw, ag, am_, av, nullptr, n, k, true, 99, 3);
    } else if (mode == 1) {
      adamw_whole_sm<<<R, 1024, whole_smem, s_lo>>>(aw, ag, am_, av, n, k, 99, 3);
    } else {
      ad::adamw_kernel<uint16_t, uint16_t, uint16_t, uint16_t, uint16_t, true>
          <<<8 * R, 256, 0, s_lo>>>(aw, ag, am_, av, nullptr, n, k, true, 99, 3);
    }
    CK(cudaGetLastError());
  };
  cudaEvent_t e0, ea, eb, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&ea));
  CK(cudaEventCreate(&eb));
  CK(cudaEventCreate(&e1));
  // Returns {total, A's end, B's end} in ms from a common start; a or b may be off.
  auto run = [&](bool a, int a_sms, bool b, int mode, int R) {
    std::vector<float> tt, ta, tb;
    for (int i = 0; i < reps + 1; ++i) {
      CK(cudaDeviceSynchronize());
      CK(cudaEventRecord(e0, s_hi));
      CK(cudaStreamWaitEvent(s_lo, e0, 0));
      if (a) work_a(a_sms);
      CK(cudaEventRecord(ea, s_hi));
      if (b) work_b(mode, R);
      CK(cudaEventRecord(eb, s_lo));
      CK(cudaStreamWaitEvent(s_hi, eb, 0));
      CK(cudaEventRecord(e1, s_hi));
      CK(cudaEventSynchronize(e1));
      float t = 0, x1 = 0, x2 = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      CK(cudaEventElapsedTime(&x1, e0, ea));
      CK(cudaEventElapsedTime(&x2, e0, eb));
      if (i) tt.push_back(t), ta.push_back(x1), tb.push_back(x2);
    }
    return std::vector<float>{median(tt), median(ta), median(tb)};
  };
  const float a_full = run(true, sms, false, 0, 0)[0];
  std::printf("A alone (%d SMs): %.3f ms\n", sms, a_full);
  std::vector<char*> rows;
  auto row = [&](const char* what, int R, float a_alone, float b_alone, const std::vector<float>& c) {
    char* line = new char[256];
    std::snprintf(line, 256, "| %-26s | %3d | %7.3f | %7.3f | %7.3f | %7.3f | %7.3f | %7.3f |", what, R, a_alone, b_alone,
                  a_alone + b_alone, c[0], c[1], a_full + b_alone);
    rows.push_back(line);
    std::puts(line);
  };
  {
    const float b0 = run(false, sms, true, 0, 0)[0];
    row("short blocks, A all SMs", 0, a_full, b0, run(true, sms, true, 0, 0));
  }
  for (int R : {8, 12, 16, 24, 32}) {
    const float a_r = run(true, sms - R, false, 0, 0)[0];
    const float b1 = run(false, sms, true, 1, R)[0];
    row("whole SMs", R, a_r, b1, run(true, sms - R, true, 1, R));
    const float b2 = run(false, sms, true, 2, R)[0];
    row("8 x R blocks of 256", R, a_r, b2, run(true, sms - R, true, 2, R));
  }
  std::printf("\n| B kind | R | A alone (132-R SMs) | B alone | sum | concurrent | A done at | A(132)+B |\n");
  for (char* l : rows) std::puts(l);
  return 0;
}
