// CPU GEMM, C[M,N] = alpha * op(A) op(B) + beta * C, row-major, through OpenBLAS cblas_sgemm
// (which threads internally by splitting M/N, never K, so results do not depend on its thread
// count). Matrices may have a row stride larger than their width (leading dimension). A bf16 C
// (a bf16 gradient) is widened into an f32 temporary, updated there and rounded once.
#include <cblas.h>

#include <algorithm>
#include <vector>

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
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = ta == Trans::kNo ? a.size(1) : a.size(0);
  if (M == 0 || N == 0) return;
  if (c.dtype() == DType::kBF16) {
    // A bf16 output (a bf16 gradient): widen C, run the f32 GEMM with beta, round once (RNE).
    const int ldc = ld_of(c);
    uint16_t* cb = static_cast<uint16_t*>(c.data_ptr());
    // Host scratch outside the allocator: the CUDA path rounds in the GEMM epilogue, so the
    // planner (which mirrors the allocator) must not see this CPU-only temporary.
    std::vector<float> scratch(static_cast<size_t>(M * N));
    float* tp = scratch.data();
    Tensor tmp = Tensor::from_blob(tp, {M, N}, DType::kF32, Device::cpu());
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) tp[i * N + j] = beta == 0.0f ? 0.0f : bf16_to_float(cb[i * ldc + j]);
    cpu::matmul(ctx, a, ta, b, tb, tmp, alpha, beta);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) cb[i * ldc + j] = float_to_bf16(tp[i * N + j]);
    return;
  }
  require_f32(c, "matmul", "c");
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
