// RoPE (rotate-half) and SwiGLU (also with a weight per row) on the CPU: forwards against double
// loops, backwards against central finite differences of those loops, plus RoPE invariants
// (position 0 is the identity, norms are kept, in-place use).
#include <cmath>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
// Rotate pairs (i, i + d/2) by pos * theta^(-2i/d), written as a complex multiply in double.
std::vector<double> rope_ref(const std::vector<double>& x, const std::vector<int32_t>& pos, int64_t heads,
                             int64_t d, double theta) {
  std::vector<double> y(x.size());
  const int64_t T = static_cast<int64_t>(pos.size()), half = d / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = pos[t] * std::pow(theta, -2.0 * i / d);
        const int64_t base = (t * heads + h) * d;
        const double re = x[base + i], im = x[base + i + half];
        y[base + i] = re * std::cos(ang) - im * std::sin(ang);
        y[base + i + half] = re * std::sin(ang) + im * std::cos(ang);
      }
  return y;
}

std::vector<double> swiglu_ref(const std::vector<double>& gu, int64_t N, int64_t I) {
  std::vector<double> h(N * I);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t i = 0; i < I; ++i) {
      const double g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
      h[r * I + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return h;
}
}  // namespace

TEST(RoPE, ForwardBackwardAgainstDouble) {
  Context ctx;
  const int64_t T = 7, heads = 3, d = 10;  // d/2 = 5: not a power of two
  const double theta = 10000.0;
  std::vector<int32_t> pos = {0, 1, 2, 0, 5, 63, 17};  // restarts, like packed documents
  auto x = randn(T * heads * d, 40);
  Tensor xt = tensor(x, {T, heads, d}), pt = ints(pos, {T}), y = poisoned({T, heads, d});
  ops::rope_forward(ctx, xt, pt, static_cast<float>(theta), y);
  expect_close(y, rope_ref(to_d(x), pos, heads, d, theta), 2e-5, 2e-5, "rope forward");
  for (int64_t i = 0; i < heads * d; ++i) EXPECT_EQ(y.get(i), x[i]) << "position 0 is the identity";
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double n0 = 0, n1 = 0;
      for (int64_t i = 0; i < d; ++i) {
        n0 += std::pow(x[(t * heads + h) * d + i], 2);
        n1 += std::pow(y.get((t * heads + h) * d + i), 2);
      }
      EXPECT_NEAR(n0, n1, 1e-5 * n0);
    }

  auto rw = randn(T * heads * d, 41);
  Tensor dx = poisoned({T, heads, d});
  ops::rope_backward(ctx, tensor(rw, {T, heads, d}), pt, static_cast<float>(theta), dx);
  auto g = fd_grad([&](const std::vector<double>& xv) { return dot(rope_ref(xv, pos, heads, d, theta), to_d(rw)); },
                   to_d(x));
  expect_close(dx, g, 2e-5, 2e-5, "rope backward");

  // In place (y aliases x) gives the same values.
  ops::rope_forward(ctx, xt, pt, static_cast<float>(theta), xt);
  expect_close(xt, to_d(y), 0, 0, "rope in place");

  Tensor odd = tensor(randn(T * 3, 42), {T, 1, 3}), odd_y = poisoned({T, 1, 3});
  EXPECT_THROW(ops::rope_forward(ctx, odd, pt, 1e4f, odd_y), Error);
}

