// MoE router on the CPU: softmax/top-k/renormalize against a double reference, ties to the lower
// expert index, top-k = E, the backward (with and without renormalization, with an extra probs
// gradient) against finite differences, load-balancing statistics and the HF aux loss by hand and
// by its [k,E] definition, and the z-loss forward/backward.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
struct RouterRef {
  std::vector<double> probs, w;
  std::vector<int> idx;
};

RouterRef router_ref(const std::vector<double>& logits, int64_t T, int64_t E, int k, bool normalize) {
  RouterRef r;
  r.probs.resize(T * E);
  for (int64_t t = 0; t < T; ++t) {
    double z = 0.0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(logits[t * E + e]);
    for (int64_t e = 0; e < E; ++e) r.probs[t * E + e] = std::exp(logits[t * E + e]) / z;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return r.probs[t * E + a] > r.probs[t * E + b]; });
    double s = 0.0;
    for (int j = 0; j < k; ++j) s += r.probs[t * E + order[j]];
    for (int j = 0; j < k; ++j) {
      r.idx.push_back(order[j]);
      r.w.push_back(r.probs[t * E + order[j]] / (normalize ? s : 1.0));
    }
  }
  return r;
}
}  // namespace

TEST(Router, TopkMatchesReferenceIncludingKEqualsE) {
  Context ctx;
  const int64_t T = 17, E = 6;
  auto logits = randn(T * E, 100, 2.0f);
  for (int k : {1, 2, 6})
    for (bool norm : {false, true}) {
      Tensor probs = poisoned({T, E}), idx = Tensor::empty({T, k}, DType::kI32), w = poisoned({T, k});
      ops::router_topk(ctx, tensor(logits, {T, E}), k, norm, probs, idx, w);
      auto ref = router_ref(to_d(logits), T, E, k, norm);
      expect_close(probs, ref.probs, 1e-6, 1e-7, "router probs");
      for (int64_t i = 0; i < T * k; ++i) ASSERT_EQ(idx.data<int32_t>()[i], ref.idx[i]) << "k=" << k << " i=" << i;
      expect_close(w, ref.w, 1e-6, 1e-7, "router weights");
      if (k == E && norm)
        for (int64_t i = 0; i < T * k; ++i) EXPECT_NEAR(w.get(i), probs.get((i / k) * E + idx.data<int32_t>()[i]), 1e-6);
    }
}

TEST(Router, TiesPickTheLowerExpertIndex) {
  Context ctx;
  Tensor logits = tensor({1, 3, 3, 0, 3,  /**/ 2, 2, 2, 2, 2,  /**/ 5, 0, 0, 0, 5}, {3, 5});
  Tensor probs = poisoned({3, 5}), idx = Tensor::empty({3, 3}, DType::kI32), w = poisoned({3, 3});
  ops::router_topk(ctx, logits, 3, true, probs, idx, w);
  std::vector<int32_t> want = {1, 2, 4, /**/ 0, 1, 2, /**/ 0, 4, 1};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(idx.data<int32_t>()[i], want[i]) << i;
  for (int i = 3; i < 6; ++i) EXPECT_NEAR(w.get(i), 1.0 / 3.0, 1e-7);
  Tensor bad_idx = Tensor::empty({3, 6}, DType::kI32), bad_w = poisoned({3, 6});
  EXPECT_THROW(ops::router_topk(ctx, logits, 6, true, probs, bad_idx, bad_w), Error);  // k > E
  Tensor nan_logits = tensor({NAN, 1, 2, 3, 4}, {1, 5});
  Tensor p1 = poisoned({1, 5}), i1 = Tensor::empty({1, 2}, DType::kI32), w1 = poisoned({1, 2});
  EXPECT_THROW(ops::router_topk(ctx, nan_logits, 2, true, p1, i1, w1), Error);
}

TEST(Router, BackwardMatchesFiniteDifferences) {
  Context ctx;
  const int64_t T = 5, E = 7;
  const int k = 3;
  auto logits = randn(T * E, 110, 1.5f);
  auto dw = randn(T * k, 111), dpx = randn(T * E, 112);
  for (bool norm : {false, true})
    for (bool extra : {false, true}) {
      Tensor probs = poisoned({T, E}), idx = Tensor::empty({T, k}, DType::kI32), w = poisoned({T, k});
      ops::router_topk(ctx, tensor(logits, {T, E}), k, norm, probs, idx, w);
      Tensor dl = poisoned({T, E});
      ops::router_topk_backward(ctx, probs, idx, w, tensor(dw, {T, k}), extra ? tensor(dpx, {T, E}) : Tensor(),
                                norm, dl);
      auto f = [&](const std::vector<double>& x) {
        auto r = router_ref(x, T, E, k, norm);
        return dot(r.w, to_d(dw)) + (extra ? dot(r.probs, to_d(dpx)) : 0.0);
      };
      expect_close(dl, fd_grad(f, to_d(logits)), 1e-4, 1e-6,
                   std::string("router backward norm=") + (norm ? "1" : "0") + " extra=" + (extra ? "1" : "0"));
    }
}

