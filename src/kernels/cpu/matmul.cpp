// CPU GEMM, C[M,N] = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS cblas_sgemm
// (which threads internally by splitting M/N, never K, so results do not depend on its thread
// count). Matrices may have a row stride larger than their width (leading dimension).
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"

namespace moetrain::cpu {

namespace {
// Leading dimension of a row-major matrix whose last dim is unit-stride.
int ld_of(const Tensor& t) {
  const int64_t cols = std::max<int64_t>(t.size(1), 1);
  return static_cast<int>(t.size(0) > 1 ? std::max(t.stride(0), cols) : cols);
}
}  // namespace

void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c,
            float alpha, float beta) {
  require_f32(a, "matmul", "a");
  require_f32(b, "matmul", "b");
  require_f32(c, "matmul", "c");
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = ta == Trans::kNo ? a.size(1) : a.size(0);
  if (M == 0 || N == 0) return;
  float* cp = c.data<float>();
  const int ldc = ld_of(c);
  if (K == 0) {  // op(A) op(B) is all zeros: C = beta * C (beta == 0 clears NaNs too)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) cp[i * ldc + j] = beta == 0.0f ? 0.0f : beta * cp[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta == Trans::kNo ? CblasNoTrans : CblasTrans,
              tb == Trans::kNo ? CblasNoTrans : CblasTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), alpha, a.data<float>(), ld_of(a), b.data<float>(), ld_of(b), beta,
              cp, ldc);
}

}  // namespace moetrain::cpu
