// Standalone check + benchmark of the warp-specialized TMA grouped GEMM (src/kernels/cuda/
// grouped_gemm_ws.cu) for y = x W[e]^T and dx = dy W[e], next to the cp.async wgmma kernel
// (grouped_gemm_wgmma.cu). Every variant is compared with a float64 reference on random data (edge
// cases on every row, model shapes on sampled rows), in full with the wgmma kernel, for unwritten
// (NaN-poisoned) elements and for run-to-run bit equality, then timed with CUDA events (median).
// Build: see bench/standalone/gemm_ws_run.sh (no project libraries; stub headers of gemm_stub/).
// Usage: gemm_ws [reps = 20] [edges | shapes | all | prof] (prof: one gate_up fwd + dx of each, for ncu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_wgmma.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"

using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace mc = moetrain::cuda;

#define CK(x) MT_CUDA_CHECK(x)

static int g_fail = 0;

__device__ __forceinline__ float unit_hash(uint64_t i, uint64_t seed) {
  uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full);
  z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
  z = (z ^ (z >> 29)) * 0xC4CEB9FE1A85EC53ull;
  z ^= z >> 32;
  return static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;  // [-1, 1)
}
__global__ void fill_kernel(bf16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __float2bfloat16_rn(unit_hash(i, seed) * scale);
}
void fill(bf16* p, int64_t n, uint64_t seed, float scale) {
  if (n <= 0) return;
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
}

// ref[i, j] for rows rows[i] (float64): mode 0: sum_k a[r, k] w[e][j, k] (a [N, red], w [E, cols,
// red]); mode 1: sum_m a[r, m] w[e][m, j] (a [N, red], w [E, red, cols]); 0 past offsets[E].
__global__ void ref_kernel(int mode, const bf16* a, const bf16* w, const int32_t* off, int E, const int64_t* rows,
                           int nrows, int64_t red, int64_t cols, double* ref) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= nrows * cols) return;
  const int64_t i = idx / cols, j = idx % cols, r = rows[i];
  double s = 0.0;
  if (r < off[E]) {
    int e = 0;
    while (off[e + 1] <= r) ++e;
    const bf16* we = w + static_cast<int64_t>(e) * red * cols;
    for (int64_t k = 0; k < red; ++k) {
      const double wv = __bfloat162float(mode == 0 ? we[j * red + k] : we[k * cols + j]);
      s += static_cast<double>(__bfloat162float(a[r * red + k])) * wv;
    }
  }
  ref[idx] = s;
}

// max |a - b| and max |b| (as float bits: non-negative floats order like integers), NaN count in a.
__global__ void diff_kernel(const bf16* a, const bf16* b, int64_t n, unsigned* maxd, unsigned* maxb,
                            unsigned long long* nans) {
  float md = 0.f, mb = 0.f;
  unsigned long long nn = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (isnan(x)) ++nn; else md = fmaxf(md, fabsf(x - y));
    mb = fmaxf(mb, fabsf(y));
  }
  atomicMax(maxd, __float_as_uint(md));
  atomicMax(maxb, __float_as_uint(mb));
  atomicAdd(nans, nn);
}

struct Problem {
  int E = 0;
  int64_t N = 0, K = 0, M = 0;
  std::vector<int32_t> off;  // [E+1]
  bf16 *x = nullptr, *w = nullptr, *dy = nullptr, *out = nullptr, *out2 = nullptr;
  int32_t* doff = nullptr;
  void alloc(uint64_t seed) {
    const int64_t wide = std::max(K, M);
    CK(cudaMalloc(&x, N * K * 2 + 16));
    CK(cudaMalloc(&w, E * M * K * 2 + 16));
    CK(cudaMalloc(&dy, N * M * 2 + 16));
    CK(cudaMalloc(&out, N * wide * 2 + 16));
    CK(cudaMalloc(&out2, N * wide * 2 + 16));
    CK(cudaMalloc(&doff, (E + 1) * 4));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
    fill(x, N * K, seed + 1, 1.0f);
    fill(w, E * M * K, seed + 2, 0.05f);
    fill(dy, N * M, seed + 3, 1.0f);
  }
  void release() {
    for (void* p : {(void*)x, (void*)w, (void*)dy, (void*)out, (void*)out2, (void*)doff}) CK(cudaFree(p));
  }
};

