// CUDA GEMM through cuBLAS: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, computed as the
// column-major product C^T = op(B)^T op(A)^T. bf16 inputs with bf16 or f32 output, or all f32;
// fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32). Matrices may have a row stride larger than
// their width (leading dimension), like the CPU twin.
//
// Algorithm choice (MT_MATMUL_TUNE, default 1): cublasGemmEx's default is about cuBLASLt's first
// heuristic pick, and another of the heuristic's offers is up to 20% faster on some of the model's
// shapes (docs/design/kernels.md, round 45). The first beta = 0 call of a bf16 shape times the
// default and each offer that keeps K in one piece, on the call's own operands (a beta = 0 GEMM run
// again rewrites the same output), and keeps the fastest offer whose output has the default's bits
// (a 64-bit checksum of C against the default's; most offers agree, but on small shapes some use
// other MMA instructions, and a split K sums in another order). The choice then serves that shape's
// beta = 0 calls and its alpha = beta = 1 calls (C + AB rounded once, whatever the kernel); other
// calls run the default, and so do calls whose operands are not 256-byte aligned (the heuristic
// assumes that much) and GEMMs under 2^16 outputs or 2^28 multiply-adds. The timing waits on the host once per shape.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "core/env.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

template <typename T>
__global__ void scale_matrix_kernel(T* __restrict__ c, int64_t M, int64_t N, int64_t ldc, float beta) {
  pdl_wait();
  const int64_t n = M * N;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / N, j = e - i * N;
    c[i * ldc + j] = beta == 0.0f ? from_f<T>(0.0f) : from_f<T>(beta * to_f(c[i * ldc + j]));
  }
}

void need_matrix(const Tensor& t, const char* name) {
  MT_CHECK(t.defined(), "[matmul] {} is undefined", name);
  MT_CHECK(t.device().is_cuda(), "[matmul] {} is on {}, expected a CUDA tensor", name, t.device().str());
  MT_CHECK(t.dim() == 2, "[matmul] {} is {}, expected a 2-D matrix", name, t.desc());
  MT_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "[matmul] {} ({}) needs unit stride along its last dim", name,
           t.desc());
  MT_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), "[matmul] {} ({}) has overlapping rows", name, t.desc());
}

int64_t ld_of(const Tensor& t) {
  const int64_t cols = std::max<int64_t>(t.size(1), 1);
  return t.size(0) > 1 ? std::max(t.stride(0), cols) : cols;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: MT_FAIL("[matmul] dtype {} is not supported on CUDA", dtype_name(t));
  }
}

