// MoE token permutation and grouped expert GEMM on the CPU: route index by hand (stable order,
// experts with zero tokens, all tokens on one expert), permute/unpermute invariants and
// backwards (adjoint and finite differences), per-pick values into row order and back, grouped
// matmul against a loop of matmuls and a double loop, its backward against finite differences, dw
// accumulation and the dx-less path.
#include <cmath>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
struct Route {
  Tensor counts, offsets, row_of, token_of;
};
Route route(Context& ctx, const std::vector<int32_t>& idx, int64_t T, int64_t k, int E) {
  Route r{Tensor::empty({E}, DType::kI32), Tensor::empty({E + 1}, DType::kI32), Tensor::empty({T * k}, DType::kI32),
          Tensor::empty({T * k}, DType::kI32)};
  ops::moe_route_index(ctx, ints(idx, {T, k}), E, r.counts, r.offsets, r.row_of, r.token_of);
  return r;
}
std::vector<int32_t> iv(const Tensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}

// y[t] = sum_j w[t,j] yp[row_of[t*k+j]] in double.
std::vector<double> unpermute_ref(const std::vector<double>& yp, const std::vector<int32_t>& row_of,
                                  const std::vector<double>& w, int64_t T, int64_t k, int64_t H) {
  std::vector<double> y(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) y[t * H + h] += w[t * k + j] * yp[row_of[t * k + j] * H + h];
  return y;
}

// y[r] = x[r] W[e]^T for the rows of expert e, in double.
std::vector<double> grouped_ref(const std::vector<double>& x, const std::vector<double>& w,
                                const std::vector<int32_t>& off, int64_t N, int64_t K, int64_t M) {
  std::vector<double> y(N * M, 0.0);
  for (size_t e = 0; e + 1 < off.size(); ++e)
    for (int64_t r = off[e]; r < off[e + 1]; ++r)
      for (int64_t m = 0; m < M; ++m) {
        double s = 0.0;
        for (int64_t c = 0; c < K; ++c) s += x[r * K + c] * w[(e * M + m) * K + c];
        y[r * M + m] = s;
      }
  return y;
}
}  // namespace

