// Standalone benchmark of the end-of-step AdamW over the non-expert parameters (adamw_multi_kernel,
// src/kernels/cuda/adamw_kernel.cuh) at the 4-layer proxy's shapes, all-bf16 state, stochastic
// rounding: the embedding (151,936 x 2,048, most rows without a gradient, so g, m and v exactly 0),
// the lm_head (dense gradient) and each layer's q, k, v, o, router and norm weights. It times the
// committed kernel (since round 39 a vector whose gradient, m and v are all +0 takes a short path,
// Consts::zero_*) and variants of its per-vector math, each checked bit for bit against the committed
// kernel's result of one step from the same state:
//   scalar  round 38's adamw_chunk: update() per element (__fsqrt_rn / __fdiv_rn with their slow
//           paths, which exact zeros take);
//   z8      update8<kZeros> for every vector (selects for exact zeros, no slow path for them);
//   vote    per vector: update8<kZeros> when any of its v is 0, else update() per element;
//   vote8   per vector: update8<kZeros> when any v is 0, else update8<> (redo on a miss);
// and some of them compiled for 4 blocks of 256 threads an SM (64 registers) instead of 3.
// Also each job alone (scalar), to see where the time goes. Median of 10 steps (CUDA events).
// nvcc -O3 -std=c++17 -arch=sm_90a -I src bench/standalone/adamw_multi.cu -o adamw_multi && ./adamw_multi [layers]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/adamw_kernel.cuh"
#include "median_events.cuh"

using namespace moetrain;
using namespace moetrain::cuda::adamw_detail;
using B16 = uint16_t;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// ---- fill: a counter hash to a normal-ish value, bf16 ------------------------------------------
__device__ __forceinline__ uint32_t mix(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
__device__ __forceinline__ float unit(uint64_t s) { return (mix(s) >> 8) * (1.0f / 16777216.0f) - 0.5f; }
// kind 0: weight ~0.02; 1: gradient ~1e-3; 2: m ~1e-4; 3: v ~1e-8 (positive). Rows r with
// (row_hash % 1000) >= live_permille get 0 (g: >= grad_permille), as an embedding's unseen rows.
__global__ void fill_kernel(B16* p, int64_t n, int64_t cols, int kind, uint64_t seed, int live_permille) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = i / cols;
    const bool live = static_cast<int>(mix(row * 7919 + 17) % 1000u) < live_permille;
    const float u = unit(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) + unit(seed + 3 * static_cast<uint64_t>(i));
    float x = kind == 0 ? 0.04f * u : kind == 1 ? 2e-3f * u : kind == 2 ? 2e-4f * u : 1e-8f * (u + 1.1f);
    if (!live) x = 0.0f;
    p[i] = am::bf16_rne(x);
  }
}

// ---- variants of adamw_chunk's vector path (all-bf16, no compute copy) ---------------------------
template <int kMode>
__device__ __forceinline__ void chunk_v(B16* __restrict__ w, const B16* __restrict__ g, B16* __restrict__ m,
                                        B16* __restrict__ v, int64_t n, const am::Consts& k, bool sr, uint64_t key,
                                        uint64_t counter, int64_t c) {
  const int64_t i0 = c * 8;
  if (i0 + 8 > n) {  // the committed scalar tail
    adamw_chunk<B16, B16, B16, B16, float, true>(w, g, m, v, nullptr, n, k, sr, key, counter, c);
    return;
  }
  float wf[8], gf[8], mf[8], vf[8];
  load8(w + i0, wf);
  load8(g + i0, gf);
  load8(m + i0, mf);
  load8(v + i0, vf);
  if constexpr (kMode == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) am::update(k, gf[j], mf[j], vf[j], wf[j]);
  } else if constexpr (kMode == 1) {
    am::update8<true>(k, gf, mf, vf, wf);
  } else {
    bool zero = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) zero |= vf[j] == 0.0f;
    if (zero) {
      am::update8<true>(k, gf, mf, vf, wf);
    } else if constexpr (kMode == 2) {
#pragma unroll
      for (int j = 0; j < 8; ++j) am::update(k, gf[j], mf[j], vf[j], wf[j]);
    } else {
      am::update8<false>(k, gf, mf, vf, wf);
    }
  }
  store8(m + i0, mf);
  store8(v + i0, vf);
  st16(w + i0, round8_bits(wf, sr, key, counter, i0));
}

