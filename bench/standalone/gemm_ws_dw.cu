// Standalone check + benchmark of the warp-specialized TMA dW kernel (src/kernels/cuda/
// grouped_gemm_ws_dw.cuh) against the cp.async wgmma dW kernel (grouped_gemm_wgmma.cu): bit
// equality with it, a float64 reference (every element on edge cases, sampled on model shapes),
// run-to-run bits, untouched / zeroed empty experts, the fused sum of squares; then CUDA-event
// medians. With -DMT_DW_OLD (the run script, given a snapshot of an earlier grouped_gemm_ws_dw.cuh
// renamed to namespace gwd_old) that kernel is checked and timed beside it: an A/B in one process.
// Build / run: bench/standalone/gemm_ws_dw_run.sh. Usage: gemm_ws_dw [reps] [edges|shapes|lmhead].
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
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
#include "kernels/cuda/grouped_gemm_wgmma.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw.cuh"
#include "dw_harness.cuh"
#ifdef MT_DW_OLD
#include "kernels/cuda/grouped_gemm_ws_dw_old.cuh"
constexpr bool kHaveOld = true;
#else
constexpr bool kHaveOld = false;
#endif

using moetrain::Context;
using bf16 = __nv_bfloat16;
namespace mc = moetrain::cuda;
#define CK(x) MT_CUDA_CHECK(x)
// cuBLAS / cublasLt calls of the lmhead mode: a failed call stops the harness instead of being timed.
#define CB(x)                                                                       \
  do {                                                                              \
    const cublasStatus_t st_ = (x);                                                 \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s:%d: %s failed with status %d\n", __FILE__, __LINE__, #x, (int)st_); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

static int g_fail = 0;

__global__ void fill_f32(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = unit(i, seed) * scale;
}
// Zeros and tiny values in dw for the sums of squares: x[:, j] = 0 for j % 7 == 3, x[:, j] *= 2^-64 for
// j % 5 == 0, dy[:, i] *= 2^-62 for i % 3 == 0 (products down to f32 / bf16 subnormals).
__global__ void make_special(bf16* x, bf16* dy, int64_t rows, int64_t K, int64_t M) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * K; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = i % K;
    const float v = __bfloat162float(x[i]);
    x[i] = __float2bfloat16_rn(j % 7 == 3 ? 0.0f : j % 5 == 0 ? v * 0x1p-64f : v);
  }
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * M; i += (int64_t)gridDim.x * blockDim.x)
    if ((i % M) % 3 == 0) dy[i] = __float2bfloat16_rn(__bfloat162float(dy[i]) * 0x1p-62f);
}

// Sampled elements idx = s * samp of dw [E, M, K]: ref (f64) = old (if acc) + sum_r dy[r, i] x[r, j];
// max |out - ref|, max |ref|, NaN count.
__global__ void ref_check(const bf16* x, const bf16* dy, const int32_t* off, int64_t K, int64_t M, int64_t total,
                          int64_t samp, const void* out, const void* old, int f32, int acc, double* res,
                          unsigned long long* nans) {
  __shared__ double sd[256], sr[256];
  double md = 0.0, mr = 0.0;
  unsigned long long nn = 0;
  for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s * samp < total; s += (int64_t)gridDim.x * blockDim.x) {
    const int64_t idx = s * samp, e = idx / (M * K), i = (idx / K) % M, j = idx % K;
    double r = 0.0;
    for (int64_t row = off[e]; row < off[e + 1]; ++row)
      r += (double)__bfloat162float(dy[row * M + i]) * (double)__bfloat162float(x[row * K + j]);
    if (acc) r += f32 ? (double)((const float*)old)[idx] : (double)__bfloat162float(((const bf16*)old)[idx]);
    const double v = f32 ? (double)((const float*)out)[idx] : (double)__bfloat162float(((const bf16*)out)[idx]);
    if (isnan(v)) ++nn; else md = fmax(md, fabs(v - r));
    mr = fmax(mr, fabs(r));
  }
  sd[threadIdx.x] = md;
  sr[threadIdx.x] = mr;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int t = 1; t < 256; ++t) {
      md = fmax(md, sd[t]);
      mr = fmax(mr, sr[t]);
    }
    res[2 * blockIdx.x] = md;
    res[2 * blockIdx.x + 1] = mr;
  }
  if (nn) atomicAdd(nans, nn);
}


