// Standalone check + benchmark of the expert dW GEMM with AdamW in its epilogue (src/kernels/cuda/
// grouped_gemm_ws_dw_adamw.cuh) against the unfused sequence it replaces: dispatch_dw (TMA dW, the
// stored grad + per-tile sums of squares) then adamw_kernel over the whole [E, M, K] tensor. Checks
// bit equality of master / m / v / compute and of the per-tile partials (edge shapes: every element;
// model shapes too), then CUDA-event medians and effective bandwidth. With -DMT_DW_OLD (the run script,
// given snapshots of earlier grouped_gemm_ws_dw*.cuh renamed to namespace gwd_old) their dW and fused
// kernels are timed beside these: an A/B in one process.
// Build / run: bench/standalone/gemm_ws_dw_adamw_run.sh. Usage: gemm_ws_dw_adamw [reps] [edges|shapes|all|skew|skewparts|
// skewprof|skewloop|tiny] (skewparts: gate_up under even, proxy, heavy-only, light-only and no-row routing).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw_adamw.cuh"
#include "dw_harness.cuh"
#ifdef MT_DW_OLD
#include "kernels/cuda/grouped_gemm_ws_dw_adamw_old.cuh"
#endif

using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace mc = moetrain::cuda;
namespace gwd = moetrain::cuda::gwd;
namespace am = moetrain::adamw_math;
#define CK(x) MT_CUDA_CHECK(x)

static int g_fail = 0;

__device__ __forceinline__ float normal(uint64_t i, uint64_t seed) {
  const uint64_t z = mix(i, seed);
  const float u1 = (static_cast<float>(z >> 40) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(z & 0xffffffu) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
// kind 0: uniform*scale, 1: normal*scale, 2: (normal*scale)^2 (positive). NaN from index nan_from on.
template <typename T>
__global__ void fill(T* p, int64_t n, uint64_t seed, float scale, int kind, int64_t nan_from) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float f = kind == 0 ? unit(i, seed) * scale : normal(i, seed) * scale;
    if (kind == 2) f = f * f;
    if (i >= nan_from) f = NAN;
    if constexpr (sizeof(T) == 2) p[i] = am::bf16_rne(f);
    else p[i] = f;
  }
}
template <typename T>
void fill_h(void* p, int64_t n, uint64_t seed, float scale, int kind, int64_t nan_from = INT64_MAX) {
  fill<T><<<2048, 256>>>(static_cast<T*>(p), n, seed, scale, kind, nan_from);
  CK(cudaGetLastError());
}
__global__ void count_diff(const uint32_t* a, const uint32_t* b, int64_t n, unsigned long long* out) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    c += a[i] != b[i];
  if (c) atomicAdd(out, c);
}
// Number of differing 4-byte words (sizes here are multiples of 4).
int64_t ndiff(const void* a, const void* b, int64_t bytes) {
  static unsigned long long* d = nullptr;
  if (!d) CK(cudaMalloc(&d, 8));
  CK(cudaMemset(d, 0, 8));
  count_diff<<<2048, 256>>>(static_cast<const uint32_t*>(a), static_cast<const uint32_t*>(b), bytes / 4, d);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost));
  return static_cast<int64_t>(h);
}


// A precision configuration: grad, master, m, v stored bf16 (else f32); compute copy (bf16) or none.
struct Conf {
  const char* name;
  bool g16, w16, m16, v16, comp;
};
const Conf kAllBf16{"all-bf16", true, true, true, true, false};
const Conf kDefault{"default", false, false, false, false, true};
const Conf kMixed{"g16-f32st", true, false, false, false, true};

