// Standalone benchmark of the AdamW kernel over storage dtypes (src/kernels/cuda/adamw_kernel.cuh)
// next to the previous fp32-only kernel: bit-exactness against a host loop running the CPU twin's
// element code (kernels/adamw_math.h) on 1M+3 random elements, then the median of 10 timed steps
// (CUDA events, after 3 warm-ups) on 604M elements (the expert parameters of one Qwen3-30B-A3B
// layer), with the bytes each variant moves and the achieved bandwidth.
// nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -I src bench/standalone/adamw_precision.cu -o adamw_precision
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/adamw_kernel.cuh"
#include "median_events.cuh"

using namespace moetrain;
using namespace moetrain::cuda::adamw_detail;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));           \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// The kernel before this change: f32 master, grad, m, v; optional bf16 compute copy.
__global__ void old_adamw_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, uint16_t* __restrict__ compute, int64_t n, float lr, float b1,
                                 float b2, float eps, float wd, float bc1, float bc2, float gscale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float gi = g[i] * gscale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float nw = w[i] - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * w[i]);
    w[i] = nw;
    if (compute) compute[i] = am::bf16_rne(nw);
  }
}

struct Case {
  const char* name;
  int w, g, m, v, c;  // bytes per element of each storage (c: 0 = no compute copy)
  bool sr;
};

template <typename T> T* dev_alloc(int64_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
  return p;
}

// Random storage values: weights ~0.05, grads ~1, m ~0.1, v > 0.
std::vector<float> host_values(int64_t n, int kind, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    const float r = d(gen);
    x = kind == 0 ? 0.05f * r : kind == 1 ? r : kind == 2 ? 0.1f * r : 1e-2f * r * r + 1e-4f;
  }
  return v;
}
template <typename T> std::vector<T> encode(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) out[i] = v[i];
    else out[i] = am::bf16_rne(v[i]);
  }
  return out;
}
inline float hload(const float* p, int64_t i) { return p[i]; }
inline float hload(const uint16_t* p, int64_t i) { return am::bf16_to_f32(p[i]); }
inline void hstore(float* p, int64_t i, float x) { p[i] = x; }
inline void hstore(uint16_t* p, int64_t i, float x) { p[i] = am::bf16_rne(x); }

template <typename W, typename G, typename M, typename V, typename C>
struct Run {
  int64_t n;
  W* w;
  G* g;
  M* m;
  V* v;
  C* c;
  bool use_c;
  void alloc(int64_t n_, bool use_c_) {
    n = n_, use_c = use_c_;
    w = dev_alloc<W>(n), g = dev_alloc<G>(n), m = dev_alloc<M>(n), v = dev_alloc<V>(n);
    c = use_c ? dev_alloc<C>(n) : nullptr;
  }
  void upload(const std::vector<float> (&h)[4]) {
    auto up = [&](auto* d, const std::vector<float>& src) {
      using T = std::remove_pointer_t<decltype(d)>;
      auto e = encode<T>(src);
      CK(cudaMemcpy(d, e.data(), e.size() * sizeof(T), cudaMemcpyHostToDevice));
    };
    up(w, h[0]), up(g, h[1]), up(m, h[2]), up(v, h[3]);
  }
  void launch(const am::Consts& k, bool sr, uint64_t key, uint64_t counter) {
    adamw_kernel<W, G, M, V, C, true><<<static_cast<unsigned>(std::min<int64_t>((n / 8 + 255) / 256 + 1, 65536)), 256>>>(
        w, g, m, v, use_c ? c : nullptr, n, k, sr, key, counter);
  }
  // Bits after one step vs the CPU twin's loop; returns mismatching elements.
  int64_t check(const std::vector<float> (&h)[4], const am::Consts& k, bool sr, uint64_t key, uint64_t counter) {
    auto hw = encode<W>(h[0]);
    auto hg = encode<G>(h[1]);
    auto hm = encode<M>(h[2]);
    auto hv = encode<V>(h[3]);
    std::vector<C> hc(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float mi = hload(hm.data(), i), vi = hload(hv.data(), i), wi = hload(hw.data(), i);
      am::update(k, hload(hg.data(), i), mi, vi, wi);
      hstore(hm.data(), i, mi);
      hstore(hv.data(), i, vi);
      if constexpr (std::is_same_v<W, uint16_t>)
        hw[i] = sr ? am::bf16_stochastic(wi, am::random_word(key, counter, static_cast<uint64_t>(i))) : am::bf16_rne(wi);
      else hw[i] = wi;
      hstore(hc.data(), i, hload(hw.data(), i));
    }
    auto diff = [&](const auto& host, const auto* dev) {
      using T = typename std::decay_t<decltype(host)>::value_type;
      std::vector<T> back(host.size());
      CK(cudaMemcpy(back.data(), dev, back.size() * sizeof(T), cudaMemcpyDeviceToHost));
      int64_t bad = 0;
      for (size_t i = 0; i < back.size(); ++i) bad += std::memcmp(&back[i], &host[i], sizeof(T)) != 0;
      return bad;
    };
    return diff(hw, w) + diff(hm, m) + diff(hv, v) + (use_c ? diff(hc, c) : 0);
  }
  void release() {
    cudaFree(w), cudaFree(g), cudaFree(m), cudaFree(v);
    if (c) cudaFree(c);
  }
};