// Qwen3's q/k path as one op: RoPE of the per-head RMSNorm, against double loops, backward (x and
// the norm weight, which accumulates) against finite differences; the gradient may overwrite dy.
TEST(NormRope, ForwardBackwardAgainstDouble) {
  Context ctx;
  const int64_t T = 5, heads = 3, d = 8;
  const double theta = 10000.0, eps = 1e-5;
  const std::vector<int32_t> pos = {0, 3, 1, 9, 2};
  auto x = randn(T * heads * d, 43), w = randn(d, 44), rw = randn(T * heads * d, 45);
  auto ref = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
    std::vector<double> n(xv.size());
    for (int64_t r = 0; r < T * heads; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += xv[r * d + i] * xv[r * d + i];
      const double rs = 1.0 / std::sqrt(ss / d + eps);
      for (int64_t i = 0; i < d; ++i) n[r * d + i] = xv[r * d + i] * rs * wv[i];
    }
    return rope_ref(n, pos, heads, d, theta);
  };
  Tensor xt = tensor(x, {T, heads, d}), wt = tensor(w, {d}), pt = ints(pos, {T});
  Tensor y = poisoned({T, heads, d}), rstd = poisoned({T * heads});
  ops::norm_rope_forward(ctx, xt, wt, static_cast<float>(eps), pt, static_cast<float>(theta), y, rstd);
  expect_close(y, ref(to_d(x), to_d(w)), 2e-5, 2e-5, "norm_rope forward");

  auto dw0 = randn(d, 46);
  Tensor dyx = tensor(rw, {T, heads, d}), dw = tensor(dw0, {d});
  ops::norm_rope_backward(ctx, xt, wt, rstd, pt, static_cast<float>(theta), dyx, dyx, dw);  // in place
  auto gx = fd_grad([&](const std::vector<double>& xv) { return dot(ref(xv, to_d(w)), to_d(rw)); }, to_d(x));
  auto gw = fd_grad([&](const std::vector<double>& wv) { return dot(ref(to_d(x), wv), to_d(rw)); }, to_d(w));
  for (int64_t i = 0; i < d; ++i) gw[i] += dw0[i];
  expect_close(dyx, gx, 1e-4, 1e-5, "norm_rope dx");
  expect_close(dw, gw, 1e-4, 1e-5, "norm_rope dw");

  Tensor bad_rstd = poisoned({T});
  EXPECT_THROW(ops::norm_rope_forward(ctx, xt, wt, 1e-5f, pt, 1e4f, y, bad_rstd), Error);
}

// q and k in one call: exactly the single op on each, and each side's bad input is named.
TEST(NormRope, QkPairIsTheSingleOpOnEach) {
  Context ctx;
  const int64_t T = 6, nh = 4, nkv = 2, d = 8;
  const std::vector<int32_t> pos = {0, 5, 1, 2, 7, 3};
  Tensor pt = ints(pos, {T});
  Tensor xq = tensor(randn(T * nh * d, 51), {T, nh, d}), xk = tensor(randn(T * nkv * d, 52), {T, nkv, d});
  Tensor wq = tensor(randn(d, 53), {d}), wk = tensor(randn(d, 54), {d});
  ops::NormRopeFwdIO q{xq, wq, poisoned({T, nh, d}), poisoned({T * nh})};
  ops::NormRopeFwdIO k{xk, wk, poisoned({T, nkv, d}), poisoned({T * nkv})};
  ops::norm_rope_forward_qk(ctx, q, k, 1e-6f, pt, 1e4f);
  Tensor yq = poisoned({T, nh, d}), rq = poisoned({T * nh}), yk = poisoned({T, nkv, d}), rk = poisoned({T * nkv});
  ops::norm_rope_forward(ctx, xq, wq, 1e-6f, pt, 1e4f, yq, rq);
  ops::norm_rope_forward(ctx, xk, wk, 1e-6f, pt, 1e4f, yk, rk);
  expect_close(q.y, to_d(yq), 0, 0, "qk forward y (q)");
  expect_close(q.rstd, to_d(rq), 0, 0, "qk forward rstd (q)");
  expect_close(k.y, to_d(yk), 0, 0, "qk forward y (k)");
  expect_close(k.rstd, to_d(rk), 0, 0, "qk forward rstd (k)");

  const auto gq = randn(T * nh * d, 55), gk = randn(T * nkv * d, 56), w0 = randn(d, 57);
  Tensor dq = tensor(gq, {T, nh, d}), dk = tensor(gk, {T, nkv, d});
  ops::NormRopeBwdIO bq{xq, wq, rq, dq, dq, tensor(w0, {d})};
  ops::NormRopeBwdIO bk{xk, wk, rk, dk, dk, tensor(w0, {d})};
  ops::norm_rope_backward_qk(ctx, bq, bk, pt, 1e4f);
  Tensor dq1 = tensor(gq, {T, nh, d}), dk1 = tensor(gk, {T, nkv, d}), dwq = tensor(w0, {d}), dwk = tensor(w0, {d});
  ops::norm_rope_backward(ctx, xq, wq, rq, pt, 1e4f, dq1, dq1, dwq);
  ops::norm_rope_backward(ctx, xk, wk, rk, pt, 1e4f, dk1, dk1, dwk);
  expect_close(dq, to_d(dq1), 0, 0, "qk backward dx (q)");
  expect_close(dk, to_d(dk1), 0, 0, "qk backward dx (k)");
  expect_close(bq.dw, to_d(dwq), 0, 0, "qk backward dw (q)");
  expect_close(bk.dw, to_d(dwk), 0, 0, "qk backward dw (k)");

  ops::NormRopeFwdIO bad{xk, wk, poisoned({T, nkv, d}), poisoned({T})};  // k's rstd is [T], not [T*nkv]
  try {
    ops::norm_rope_forward_qk(ctx, q, bad, 1e-6f, pt, 1e4f);
    ADD_FAILURE() << "a wrong rstd shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("norm_rope_forward_qk (k)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rstd"), std::string::npos) << e.what();
  }
}