template <int kMode, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) multi_v(const __grid_constant__ MultiBatch b) {
  const int64_t total = b.start[b.njobs];
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < total; c += (int64_t)gridDim.x * blockDim.x) {
    int lo = 0, hi = b.njobs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (b.start[mid] <= c) lo = mid; else hi = mid - 1;
    }
    const MultiJob& j = b.job[lo];
    const int64_t lc = c - b.start[lo];
    if (kMode < 0 || !j.vec)
      adamw_chunk<B16, B16, B16, B16, float, true>(static_cast<B16*>(j.w), static_cast<const B16*>(j.g),
                                                   static_cast<B16*>(j.m), static_cast<B16*>(j.v), nullptr, j.n, j.k,
                                                   j.sr != 0, j.key, j.counter, lc);
    else
      chunk_v<kMode>(static_cast<B16*>(j.w), static_cast<const B16*>(j.g), static_cast<B16*>(j.m),
                     static_cast<B16*>(j.v), j.n, j.k, j.sr != 0, j.key, j.counter, lc);
  }
}

struct Param {
  std::string name;
  int64_t rows, cols;
  int live_permille, grad_permille;
  bool decay;
  B16 *w, *g, *m, *v;       // state
  B16 *w0, *m0, *v0;        // the state before the step (restored before each check)
};

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 4;
  const int64_t H = 2048, V = 151936, Q = 4096, KV = 512, E = 128;
  std::vector<Param> ps;
  // Embedding: 20% of the rows seen before (m, v non-zero), 2.7% (4,096 of 151,936) with a gradient.
  ps.push_back({"embed", V, H, 200, 27, true});
  ps.push_back({"lm_head", V, H, 1000, 1000, true});
  for (int l = 0; l < layers; ++l) {
    ps.push_back({"q", Q, H, 1000, 1000, true});
    ps.push_back({"k", KV, H, 1000, 1000, true});
    ps.push_back({"v", KV, H, 1000, 1000, true});
    ps.push_back({"o", H, Q, 1000, 1000, true});
    ps.push_back({"router", E, H, 1000, 1000, true});
  }
  ps.push_back({"norms", 1, layers * (2 * H + 2 * 128) + H, 1000, 1000, false});  // every layer's, and the final one
  if (ps.size() > static_cast<size_t>(kMultiJobs)) {
    std::fprintf(stderr, "%zu jobs: more than one launch holds (%d)\n", ps.size(), kMultiJobs);
    return 1;
  }
  int64_t total = 0;
  for (Param& p : ps) {
    const int64_t n = p.rows * p.cols;
    total += n;
    for (B16** q : {&p.w, &p.g, &p.m, &p.v, &p.w0, &p.m0, &p.v0}) CK(cudaMalloc(q, n * sizeof(B16)));
    const int live_g = std::min(p.live_permille, p.grad_permille);
    fill_kernel<<<4096, 256>>>(p.w0, n, p.cols, 0, 11 + n, 1000);
    fill_kernel<<<4096, 256>>>(p.g, n, p.cols, 1, 12 + n, live_g);
    fill_kernel<<<4096, 256>>>(p.m0, n, p.cols, 2, 13 + n, p.live_permille);
    fill_kernel<<<4096, 256>>>(p.v0, n, p.cols, 3, 14 + n, p.live_permille);
  }
  CK(cudaDeviceSynchronize());
  auto restore = [&] {
    for (Param& p : ps) {
      const size_t bytes = p.rows * p.cols * sizeof(B16);
      CK(cudaMemcpyAsync(p.w, p.w0, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(p.m, p.m0, bytes, cudaMemcpyDeviceToDevice));
      CK(cudaMemcpyAsync(p.v, p.v0, bytes, cudaMemcpyDeviceToDevice));
    }
  };
  int step = 7;
  auto batch_of = [&](const std::vector<int>& which) {
    MultiBatch b{};
    b.njobs = static_cast<int>(which.size());
    for (int q = 0; q < b.njobs; ++q) {
      Param& p = ps[which[q]];
      MultiJob& j = b.job[q];
      j.w = p.w, j.g = p.g, j.m = p.m, j.v = p.v, j.comp = nullptr, j.n = p.rows * p.cols;
      j.k = am::make_consts(3e-5f, 0.9f, 0.95f, 1e-8f, p.decay ? 0.01f : 0.0f, step, 1.0f);
      j.key = 0x5eed0000ull + which[q], j.counter = static_cast<uint64_t>(step);
      j.sr = 1, j.vec = 1;
      b.start[q + 1] = b.start[q] + (j.n + 7) / 8;
    }
    return b;
  };
  std::vector<int> all;
  for (int i = 0; i < static_cast<int>(ps.size()); ++i) all.push_back(i);
  auto grid = [](const MultiBatch& b) {
    return static_cast<unsigned>(std::min<int64_t>((b.start[b.njobs] + 255) / 256, 65536));
  };
  // mode -1: the committed adamw_multi_kernel itself (through adamw_chunk).
  auto launch = [&](int mode, const std::vector<int>& which) {
    const MultiBatch b = batch_of(which);
    switch (mode) {
      case -1: adamw_multi_kernel<B16, B16, B16, B16, float><<<grid(b), 256>>>(b); break;
      case 0: multi_v<0, 1><<<grid(b), 256>>>(b); break;
      case 1: multi_v<1, 1><<<grid(b), 256>>>(b); break;
      case 2: multi_v<2, 1><<<grid(b), 256>>>(b); break;
      case 3: multi_v<3, 1><<<grid(b), 256>>>(b); break;
      case 4: multi_v<0, 4><<<grid(b), 256>>>(b); break;
      case 5: multi_v<1, 4><<<grid(b), 256>>>(b); break;
      case 6: multi_v<3, 4><<<grid(b), 256>>>(b); break;
    }
  };
  // Reference: one committed step from the saved state, copied out.
  std::vector<std::vector<B16>> ref;
  restore();
  launch(-1, all);
  CK(cudaDeviceSynchronize());
  for (Param& p : ps)
    for (B16* d : {p.w, p.m, p.v}) {
      ref.emplace_back(p.rows * p.cols);
      CK(cudaMemcpy(ref.back().data(), d, ref.back().size() * sizeof(B16), cudaMemcpyDeviceToHost));
    }
  auto mismatches = [&] {
    int64_t bad = 0;
    size_t r = 0;
    std::vector<B16> h;
    for (Param& p : ps)
      for (B16* d : {p.w, p.m, p.v}) {
        h.resize(p.rows * p.cols);
        CK(cudaMemcpy(h.data(), d, h.size() * sizeof(B16), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < h.size(); ++i) bad += h[i] != ref[r][i];
        ++r;
      }
    return bad;
  };
  const double bytes = 14.0 * static_cast<double>(total);
  std::printf("non-expert AdamW, %d layers: %lld weights, %.2f GB at 14 bytes a weight\n", layers,
              static_cast<long long>(total), bytes / 1e9);
  std::printf("| variant | ms | GB/s | mismatching values vs committed |\n|---|---|---|---|\n");
  const char* names[] = {"committed adamw_multi_kernel", "scalar (copy)", "z8", "vote", "vote8",
                         "scalar, 4 blocks/SM", "z8, 4 blocks/SM", "vote8, 4 blocks/SM"};
  for (int mode = -1; mode <= 6; ++mode) {
    restore();
    launch(mode, all);
    CK(cudaDeviceSynchronize());
    const int64_t bad = mismatches();
    restore();
    const float ms = median_event_ms([&] { launch(mode, all); });
    std::printf("| %s | %.3f | %.0f | %lld |\n", names[mode + 1], ms, bytes / (ms * 1e-3) / 1e9,
                static_cast<long long>(bad));
  }
  std::printf("\nper job (committed kernel, one job a launch):\n| job | weights | ms | GB/s |\n|---|---|---|---|\n");
  for (int i = 0; i < std::min<int>(static_cast<int>(ps.size()), 8); ++i) {
    restore();
    const float ms = median_event_ms([&] { launch(-1, {i}); });
    const double n = static_cast<double>(ps[i].rows * ps[i].cols);
    std::printf("| %s | %.0f | %.3f | %.0f |\n", ps[i].name.c_str(), n, ms, 14.0 * n / (ms * 1e-3) / 1e9);
  }
  for (int mode : {1, 2, 3, 5, 6}) {
    restore();
    const float ms = median_event_ms([&] { launch(mode, {0}); });
    const double n = static_cast<double>(ps[0].rows * ps[0].cols);
    std::printf("| embed, %s | %.0f | %.3f | %.0f |\n", names[mode + 1], n, ms, 14.0 * n / (ms * 1e-3) / 1e9);
  }
  return 0;
}