// One set of optimizer tensors [E, M, K].
struct State {
  void *w = nullptr, *m = nullptr, *v = nullptr, *c = nullptr;
};
State alloc_state(const Conf& cf, int64_t n) {
  State s;
  CK(cudaMalloc(&s.w, n * (cf.w16 ? 2 : 4)));
  CK(cudaMalloc(&s.m, n * (cf.m16 ? 2 : 4)));
  CK(cudaMalloc(&s.v, n * (cf.v16 ? 2 : 4)));
  if (cf.comp) CK(cudaMalloc(&s.c, n * 2));
  return s;
}
void free_state(State& s) {
  for (void* q : {s.w, s.m, s.v, s.c})
    if (q) CK(cudaFree(q));
  s = State{};
}
void copy_state(const Conf& cf, int64_t n, const State& src, State& dst) {
  CK(cudaMemcpy(dst.w, src.w, n * (cf.w16 ? 2 : 4), cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(dst.m, src.m, n * (cf.m16 ? 2 : 4), cudaMemcpyDeviceToDevice));
  CK(cudaMemcpy(dst.v, src.v, n * (cf.v16 ? 2 : 4), cudaMemcpyDeviceToDevice));
  if (cf.comp) CK(cudaMemcpy(dst.c, src.c, n * 2, cudaMemcpyDeviceToDevice));
}
void init_state(const Conf& cf, int64_t n, State& s, uint64_t seed) {
  if (cf.w16) fill_h<uint16_t>(s.w, n, seed, 0.02f, 1);
  else fill_h<float>(s.w, n, seed, 0.02f, 1);
  if (cf.m16) fill_h<uint16_t>(s.m, n, seed + 1, 1e-2f, 1);
  else fill_h<float>(s.m, n, seed + 1, 1e-2f, 1);
  if (cf.v16) fill_h<uint16_t>(s.v, n, seed + 2, 3e-2f, 2);
  else fill_h<float>(s.v, n, seed + 2, 3e-2f, 2);
  if (cf.comp) CK(cudaMemset(s.c, 0x5A, n * 2));
}

template <typename W, typename G, typename M, typename V>
void adamw_launch(Context& ctx, const State& s, const void* g, int64_t n, const am::Consts& k, bool sr, uint64_t key,
                  uint64_t counter) {
  const int64_t chunks = (n + 7) / 8, blocks = std::min<int64_t>(std::max<int64_t>((chunks + 255) / 256, 1), 65536);
  const unsigned grid = static_cast<unsigned>(blocks);  // grid_for(chunks) of elementwise.cu
  moetrain::cuda::adamw_detail::adamw_kernel<W, G, M, V, uint16_t, true><<<grid, 256, 0, mc::stream_of(ctx)>>>(
      static_cast<W*>(s.w), static_cast<const G*>(g), static_cast<M*>(s.m), static_cast<V*>(s.v),
      static_cast<uint16_t*>(s.c), n, k, sr, key, counter);
  CK(cudaGetLastError());
}
void adamw_unfused(Context& ctx, const Conf& cf, const State& s, const void* g, int64_t n, const am::Consts& k,
                   bool sr, uint64_t key, uint64_t counter) {
  using u16 = uint16_t;
  if (cf.w16) adamw_launch<u16, u16, u16, u16>(ctx, s, g, n, k, sr, key, counter);
  else if (cf.g16) adamw_launch<float, u16, float, float>(ctx, s, g, n, k, sr, key, counter);
  else adamw_launch<float, float, float, float>(ctx, s, g, n, k, sr, key, counter);
}

struct Opt {
  am::Consts k;
  bool sr;
  uint64_t key, counter;
};

gwd::DwAdamWArgs args_for(const Conf& cf, const State& s, const void* prior, const Opt& o) {
  gwd::DwAdamWArgs a;
  a.master = s.w;
  a.master_bf16 = cf.w16;
  a.m = s.m;
  a.m_bf16 = cf.m16;
  a.v = s.v;
  a.v_bf16 = cf.v16;
  a.compute = s.c;
  a.compute_bf16 = true;
  a.grad_bf16 = cf.g16;
  a.prior = prior;
  a.k = o.k;
  a.sr = o.sr;
  a.key = o.key;
  a.counter = o.counter;
  return a;
}

// The moments m, v of the experts without rows set to exactly 0, as in a training step: an expert
// that has not had a row yet keeps m = v = 0 (g = 0 each step). zero_all: every expert's.
void zero_moments(const Prob& p, const Conf& cf, const State& s, bool zero_all) {
  const int64_t per = p.M * p.K;
  for (int e = 0; e < p.E; ++e) {
    if (!zero_all && p.off[e + 1] > p.off[e]) continue;
    CK(cudaMemset(static_cast<char*>(s.m) + e * per * (cf.m16 ? 2 : 4), 0, per * (cf.m16 ? 2 : 4)));
    CK(cudaMemset(static_cast<char*>(s.v) + e * per * (cf.v16 ? 2 : 4), 0, per * (cf.v16 ? 2 : 4)));
  }
}

// The idle experts' m set to normal * scale (tiny: a long-idle expert's decayed first moment).
void tiny_moments(const Prob& p, const Conf& cf, const State& s, float scale) {
  const int64_t per = p.M * p.K;
  for (int e = 0; e < p.E; ++e) {
    if (p.off[e + 1] > p.off[e]) continue;
    char* m = static_cast<char*>(s.m) + e * per * (cf.m16 ? 2 : 4);
    if (cf.m16) fill_h<uint16_t>(m, per, 31 + e, scale, 1);
    else fill_h<float>(m, per, 31 + e, scale, 1);
  }
}

// The unfused sequence: grad (= prior copy when acc) <- dispatch_dw; adamw_kernel from grad.
void run_unfused(Context& ctx, const Prob& p, const Conf& cf, const State& s, void* grad, bool acc, double* part,
                 const Opt& o) {
  const int64_t n = (int64_t)p.E * p.M * p.K;
  gwd::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, grad, cf.g16, acc, part, 0);
  adamw_unfused(ctx, cf, s, grad, n, o.k, o.sr, o.key, o.counter);
}

