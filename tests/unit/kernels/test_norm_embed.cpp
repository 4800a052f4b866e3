// Embedding and RMSNorm on the CPU: forward against double loops, backward against central finite
// differences of a double reference, gradient accumulation, and argument checks.
#include <cmath>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

TEST(Embedding, ForwardGathersAndBackwardScatterAdds) {
  Context ctx;
  const int64_t V = 11, H = 37, T = 9;
  auto tab = randn(V * H, 10);
  std::vector<int32_t> ids = {3, 0, 10, 3, 3, 7, 0, 1, 10};  // repeats must accumulate
  Tensor table = tensor(tab, {V, H}), idt = ints(ids, {T}), out = poisoned({T, H});
  ops::embedding_forward(ctx, table, idt, out);
  std::vector<double> want(T * H);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) want[t * H + h] = tab[ids[t] * H + h];
  expect_close(out, want, 0, 0, "embedding forward");

  auto dout = randn(T * H, 11);
  auto init = randn(V * H, 12);
  Tensor dtable = tensor(init, {V, H});
  ctx.set_num_threads(3);
  ops::embedding_backward(ctx, idt, tensor(dout, {T, H}), dtable);
  std::vector<double> wantg = to_d(init);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) wantg[ids[t] * H + h] += dout[t * H + h];
  expect_close(dtable, wantg, 1e-6, 1e-6, "embedding backward (+=)");

  Tensor bad = ints({3, 11}, {2});
  Tensor out2 = poisoned({2, H});
  EXPECT_THROW(ops::embedding_forward(ctx, table, bad, out2), Error);
  Tensor wrong = poisoned({T, H + 1});
  EXPECT_THROW(ops::embedding_forward(ctx, table, idt, wrong), Error);
}

namespace {
// y[r,i] = x[r,i] * w[i] / sqrt(mean_i x^2 + eps), in double.
std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int64_t R,
                                int64_t D, double eps) {
  std::vector<double> y(R * D);
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0.0;
    for (int64_t i = 0; i < D; ++i) ms += x[r * D + i] * x[r * D + i];
    ms /= D;
    for (int64_t i = 0; i < D; ++i) y[r * D + i] = x[r * D + i] * w[i] / std::sqrt(ms + eps);
  }
  return y;
}
}  // namespace

TEST(RMSNorm, ForwardMatchesDoubleLoop) {
  Context ctx;
  for (auto [R, D] : {std::pair<int64_t, int64_t>{1, 1}, {5, 37}, {33, 128}}) {
    auto x = randn(R * D, 20, 2.0f), w = randn(D, 21);
    Tensor y = poisoned({R, D}), rstd = poisoned({R});
    ops::rmsnorm_forward(ctx, tensor(x, {R, D}), tensor(w, {D}), 1e-6f, y, rstd);
    expect_close(y, rmsnorm_ref(to_d(x), to_d(w), R, D, 1e-6), 2e-6, 1e-6, "rmsnorm y");
    for (int64_t r = 0; r < R; ++r) {
      double ms = 0.0;
      for (int64_t i = 0; i < D; ++i) ms += double(x[r * D + i]) * x[r * D + i];
      EXPECT_NEAR(rstd.get(r), 1.0 / std::sqrt(ms / D + 1e-6), 1e-6 / std::sqrt(ms / D + 1e-6));
    }
    // x_copy: the same y, and x in the copy; it may not alias x or y.
    Tensor y2 = poisoned({R, D}), rstd2 = poisoned({R}), xc = poisoned({R, D});
    Tensor xt = tensor(x, {R, D});
    ops::rmsnorm_forward(ctx, xt, tensor(w, {D}), 1e-6f, y2, rstd2, &xc);
    for (int64_t i = 0; i < R * D; ++i) {
      ASSERT_EQ(y2.get(i), y.get(i)) << i;
      ASSERT_EQ(xc.get(i), x[i]) << i;
    }
    EXPECT_THROW(ops::rmsnorm_forward(ctx, xt, tensor(w, {D}), 1e-6f, y2, rstd2, &xt), Error);
  }
}

TEST(RMSNorm, BackwardMatchesFiniteDifferences) {
  Context ctx;
  ctx.set_num_threads(4);
  const int64_t R = 6, D = 19;
  const double eps = 1e-5;
  auto x = randn(R * D, 30), w = randn(D, 31), rw = randn(R * D, 32);
  Tensor xt = tensor(x, {R, D}), wt = tensor(w, {D});
  Tensor y = poisoned({R, D}), rstd = poisoned({R});
  ops::rmsnorm_forward(ctx, xt, wt, static_cast<float>(eps), y, rstd);
  auto dw0 = randn(D, 33);
  Tensor dx = poisoned({R, D}), dw = tensor(dw0, {D});
  ops::rmsnorm_backward(ctx, xt, wt, rstd, tensor(rw, {R, D}), dx, dw);
  const auto rwd = to_d(rw);
  auto gx = fd_grad([&](const std::vector<double>& xv) { return dot(rmsnorm_ref(xv, to_d(w), R, D, eps), rwd); },
                    to_d(x));
  auto gw = fd_grad([&](const std::vector<double>& wv) { return dot(rmsnorm_ref(to_d(x), wv, R, D, eps), rwd); },
                    to_d(w));
  for (int64_t i = 0; i < D; ++i) gw[i] += dw0[i];  // dw accumulates
  expect_close(dx, gx, 1e-4, 1e-5, "rmsnorm dx");
  expect_close(dw, gw, 1e-4, 1e-5, "rmsnorm dw");

  // dx_accumulate: the residual stream's gradient plus the norm's (dw adds a second time).
  auto prior = randn(R * D, 34);
  Tensor dx_acc = tensor(prior, {R, D});
  ops::rmsnorm_backward(ctx, xt, wt, rstd, tensor(rw, {R, D}), dx_acc, dw, /*dx_accumulate=*/true);
  for (int64_t i = 0; i < R * D; ++i) gx[i] += prior[i];
  for (int64_t i = 0; i < D; ++i) gw[i] += gw[i] - dw0[i];
  expect_close(dx_acc, gx, 1e-4, 1e-5, "rmsnorm dx (accumulate)");
  expect_close(dw, gw, 1e-4, 1e-5, "rmsnorm dw (second call)");

  Tensor rstd_bad = Tensor::zeros({R}, DType::kBF16);
  EXPECT_THROW(ops::rmsnorm_backward(ctx, xt, wt, rstd_bad, tensor(rw, {R, D}), dx, dw), Error);
}
