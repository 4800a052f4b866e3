// Standalone check + benchmark of the expert grouped GEMM kernels (no project libraries): the
// Hopper wgmma kernels (grouped_gemm_wgmma.cu) and the mma.sync kernels (grouped_gemm_mma.cu) are
// compared with a float64 reference on random data (edge cases in full, the Qwen3-30B-A3B shapes
// on sampled rows / experts; dW both += and =, f32 and bf16), checked for determinism and for
// unwritten outputs, and timed with CUDA events.
// Build (repo root): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo
//   -Ibench/standalone/gemm_stub -Isrc bench/standalone/gemm_bench.cu
//   src/kernels/cuda/grouped_gemm_mma.cu src/kernels/cuda/grouped_gemm_wgmma.cu -o gemm_bench
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/context.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_mma.cuh"
#include "kernels/cuda/grouped_gemm_wgmma.cuh"

using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace mc = moetrain::cuda;

#define CK(x) MT_CUDA_CHECK(x)

static int g_fail = 0;

__device__ __forceinline__ float hash_unit(uint64_t i, uint64_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
}
template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = hash_unit(i, seed) * scale;
    if constexpr (sizeof(T) == 4) p[i] = v; else p[i] = __float2bfloat16_rn(v);
  }
}
template <typename T>
void fill(T* p, int64_t n, uint64_t seed, float scale) {
  fill_kernel<<<1024, 256>>>(p, n, seed, scale);
  CK(cudaGetLastError());
}

__device__ __forceinline__ double ld(const bf16& v) { return static_cast<double>(__bfloat162float(v)); }
__device__ __forceinline__ double ld(const float& v) { return static_cast<double>(v); }

// ref[ri, j] for rows rows[ri]: mode 0: sum_k a[r,k] w[e][j,k] (a [N,KD]); mode 1: sum_m a[r,m] w[e][m,j].
__global__ void ref_rows_kernel(int mode, const bf16* a, const bf16* w, const int32_t* off, int E, const int64_t* rows,
                                int nrows, int64_t KD, int64_t NC, double* ref) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= nrows * NC) return;
  const int64_t ri = idx / NC, j = idx % NC, r = rows[ri];
  double s = 0.0;
  if (r < off[E]) {
    int e = 0;
    while (e + 1 < E && off[e + 1] <= r) ++e;
    const bf16* we = w + static_cast<int64_t>(e) * KD * NC;
    for (int64_t k = 0; k < KD; ++k)
      s += ld(a[r * KD + k]) * (mode == 0 ? ld(we[j * KD + k]) : ld(we[k * NC + j]));
  }
  ref[idx] = s;
}
// ref[m, j] = sum over rows r of expert e of dy[r, m] x[r, j].
__global__ void ref_dw_kernel(const bf16* x, const bf16* dy, const int32_t* off, int e, int64_t M, int64_t K,
                              double* ref) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= M * K) return;
  const int64_t m = idx / K, j = idx % K;
  double s = 0.0;
  for (int64_t r = off[e]; r < off[e + 1]; ++r) s += ld(dy[r * M + m]) * ld(x[r * K + j]);
  ref[idx] = s;
}

template <typename T>
std::vector<double> to_host_d(const T* d, int64_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<double> o(n);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (sizeof(T) == 2) o[i] = static_cast<double>(__bfloat162float(h[i]));
    else o[i] = static_cast<double>(h[i]);  // float or double
  }
  return o;
}

// max |got - want| / max |want| (NaN -> inf); prints and counts a failure above tol.
double report(const char* what, const std::vector<double>& got, const std::vector<double>& want, double tol) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::fabs(want[i]));
  }
  const double rel = num / den;
  const bool ok = rel <= tol;
  if (!ok) ++g_fail;
  std::printf("  %-48s max rel err %.3e %s\n", what, rel, ok ? "ok" : "FAIL");
  return rel;
}