// zeros: 0 = random moments, 1 = the idle experts' moments 0, 2 = every moment 0, 3 = the idle
// experts' m tiny (normal * 1e-25), 4 = their m about 1e-39 (subnormal; some quotients subnormal),
// 5 = about 3e-40 (mostly quotients below 2^-125).
bool check(Context& ctx, const Prob& p, const Conf& cf, bool acc, bool sr, bool with_ss, std::vector<int> variants,
           int zeros = 0) {
  const int64_t n = (int64_t)p.E * p.M * p.K, gb = n * (cf.g16 ? 2 : 4);
  const int64_t tiles = gwd::dw_adamw_tiles(p.E, p.K, p.M, cf.g16);
  Opt o{am::make_consts(2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f), sr, 0x1234abcdull + p.E, 77 + (uint64_t)p.K};
  State s0 = alloc_state(cf, n), sr_ = alloc_state(cf, n), sf = alloc_state(cf, n);
  init_state(cf, n, s0, 100 + p.M);
  if (zeros == 1 || zeros == 2) zero_moments(p, cf, s0, zeros == 2);
  if (zeros >= 3) tiny_moments(p, cf, s0, zeros == 3 ? 1e-25f : zeros == 4 ? 1e-39f : 3e-40f);
  void *grad, *prior = nullptr, *prior0 = nullptr;
  double *pr, *pf;
  CK(cudaMalloc(&grad, gb));
  CK(cudaMalloc(&pr, tiles * 8 + 8));
  CK(cudaMalloc(&pf, tiles * 8 + 8));
  if (acc) {
    CK(cudaMalloc(&prior, gb));
    CK(cudaMalloc(&prior0, gb));
    if (cf.g16) fill_h<uint16_t>(prior, n, 5, 3.0f, 0);
    else fill_h<float>(prior, n, 5, 3.0f, 0);
    CK(cudaMemcpy(prior0, prior, gb, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(grad, prior, gb, cudaMemcpyDeviceToDevice));
  } else {
    CK(cudaMemset(grad, 0xFF, gb));
  }
  CK(cudaMemset(pr, 0xFF, tiles * 8 + 8));
  copy_state(cf, n, s0, sr_);
  run_unfused(ctx, p, cf, sr_, grad, acc, with_ss ? pr : nullptr, o);
  CK(cudaDeviceSynchronize());
  const int64_t changed = ndiff(sr_.w, s0.w, n * (cf.w16 ? 2 : 4));
  bool ok = true;
  for (int var : variants) {
    copy_state(cf, n, s0, sf);
    CK(cudaMemset(pf, 0xFF, tiles * 8 + 8));
    const gwd::DwAdamWArgs a = args_for(cf, sf, prior, o);
    const bool took = gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, with_ss ? pf : nullptr, var);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const int64_t dw_ = ndiff(sf.w, sr_.w, n * (cf.w16 ? 2 : 4)), dm = ndiff(sf.m, sr_.m, n * (cf.m16 ? 2 : 4)),
                  dv = ndiff(sf.v, sr_.v, n * (cf.v16 ? 2 : 4)), dc = cf.comp ? ndiff(sf.c, sr_.c, n * 2) : 0,
                  dp = with_ss ? ndiff(pf, pr, tiles * 8 + 8) : 0, dpr = acc ? ndiff(prior, prior0, gb) : 0;
    const bool good = took && dw_ == 0 && dm == 0 && dv == 0 && dc == 0 && dp == 0 && dpr == 0 && changed > 0;
    std::printf("%-10s %-9s %-2s sr%d ss%d v%d z%d: words differ w %lld m %lld v %lld comp %lld partials %lld prior %lld;"
                " weights changed %.1f%% %s\n",
                p.tag, cf.name, acc ? "+=" : "=", sr ? 1 : 0, with_ss ? 1 : 0, var, zeros, (long long)dw_, (long long)dm,
                (long long)dv, (long long)dc, (long long)dp, (long long)dpr,
                100.0 * changed / (double)(n * (cf.w16 ? 0.5 : 1.0)), good ? "PASS" : "FAIL");
    ok = ok && good;
  }
  free_state(s0);
  free_state(sr_);
  free_state(sf);
  for (void* q : {grad, prior, prior0, (void*)pr, (void*)pf})
    if (q) CK(cudaFree(q));
  if (!ok) ++g_fail;
  return ok;
}

