// cublaslt_sweep: for the loss head's GEMMs (logits, dx, dW += at a chunk's rows), times
// cublasGemmEx(CUBLAS_GEMM_DEFAULT) (what ops::matmul runs) against every algorithm cuBLASLt's
// heuristic offers, and says whether each one writes the same bits as the default. A diagnostic for
// docs/design/kernels.md ("Loss head: chunked vs unfused"); not part of the build (round 38, docs/performance.md).
//   nvcc -O2 -std=c++17 -arch=sm_90a bench/standalone/cublaslt_sweep.cu -lcublasLt -lcublas -o /tmp/sweep
//   /tmp/sweep [rows ...]   (default 820 4096)
//   /tmp/sweep layer        (a Qwen3-30B-A3B layer's cuBLAS GEMMs at 4096 tokens: q|k|v and o projections,
//                            forward, dx, dW bf16 and f32 +=; round 45)
//   /tmp/sweep dense06      (Qwen3-0.6B's at 4 x 4096 tokens: q|k|v, o, gate|up, down; f32 dW +=)
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)
#define CB(x)                                                                   \
  do {                                                                          \
    int s_ = static_cast<int>(x);                                               \
    if (s_ != 0) {                                                              \
      std::fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, s_); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(scale * ((h & 0xFFFF) / 32768.0f - 1.0f));
  }
}

__global__ void count_diff(const unsigned* a, const unsigned* b, size_t n, unsigned long long* out) {
  unsigned long long k = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    k += a[i] != b[i];
  if (k) atomicAdd(out, k);
}

struct Case {
  const char* name;
  cublasOperation_t ta, tb;  // column-major: C[m,n] = op(A) op(B)
  int m, n, k, lda, ldb, ldc;
  cudaDataType_t ct;
  float beta;
};


// Row-major C[M,N] = op(A) op(B) as ops::matmul issues it (the column-major C^T = op(B)^T op(A)^T):
// A is [M,K] (ta N) or [K,M] (ta T), B is [K,N] (tb N) or [N,K] (tb T), all dense.
Case row_major(const char* name, int M, int N, int K, bool ta, bool tb, cudaDataType_t ct, float beta) {
  Case c{};
  c.name = name;
  c.ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
  c.tb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.m = N, c.n = M, c.k = K;
  c.lda = tb ? K : N;
  c.ldb = ta ? M : K;
  c.ldc = N;
  c.ct = ct;
  c.beta = beta;
  return c;
}