// ref_check over 512 blocks, reduced on the host: max |out - ref|, max |ref|, NaN count.
struct RefErr {
  double md, mr;
  unsigned long long nans;
};
RefErr ref_error(const Prob& p, int64_t K, int64_t M, int64_t tot, int64_t samp, const void* out, const void* old,
                 bool f32, bool acc) {
  const int blocks = 512;
  double* res;
  unsigned long long* nans;
  CK(cudaMalloc(&res, blocks * 16));
  CK(cudaMalloc(&nans, 8));
  CK(cudaMemset(nans, 0, 8));
  ref_check<<<blocks, 256>>>(p.x, p.dy, p.doff, K, M, tot, samp, out, old, f32 ? 1 : 0, acc ? 1 : 0, res, nans);
  CK(cudaDeviceSynchronize());
  std::vector<double> hr(2 * blocks);
  RefErr r{0.0, 0.0, 0};
  CK(cudaMemcpy(hr.data(), res, blocks * 16, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&r.nans, nans, 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(res));
  CK(cudaFree(nans));
  for (int b = 0; b < blocks; ++b) {
    r.md = std::max(r.md, hr[2 * b]);
    r.mr = std::max(r.mr, hr[2 * b + 1]);
  }
  return r;
}

// impl 0: wgmma (cp.async); 1: ws default; 2: ws other BK; 3: the old ws kernel (MT_DW_OLD), default.
const char* impl_name(int impl) { return impl == 0 ? "wgmma" : impl == 1 ? "ws v0" : impl == 2 ? "ws v1" : "ws old v0"; }
// add: sum the ws kernels' per-tile partials into *ss (the stub's one-thread sum; timings leave it out).
void run(Context& ctx, int impl, const Prob& p, void* dw, bool b16, bool acc, double* ss, bool add = true) {
  if (impl == 0) mc::grouped_gemm_wgmma_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, dw, b16, acc, 0, 0, ss);
  else {
    double* part = nullptr;
    const int64_t n = mc::gwd::dw_tiles(p.E, p.K, p.M, b16);
    if (ss) part = static_cast<double*>(mc::device_scratch(ctx, n * 8).data_ptr());
    if (impl != 3) mc::gwd::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, dw, b16, acc, part, impl - 1);
#ifdef MT_DW_OLD
    else mc::gwd_old::dispatch_dw(ctx, p.x, p.dy, p.doff, p.E, p.N, p.K, p.M, dw, b16, acc, part, 0);
#endif
    if (ss && add) mc::add_partials_into(ctx, part, n, ss);
  }
  CK(cudaGetLastError());
}