// A 64-bit checksum of the m x n column-major matrix c (leading dimension ldc, elements of `bytes`
// bytes): the sum over elements of a 64-bit mix of (index, bits), order-free, so any changed element
// changes it (but for a 2^-64 chance).
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__global__ void checksum_kernel(const void* __restrict__ c, int64_t m, int64_t n, int64_t ldc, int bytes,
                                unsigned long long* __restrict__ out) {
  pdl_wait();
  unsigned long long acc = 0;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < m * n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t col = e / m, row = e - col * m, at = col * ldc + row;
    const unsigned long long bits = bytes == 4 ? static_cast<const uint32_t*>(c)[at] : static_cast<const uint16_t*>(c)[at];
    acc += mix64((static_cast<unsigned long long>(e) << 32) ^ bits);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

// A bf16 GEMM's shape as cuBLAS sees it, and the algorithm it runs with.
struct GemmShape {
  int dev, m, n, k, lda, ldb, ldc;
  cublasOperation_t opa, opb;
  cudaDataType_t ct;
  bool operator<(const GemmShape& o) const {
    const long long x[10] = {dev, m, n, k, lda, ldb, ldc, opa, opb, ct};
    const long long y[10] = {o.dev, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.opa, o.opb, o.ct};
    return std::lexicographical_compare(x, x + 10, y, y + 10);
  }
};
struct GemmChoice {
  bool lt = false;  // false: cublasGemmEx's default
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

constexpr size_t kMaxTunedShapes = 512;  // shapes beyond this run the default, untimed
// Smaller GEMMs run the default, untimed: too short for 1% to matter, and their outputs too small for
// the checksum to tell another summation order from the default's by every element with certainty.
constexpr int64_t kMinTunedOutputs = int64_t{1} << 16;
constexpr double kMinTunedMacs = 268435456.0;  // 2^28

std::mutex& tune_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<GemmShape, GemmChoice>& tuned() {
  static std::map<GemmShape, GemmChoice> m;  // descriptors live as long as the process
  return m;
}

std::atomic<int>& tuning_flag() {
  static std::atomic<int> on{env_int("MT_MATMUL_TUNE", 1) != 0 ? 1 : 0};
  return on;
}
bool tuning_on() { return tuning_flag().load(std::memory_order_relaxed) != 0; }

// cublasGemmEx with the default algorithm: C = alpha op(A) op(B) + beta C (column-major).
void gemm_default(cublasHandle_t h, const GemmShape& g, const void* A, const void* B, void* C, float alpha,
                  float beta) {
  MT_CUBLAS_CHECK(cublasGemmEx(h, g.opa, g.opb, g.m, g.n, g.k, &alpha, A, CUDA_R_16BF, g.lda, B, CUDA_R_16BF, g.ldb,
                               &beta, C, g.ct, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_lt(Context& ctx, const GemmChoice& c, const void* A, const void* B, void* C, float alpha, float beta) {
  MT_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(ctx.cublaslt_handle()), c.desc, &alpha, A, c.la, B,
                                 c.lb, &beta, C, c.lc, C, c.lc, &c.algo, ctx.cublaslt_workspace(),
                                 Context::kCublasLtWorkspaceBytes, stream_of(ctx)));
}

// The median of 3 timed runs after one untimed one, in ms.
template <typename F>
float time_runs(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, F&& run) {
  run();
  float t[3];
  for (float& x : t) {
    MT_CUDA_CHECK(cudaEventRecord(e0, st));
    run();
    MT_CUDA_CHECK(cudaEventRecord(e1, st));
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    MT_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
  }
  std::sort(t, t + 3);
  return t[1];
}

// The descriptors of shape g and cuBLASLt's offers for it that fit the workspace and keep K in one
// piece (a split K sums in another order: other bits than the default's).
GemmChoice describe(const GemmShape& g) {
  GemmChoice c;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.opa, sizeof(g.opa)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.opb, sizeof(g.opb)));
  const bool na = g.opa == CUBLAS_OP_N, nb = g.opb == CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.la, CUDA_R_16BF, na ? g.m : g.k, na ? g.k : g.m, g.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lb, CUDA_R_16BF, nb ? g.k : g.n, nb ? g.n : g.k, g.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.lc, g.ct, g.m, g.n, g.ldc));
  return c;
}

// (A fixed array: nvcc's front end failed on a std::vector of these.)
struct Offers {
  cublasLtMatmulAlgo_t algo[16];
  int n = 0;
  const cublasLtMatmulAlgo_t* begin() const { return algo; }
  const cublasLtMatmulAlgo_t* end() const { return algo + n; }
};

Offers offers(Context& ctx, const GemmChoice& c) {
  cublasLtMatmulPreference_t pref;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = Context::kCublasLtWorkspaceBytes;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res[16];
  int got = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(ctx.cublaslt_handle()),
                                                           c.desc, c.la, c.lb, c.lc, c.lc, pref, 16, res, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  Offers out;
  for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < got; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws) continue;
    int splitk = 1;
    size_t sz = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                             &sz) != CUBLAS_STATUS_SUCCESS || splitk > 1)
      continue;
    out.algo[out.n++] = res[i].algo;
  }
  return out;
}

