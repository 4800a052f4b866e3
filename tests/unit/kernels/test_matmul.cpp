// GEMM on the CPU: every transpose combination, alpha/beta, row-strided views, K = 0, and shape
// checks, against a double loop.
#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
// C = alpha * op(A) op(B) + beta * C0 with A stored [M,K] or [K,M] (ta), B stored [K,N] or [N,K].
std::vector<double> gemm_ref(const std::vector<float>& a, bool ta, const std::vector<float>& b, bool tb,
                             const std::vector<float>& c0, int64_t M, int64_t N, int64_t K, double alpha,
                             double beta) {
  std::vector<double> c(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < K; ++p) s += double(ta ? a[p * M + i] : a[i * K + p]) * (tb ? b[j * K + p] : b[p * N + j]);
      c[i * N + j] = alpha * s + beta * c0[i * N + j];
    }
  return c;
}
}  // namespace

TEST(Matmul, AllTransposesAlphaBeta) {
  Context ctx;
  const int64_t M = 7, N = 13, K = 5;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto a = randn(M * K, 1), b = randn(K * N, 2), c0 = randn(M * N, 3);
      Tensor at = tensor(a, ta ? Shape{K, M} : Shape{M, K});
      Tensor bt = tensor(b, tb ? Shape{N, K} : Shape{K, N});
      Tensor c = tensor(c0, {M, N});
      ops::matmul(ctx, at, ta ? ops::Trans::kYes : ops::Trans::kNo, bt, tb ? ops::Trans::kYes : ops::Trans::kNo,
                  c, 0.75f, -0.5f);
      expect_close(c, gemm_ref(a, ta, b, tb, c0, M, N, K, 0.75, -0.5), 1e-5, 1e-5,
                   "matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
}

TEST(Matmul, BetaZeroOverwritesNaNAndStridedViews) {
  Context ctx;
  const int64_t M = 9, N = 3, K = 17;
  auto a = randn(M * K, 4), b = randn(K * N, 5);
  Tensor c = poisoned({M, N});
  ops::matmul(ctx, tensor(a, {M, K}), ops::Trans::kNo, tensor(b, {K, N}), ops::Trans::kNo, c);
  std::vector<float> zero(M * N, 0.0f);
  expect_close(c, gemm_ref(a, false, b, false, zero, M, N, K, 1, 0), 1e-5, 1e-5, "beta 0");

  // A is the right half of a [M, 2K] buffer: row stride 2K.
  auto wide = randn(M * 2 * K, 6);
  Tensor wt = tensor(wide, {M, 2 * K}).slice(1, K, 2 * K);
  std::vector<float> half(M * K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t p = 0; p < K; ++p) half[i * K + p] = wide[i * 2 * K + K + p];
  Tensor c2 = poisoned({M, N});
  ops::matmul(ctx, wt, ops::Trans::kNo, tensor(b, {K, N}), ops::Trans::kNo, c2);
  expect_close(c2, gemm_ref(half, false, b, false, zero, M, N, K, 1, 0), 1e-5, 1e-5, "strided A");

  // A transposed view (column stride != 1) is rejected with a message.
  Tensor tv = tensor(a, {M, K}).transpose(0, 1);
  Tensor c3 = poisoned({K, N});
  EXPECT_THROW(ops::matmul(ctx, tv, ops::Trans::kNo, tensor(randn(M * N, 7), {M, N}), ops::Trans::kNo, c3),
               Error);
}

TEST(Matmul, EmptyInnerDimAndShapeErrors) {
  Context ctx;
  Tensor a = Tensor::empty({4, 0}, DType::kF32), b = Tensor::empty({0, 3}, DType::kF32);
  Tensor c = tensor(randn(12, 8), {4, 3});
  ops::matmul(ctx, a, ops::Trans::kNo, b, ops::Trans::kNo, c, 1.0f, 0.0f);
  expect_close(c, std::vector<double>(12, 0.0), 0, 0, "K = 0 gives zeros");
  Tensor a2 = tensor(randn(8, 9), {4, 2}), b2 = tensor(randn(9, 10), {3, 3}), c2 = poisoned({4, 3});
  EXPECT_THROW(ops::matmul(ctx, a2, ops::Trans::kNo, b2, ops::Trans::kNo, c2), Error);
  Tensor c_wrong = poisoned({4, 4});
  Tensor b3 = tensor(randn(6, 11), {2, 3});
  EXPECT_THROW(ops::matmul(ctx, a2, ops::Trans::kNo, b3, ops::Trans::kNo, c_wrong), Error);
}