bool check_mode(Context& ctx, const Prob& p, bool b16, bool acc, int64_t samp) {
  const int64_t tot = (int64_t)p.E * p.M * p.K, bytes = tot * (b16 ? 2 : 4);
  std::vector<int> impls = {0, 1, 2, 1};
  std::vector<const char*> name = {"wgmma", "ws v0", "ws v1", "ws v0 rerun"};
  if (kHaveOld) {
    impls.push_back(3);
    name.push_back("ws old v0");
  }
  const int n_out = static_cast<int>(impls.size());
  void* init;
  std::vector<void*> outs(n_out);
  double* ss;
  CK(cudaMalloc(&init, bytes + 16));
  for (void*& q : outs) CK(cudaMalloc(&q, bytes + 16));
  CK(cudaMalloc(&ss, n_out * 8));
  if (acc) {
    if (b16) fill_bf16<<<1024, 256>>>((bf16*)init, tot, 5, 3.0f, INT64_MAX);
    else fill_f32<<<1024, 256>>>((float*)init, tot, 5, 3.0f);
  } else {
    CK(cudaMemset(init, 0xFF, bytes));  // NaN: unwritten elements show
  }
  CK(cudaMemset(ss, 0, n_out * 8));
  for (int i = 0; i < n_out; ++i) {
    CK(cudaMemcpy(outs[i], init, bytes, cudaMemcpyDeviceToDevice));
    run(ctx, impls[i], p, outs[i], b16, acc, ss + i);
  }
  CK(cudaDeviceSynchronize());
  std::vector<unsigned char> h0(bytes), h1(bytes), hin(bytes);
  CK(cudaMemcpy(h0.data(), outs[0], bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hin.data(), init, bytes, cudaMemcpyDeviceToHost));
  std::vector<double> hs(n_out);
  CK(cudaMemcpy(hs.data(), ss, n_out * 8, cudaMemcpyDeviceToHost));
  bool ok = true;
  char line[512];
  // host sum of squares of the old kernel's output (f64)
  double hss = 0.0;
  for (int64_t i = 0; i < tot; ++i) {
    double v;
    if (b16) { bf16 b; std::memcpy(&b, &h0[2 * i], 2); v = __bfloat162float(b); }
    else { float f; std::memcpy(&f, &h0[4 * i], 4); v = f; }
    hss += v * v;
  }
  for (int i = 0; i < n_out; ++i) {
    CK(cudaMemcpy(h1.data(), outs[i], bytes, cudaMemcpyDeviceToHost));
    int64_t ndiff = 0, nempty_bad = 0;
    const size_t es = b16 ? 2 : 4;
    for (int64_t k = 0; k < tot; ++k) ndiff += std::memcmp(&h1[k * es], &h0[k * es], es) != 0;
    for (int e = 0; e < p.E; ++e) {
      if (p.off[e + 1] > p.off[e]) continue;
      const size_t b0 = (size_t)e * p.M * p.K * es, n = (size_t)p.M * p.K * es;
      if (acc) nempty_bad += std::memcmp(&h1[b0], &hin[b0], n) != 0;
      else for (size_t k = 0; k < n; ++k) nempty_bad += h1[b0 + k] != 0;
    }
    // float64 reference
    const RefErr r = ref_error(p, p.K, p.M, tot, samp, outs[i], init, !b16, acc);
    const double md = r.md, mr = r.mr;
    const unsigned long long hn = r.nans;
    const double rel = mr > 0 ? md / mr : md, tol = b16 ? 8e-3 : 1e-5;
    const double ssrel = std::fabs(hs[i] - hss) / std::max(hss, 1e-300);
    const bool good = rel <= tol && hn == 0 && nempty_bad == 0 && ssrel < 1e-9 && (i == 0 || (ndiff == 0 && hs[i] == hs[0]));
    std::snprintf(line, sizeof line,
                  "%-14s %s %-2s %-11s: max rel err %.2e (tol %.0e), NaN %llu, bits differ from wgmma %lld, empty experts bad %lld, "
                  "ss %.10e (host %.10e) %s\n",
                  p.tag, b16 ? "bf16" : "f32 ", acc ? "+=" : "=", name[i], rel, tol, hn, (long long)ndiff,
                  (long long)nempty_bad, hs[i], hss, good ? "PASS" : "FAIL");
    std::fputs(line, stdout);
    ok = ok && good;
  }
  CK(cudaFree(init));
  for (void* q : outs) CK(cudaFree(q));
  CK(cudaFree(ss));
  if (!ok) ++g_fail;
  return ok;
}