float time_ms(const std::function<void()>& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string part = argc > 2 ? argv[2] : "all";
  Context ctx;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  ctx.facts_.sm_count = prop.multiProcessorCount;
  ctx.facts_.cc_major = prop.major;
  ctx.facts_.cc_minor = prop.minor;
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  // variant: 0 = default, 4 = the other walk depth, 8 = first batch fetched after the mainloop
  const std::vector<int> all_vars = {0, 4, 8, 12};
  const std::vector<int> time_vars = {0, 4, 8, 12};
  if (part != "shapes" && part != "skewparts" && part != "tiny" && part != "skew" && part != "skewprof" && part != "skewloop") {
    std::vector<Prob> edges;
    edges.push_back(make("uneven", {0, 1, 1000, 0, 64, 65, 128, 129, 255, 257, 3, 0}, 2300, 264, 200));
    edges.push_back(make("empty+tail", {0, 300, 1, 0, 130}, 500, 200, 136));
    edges.push_back(make("one-full", {64, 0, 0}, 64, 64, 64));
    edges.push_back(make("all-empty", {0, 0, 0, 0}, 16, 72, 40));
    edges.push_back(make("N-edge", {5, 31, 33}, 69, 520, 264));
    for (Prob& p : edges) {
      for (const Conf* cf : {&kAllBf16, &kDefault, &kMixed})
        for (bool acc : {false, true}) {
          check(ctx, p, *cf, acc, true, true, all_vars);
          if (cf->w16) check(ctx, p, *cf, acc, false, true, {0});
        }
      check(ctx, p, kAllBf16, false, true, false, {0});
      check(ctx, p, kDefault, true, false, false, {0});
      for (int z : {1, 2, 3, 4, 5})  // exact zeros or tiny m in the moments (the idle experts' fast path)
        for (const Conf* cf : {&kAllBf16, &kDefault, &kMixed}) {
          check(ctx, p, *cf, false, true, true, {0}, z);
          check(ctx, p, *cf, true, true, true, {0}, z);
        }
      release(p);
    }
  }
  if (part == "skewprof" || part == "skewloop") {
    // One fused gate_up launch (all-bf16, sr) per case, for Nsight Compute (skewprof), or each case
    // looped for about 2 s (skewloop, for clock / power sampling beside it): uniform routing, the proxy's
    // routing with random moments, the same with the idle experts' moments 0.
    std::vector<int64_t> skew(128);
    {
      std::vector<int> rank(128);
      for (int e = 0; e < 128; ++e) rank[e] = e;
      std::mt19937 rng(5);
      std::shuffle(rank.begin(), rank.end(), rng);
      for (int e = 0; e < 128; ++e) skew[e] = rank[e] < 4 ? 4096 : rank[e] < 68 ? 256 : 0;
    }
    for (int c = 0; c < 5; ++c) {
      Prob p = make("gate_up", c == 0 ? routed(4096, 8, 128, 42) : skew, 32768, 2048, 1536);
      const int64_t n = (int64_t)p.E * p.M * p.K;
      State st = alloc_state(kAllBf16, n);
      init_state(kAllBf16, n, st, 7);
      if (c == 2) zero_moments(p, kAllBf16, st, false);
      if (c == 3) tiny_moments(p, kAllBf16, st, 1e-25f);
      if (c == 4) tiny_moments(p, kAllBf16, st, 3e-40f);
      double* part_;
      CK(cudaMalloc(&part_, gwd::dw_adamw_tiles(p.E, p.K, p.M, true) * 8));
      Opt o{am::make_consts(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f), true, 99, 3};
      const gwd::DwAdamWArgs a = args_for(kAllBf16, st, nullptr, o);
      const char* name[5] = {"uniform", "skew, random moments", "skew, idle moments 0", "skew, idle m ~1e-25",
                             "skew, idle m ~3e-40"};
      CK(cudaDeviceSynchronize());
      if (part == "skewprof") {
        gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part_, 0);
        CK(cudaDeviceSynchronize());
        std::printf("launched: %s\n", name[c]);
      } else {
        std::printf("%-22s medians of 23 launches each (3 warm-up), in order:", name[c]);
        for (int r = 0; r < 6; ++r)
          std::printf(" %.3f", time_ms([&] {
            gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part_, 0); }, 20));
        std::printf("\n%-22s without the per-tile sums of squares, alternating with them:", name[c]);
        for (int r = 0; r < 3; ++r)
          std::printf(" none %.3f sums %.3f", time_ms([&] {
            gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, nullptr, 0); }, 20),
            time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part_, 0); }, 20));
        std::printf("\n");