Problem from_counts(const std::vector<int64_t>& counts, int64_t N, int64_t K, int64_t M) {
  Problem p;
  p.E = static_cast<int>(counts.size());
  p.N = N;
  p.K = K;
  p.M = M;
  p.off.assign(p.E + 1, 0);
  for (int e = 0; e < p.E; ++e) p.off[e + 1] = p.off[e] + static_cast<int32_t>(counts[e]);
  if (p.off[p.E] > N) {
    std::fprintf(stderr, "bad problem: %d rows > N %lld\n", p.off[p.E], (long long)N);
    std::exit(2);
  }
  return p;
}

// T tokens, each routed to topk distinct experts uniformly at random.
Problem routed(int64_t T, int topk, int E, int64_t K, int64_t M, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> counts(E, 0);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int i = 0; i < topk; ++i) {
      std::swap(perm[i], perm[i + static_cast<int>(rng() % (E - i))]);
      ++counts[perm[i]];
    }
  }
  return from_counts(counts, T * topk, K, M);
}

// The proxy model's deeper layers (untrained router, as logging.log_expert_load reports them): 4
// experts take 4096 rows each, 64 take 256, 60 are idle; ranks shuffled as in gemm_ws_dw_adamw's skew.
Problem skewed(int64_t K, int64_t M) {
  std::vector<int> rank(128);
  for (int e = 0; e < 128; ++e) rank[e] = e;
  std::mt19937 rng(5);
  std::shuffle(rank.begin(), rank.end(), rng);
  std::vector<int64_t> counts(128);
  for (int e = 0; e < 128; ++e) counts[e] = rank[e] < 4 ? 4096 : rank[e] < 68 ? 256 : 0;
  return from_counts(counts, 32768, K, M);
}

// impl 0: wgmma (cp.async, the current kernel); 1..8: ws variants (see grouped_gemm_ws.cuh).
const char* impl_name(int im) {
  static const char* n[] = {"wgmma", "ws-coop", "ws-coop-c2", "ws-ping", "ws-ping-c2", "ws-coop-rowmaj", "ws-tall", "ws-coop-dyn", "ws-tall-dyn"};
  return n[im];
}
void run(Context& ctx, int im, bool dx, Problem& p) {
  if (!dx) {
    if (im == 0) mc::grouped_gemm_wgmma_forward(ctx, p.x, p.w, p.doff, p.E, p.N, p.K, p.M, p.out);
    else mc::grouped_gemm_ws_forward(ctx, p.x, p.w, p.doff, p.E, p.N, p.K, p.M, p.out, im);
  } else {
    if (im == 0) mc::grouped_gemm_wgmma_dx(ctx, p.dy, p.w, p.doff, p.E, p.N, p.K, p.M, p.out);
    else mc::grouped_gemm_ws_dx(ctx, p.dy, p.w, p.doff, p.E, p.N, p.K, p.M, p.out, im);
  }
}

std::vector<double> bf_to_host(const bf16* d, int64_t n) {
  std::vector<bf16> h(n);
  CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<double> o(n);
  for (int64_t i = 0; i < n; ++i) o[i] = __bfloat162float(h[i]);
  return o;
}

void verdict(const char* what, double rel, double tol, uint64_t nans) {
  const bool ok = rel <= tol && nans == 0 && !std::isnan(rel);
  if (!ok) ++g_fail;
  std::printf("  %-44s max rel err %.3e, %llu NaN %s\n", what, rel, (unsigned long long)nans, ok ? "ok" : "FAIL");
}