unsigned long long checksum(Context& ctx, const GemmShape& g, const void* C) {
  auto* out = static_cast<unsigned long long*>(ctx.gemm_check_scratch());
  cudaStream_t st = stream_of(ctx);
  MT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(*out), st));
  launch_pdl(checksum_kernel, grid_for(static_cast<int64_t>(g.m) * g.n), 256, 0, st, C, static_cast<int64_t>(g.m),
             static_cast<int64_t>(g.n), static_cast<int64_t>(g.ldc), g.ct == CUDA_R_32F ? 4 : 2, out);
  check_launch("matmul checksum");
  unsigned long long v = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&v, out, sizeof(v), cudaMemcpyDeviceToHost, st));
  MT_CUDA_CHECK(cudaStreamSynchronize(st));
  return v;
}

// Times the default and the offers on this call's operands (beta is 0, so each run writes the same
// C) and returns the fastest offer with the default's bits, if it is at least 1% faster than the
// default. C is left with the last run's output: the caller runs the GEMM again.
GemmChoice tune(Context& ctx, cublasHandle_t h, const GemmShape& g, const void* A, const void* B, void* C,
                float alpha) {
  GemmChoice c = describe(g);
  cudaStream_t st = stream_of(ctx);
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  const float t_default = time_runs(st, e0, e1, [&] { gemm_default(h, g, A, B, C, alpha, 0.0f); });
  const unsigned long long want = checksum(ctx, g, C);
  float best = t_default;
  for (const cublasLtMatmulAlgo_t& algo : offers(ctx, c)) {
    GemmChoice cand = c;
    cand.lt = true;
    cand.algo = algo;
    const float t = time_runs(st, e0, e1, [&] { gemm_lt(ctx, cand, A, B, C, alpha, 0.0f); });
    if (t < 0.99f * t_default && t < best && checksum(ctx, g, C) == want) best = t, c.lt = true, c.algo = algo;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return c;
}

GemmShape shape_of(const Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const Tensor& c) {
  // cuBLAS's A is our b, its B our a (the column-major view).
  const int64_t K = ta == Trans::kNo ? a.size(1) : a.size(0);
  return {ctx.device().index, static_cast<int>(c.size(1)), static_cast<int>(c.size(0)), static_cast<int>(K),
          static_cast<int>(ld_of(b)), static_cast<int>(ld_of(a)), static_cast<int>(ld_of(c)),
          tb == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T, ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T,
          cuda_type(c.dtype())};
}

}  // namespace