#ifdef MT_DW_OLD
        moetrain::cuda::gwd_old::DwAdamWArgs ao;
        std::memcpy(&ao, &a, sizeof ao);
        std::printf("%-22s old kernel, alternating with the new:", name[c]);
        for (int r = 0; r < 4; ++r)
          std::printf(" old %.3f new %.3f", time_ms([&] {
            moetrain::cuda::gwd_old::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, ao, part_, 0); }, 20),
            time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part_, 0); }, 20));
        std::printf("\n");
#endif
        std::fflush(stdout);
      }
      free_state(st);
      CK(cudaFree(part_));
      release(p);
    }
    return 0;
  }
  if (part == "skewparts") {  // where the proxy routing's extra time goes (gate_up, all-bf16, sr, moments of
    // the idle experts 0): even routing; the proxy's; its 4 heavy experts alone; its 64 light ones alone;
    // no expert with rows (the whole update through the idle-tile walk)
    std::vector<int> rank(128);
    for (int e = 0; e < 128; ++e) rank[e] = e;
    std::mt19937 rng(5);
    std::shuffle(rank.begin(), rank.end(), rng);
    auto counts_of = [&](int which) {
      std::vector<int64_t> c(128, 0);
      for (int e = 0; e < 128; ++e) {
        if (which == 0) c[e] = 256;
        if (which == 1) c[e] = rank[e] < 4 ? 4096 : rank[e] < 68 ? 256 : 0;
        if (which == 2) c[e] = rank[e] < 4 ? 4096 : 0;
        if (which == 3) c[e] = rank[e] >= 4 && rank[e] < 68 ? 256 : 0;
      }
      return c;
    };
    const char* names[5] = {"even (256 rows each)", "proxy (4 x 4096, 64 x 256, 60 idle)", "4 x 4096, 124 idle",
                            "64 x 256, 64 idle", "all idle"};
    for (int which = 0; which < 5; ++which) {
      std::vector<int64_t> c = which == 4 ? std::vector<int64_t>(128, 0) : counts_of(which);
      int64_t rows = 0;
      for (int64_t v : c) rows += v;
      Prob p = make("gate_up", c, rows > 0 ? rows : 8, 2048, 1536);
      const int64_t n = (int64_t)p.E * p.M * p.K;
      State st = alloc_state(kAllBf16, n);
      init_state(kAllBf16, n, st, 7);
      zero_moments(p, kAllBf16, st, false);
      if (which > 0 && which < 4) check(ctx, p, kAllBf16, false, true, true, {0}, 1);
      double* part_;
      CK(cudaMalloc(&part_, gwd::dw_adamw_tiles(p.E, p.K, p.M, true) * 8));
      Opt o{am::make_consts(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f), true, 99, 3};
      const gwd::DwAdamWArgs a = args_for(kAllBf16, st, nullptr, o);
      std::printf("| %-38s |", names[which]);
      for (int r = 0; r < 3; ++r)
        std::printf(" %.3f", time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part_, 0); }, reps));