// Checks one implementation's fwd or dx: output poisoned with NaN first; rows `rows` against the
// float64 reference; when `cmp` is given, every element against it (another implementation's
// output), and the whole output twice for bit equality.
void check(Context& ctx, int im, bool dx, Problem& p, const std::vector<int64_t>& rows, const char* tag,
           const bf16* cmp) {
  const int64_t cols = dx ? p.K : p.M, red = dx ? p.M : p.K, n = p.N * cols;
  const int nr = static_cast<int>(rows.size());
  int64_t* drows;
  double* dref;
  CK(cudaMalloc(&drows, nr * 8 + 8));
  CK(cudaMalloc(&dref, nr * cols * 8 + 8));
  CK(cudaMemcpy(drows, rows.data(), nr * 8, cudaMemcpyHostToDevice));
  CK(cudaMemset(p.out, 0xFF, n * 2));  // NaN poison
  run(ctx, im, dx, p);
  CK(cudaGetLastError());
  ref_kernel<<<static_cast<unsigned>((nr * cols + 255) / 256), 256>>>(dx ? 1 : 0, dx ? p.dy : p.x, p.w, p.doff, p.E,
                                                                     drows, nr, red, cols, dref);
  CK(cudaDeviceSynchronize());
  const std::vector<double> got_all = bf_to_host(p.out, n), ref = [&] {
    std::vector<double> r(nr * cols);
    CK(cudaMemcpy(r.data(), dref, nr * cols * 8, cudaMemcpyDeviceToHost));
    return r;
  }();
  double num = 0.0, den = 1e-30;
  uint64_t nans = 0;
  for (int i = 0; i < nr; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double g = got_all[rows[i] * cols + j], want = ref[i * cols + j];
      if (std::isnan(g)) ++nans; else num = std::max(num, std::fabs(g - want));
      den = std::max(den, std::fabs(want));
    }
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s %s vs f64 (%d rows)", tag, impl_name(im), dx ? "dx" : "fwd", nr);
  verdict(buf, num / den, 1e-2, nans);
  {  // the whole output: NaN (unwritten) count, and against cmp
    unsigned* st;
    unsigned long long* nn;
    CK(cudaMalloc(&st, 8));
    CK(cudaMalloc(&nn, 8));
    CK(cudaMemset(st, 0, 8));
    CK(cudaMemset(nn, 0, 8));
    diff_kernel<<<1024, 256>>>(p.out, cmp ? cmp : p.out, n, st, st + 1, nn);
    unsigned h[2];
    unsigned long long hn;
    CK(cudaMemcpy(h, st, 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hn, nn, 8, cudaMemcpyDeviceToHost));
    float md, mb;
    std::memcpy(&md, &h[0], 4);
    std::memcpy(&mb, &h[1], 4);
    std::snprintf(buf, sizeof buf, "%s %s %s all %lld rows%s", tag, impl_name(im), dx ? "dx" : "fwd", (long long)p.N,
                  cmp ? " vs wgmma" : "");
    verdict(buf, cmp ? md / std::max(mb, 1e-30f) : 0.0, 1e-2, hn);
    CK(cudaFree(st));
    CK(cudaFree(nn));
  }
  {  // a second run must give the same bits (a race shows as a moving result)
    CK(cudaMemset(p.out2, 0xFF, n * 2));
    bf16* keep = p.out;
    p.out = p.out2;
    run(ctx, im, dx, p);
    p.out = keep;
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> a(n), b(n);
    CK(cudaMemcpy(a.data(), p.out, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), p.out2, n * 2, cudaMemcpyDeviceToHost));
    const bool same = a == b;
    if (!same) ++g_fail;
    std::printf("  %-44s %s\n", (std::string(tag) + " " + impl_name(im) + (dx ? " dx" : " fwd") + " rerun bits").c_str(),
                same ? "same ok" : "DIFFER FAIL");
  }
  CK(cudaFree(drows));
  CK(cudaFree(dref));
}