struct Problem {
  int E;
  int64_t N, K, M;
  std::vector<int32_t> off;  // [E+1]
  bf16 *x, *w, *dy, *y, *dx;
  int32_t* doff;
  void alloc() {
    CK(cudaMalloc(&x, N * K * 2 + 16));
    CK(cudaMalloc(&w, E * M * K * 2 + 16));
    CK(cudaMalloc(&dy, N * M * 2 + 16));
    CK(cudaMalloc(&y, N * M * 2 + 16));
    CK(cudaMalloc(&dx, N * K * 2 + 16));
    CK(cudaMalloc(&doff, (E + 1) * 4));
    CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
    fill(x, N * K, 11, 1.0f);
    fill(w, E * M * K, 12, 0.05f);
    fill(dy, N * M, 13, 1.0f);
  }
  void release() {
    for (void* p : {(void*)x, (void*)w, (void*)dy, (void*)y, (void*)dx, (void*)doff}) CK(cudaFree(p));
  }
};

Problem make_counts(const std::vector<int64_t>& counts, int64_t N, int64_t K, int64_t M) {
  Problem p{};
  p.E = static_cast<int>(counts.size());
  p.N = N;
  p.K = K;
  p.M = M;
  p.off.assign(p.E + 1, 0);
  for (int e = 0; e < p.E; ++e) p.off[e + 1] = p.off[e] + static_cast<int32_t>(counts[e]);
  return p;
}

Problem make_routed(int64_t T, int topk, int E, int64_t K, int64_t M, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> counts(E, 0);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int i = 0; i < topk; ++i) {
      const int j = i + static_cast<int>(rng() % (E - i));
      std::swap(perm[i], perm[j]);
      ++counts[perm[i]];
    }
  }
  return make_counts(counts, T * topk, K, M);
}

// kNew256k64 / kNew128k32: dW only, the non-default stage depth (64 / 32 rows) of each tile width.
enum Impl { kOld, kNew256, kNew128, kNew256k64, kNew128k32 };
const char* impl_name(Impl i) {
  const char* n[] = {"mma", "wgmma256", "wgmma128", "wg256k64", "wg128k32"};
  return n[i];
}
bool dw_only(Impl i) { return i == kNew256k64 || i == kNew128k32; }

void run_fwd(Context& ctx, Impl im, Problem& p) {
  if (im == kOld) mc::grouped_gemm_mma_forward(ctx, p.x, p.w, p.doff, p.E, p.N, p.K, p.M, p.y);
  else mc::grouped_gemm_wgmma_forward(ctx, p.x, p.w, p.doff, p.E, p.N, p.K, p.M, p.y, im == kNew128 ? 128 : 256);
}
void run_dx(Context& ctx, Impl im, Problem& p) {
  if (im == kOld) mc::grouped_gemm_mma_dx(ctx, p.dy, p.w, p.doff, p.E, p.N, p.K, p.M, p.dx);
  else mc::grouped_gemm_wgmma_dx(ctx, p.dy, p.w, p.doff, p.E, p.N, p.K, p.M, p.dx, im == kNew128 ? 128 : 256);
}
// dW: kOld = mma.sync; kNew256 / kNew128 = wgmma dW kernel with a 256 / 128 wide bf16 tile (f32
// always uses 128, so kNew256 with f32 runs the same kernel as kNew128).
void run_dw(Context& ctx, Impl im, Problem& p, void* dw, bool bf, bool acc) {
  if (im == kOld) mc::grouped_gemm_mma_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, dw, bf, acc);
  else
    mc::grouped_gemm_wgmma_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, dw, bf, acc,
                              im == kNew128 || im == kNew128k32 ? 128 : 256,
                              im == kNew256k64 ? 64 : im == kNew128k32 ? 32 : 0);
}

template <typename T>
__global__ void count_nan_kernel(const T* p, int64_t n, unsigned long long* cnt) {
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v;
    if constexpr (sizeof(T) == 4) v = p[i]; else v = __bfloat162float(p[i]);
    c += isnan(v) ? 1 : 0;
  }
  atomicAdd(cnt, c);
}
// Number of NaN elements of a device buffer (unwritten elements after a NaN poison).
uint64_t count_nan(const void* p, int64_t n, bool bf) {
  unsigned long long* d;
  CK(cudaMalloc(&d, 8));
  CK(cudaMemset(d, 0, 8));
  if (bf) count_nan_kernel<<<1024, 256>>>(static_cast<const bf16*>(p), n, d);
  else count_nan_kernel<<<1024, 256>>>(static_cast<const float*>(p), n, d);
  CK(cudaGetLastError());
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h;
}