#ifdef MT_DW_OLD
      moetrain::cuda::gwd_old::DwAdamWArgs ao;
      std::memcpy(&ao, &a, sizeof ao);
      std::printf(" | old");
      for (int r = 0; r < 3; ++r)
        std::printf(" %.3f", time_ms([&] {
          moetrain::cuda::gwd_old::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, ao, part_, 0); }, reps));
#endif
      std::printf(" |\n");
      std::fflush(stdout);
      free_state(st);
      CK(cudaFree(part_));
      release(p);
    }
    return 0;
  }
  if (part == "skew") {  // fused vs separate kernels as the routing gets less even (gate_up, all-bf16)
    for (double alpha : {0.0, 0.5, 1.0, -1.0}) {
      // rows of expert e proportional to 1 / (rank + 1)^alpha, ranks shuffled, 32768 rows in all;
      // alpha -1: the proxy model's deeper layers (untrained router): 4 experts take every token
      // (4096 rows), 64 take 256, 60 are idle (max / mean 16, as logging.log_expert_load reports)
      std::vector<int> rank(128);
      for (int e = 0; e < 128; ++e) rank[e] = e;
      std::mt19937 rng(5);
      std::shuffle(rank.begin(), rank.end(), rng);
      std::vector<double> wgt(128);
      double tot = 0;
      for (int e = 0; e < 128; ++e) tot += wgt[e] = std::pow(rank[e] + 1.0, -alpha);
      std::vector<int64_t> counts(128);
      int64_t used = 0;
      for (int e = 0; e < 128; ++e) used += counts[e] = static_cast<int64_t>(32768 * wgt[e] / tot);
      counts[0] += 32768 - used;
      if (alpha < 0)
        for (int e = 0; e < 128; ++e) counts[e] = rank[e] < 4 ? 4096 : rank[e] < 68 ? 256 : 0;
      const int64_t mx = *std::max_element(counts.begin(), counts.end()), mn = *std::min_element(counts.begin(), counts.end());
      Prob p = make("gate_up", counts, 32768, 2048, 1536);
      if (alpha < 0) {  // bits against the separate kernels with 60 idle experts (= and += / prior)
        for (int z : {0, 1, 3, 4, 5}) {
          check(ctx, p, kAllBf16, false, true, true, {0}, z);
          check(ctx, p, kAllBf16, false, false, true, {0}, z);
          check(ctx, p, kDefault, true, false, true, {0}, z);
        }
      }
      const int64_t n = (int64_t)p.E * p.M * p.K;
      State st = alloc_state(kAllBf16, n);
      init_state(kAllBf16, n, st, 7);
      void* grad;
      CK(cudaMalloc(&grad, n * 2));
      double* part;
      CK(cudaMalloc(&part, gwd::dw_adamw_tiles(p.E, p.K, p.M, true) * 8));
      Opt o{am::make_consts(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f), true, 99, 3};
      const gwd::DwAdamWArgs a = args_for(kAllBf16, st, nullptr, o);
      std::printf("| rows ~ rank^%.1f (%lld..%lld) | dW %8.3f | unfused %8.3f | fused %8.3f |\n", -alpha, (long long)mn,
                  (long long)mx,
                  time_ms([&] { gwd::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, grad, true, false, part, 0); }, reps),
                  time_ms([&] { run_unfused(ctx, p, kAllBf16, st, grad, false, part, o); }, reps),
                  time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part, 0); }, reps));
      if (alpha < 0) {  // as in a training step: the idle experts' moments are exactly 0
        zero_moments(p, kAllBf16, st, false);
        for (const bool sr : {true, false}) {
          Opt oz = o;
          oz.sr = sr;
          const gwd::DwAdamWArgs az = args_for(kAllBf16, st, nullptr, oz);
          std::printf("| idle experts' moments 0, %s | unfused %8.3f | fused %8.3f |", sr ? "sr " : "rne",
                      time_ms([&] { run_unfused(ctx, p, kAllBf16, st, grad, false, part, oz); }, reps),
                      time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, az, part, 0); },
                              reps));