template <typename F>
double median_ms(F fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ts;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  Context ctx;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  ctx.facts_.sm_count = prop.multiProcessorCount;
  ctx.facts_.cc_major = prop.major;
  ctx.facts_.cc_minor = prop.minor;
  std::printf("device %s, %d SMs, cc %d.%d, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor,
              prop.l2CacheSize >> 20);
  const int impls[] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string part = argc > 2 ? argv[2] : "all";  // "edges", "shapes" or "all"
  std::vector<std::string> table;

  if (part == "profdown") {  // one down dx of ws-coop and ws-coop-c2 at even routing, for ncu
    Problem p = routed(4096, 8, 128, 768, 2048, 42);
    p.alloc(7);
    for (int im : {1, 2}) run(ctx, im, true, p);
    CK(cudaDeviceSynchronize());
    p.release();
    return 0;
  }
  if (part == "prof") {  // one gate_up fwd and dx of each kernel, for ncu
    for (bool skew : {false, true}) {
      Problem p = skew ? skewed(2048, 1536) : routed(4096, 8, 128, 2048, 1536, 42);
      p.alloc(7);
      for (bool dx : {false, true})
        for (int im : {0, 1, 2, 3}) run(ctx, im, dx, p);
      CK(cudaDeviceSynchronize());
      p.release();
    }
    CK(cudaDeviceSynchronize());
    return 0;
  }
  if (part == "tall") {  // cooperative against tall tiles on three routings, alternating, timings only
    std::vector<int64_t> flat(128, 256);
    for (int r = 0; r < 2; ++r)
      for (const char* route : {"even", "skew", "flat256"})
        for (const int64_t K : {2048, 768}) {
          const int64_t M = K == 2048 ? 1536 : 2048;
          Problem p = std::strcmp(route, "even") == 0   ? routed(4096, 8, 128, K, M, 42)
                      : std::strcmp(route, "skew") == 0 ? skewed(K, M)
                                                        : from_counts(flat, 32768, K, M);
          p.alloc(7);
          const double f = 2.0 * p.N * p.K * p.M;
          for (bool dx : {false, true})
            for (int im : {1, 7, 6, 8, 2}) {
              const double ms = median_ms([&] { run(ctx, im, dx, p); }, reps);
              std::printf("| %d | %-7s | %-9s | %-4s | %-14s | %8.3f | %6.0f |\n", r, route,
                          K == 2048 ? "gate_up" : "down", dx ? "dx" : "fwd", impl_name(im), ms, f / ms / 1e9);
            }
          p.release();
        }
    return 0;
  }
  if (part != "shapes") std::printf("== edge cases (every row) ==\n");
  struct Edge {
    const char* tag;
    std::vector<int64_t> counts;
    int64_t N, K, M;
  };
  const std::vector<Edge> edges = {
      {"uneven", {0, 1, 1000, 0, 64, 65, 128, 129, 255, 257, 3, 0}, 2000, 256, 520},  // 98 tail rows
      {"empty+tail", {0, 300, 1, 0, 130}, 500, 200, 136},
      {"one-expert", {0, 0, 777, 0}, 777, 72, 264},
      {"all-tail", {0, 0, 0}, 40, 64, 128},
      {"tiny", {5, 3}, 9, 8, 8},
      {"many", {3, 0, 70, 1, 0, 0, 129, 64, 65, 2, 0, 33, 7, 0, 90, 5, 0, 0, 0, 11,
                200, 1, 0, 64, 63, 0, 8, 0, 300, 4, 0, 0, 17, 0, 128, 9, 0, 1, 0, 50}, 1700, 136, 200},
  };
  uint64_t seed = 100;
  for (const Edge& ed : edges) {
    if (part == "shapes") break;
    Problem p = from_counts(ed.counts, ed.N, ed.K, ed.M);
    p.alloc(seed += 10);
    std::vector<int64_t> rows(p.N);
    for (int64_t r = 0; r < p.N; ++r) rows[r] = r;
    for (int im : impls)
      for (bool dx : {false, true}) check(ctx, im, dx, p, rows, ed.tag, nullptr);
    p.release();
  }

  struct Shape {
    const char* name;
    int64_t K, M;
  };
  const Shape shapes[] = {{"gate_up 2048->1536", 2048, 1536}, {"down 768->2048", 768, 2048},
                          {"gate_up skew", 2048, 1536}, {"down skew", 768, 2048}};
  for (const Shape& s : shapes) {
    if (part == "edges") break;
    Problem p = std::strstr(s.name, "skew") ? skewed(s.K, s.M) : routed(4096, 8, 128, s.K, s.M, 42);
    p.alloc(seed += 10);
    int mn = 1 << 30, mx = 0;
    for (int e = 0; e < p.E; ++e) {
      mn = std::min(mn, p.off[e + 1] - p.off[e]);
      mx = std::max(mx, p.off[e + 1] - p.off[e]);
    }
    std::printf("== %s: N %lld, E %d, rows/expert %d..%d ==\n", s.name, (long long)p.N, p.E, mn, mx);
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < p.N; r += 97) rows.push_back(r);
    for (int e = 1; e < p.E; e += 9) {  // both sides of some expert boundaries
      rows.push_back(p.off[e] - 1);
      rows.push_back(p.off[e]);
    }
    rows.push_back(p.N - 1);
    bf16* old;
    const int64_t wide = std::max(p.K, p.M);
    CK(cudaMalloc(&old, p.N * wide * 2));
    for (bool dx : {false, true}) {
      run(ctx, 0, dx, p);
      CK(cudaMemcpy(old, p.out, p.N * (dx ? p.K : p.M) * 2, cudaMemcpyDeviceToDevice));
      for (int im : impls) check(ctx, im, dx, p, rows, s.name, old);
    }
    CK(cudaFree(old));
    const double f = 2.0 * p.N * p.K * p.M;
    for (bool dx : {false, true})
      for (int im : {0, 1, 2, 6, 3, 4, 5, 0, 1, 6}) {  // wgmma, ws-coop, ws-tall twice: the spread of one version
        const double ms = median_ms([&] { run(ctx, im, dx, p); }, reps);
        char b[200];
        std::snprintf(b, sizeof b, "| %-20s | %-4s | %-11s | %8.3f | %6.0f |", s.name, dx ? "dx" : "fwd",
                      impl_name(im), ms, f / ms / 1e9);
        table.push_back(b);
      }
    p.release();
  }
  if (!table.empty()) std::printf("\n| shape | op | kernel | ms | TFLOP/s |\n|---|---|---|---|---|\n");
  for (auto& t : table) std::printf("%s\n", t.c_str());
  std::printf("\n%s: %d check(s) failed\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