TEST(Router, StatsAndHFAuxLoss) {
  Context ctx;
  // Hand values: E = 4, N = 2 rows: aux = 4 * (1 * 0.45 + 0.5 * 0.25 + 0.5 * 0.2 + 0) = 2.7.
  EXPECT_NEAR(ops::aux_loss_value(tensor({2, 1, 1, 0}, {4}), tensor({0.9f, 0.5f, 0.4f, 0.2f}, {4}), 2), 2.7, 1e-6);
  // Balanced routing gives k (HF's value does not divide by k): 4 tokens, k = 2, each expert twice,
  // each prob 1/4.
  EXPECT_NEAR(ops::aux_loss_value(tensor({2, 2, 2, 2}, {4}), tensor({1, 1, 1, 1}, {4}), 4), 2.0, 1e-6);

  const int64_t T = 23, E = 5;
  const int k = 2;
  auto logits = randn(T * E, 120);
  Tensor probs = poisoned({T, E}), idx = Tensor::empty({T, k}, DType::kI32), w = poisoned({T, k});
  ops::router_topk(ctx, tensor(logits, {T, E}), k, true, probs, idx, w);
  Tensor counts = tensor({1, 0, 0, 0, 2}, {E}), psum = tensor({0.5f, 0, 0, 0, 0}, {E});  // accumulate
  ops::router_stats(ctx, probs, idx, counts, psum);
  // HF definition: f[k,E] = mean over rows of one-hot(slot choice); P[E] = mean of probs.
  std::vector<double> f(k * E, 0.0), P(E, 0.0);
  std::vector<double> cnt = {1, 0, 0, 0, 2}, ps = {0.5, 0, 0, 0, 0};
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      f[j * E + idx.data<int32_t>()[t * k + j]] += 1.0 / T;
      cnt[idx.data<int32_t>()[t * k + j]] += 1;
    }
    for (int64_t e = 0; e < E; ++e) {
      P[e] += probs.get(t * E + e) / T;
      ps[e] += probs.get(t * E + e);
    }
  }
  expect_close(counts, cnt, 0, 0, "router_stats counts");
  expect_close(psum, ps, 1e-6, 1e-6, "router_stats prob_sum");
  double hf = 0.0;
  for (int j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e) hf += f[j * E + e] * P[e];
  hf *= E;
  Tensor c2 = zeros({E}), p2 = zeros({E});
  Tensor health = tensor({7.0f, 7.0f}, {2});  // overwritten
  ops::router_stats(ctx, probs, idx, c2, p2, tensor(logits, {T, E}), &health);
  EXPECT_NEAR(ops::aux_loss_value(c2, p2, T), hf, 1e-6);
  // The health sums: sum_t logsumexp(logits[t]) and sum_{t,e} p * logit, so that their difference
  // over T is the mean entropy -sum_e p log p of the router's softmax.
  double lse_sum = 0.0, pl_sum = 0.0, entropy = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double z = 0.0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(static_cast<double>(logits[t * E + e]));
    lse_sum += std::log(z);
    for (int64_t e = 0; e < E; ++e) {
      const double pe = std::exp(static_cast<double>(logits[t * E + e])) / z;
      pl_sum += probs.get(t * E + e) * static_cast<double>(logits[t * E + e]);
      entropy -= pe * std::log(pe);
    }
  }
  EXPECT_NEAR(health.get(0), lse_sum, 1e-4 * std::abs(lse_sum) + 1e-5);
  EXPECT_NEAR(health.get(1), pl_sum, 1e-4 * std::abs(pl_sum) + 1e-5);
  EXPECT_NEAR((health.get(0) - health.get(1)) / T, entropy / T, 1e-5);
  EXPECT_THROW(ops::router_stats(ctx, probs, idx, c2, p2, tensor(logits, {T, E})), Error);  // no output

  // aux backward: d/dprobs of coef * E * sum_e counts_e/N * (sum_t p[t,e])/N, counts held fixed.
  const float coef = 0.01f;
  auto d0 = randn(T * E, 121);
  Tensor dprobs = tensor(d0, {T, E});
  ops::aux_loss_backward(ctx, c2, T, coef, dprobs);
  const auto cd = to_d(c2);
  auto g = fd_grad(
      [&](const std::vector<double>& p) {
        double s = 0.0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e) s += cd[e] / T * p[t * E + e] / T;
        return coef * E * s;
      },
      to_d(probs));
  for (int64_t i = 0; i < T * E; ++i) g[i] += d0[i];
  expect_close(dprobs, g, 1e-5, 1e-7, "aux_loss_backward (+=)");

  // The aux row inside router_topk_backward gives the bits of the two-step form.
  auto dwv = randn(T * k, 122);
  for (bool norm : {false, true}) {
    Tensor rows = zeros({T, E}), one = poisoned({T, E}), two = poisoned({T, E});
    ops::aux_loss_backward(ctx, c2, T, coef, rows);
    ops::router_topk_backward(ctx, probs, idx, w, tensor(dwv, {T, k}), rows, norm, two);
    ops::router_topk_backward(ctx, probs, idx, w, tensor(dwv, {T, k}), Tensor(), norm, one, c2, T, coef);
    for (int64_t i = 0; i < T * E; ++i) ASSERT_EQ(one.get(i), two.get(i)) << "aux row inside, norm=" << norm << " at " << i;
  }
}

TEST(Router, ZLoss) {
  Context ctx;
  const int64_t T = 9, E = 6;
  auto logits = randn(T * E, 130, 3.0f);
  auto zref = [&](const std::vector<double>& x) {
    double z = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(x[t * E + e]);
      z += std::log(s) * std::log(s);
    }
    return z;
  };
  Tensor lt = tensor(logits, {T, E}), lse = poisoned({T});
  const double z = ops::router_zloss_forward(ctx, lt, lse);
  EXPECT_NEAR(z, zref(to_d(logits)), 1e-9 * zref(to_d(logits)));
  auto d0 = randn(T * E, 131);
  Tensor dl = tensor(d0, {T, E});
  const float scale = 0.125f;
  ops::router_zloss_backward(ctx, lt, lse, scale, dl);
  auto g = fd_grad([&](const std::vector<double>& x) { return scale * zref(x); }, to_d(logits));
  for (int64_t i = 0; i < T * E; ++i) g[i] += d0[i];
  expect_close(dl, g, 1e-5, 1e-6, "zloss backward (+=)");
}