void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, float alpha,
            float beta) {
  need_matrix(a, "a");
  need_matrix(b, "b");
  need_matrix(c, "c");
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = ta == Trans::kNo ? a.size(1) : a.size(0);
  const int64_t am = ta == Trans::kNo ? a.size(0) : a.size(1);
  const int64_t bk = tb == Trans::kNo ? b.size(0) : b.size(1);
  const int64_t bn = tb == Trans::kNo ? b.size(1) : b.size(0);
  MT_CHECK(am == M && bk == K && bn == N, "[matmul] op(a) is [{}, {}], op(b) is [{}, {}], c is [{}, {}]", am, K, bk,
           bn, M, N);
  MT_CHECK(a.dtype() == b.dtype(), "[matmul] a is {} but b is {}; both must have one dtype", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  MT_CHECK(a.dtype() != DType::kF32 || c.dtype() == DType::kF32, "[matmul] f32 inputs need an f32 output, c is {}",
           dtype_name(c.dtype()));
  if (M == 0 || N == 0) return;
  const int64_t ldc = ld_of(c);
  if (K == 0) {  // op(A) op(B) is empty: C = beta * C (beta == 0 clears NaNs too)
    MT_CUDA_DISPATCH(c.dtype(), T, "matmul",
      launch_pdl(scale_matrix_kernel<T>, grid_for(M * N), 256, 0, stream_of(ctx), static_cast<T*>(c.data_ptr()), M, N, ldc,
                                                                        beta));
    check_launch("matmul");
    return;
  }
  MT_CHECK(M < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31),
           "[matmul] dims [{}, {}, {}] exceed cuBLAS's int range", M, N, K);
  auto h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  MT_CHECK(h, "[matmul] the Context has no cuBLAS handle (is it a CUDA context?)");
  MT_CUBLAS_CHECK(cublasSetStream(h, stream_of(ctx)));
  const cublasOperation_t opa = ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t opb = tb == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
  // The heuristic's offers assume 256-byte aligned operands (cuBLASLt's default for the
  // MIN_ALIGNMENT preferences); other calls (strided column views) run the default.
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 255) == 0; };
  if (a.dtype() == DType::kBF16 && tuning_on() && aligned(a.data_ptr()) && aligned(b.data_ptr()) &&
      aligned(c.data_ptr()) && M * N >= kMinTunedOutputs && static_cast<double>(M * N) * K >= kMinTunedMacs) {
    const GemmShape g = shape_of(ctx, a, ta, b, tb, c);
    const GemmChoice* choice = nullptr;
    {
      std::lock_guard<std::mutex> lock(tune_mutex());
      auto& m = tuned();
      auto it = m.find(g);
      if (it == m.end() && beta == 0.0f && m.size() < kMaxTunedShapes)
        it = m.insert(std::make_pair(g, tune(ctx, h, g, b.data_ptr(), a.data_ptr(), c.data_ptr(), alpha))).first;
      if (it != m.end()) choice = &it->second;  // map nodes stay put
    }
    if (choice && choice->lt && (beta == 0.0f || (alpha == 1.0f && beta == 1.0f))) {
      gemm_lt(ctx, *choice, b.data_ptr(), a.data_ptr(), c.data_ptr(), alpha, beta);
    } else {
      gemm_default(h, g, b.data_ptr(), a.data_ptr(), c.data_ptr(), alpha, beta);
    }
    return;
  }
  MT_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                               b.data_ptr(), cuda_type(b.dtype()), static_cast<int>(ld_of(b)), a.data_ptr(),
                               cuda_type(a.dtype()), static_cast<int>(ld_of(a)), &beta, c.data_ptr(),
                               cuda_type(c.dtype()), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

void set_matmul_tuning(bool on) { tuning_flag().store(on ? 1 : 0); }

int matmul_tuned_shapes(int* with_lt) {
  std::lock_guard<std::mutex> lock(tune_mutex());
  int n = 0;
  for (const auto& kv : tuned()) n += kv.second.lt;
  if (with_lt) *with_lt = n;
  return static_cast<int>(tuned().size());
}

MatmulOfferCheck matmul_check_offers(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                                     const Tensor& c_init, float alpha, float beta) {
  MT_CHECK(a.dtype() == DType::kBF16 && b.dtype() == DType::kBF16, "[matmul_check_offers] needs bf16 a and b");
  auto h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  MT_CUBLAS_CHECK(cublasSetStream(h, stream_of(ctx)));
  const GemmShape g = shape_of(ctx, a, ta, b, tb, c_init);
  Tensor out = c_init.clone(MemCategory::kWorkspace);
  gemm_default(h, g, b.data_ptr(), a.data_ptr(), out.data_ptr(), alpha, beta);
  const unsigned long long want = checksum(ctx, g, out.data_ptr());
  GemmChoice c = describe(g);
  MatmulOfferCheck r;
  for (const cublasLtMatmulAlgo_t& algo : offers(ctx, c)) {
    out.copy_from(c_init);
    c.lt = true;
    c.algo = algo;
    gemm_lt(ctx, c, b.data_ptr(), a.data_ptr(), out.data_ptr(), alpha, beta);
    ++r.offers;
    r.differing += checksum(ctx, g, out.data_ptr()) != want;
  }
  return r;
}

}  // namespace moetrain::cuda