#ifdef MT_DW_OLD
          namespace gold = moetrain::cuda::gwd_old;
          gold::DwAdamWArgs ao;
          std::memcpy(&ao, &az, sizeof ao);
          std::printf(" old fused %8.3f |", time_ms([&] {
            gold::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, ao, part, 0); }, reps));
#endif
          std::printf("\n");
        }
      }
      free_state(st);
      CK(cudaFree(grad));
      CK(cudaFree(part));
      release(p);
    }
    std::printf("%s: %d failing check(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
    return g_fail ? 1 : 0;
  }
  if (part == "tiny") {  // magnitudes like the proxy model's: tiny gradients and moments
    const std::vector<int64_t> counts = routed(4096, 8, 128, 42);
    Prob p = make("gate_up", counts, 32768, 2048, 1536);
    fill_bf16<<<1024, 256>>>(p.dy, p.N * p.M, 12, 1e-6f, INT64_MAX);
    const int64_t n = (int64_t)p.E * p.M * p.K;
    for (int mag = 0; mag < 2; ++mag) {
      State st = alloc_state(kAllBf16, n);
      init_state(kAllBf16, n, st, 7);
      if (mag) {
        fill_h<uint16_t>(st.m, n, 8, 1e-7f, 1);
        fill_h<uint16_t>(st.v, n, 9, 3e-7f, 2);
      }
      void* grad;
      CK(cudaMalloc(&grad, n * 2));
      double* part;
      CK(cudaMalloc(&part, gwd::dw_adamw_tiles(p.E, p.K, p.M, true) * 8));
      Opt o{am::make_consts(1e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 5, 1.0f), true, 99, 3};
      const gwd::DwAdamWArgs a = args_for(kAllBf16, st, nullptr, o);
      std::printf("| tiny dy, %s moments | unfused %8.3f | fused v0 %8.3f | fused v8 %8.3f |\n", mag ? "tiny" : "O(1e-2)",
                  time_ms([&] { run_unfused(ctx, p, kAllBf16, st, grad, false, part, o); }, reps),
                  time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part, 0); }, reps),
                  time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part, 8); }, reps));
      free_state(st);
      CK(cudaFree(grad));
      CK(cudaFree(part));
    }
    release(p);
    return 0;
  }
  if (part != "edges") {
    struct S { const char* tag; int64_t K, M; };
    const std::vector<int64_t> counts = routed(4096, 8, 128, 42);
    std::vector<std::string> table;
    {  // device-to-device copy: the bandwidth ceiling (bytes read + written)
      const int64_t bytes = int64_t(2) << 30;
      void *a, *b;
      CK(cudaMalloc(&a, bytes));
      CK(cudaMalloc(&b, bytes));
      CK(cudaMemset(a, 1, bytes));
      const float ms = time_ms([&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, reps);
      char line[256];
      std::snprintf(line, sizeof line, "| copy 2 GiB | - | - | memcpy | %8.3f | %7.0f |", ms, 2.0 * bytes / ms / 1e6);
      table.push_back(line);
      std::puts(line);
      CK(cudaFree(a));
      CK(cudaFree(b));
    }
    for (S s : {S{"gate_up", 2048, 1536}, S{"down", 768, 2048}}) {
      Prob p = make(s.tag, counts, 32768, s.K, s.M);
      check(ctx, p, kAllBf16, false, true, true, {0, 4, 8, 12});
      check(ctx, p, kAllBf16, true, false, true, {0});
      check(ctx, p, kDefault, true, false, true, {0, 4, 8});
      check(ctx, p, kDefault, false, false, false, {0});
      check(ctx, p, kMixed, false, false, true, {0});
      const int64_t n = (int64_t)p.E * p.M * p.K;
      for (const Conf* cf : {&kAllBf16, &kDefault}) {
        const int64_t gb = n * (cf->g16 ? 2 : 4), tiles = gwd::dw_adamw_tiles(p.E, p.K, p.M, cf->g16);
        State st = alloc_state(*cf, n);
        init_state(*cf, n, st, 7);
        void* grad;
        double* part;
        CK(cudaMalloc(&grad, gb));
        CK(cudaMalloc(&part, tiles * 8));
        for (const bool sr : {true, false}) {
          if (!sr && !cf->w16) continue;  // stochastic rounding exists only with a bf16 master
          Opt o{am::make_consts(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 1.0f), sr, 99, 3};
          const double sw = cf->w16 ? 2 : 4, sg = cf->g16 ? 2 : 4, sm = cf->m16 ? 2 : 4, sv = cf->v16 ? 2 : 4,
                       sc = cf->comp ? 2 : 0, gemm_in = 2.0 * p.N * (p.K + p.M);
          const double b_fused = n * (2 * sw + 2 * sm + 2 * sv + sc) + gemm_in;
          const double b_dw = n * sg + gemm_in, b_adamw = n * (2 * sw + sg + 2 * sm + 2 * sv + sc);
          auto row = [&](const char* what, float ms, double bytes) {
            char line[256];
            std::snprintf(line, sizeof line, "| %-8s | %-8s | %-5s | %-22s | %8.3f | %7.0f |", s.tag, cf->name,
                          cf->w16 ? (sr ? "= sr" : "= rne") : "=", what, ms, bytes / ms / 1e6);
            table.push_back(line);
            std::puts(line);
          };
          row("dW (ws, +ss)", time_ms([&] { gwd::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, grad, cf->g16,
                                                              false, part, 0); }, reps), b_dw);
#ifdef MT_DW_OLD
          row("old dW (ws, +ss)", time_ms([&] { moetrain::cuda::gwd_old::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N,
                                                   p.K, p.M, grad, cf->g16, false, part, 0); }, reps), b_dw);
#endif
          row("adamw_kernel", time_ms([&] { adamw_unfused(ctx, *cf, st, grad, n, o.k, o.sr, o.key, o.counter); }, reps),
              b_adamw);
          row("unfused dW+adamw", time_ms([&] { run_unfused(ctx, p, *cf, st, grad, false, part, o); }, reps),
              b_dw + b_adamw);
          const gwd::DwAdamWArgs a = args_for(*cf, st, nullptr, o);
          for (int var : time_vars) {
            char what[64];
            std::snprintf(what, sizeof what, "fused v%d (+ss)", var);
            row(what, time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, part, var); },
                              reps), b_fused);
          }
#ifdef MT_DW_OLD
          {
            moetrain::cuda::gwd_old::DwAdamWArgs ao;
            static_assert(sizeof ao == sizeof a, "DwAdamWArgs changed");
            std::memcpy(&ao, &a, sizeof ao);  // the same struct, renamed
            row("old fused v0 (+ss)", time_ms([&] { moetrain::cuda::gwd_old::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff,
                                                        p.E, p.N, p.K, p.M, ao, part, 0); }, reps), b_fused);
          }
#endif
          row("fused v0 (no ss)",
              time_ms([&] { gwd::dispatch_dw_adamw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, a, nullptr, 0); }, reps),
              b_fused);
        }
        free_state(st);
        CK(cudaFree(grad));
        CK(cudaFree(part));
      }
      release(p);
    }
    std::printf("\n| shape | config | mode | kernel | ms | GB/s |\n");
    for (auto& l : table) std::puts(l.c_str());
  }
  std::printf("%s: %d failing check(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