template <typename W, typename G, typename M, typename V, typename C>
void run_case(const char* name, bool use_c, bool sr, int64_t n_check, int64_t n_time, double bytes_per_elem,
              std::vector<std::string>& rows) {
  const am::Consts k = am::make_consts(3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.7f);
  const uint64_t key = 0x1234567890abcdefull, counter = (uint64_t{0x520003} << 40) ^ 5;
  std::vector<float> h[4] = {host_values(n_check, 0, 1), host_values(n_check, 1, 2), host_values(n_check, 2, 3),
                             host_values(n_check, 3, 4)};
  Run<W, G, M, V, C> small;
  small.alloc(n_check, use_c);
  small.upload(h);
  small.launch(k, sr, key, counter);
  CK(cudaDeviceSynchronize());
  const int64_t bad = small.check(h, k, sr, key, counter);
  small.release();
  Run<W, G, M, V, C> big;
  big.alloc(n_time, use_c);
  CK(cudaMemset(big.w, 0x3c, n_time * sizeof(W)));  // finite non-zero values, not zeros
  CK(cudaMemset(big.g, 0x3c, n_time * sizeof(G)));
  CK(cudaMemset(big.m, 0x3c, n_time * sizeof(M)));
  CK(cudaMemset(big.v, 0x3c, n_time * sizeof(V)));
  const float ms = median_event_ms([&] { big.launch(k, sr, key, counter); });
  big.release();
  char buf[256];
  std::snprintf(buf, sizeof buf, "| %s | %.0f | %.3f | %.0f | %lld |", name, bytes_per_elem, ms,
                bytes_per_elem * n_time / (ms * 1e-3) / 1e9, static_cast<long long>(bad));
  rows.push_back(buf);
}

int main() {
  const int64_t n_check = (1 << 20) + 3, n_time = 604'000'000;
  std::vector<std::string> rows;
  {  // the old kernel, f32 everything + bf16 compute copy
    float *w = dev_alloc<float>(n_time), *g = dev_alloc<float>(n_time), *m = dev_alloc<float>(n_time),
          *v = dev_alloc<float>(n_time);
    uint16_t* c = dev_alloc<uint16_t>(n_time);
    CK(cudaMemset(w, 0x3c, n_time * 4));
    CK(cudaMemset(g, 0x3c, n_time * 4));
    CK(cudaMemset(m, 0x3c, n_time * 4));
    CK(cudaMemset(v, 0x3c, n_time * 4));
    const float ms = median_event_ms([&] {
      old_adamw_kernel<<<65536, 256>>>(w, g, m, v, c, n_time, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.4f, 0.2f, 0.7f);
    });
    char buf[256];
    std::snprintf(buf, sizeof buf, "| old kernel f32 master/grad/m/v + bf16 copy | 30 | %.3f | %.0f | - |", ms,
                  30.0 * n_time / (ms * 1e-3) / 1e9);
    rows.push_back(buf);
    cudaFree(w), cudaFree(g), cudaFree(m), cudaFree(v), cudaFree(c);
  }
  using B = uint16_t;
  run_case<float, float, float, float, B>("new, f32 master/grad/m/v + bf16 copy", true, false, n_check, n_time, 30, rows);
  run_case<float, B, B, B, B>("new, bf16 grad + f32 master + bf16 m/v + bf16 copy", true, false, n_check, n_time, 20, rows);
  run_case<B, float, float, float, float>("new, bf16 weights (no master), f32 grad/m/v", false, true, n_check, n_time, 24, rows);
  run_case<B, B, B, B, float>("new, all bf16, stochastic", false, true, n_check, n_time, 14, rows);
  run_case<B, B, B, B, float>("new, all bf16, nearest", false, false, n_check, n_time, 14, rows);
  std::printf("\nAdamW step over %lld elements (one Qwen3-30B-A3B layer's experts), median of 10\n",
              static_cast<long long>(n_time));
  std::printf("| variant | bytes/elem | ms | GB/s | mismatching elements vs CPU twin (1M+3) |\n|---|---|---|---|---|\n");
  for (const auto& r : rows) std::printf("%s\n", r.c_str());
  return 0;
}