TEST(RoPE, LargePositionUsesFp32AngleOfHF) {
  // Dim pair 0 has inv_freq exactly 1, so the fp32 angle is the position itself (exact), and the
  // result must match a double evaluation at that angle to fp32 rounding.
  Context ctx;
  const int32_t p = 40000;
  Tensor x = tensor({0.25f, -1.5f, 2.0f, 0.5f}, {1, 1, 4}), y = poisoned({1, 1, 4});
  ops::rope_forward(ctx, x, ints({p}, {1}), 1e6f, y);
  EXPECT_NEAR(y.get(0), 0.25 * std::cos(double(p)) - 2.0 * std::sin(double(p)), 1e-6);
  EXPECT_NEAR(y.get(2), 2.0 * std::cos(double(p)) + 0.25 * std::sin(double(p)), 1e-6);
}

TEST(SwiGLU, ForwardBackward) {
  Context ctx;
  ctx.set_num_threads(2);
  for (auto [N, I] : {std::pair<int64_t, int64_t>{1, 1}, {5, 13}, {70, 3}}) {
    auto gu = randn(N * 2 * I, 50, 3.0f);  // includes large |g| where the sigmoid saturates
    Tensor gt = tensor(gu, {N, 2 * I}), h = poisoned({N, I});
    ops::swiglu_forward(ctx, gt, h);
    expect_close(h, swiglu_ref(to_d(gu), N, I), 1e-6, 1e-6, "swiglu forward");
    auto rw = randn(N * I, 51);
    Tensor dgu = poisoned({N, 2 * I});
    ops::swiglu_backward(ctx, gt, tensor(rw, {N, I}), dgu);
    auto g = fd_grad([&](const std::vector<double>& v) { return dot(swiglu_ref(v, N, I), to_d(rw)); }, to_d(gu));
    expect_close(dgu, g, 1e-5, 1e-5, "swiglu backward");
  }
  Tensor odd = tensor(randn(6, 52), {2, 3}), h = poisoned({2, 1});
  EXPECT_THROW(ops::swiglu_forward(ctx, odd, h), Error);
}

// h[r] = w[r] * swiglu(gu[r]): forward against the double loop, and both gradients (gu and w) by
// finite differences of sum(h * rw).
TEST(SwiGLU, WeightedRowsForwardBackward) {
  Context ctx;
  ctx.set_num_threads(2);
  for (auto [N, I] : {std::pair<int64_t, int64_t>{1, 1}, {5, 13}, {40, 8}}) {
    auto gu = randn(N * 2 * I, 60, 3.0f);
    auto w = randn(N, 61);
    auto rw = randn(N * I, 62);
    auto ref = [&](const std::vector<double>& g, const std::vector<double>& wv) {
      std::vector<double> h = swiglu_ref(g, N, I);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t i = 0; i < I; ++i) h[r * I + i] *= wv[r];
      return h;
    };
    Tensor gt = tensor(gu, {N, 2 * I}), wt = tensor(w, {N}), h = poisoned({N, I});
    ops::swiglu_forward(ctx, gt, h, wt);
    expect_close(h, ref(to_d(gu), to_d(w)), 1e-6, 1e-6, "weighted swiglu forward");
    Tensor dgu = poisoned({N, 2 * I}), dw = poisoned({N});
    ops::swiglu_backward_weighted(ctx, gt, tensor(rw, {N, I}), wt, dgu, dw);
    auto g_gu = fd_grad([&](const std::vector<double>& v) { return dot(ref(v, to_d(w)), to_d(rw)); }, to_d(gu));
    expect_close(dgu, g_gu, 1e-5, 1e-5, "weighted swiglu backward, gu");
    auto g_w = fd_grad([&](const std::vector<double>& v) { return dot(ref(to_d(gu), v), to_d(rw)); }, to_d(w));
    expect_close(dw, g_w, 1e-5, 1e-5, "weighted swiglu backward, w");
  }
  Tensor gt = tensor(randn(8, 63), {2, 4}), h = poisoned({2, 2}), dgu = poisoned({2, 4}), dw = poisoned({2});
  Tensor short_w = tensor(randn(3, 64), {3});
  EXPECT_THROW(ops::swiglu_forward(ctx, gt, h, short_w), Error);
  EXPECT_THROW(ops::swiglu_backward_weighted(ctx, gt, h, short_w, dgu, dw), Error);
}