// Checks fwd, dx and dw (f32 and bf16) of one implementation on sampled rows / experts.
void check(Context& ctx, Impl im, Problem& p, const std::vector<int64_t>& rows, const std::vector<int>& experts,
           const char* tag) {
  char buf[160];
  int64_t* drows;
  double* dref;
  const int nr = static_cast<int>(rows.size());
  const int64_t wide = std::max(p.M, p.K);
  CK(cudaMalloc(&drows, nr * 8 + 8));
  CK(cudaMalloc(&dref, std::max<int64_t>(nr * wide, p.M * p.K) * 8 + 8));
  CK(cudaMemcpy(drows, rows.data(), nr * 8, cudaMemcpyHostToDevice));
  auto gather = [&](const bf16* out, int64_t ncol) {
    std::vector<double> h = to_host_d(out, p.N * ncol), o(nr * ncol);
    for (int i = 0; i < nr; ++i)
      for (int64_t j = 0; j < ncol; ++j) o[i * ncol + j] = h[rows[i] * ncol + j];
    return o;
  };
  // forward
  if (!dw_only(im)) {  // fwd and dx
    CK(cudaMemset(p.y, 0xFF, p.N * p.M * 2));  // NaN poison
    run_fwd(ctx, im, p);
    ref_rows_kernel<<<(nr * p.M + 255) / 256, 256>>>(0, p.x, p.w, p.doff, p.E, drows, nr, p.K, p.M, dref);
    CK(cudaDeviceSynchronize());
    std::snprintf(buf, sizeof buf, "%s %s fwd", tag, impl_name(im));
    report(buf, gather(p.y, p.M), to_host_d(dref, nr * p.M), 1e-2);
    // dx
    CK(cudaMemset(p.dx, 0xFF, p.N * p.K * 2));
    run_dx(ctx, im, p);
    ref_rows_kernel<<<(nr * p.K + 255) / 256, 256>>>(1, p.dy, p.w, p.doff, p.E, drows, nr, p.M, p.K, dref);
    CK(cudaDeviceSynchronize());
    std::snprintf(buf, sizeof buf, "%s %s dx", tag, impl_name(im));
    report(buf, gather(p.dx, p.K), to_host_d(dref, nr * p.K), 1e-2);
  }
  // dw, f32 and bf16: += on top of random old values, and = (overwrite) on a NaN poison
  for (int mode = 0; mode < 4; ++mode) {
    const bool bf = (mode & 1) != 0, acc = mode < 2;
    if ((im == kNew256 || im == kNew256k64) && !bf) continue;  // f32 runs the 128 kernel for both
    const int64_t n = p.E * p.M * p.K;
    void* dw;
    CK(cudaMalloc(&dw, n * 4 + 16));
    if (!acc) CK(cudaMemset(dw, 0xFF, n * (bf ? 2 : 4)));
    else if (bf) fill(static_cast<bf16*>(dw), n, 21, 4.0f);
    else fill(static_cast<float*>(dw), n, 21, 4.0f);
    const int64_t me = p.M * p.K;  // one expert's slice
    auto slice = [&](int e) {
      return bf ? to_host_d(static_cast<bf16*>(dw) + e * me, me) : to_host_d(static_cast<float*>(dw) + e * me, me);
    };
    std::vector<std::vector<double>> old;
    if (acc)
      for (int e : experts) old.push_back(slice(e));
    run_dw(ctx, im, p, dw, bf, acc);
    CK(cudaDeviceSynchronize());
    if (!acc) {
      const uint64_t nn = count_nan(dw, n, bf);
      if (nn) ++g_fail;
      std::printf("  %s %s dw %s = : %llu unwritten (NaN) elements %s\n", tag, impl_name(im), bf ? "bf16" : "f32",
                  (unsigned long long)nn, nn ? "FAIL" : "ok");
    }
    for (size_t q = 0; q < experts.size(); ++q) {
      const int e = experts[q];
      ref_dw_kernel<<<(me + 255) / 256, 256>>>(p.x, p.dy, p.doff, e, p.M, p.K, dref);
      CK(cudaDeviceSynchronize());
      std::vector<double> ref = to_host_d(dref, me), got = slice(e);
      if (acc)
        for (int64_t i = 0; i < me; ++i) ref[i] += old[q][i];
      std::snprintf(buf, sizeof buf, "%s %s dw %s %s expert %d (%d rows)", tag, impl_name(im), bf ? "bf16" : "f32",
                    acc ? "+=" : "=", e, p.off[e + 1] - p.off[e]);
      report(buf, got, ref, bf ? 1e-2 : 1e-4);
    }
    CK(cudaFree(dw));
  }
  CK(cudaFree(drows));
  CK(cudaFree(dref));
}