int main(int argc, char** argv) {
  const bool dense = argc > 1 && std::strcmp(argv[1], "dense06") == 0;
  const bool layer = dense || (argc > 1 && std::strcmp(argv[1], "layer") == 0);
  std::vector<int> rows_list;
  for (int i = 1; i < argc && !layer; ++i) rows_list.push_back(std::atoi(argv[i]));
  if (layer) rows_list = {dense ? 16384 : 4096};
  if (rows_list.empty()) rows_list = {820, 4096};
  const int V = 151936, H = 2048, maxr = *std::max_element(rows_list.begin(), rows_list.end());
  __nv_bfloat16 *w, *x, *d;
  CK(cudaMalloc(&w, (size_t)V * H * 2));
  CK(cudaMalloc(&x, (size_t)maxr * H * 2));
  CK(cudaMalloc(&d, (size_t)maxr * V * 2));
  fill<<<1024, 256>>>(w, (size_t)V * H, 1, 0.02f);
  fill<<<1024, 256>>>(x, (size_t)maxr * H, 2, 1.0f);
  fill<<<1024, 256>>>(d, (size_t)maxr * V, 3, 1e-3f);
  void *c, *c0, *cref;
  const size_t cbytes = (size_t)V * std::max(H, maxr) * 4;
  CK(cudaMalloc(&c, cbytes));
  CK(cudaMalloc(&c0, cbytes));
  CK(cudaMalloc(&cref, cbytes));
  fill<<<1024, 256>>>((__nv_bfloat16*)c0, cbytes / 2, 4, 0.01f);  // the old C for beta = 1 (bits: any pattern)
  size_t ws_bytes = 64u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, s));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  unsigned long long* ndiff;
  CK(cudaMalloc(&ndiff, 8));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto time_f = [&](int reps, auto&& f) {
    for (int i = 0; i < 2; ++i) f();
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(e0, s));
      f();
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  std::printf("case | rows | default ms | TFLOP/s | best Lt ms | TFLOP/s | best same-bits Lt ms | same bits, no workspace | algos (same bits / offered)\n");
  for (int rows : rows_list) {
    std::vector<Case> cases = {
        {"logits [n,V] = X W^T, bf16", CUBLAS_OP_T, CUBLAS_OP_N, V, rows, H, H, H, V, CUDA_R_16BF, 0.0f},
        {"dx [n,H] = D W, bf16", CUBLAS_OP_N, CUBLAS_OP_N, H, rows, V, H, V, H, CUDA_R_16BF, 0.0f},
        {"dW [V,H] += D^T X, f32", CUBLAS_OP_N, CUBLAS_OP_T, H, V, rows, H, V, H, CUDA_R_32F, 1.0f},
        {"dW [V,H] += D^T X, bf16", CUBLAS_OP_N, CUBLAS_OP_T, H, V, rows, H, V, H, CUDA_R_16BF, 1.0f},
    };
    if (layer) {  // T 4096, hidden 2048, q|k|v 5120 wide, attention 4096 wide; operands from the big buffers
      const int T = rows, QKV = 5120, AW = 4096;
      cases = {
          row_major("qkv fwd [T,5120] = X Wqkv^T, bf16", T, QKV, H, false, true, CUDA_R_16BF, 0.0f),
          row_major("qkv dx [T,H] = dY Wqkv, bf16", T, H, QKV, false, false, CUDA_R_16BF, 0.0f),
          row_major("qkv dW [5120,H] += dY^T X, bf16", QKV, H, T, true, false, CUDA_R_16BF, 1.0f),
          row_major("qkv dW [5120,H] += dY^T X, f32", QKV, H, T, true, false, CUDA_R_32F, 1.0f),
          row_major("o fwd [T,H] = A Wo^T, bf16", T, H, AW, false, true, CUDA_R_16BF, 0.0f),
          row_major("o dx [T,4096] = dY Wo, bf16", T, AW, H, false, false, CUDA_R_16BF, 0.0f),
          row_major("o dW [H,4096] += dY^T A, bf16", H, AW, T, true, false, CUDA_R_16BF, 1.0f),
          row_major("o dW [H,4096] += dY^T A, f32", H, AW, T, true, false, CUDA_R_32F, 1.0f),
      };
      if (dense) {  // hidden 1024, q|k|v 4096 wide, attention 2048 wide, MLP 3072
        const int D = 1024, DQKV = 4096, DA = 2048, F = 3072;
        cases = {
            row_major("0.6B qkv fwd, bf16", T, DQKV, D, false, true, CUDA_R_16BF, 0.0f),
            row_major("0.6B qkv dx, bf16", T, D, DQKV, false, false, CUDA_R_16BF, 0.0f),
            row_major("0.6B qkv dW +=, f32", DQKV, D, T, true, false, CUDA_R_32F, 1.0f),
            row_major("0.6B o fwd, bf16", T, D, DA, false, true, CUDA_R_16BF, 0.0f),
            row_major("0.6B o dx, bf16", T, DA, D, false, false, CUDA_R_16BF, 0.0f),
            row_major("0.6B o dW +=, f32", D, DA, T, true, false, CUDA_R_32F, 1.0f),
            row_major("0.6B gate|up fwd, bf16", T, 2 * F, D, false, true, CUDA_R_16BF, 0.0f),
            row_major("0.6B gate|up dx, bf16", T, D, 2 * F, false, false, CUDA_R_16BF, 0.0f),
            row_major("0.6B gate|up dW +=, f32", 2 * F, D, T, true, false, CUDA_R_32F, 1.0f),
            row_major("0.6B down fwd, bf16", T, D, F, false, true, CUDA_R_16BF, 0.0f),
            row_major("0.6B down dx, bf16", T, F, D, false, false, CUDA_R_16BF, 0.0f),
            row_major("0.6B down dW +=, f32", D, F, T, true, false, CUDA_R_32F, 1.0f),
        };
      }
    }
    for (const Case& cs : cases) {
      // A is W or X, B is X or D, by the case (column-major view of the row-major tensors); the layer's
      // cases take both operands from the large random buffers.
      const void* A = layer ? (void*)w
                            : (std::strstr(cs.name, "logits") || std::strstr(cs.name, "dx")) ? (void*)w : (void*)x;
      const void* B = layer ? (void*)d : std::strstr(cs.name, "logits") ? (void*)x : (void*)d;
      const size_t cb = (size_t)cs.ldc * cs.n * (cs.ct == CUDA_R_32F ? 4 : 2);
      const float alpha = 1.0f;
      auto reset = [&] { CK(cudaMemcpyAsync(c, c0, cb, cudaMemcpyDeviceToDevice, s)); };
      auto run_default = [&] {
        CB(cublasGemmEx(h, cs.ta, cs.tb, cs.m, cs.n, cs.k, &alpha, A, CUDA_R_16BF, cs.lda, B, CUDA_R_16BF, cs.ldb,
                        &cs.beta, c, cs.ct, cs.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      reset();
      run_default();
      CK(cudaMemcpyAsync(cref, c, cb, cudaMemcpyDeviceToDevice, s));
      const double flop = 2.0 * cs.m * cs.n * cs.k;
      const float t_def = time_f(10, run_default);
      cublasLtMatmulDesc_t desc;
      CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &cs.ta, sizeof(cs.ta)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &cs.tb, sizeof(cs.tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      const int ar = cs.ta == CUBLAS_OP_N ? cs.m : cs.k, ac = cs.ta == CUBLAS_OP_N ? cs.k : cs.m;
      const int br = cs.tb == CUBLAS_OP_N ? cs.k : cs.n, bc = cs.tb == CUBLAS_OP_N ? cs.n : cs.k;
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ar, ac, cs.lda));
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, br, bc, cs.ldb));
      CB(cublasLtMatrixLayoutCreate(&lc, cs.ct, cs.m, cs.n, cs.ldc));
      cublasLtMatmulPreference_t pref;
      CB(cublasLtMatmulPreferenceCreate(&pref));
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[24];
      int got = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 24, res, &got));
      float best = 1e9f, best_same = 1e9f, best_same_nows = 1e9f;
      int same = 0;
      for (int i = 0; i < got; ++i) {
        auto run = [&] {
          CB(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &cs.beta, c, lc, c, lc, &res[i].algo, ws, ws_bytes, s));
        };
        reset();
        run();
        CK(cudaMemsetAsync(ndiff, 0, 8, s));
        count_diff<<<1024, 256, 0, s>>>((const unsigned*)c, (const unsigned*)cref, cb / 4, ndiff);
        unsigned long long nd = 0;
        CK(cudaMemcpyAsync(&nd, ndiff, 8, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        const bool eq = nd == 0;
        const float t = time_f(5, run);
        int id = 0, tile = 0, splitk = 0, red = 0, stages = 0, cluster = 0;
        size_t sz;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof(cluster), &sz);
        std::printf("  %s rows %d: algo %d id %d tile %d stages %d cluster %d splitk %d red %d ws %zu: %.3f ms %s\n",
                    cs.name, rows, i, id, tile, stages, cluster, splitk, red, res[i].workspaceSize, t,
                    eq ? "same bits" : "other bits");
        best = std::min(best, t);
        if (eq) {
          ++same;
          best_same = std::min(best_same, t);
          if (res[i].workspaceSize == 0) best_same_nows = std::min(best_same_nows, t);
        }
      }
      std::printf("%s | %d | %.3f | %.0f | %.3f | %.0f | %.3f | %.3f | %d / %d\n", cs.name, rows, t_def,
                  flop / t_def / 1e9, best, flop / best / 1e9, best_same, best_same_nows, same, got);
      std::fflush(stdout);
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
  }
  return 0;
}