TEST(MoePermute, RouteIndexByHand) {
  Context ctx;
  // Picks (flat t*k+j): e2 e0 | e2 e3 | e0 e2 | e3 e2; expert 1 gets nothing.
  Route r = route(ctx, {2, 0, 2, 3, 0, 2, 3, 2}, 4, 2, 4);
  EXPECT_EQ(iv(r.counts), (std::vector<int32_t>{2, 0, 4, 2}));
  EXPECT_EQ(iv(r.offsets), (std::vector<int32_t>{0, 2, 2, 6, 8}));
  EXPECT_EQ(iv(r.row_of), (std::vector<int32_t>{2, 0, 3, 6, 1, 4, 7, 5}));
  EXPECT_EQ(iv(r.token_of), (std::vector<int32_t>{0, 2, 0, 1, 2, 3, 1, 3}));
  // All tokens on one expert: the identity permutation.
  Route one = route(ctx, {3, 3, 3, 3, 3}, 5, 1, 5);
  EXPECT_EQ(iv(one.counts), (std::vector<int32_t>{0, 0, 0, 5, 0}));
  EXPECT_EQ(iv(one.offsets), (std::vector<int32_t>{0, 0, 0, 0, 5, 5}));
  EXPECT_EQ(iv(one.row_of), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(route(ctx, {0, 4}, 1, 2, 4), Error);  // expert id out of range
}

TEST(MoePermute, PermuteUnpermuteInvariantsAndBackwards) {
  Context ctx;
  ctx.set_num_threads(3);
  const int64_t T = 7, k = 3, H = 10;
  const int E = 5;
  std::vector<int32_t> idx = {0, 1, 4, 4, 0, 1, 1, 4, 0, 0, 1, 4, 4, 1, 0, 1, 0, 4, 4, 0, 1};  // experts 2, 3 empty
  Route r = route(ctx, idx, T, k, E);
  auto x = randn(T * H, 140);
  Tensor xt = tensor(x, {T, H}), xp = poisoned({T * k, H});
  ops::moe_permute(ctx, xt, r.token_of, xp);
  const auto tok = iv(r.token_of), row = iv(r.row_of);
  for (int64_t p = 0; p < T * k; ++p)
    for (int64_t h = 0; h < H; ++h) ASSERT_EQ(xp.get(p * H + h), x[tok[p] * H + h]);
  // Unpermute with all weights 1 returns k * x.
  Tensor ones = tensor(std::vector<float>(T * k, 1.0f), {T, k}), y = poisoned({T, H});
  ops::moe_unpermute(ctx, xp, r.row_of, ones, y);
  std::vector<double> kx(T * H);
  for (int64_t i = 0; i < T * H; ++i) kx[i] = k * static_cast<double>(x[i]);
  expect_close(y, kx, 1e-6, 0, "unpermute(permute(x), 1) = k x");
  // Without weights: the same sum, bit for bit.
  Tensor y_now = poisoned({T, H});
  ops::moe_unpermute(ctx, xp, r.row_of, Tensor(), y_now);
  for (int64_t i = 0; i < T * H; ++i) ASSERT_EQ(y_now.get(i), y.get(i)) << "unpermute without weights at " << i;
  Tensor short_yp = poisoned({T * k - 1, H});
  EXPECT_THROW(ops::moe_unpermute(ctx, short_yp, r.row_of, Tensor(), y_now), Error);

  // permute_backward is permute's adjoint: <permute(x), g> = <x, permute_backward(g)>.
  auto g = randn(T * k * H, 141);
  Tensor dx = poisoned({T, H});
  ops::moe_permute_backward(ctx, tensor(g, {T * k, H}), r.row_of, dx);
  EXPECT_NEAR(dot(to_d(xp), to_d(g)), dot(to_d(x), to_d(dx)), 1e-5);
  std::vector<double> dx_ref(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t h = 0; h < H; ++h) dx_ref[t * H + h] += g[row[t * k + j] * H + h];
  expect_close(dx, dx_ref, 1e-6, 1e-6, "permute backward");

  // unpermute forward with random weights, and its backward by finite differences.
  auto yp = randn(T * k * H, 142), w = randu(T * k, 143, 0.1f, 1.0f), rw = randn(T * H, 144);
  Tensor ypt = tensor(yp, {T * k, H}), wt = tensor(w, {T, k}), y2 = poisoned({T, H});
  ops::moe_unpermute(ctx, ypt, r.row_of, wt, y2);
  expect_close(y2, unpermute_ref(to_d(yp), row, to_d(w), T, k, H), 1e-6, 1e-6, "unpermute forward");
  // With a residual: the same sum, then + residual, in f32 (the bits of a separate add).
  auto rv = randn(T * H, 145);
  Tensor y3 = poisoned({T, H});
  ops::moe_unpermute(ctx, ypt, r.row_of, wt, y3, tensor(rv, {T, H}));
  for (int64_t i = 0; i < T * H; ++i)
    EXPECT_EQ(y3.get(i), static_cast<double>(static_cast<float>(y2.get(i)) + rv[i])) << "unpermute + residual at " << i;
  Tensor wrong = poisoned({T + 1, H});
  EXPECT_THROW(ops::moe_unpermute(ctx, ypt, r.row_of, wt, y3, wrong), Error);
  Tensor dyp = poisoned({T * k, H}), dw = poisoned({T, k});
  ops::moe_unpermute_backward(ctx, tensor(rw, {T, H}), ypt, r.row_of, wt, dyp, dw);
  auto gyp = fd_grad([&](const std::vector<double>& v) { return dot(unpermute_ref(v, row, to_d(w), T, k, H), to_d(rw)); },
                     to_d(yp));
  auto gw = fd_grad([&](const std::vector<double>& v) { return dot(unpermute_ref(to_d(yp), row, v, T, k, H), to_d(rw)); },
                    to_d(w));
  expect_close(dyp, gyp, 1e-5, 1e-6, "unpermute backward dyp");
  expect_close(dw, gw, 1e-5, 1e-6, "unpermute backward dtopk_w");

  Tensor bad_rows = ints(std::vector<int32_t>(T * k, 0), {T * k});  // not a permutation
  EXPECT_THROW(ops::moe_unpermute_backward(ctx, tensor(rw, {T, H}), ypt, bad_rows, wt, dyp, dw), Error);
}

// Per-pick values into row order and back: a permutation and its inverse.
TEST(MoePermute, RowsFromPicksAndBack) {
  Context ctx;
  const int64_t T = 4, k = 2;
  Route r = route(ctx, {2, 0, 2, 3, 0, 2, 3, 2}, T, k, 4);  // row_of = 2 0 3 6 1 4 7 5
  Tensor picks = tensor({0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f}, {T, k}), rows = poisoned({T * k});
  ops::moe_rows_from_picks(ctx, picks, r.row_of, rows);
  const std::vector<double> want = {1.5, 4.5, 0.5, 2.5, 5.5, 7.5, 3.5, 6.5};
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(rows.get(i), want[i]) << "row " << i;
  Tensor back = poisoned({T, k});
  ops::moe_picks_from_rows(ctx, rows, r.row_of, back);
  for (int64_t i = 0; i < T * k; ++i) EXPECT_EQ(back.get(i), picks.get(i)) << "pick " << i;
  Tensor bad = ints({0, 1, 2, 3, 4, 5, 6, 8}, {T * k});  // row 8 of 8
  EXPECT_THROW(ops::moe_rows_from_picks(ctx, picks, bad, rows), Error);
  EXPECT_THROW(ops::moe_picks_from_rows(ctx, rows, bad, back), Error);
  Tensor short_rows = poisoned({T * k - 1});
  EXPECT_THROW(ops::moe_rows_from_picks(ctx, picks, r.row_of, short_rows), Error);
}

TEST(GroupedMatmul, EqualsLoopOfMatmulsAndDoubleLoop) {
  Context ctx;
  const int64_t N = 13, K = 7, M = 9, E = 5;
  for (const std::vector<int32_t>& off : {std::vector<int32_t>{0, 4, 4, 11, 11, 13},  // empty experts 1, 3
                                          std::vector<int32_t>{0, 0, 0, 13, 13, 13}}) {  // all on expert 2
    auto x = randn(N * K, 150), w = randn(E * M * K, 151);
    Tensor xt = tensor(x, {N, K}), wt = tensor(w, {E, M, K}), offt = ints(off, {E + 1}), y = poisoned({N, M});
    ops::grouped_matmul(ctx, xt, wt, offt, y);
    expect_close(y, grouped_ref(to_d(x), to_d(w), off, N, K, M), 1e-5, 1e-5, "grouped vs double");
    for (int64_t e = 0; e < E; ++e) {
      if (off[e + 1] == off[e]) continue;
      Tensor ye = poisoned({off[e + 1] - off[e], M});
      ops::matmul(ctx, xt.slice(0, off[e], off[e + 1]), ops::Trans::kNo, wt.select(0, e), ops::Trans::kYes, ye);
      expect_close(y.slice(0, off[e], off[e + 1]).contiguous(), to_d(ye), 0, 0, "grouped vs matmul loop");
    }
  }
}

TEST(GroupedMatmul, BackwardFiniteDifferencesAndAccumulation) {
  Context ctx;
  const int64_t N = 8, K = 5, M = 6, E = 4;
  std::vector<int32_t> off = {0, 3, 3, 7, 7};  // expert 1 and 3 empty; row 7 is unused capacity
  auto x = randn(N * K, 160), w = randn(E * M * K, 161), rw = randn(N * M, 162), dw0 = randn(E * M * K, 163);
  Tensor xt = tensor(x, {N, K}), wt = tensor(w, {E, M, K}), offt = ints(off, {E + 1});
  Tensor y = poisoned({N, M});
  ops::grouped_matmul(ctx, xt, wt, offt, y);
  for (int64_t m = 0; m < M; ++m) EXPECT_EQ(y.get(7 * M + m), 0.0) << "rows past offsets[E] are zero";
  Tensor dx = poisoned({N, K}), dw = tensor(dw0, {E, M, K});
  ops::grouped_matmul_backward(ctx, xt, wt, offt, tensor(rw, {N, M}), dx, dw);
  auto gx = fd_grad([&](const std::vector<double>& v) { return dot(grouped_ref(v, to_d(w), off, N, K, M), to_d(rw)); },
                    to_d(x));
  auto gw = fd_grad([&](const std::vector<double>& v) { return dot(grouped_ref(to_d(x), v, off, N, K, M), to_d(rw)); },
                    to_d(w));
  for (int64_t i = 0; i < E * M * K; ++i) gw[i] += dw0[i];
  expect_close(dx, gx, 1e-5, 1e-5, "grouped dx");
  expect_close(dw, gw, 1e-5, 1e-5, "grouped dw (+=)");
  // Without dx: dw accumulates again, nothing else is touched.
  Tensor none;
  ops::grouped_matmul_backward(ctx, xt, wt, offt, tensor(rw, {N, M}), none, dw);
  for (int64_t i = 0; i < E * M * K; ++i) gw[i] += gw[i] - dw0[i];
  expect_close(dw, gw, 1e-5, 1e-5, "grouped dw twice");
  // Overwrite mode: a poisoned dw is fully written, the empty experts 1 and 3 with zeros.
  Tensor dwo = poisoned({E, M, K});
  ops::grouped_matmul_backward(ctx, xt, wt, offt, tensor(rw, {N, M}), none, dwo, /*accumulate_dw=*/false);
  for (int64_t i = 0; i < E * M * K; ++i) gw[i] = (gw[i] - dw0[i]) / 2;  // one pass, no initial value
  expect_close(dwo, gw, 1e-5, 1e-5, "grouped dw overwrite");
  for (int64_t i = M * K; i < 2 * M * K; ++i) EXPECT_EQ(dwo.get(i), 0.0) << "expert 1 has no rows";
  // The sum of squares of the final dw, added to dw_sum_squares, in both modes; against the
  // independent double sum of the expected gradient.
  for (bool acc : {false, true}) {
    Tensor d = acc ? tensor(dw0, {E, M, K}) : poisoned({E, M, K});
    Tensor ss = Tensor::zeros({1}, DType::kF64, Device::cpu());
    ss.data<double>()[0] = 2.0;
    ops::grouped_matmul_backward(ctx, xt, wt, offt, tensor(rw, {N, M}), none, d, acc, &ss);
    double want = 2.0;
    for (int64_t i = 0; i < E * M * K; ++i) {
      const double v = gw[i] + (acc ? dw0[i] : 0.0);
      want += v * v;
    }
    EXPECT_NEAR(ss.data<double>()[0], want, 1e-4 * want) << (acc ? "+=" : "overwrite");  // gw: finite differences
    EXPECT_DOUBLE_EQ(ss.data<double>()[0] - 2.0, ops::sum_squares(ctx, d));
  }
  Tensor ss_f32 = Tensor::zeros({1}, DType::kF32, Device::cpu());
  EXPECT_THROW(ops::grouped_matmul_backward(ctx, xt, wt, offt, tensor(rw, {N, M}), none, dwo, true, &ss_f32), Error);

  Tensor bad_off = ints({0, 3, 2, 7, 7}, {E + 1});
  EXPECT_THROW(ops::grouped_matmul(ctx, xt, wt, bad_off, y), Error);
  Tensor over = ints({0, 3, 3, 7, 9}, {E + 1});
  EXPECT_THROW(ops::grouped_matmul(ctx, xt, wt, over, y), Error);
}