// Two runs of dW (+= from the same old values, and =) must give the same bits.
void check_determinism(Context& ctx, Impl im, Problem& p, bool bf, bool acc) {
  const int64_t n = p.E * p.M * p.K, bytes = n * (bf ? 2 : 4);
  void* dw[2];
  std::vector<uint8_t> h[2];
  for (int i = 0; i < 2; ++i) {
    CK(cudaMalloc(&dw[i], bytes));
    if (bf) fill(static_cast<bf16*>(dw[i]), n, 31, 1.0f); else fill(static_cast<float*>(dw[i]), n, 31, 1.0f);
    run_dw(ctx, im, p, dw[i], bf, acc);
    run_fwd(ctx, im, p);
    CK(cudaDeviceSynchronize());
    h[i].resize(bytes);
    CK(cudaMemcpy(h[i].data(), dw[i], bytes, cudaMemcpyDeviceToHost));
  }
  const bool same = std::memcmp(h[0].data(), h[1].data(), bytes) == 0;
  if (!same) ++g_fail;
  std::printf("  determinism %s dw %s %s (two runs, same bits): %s\n", impl_name(im), bf ? "bf16" : "f32",
              acc ? "+=" : "=", same ? "ok" : "FAIL");
  for (int i = 0; i < 2; ++i) CK(cudaFree(dw[i]));
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
  std::printf("device %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  const Impl impls[] = {kOld, kNew256, kNew128, kNew256k64, kNew128k32};
  if (argc > 2 && std::strcmp(argv[2], "prof") == 0) {  // one dW of each kernel, for ncu
    Problem p = make_routed(4096, 8, 128, 2048, 1536, 42);
    p.alloc();
    void* dw;
    CK(cudaMalloc(&dw, p.E * p.M * p.K * 4));
    CK(cudaMemset(dw, 0, p.E * p.M * p.K * 4));
    run_dw(ctx, kNew128, p, dw, false, true);
    run_dw(ctx, kNew256, p, dw, true, true);
    run_dw(ctx, kNew256, p, dw, true, false);
    run_fwd(ctx, kNew256, p);
    CK(cudaDeviceSynchronize());
    return 0;
  }

  std::printf("== edge cases (every row, every expert) ==\n");
  struct Edge {
    const char* tag;
    std::vector<int64_t> counts;
    int64_t N, K, M;
  };
  const std::vector<Edge> edges = {
      {"empty+tail", {0, 300, 1, 0, 130}, 500, 200, 136},
      {"one-expert", {0, 0, 777, 0}, 777, 72, 264},
      {"all-tail", {0, 0, 0}, 40, 64, 128},
      {"tiny", {5, 3}, 9, 8, 8},
      // 40 experts x 2 x 2 tiles > one wave: several tiles per CTA, empty experts between them
      {"many", {3, 0, 70, 1, 0, 0, 129, 64, 65, 2, 0, 33, 7, 0, 90, 5, 0, 0, 0, 11,
                200, 1, 0, 64, 63, 0, 8, 0, 300, 4, 0, 0, 17, 0, 128, 9, 0, 1, 0, 50}, 1700, 136, 200},
  };
  for (const Edge& ed : edges) {
    Problem p = make_counts(ed.counts, ed.N, ed.K, ed.M);
    p.alloc();
    std::vector<int64_t> rows(p.N);
    for (int64_t r = 0; r < p.N; ++r) rows[r] = r;
    std::vector<int> ex(p.E);
    for (int e = 0; e < p.E; ++e) ex[e] = e;
    for (Impl im : impls) check(ctx, im, p, rows, ex, ed.tag);
    p.release();
  }

  struct Shape {
    const char* name;
    int64_t K, M;
  };
  const Shape shapes[] = {{"gate_up 2048->1536", 2048, 1536}, {"down 768->2048", 768, 2048}};
  std::vector<std::string> table;
  for (const Shape& s : shapes) {
    Problem p = make_routed(4096, 8, 128, s.K, s.M, 42);
    p.alloc();
    std::printf("== %s: N %lld, E %d, rows/expert %d..%d ==\n", s.name, (long long)p.N, p.E,
                [&] { int m = 1 << 30; for (int e = 0; e < p.E; ++e) m = std::min(m, p.off[e + 1] - p.off[e]); return m; }(),
                [&] { int m = 0; for (int e = 0; e < p.E; ++e) m = std::max(m, p.off[e + 1] - p.off[e]); return m; }());
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < p.N; r += 97) rows.push_back(r);
    rows.push_back(p.N - 1);
    for (Impl im : impls) check(ctx, im, p, rows, {0, p.E / 2, p.E - 1}, s.name);
    check_determinism(ctx, kNew256, p, true, true);
    check_determinism(ctx, kNew256, p, true, false);
    check_determinism(ctx, kNew128, p, false, true);
    const double f = 2.0 * p.N * p.K * p.M;
    void* dw;
    CK(cudaMalloc(&dw, p.E * p.M * p.K * 4));
    CK(cudaMemset(dw, 0, p.E * p.M * p.K * 4));
    auto row = [&](const char* op, Impl im, double ms) {
      char b[200];
      std::snprintf(b, sizeof b, "| %-20s | %-14s | %-9s | %8.3f | %6.0f |", s.name, op, impl_name(im), ms, f / ms / 1e9);
      table.push_back(b);
    };
    for (Impl im : {kOld, kNew256, kNew128}) {
      row("fwd", im, median_ms([&] { run_fwd(ctx, im, p); }, reps));
      row("dx", im, median_ms([&] { run_dx(ctx, im, p); }, reps));
    }
    for (Impl im : impls) {
      for (int mode = 0; mode < 4; ++mode) {
        const bool bf = (mode & 1) != 0, acc = mode < 2;
        if ((im == kNew256 || im == kNew256k64) && !bf) continue;
        char op[32];
        std::snprintf(op, sizeof op, "dw %s %s", bf ? "bf16" : "f32", acc ? "+=" : "=");
        CK(cudaMemset(dw, 0, p.E * p.M * p.K * 4));
        row(op, im, median_ms([&] { run_dw(ctx, im, p, dw, bf, acc); }, reps));
      }
    }
    CK(cudaFree(dw));
    p.release();
  }
  {  // copy ceiling: 1 GiB device-to-device, bytes read + written
    const int64_t nb = int64_t(1) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, nb));
    CK(cudaMalloc(&b, nb));
    CK(cudaMemset(a, 1, nb));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice)); }, reps);
    char buf[160];
    std::snprintf(buf, sizeof buf, "| copy 1 GiB d2d      | r+w            | memcpy    | %8.3f | %.0f GB/s |", ms,
                  2.0 * nb / ms / 1e6);
    table.push_back(buf);
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  std::printf("\n| shape | op | kernel | ms | TFLOP/s |\n|---|---|---|---|---|\n");
  for (auto& t : table) std::printf("%s\n", t.c_str());
  std::printf("\n%s: %d check(s) failed\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