// Median of reps CUDA-event timings of f (after 3 warm-up calls).
float median_ms(const std::function<void()>& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
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
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

float time_ms(Context& ctx, int impl, const Prob& p, void* dw, bool b16, bool acc, double* ss, int reps) {
  return median_ms([&] { run(ctx, impl, p, dw, b16, acc, ss, false); }, reps);
}

// The loss head's lm_head gradient: dw [V, H] (+)= dlogits^T [V, n] h [n, H] for one row chunk of n
// tokens (one group), by the ws kernel (variants 0 / 1) and by cuBLAS (cublasGemmEx, f32 compute,
// what ops::matmul runs), f32 += (a later chunk) and = (the first). Sampled f64 reference check.
void lmhead(Context& ctx, int reps) {
  const int64_t V = 151936, H = 2048;
  cublasHandle_t hb;
  if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) { std::puts("cublasCreate failed"); ++g_fail; return; }
  std::vector<std::string> table;
  for (int64_t n : {820, 1366, 2048, 4096}) {
    Prob p = make("lm_head", {n}, n, H, V);
    const int64_t tot = V * H;
    float *dw, *init;
    CK(cudaMalloc(&dw, tot * 4 + 16));
    CK(cudaMalloc(&init, tot * 4 + 16));
    fill_f32<<<1024, 256>>>(init, tot, 5, 3.0f);
    const double fl = 2.0 * n * H * V;
    auto cublas = [&](bool acc) {
      const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
      // row-major dw [V, H] = dy^T x: column-major dw^T [H, V] = x^T [H, n] (dy [n, V] col-major [V, n])^T
      CB(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_T, (int)H, (int)V, (int)n, &alpha, p.x, CUDA_R_16BF, (int)H, p.dy,
                      CUDA_R_16BF, (int)V, &beta, dw, CUDA_R_32F, (int)H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    {  // the chunk's other two GEMMs (cuBLAS, bf16 out): logits = h W^T [n, V], dh = dlogits W [n, H]
      bf16 *w, *lg, *dh;
      CK(cudaMalloc(&w, V * H * 2));
      CK(cudaMalloc(&lg, n * V * 2));
      CK(cudaMalloc(&dh, n * H * 2));
      fill_bf16<<<1024, 256>>>(w, V * H, 13, 0.02f, INT64_MAX);
      const float alpha = 1.0f, beta = 0.0f;
      for (int g = 0; g < 2; ++g) {
        auto once = [&] {
          if (g == 0)  // col-major lg^T [V, n] = W [V, H] (col-major [H, V])^T x h^T [H, n]
            CB(cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)V, (int)n, (int)H, &alpha, w, CUDA_R_16BF, (int)H, p.x,
                            CUDA_R_16BF, (int)H, &beta, lg, CUDA_R_16BF, (int)V, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          else  // col-major dh^T [H, n] = W^T [H, V] x dy^T [V, n]
            CB(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, (int)H, (int)n, (int)V, &alpha, w, CUDA_R_16BF, (int)H, p.dy,
                            CUDA_R_16BF, (int)V, &beta, dh, CUDA_R_16BF, (int)H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        const float ms = median_ms(once, reps);
        char line[256];
        std::snprintf(line, sizeof line, "| %5lld | %-6s | cuBLAS | %8.3f | %6.0f |", (long long)n, g ? "dh" : "logits", ms,
                      fl / ms / 1e9);
        table.push_back(line);
        std::puts(line);
      }
      CK(cudaFree(w));
      CK(cudaFree(lg));
      CK(cudaFree(dh));
    }
    for (bool acc : {true, false}) {
      // correctness: ws v0 and cuBLAS against the f64 reference on sampled elements
      for (int impl : {1, 9}) {
        CK(cudaMemcpy(dw, init, tot * 4, cudaMemcpyDeviceToDevice));
        if (impl == 9) cublas(acc);
        else run(ctx, impl, p, dw, false, acc, nullptr);
        const RefErr r = ref_error(p, H, V, tot, 9973, dw, init, true, acc);
        const bool good = r.mr > 0 && r.md / r.mr <= 1e-5 && r.nans == 0;
        std::printf("lm_head n %lld %s %s: max rel err %.2e NaN %llu %s\n", (long long)n, acc ? "+=" : "=",
                    impl == 9 ? "cuBLAS" : impl_name(impl), r.md / r.mr, r.nans, good ? "PASS" : "FAIL");
        if (!good) ++g_fail;
      }
      for (int impl : {1, 2, 9}) {
        auto once = [&] { if (impl == 9) cublas(acc); else run(ctx, impl, p, dw, false, acc, nullptr, false); };
        const float ms = median_ms(once, reps);
        char line[256];
        std::snprintf(line, sizeof line, "| %5lld | f32 %-2s | %-6s | %8.3f | %6.0f |", (long long)n, acc ? "+=" : "=",
                      impl == 9 ? "cuBLAS" : impl_name(impl), ms, fl / ms / 1e9);
        table.push_back(line);
        std::puts(line);
      }
    }
    CK(cudaFree(dw));
    CK(cudaFree(init));
    release(p);
  }
  // cublasLt: time the heuristic's top algorithms for the f32 dw (+)= GEMM at n = 820.
  {
    const int64_t n = 820;
    Prob p = make("lm_head", {n}, n, H, V);
    float* dw;
    CK(cudaMalloc(&dw, V * H * 4 + 16));
    cublasLtHandle_t lt;
    CB(cublasLtCreate(&lt));
    void* ws;
    const size_t wsz = 64ull << 20;
    CK(cudaMalloc(&ws, wsz));
    for (int acc = 1; acc >= 0; --acc) {
      cublasLtMatmulDesc_t op;
      cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      cublasOperation_t tn = CUBLAS_OP_N, tt = CUBLAS_OP_T;
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn);
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tt, sizeof tt);
      cublasLtMatrixLayout_t la, lb, lc;
      cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, H, n, H);
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, V, n, V);
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, H, V, H);
      cublasLtMatmulPreference_t pref;
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz);
      cublasLtMatmulHeuristicResult_t res[32];
      int got = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, res, &got));
      const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
      for (int i = 0; i < got; ++i) {
        auto once = [&] {
          cublasLtMatmul(lt, op, &alpha, p.x, la, p.dy, lb, &beta, dw, lc, dw, lc, &res[i].algo, ws, wsz, 0);
        };
        if (cublasLtMatmul(lt, op, &alpha, p.x, la, p.dy, lb, &beta, dw, lc, dw, lc, &res[i].algo, ws, wsz, 0) !=
                CUBLAS_STATUS_SUCCESS ||
            cudaDeviceSynchronize() != cudaSuccess) {
          std::printf("algo %d failed\n", i);
          continue;
        }
        const float ms = median_ms(once, reps);
        int tile = -1, stages = -1, splitk = -1, swz = -1, cid = -1;
        size_t sz;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &cid, sizeof cid, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &sz);
        std::printf("lt n 820 %s algo %2d (id %d tile %d stages %d splitk %d swizzle %d ws %zu): %.3f ms\n",
                    acc ? "+=" : "= ", i, cid, tile, stages, splitk, swz, res[i].workspaceSize, ms);
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
    }
    CK(cudaFree(ws));
    CK(cudaFree(dw));
    cublasLtDestroy(lt);
    release(p);
  }
  std::printf("\n| rows | mode | kernel | ms | TFLOP/s |\n|---|---|---|---|---|\n");
  for (auto& l : table) std::puts(l.c_str());
  cublasDestroy(hb);
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
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("smem: bf16 v0 %d (%d stages), v1 %d (%d), f32 v0 %d (%d), v1 %d (%d)\n", mc::gwd::Cfg<256, bf16, 32>::kSmem,
              mc::gwd::Cfg<256, bf16, 32>::kStages, mc::gwd::Cfg<256, bf16, 64>::kSmem, mc::gwd::Cfg<256, bf16, 64>::kStages,
              mc::gwd::Cfg<128, float, 64>::kSmem, mc::gwd::Cfg<128, float, 64>::kStages,
              mc::gwd::Cfg<128, float, 32>::kSmem, mc::gwd::Cfg<128, float, 32>::kStages);
  if (part == "lmhead") {
    lmhead(ctx, reps);
    std::printf("%s: %d failing check(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
    return g_fail ? 1 : 0;
  }
  if (part != "shapes") {
    std::vector<Prob> edges;
    edges.push_back(make("uneven", {0, 1, 1000, 0, 64, 65, 128, 129, 255, 257, 3, 0}, 2300, 264, 200));
    edges.push_back(make("empty+tail", {0, 300, 1, 0, 130}, 500, 200, 136));
    edges.push_back(make("one-full", {64, 0, 0}, 64, 64, 64));
    edges.push_back(make("all-empty", {0, 0, 0, 0}, 16, 72, 40));
    edges.push_back(make("N-edge", {5, 31, 33}, 69, 520, 264));
    edges.push_back(make("zeros+tiny", {40, 0, 300, 7}, 400, 520, 264));
    make_special<<<256, 256>>>(edges.back().x, edges.back().dy, edges.back().off.back(), 520, 264);
    CK(cudaGetLastError());
    for (Prob& p : edges) {
      for (bool b16 : {true, false})
        for (bool acc : {false, true}) check_mode(ctx, p, b16, acc, 1);
      release(p);
    }
  }
  if (part != "edges") {
    struct S { const char* tag; int64_t K, M; };
    const std::vector<int64_t> counts = routed(4096, 8, 128, 42);
    std::vector<std::string> table;
    for (S s : {S{"gate_up", 2048, 1536}, S{"down", 768, 2048}}) {
      Prob p = make(s.tag, counts, 32768, s.K, s.M);
      check_mode(ctx, p, true, false, 997);
      check_mode(ctx, p, false, true, 997);
      const int64_t tot = (int64_t)p.E * p.M * p.K;
      void* dw;
      double* ss;
      CK(cudaMalloc(&dw, tot * 4 + 16));
      CK(cudaMalloc(&ss, 8));
      const double fl = 2.0 * 32768 * s.K * s.M;
      struct V { const char* mode; bool b16, acc, withss; };
      for (V v : {V{"bf16 =", true, false, false}, V{"bf16 = +ss", true, false, true}, V{"f32 +=", false, true, false},
                  V{"f32 += +ss", false, true, true}}) {
        std::vector<int> timed = {0, 1, 2};
        if (kHaveOld) timed.push_back(3);
        for (int impl : timed) {
          const float ms = time_ms(ctx, impl, p, dw, v.b16, v.acc, v.withss ? ss : nullptr, reps);
          char line[256];
          std::snprintf(line, sizeof line, "| %-8s | %-11s | %-9s | %8.3f | %6.0f |", s.tag, v.mode,
                        impl_name(impl), ms, fl / ms / 1e9);
          table.push_back(line);
          std::puts(line);
        }
      }
      CK(cudaFree(dw));
      CK(cudaFree(ss));
      release(p);
    }
    std::printf("\n| shape | mode | kernel | ms | TFLOP/s |\n");
    for (auto& l : table) std::puts(l.c_str());
  }
  std::printf("%s: %d failing check(s)\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
