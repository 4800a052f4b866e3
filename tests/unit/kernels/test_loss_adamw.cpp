// Cross-entropy and AdamW on the CPU. Cross-entropy: per-row losses and lse against a double
// loop, ignore_index -100, weights, backward against finite differences, the convenience
// reduction (mean vs sum, masks, nothing valid). AdamW: several steps against a double loop with
// bias correction, weight decay and grad scaling, bf16 compute copy, argument checks.
#include <cmath>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
// sum_t w[t] * (logsumexp(x[t]) - x[t, label]) over rows with label != -100.
std::vector<double> ce_ref(const std::vector<double>& x, const std::vector<int32_t>& labels,
                           const std::vector<double>& w, int64_t V, std::vector<double>* lse = nullptr) {
  const int64_t T = static_cast<int64_t>(labels.size());
  std::vector<double> loss(T, 0.0);
  if (lse) lse->assign(T, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[t * V + v]);
    if (lse) (*lse)[t] = std::log(s);
    if (labels[t] != -100) loss[t] = w[t] * (std::log(s) - x[t * V + labels[t]]);
  }
  return loss;
}
double sum(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}
}  // namespace

TEST(CrossEntropy, ForwardBackwardWithIgnoreAndWeights) {
  Context ctx;
  ctx.set_num_threads(3);
  const int64_t T = 6, V = 1003;  // vocab not a multiple of anything
  auto x = randn(T * V, 170, 4.0f);
  std::vector<int32_t> labels = {5, -100, 1002, 0, 77, -100};
  auto w = randu(T, 171, 0.1f, 2.0f);
  Tensor xt = tensor(x, {T, V}), lt = ints(labels, {T}), wt = tensor(w, {T});
  Tensor losses = poisoned({T}), lse = poisoned({T});
  ops::cross_entropy_forward(ctx, xt, lt, wt, losses, lse);
  std::vector<double> lse_ref;
  expect_close(losses, ce_ref(to_d(x), labels, to_d(w), V, &lse_ref), 1e-6, 1e-6, "ce losses");
  expect_close(lse, lse_ref, 1e-6, 1e-6, "ce lse (written for ignored rows too)");
  Tensor l2 = poisoned({T});
  ops::cross_entropy_forward(ctx, xt, lt, Tensor(), l2, lse);  // undefined weights = ones
  expect_close(l2, ce_ref(to_d(x), labels, std::vector<double>(T, 1.0), V), 1e-6, 1e-6, "ce unweighted");

  // Backward on a smaller vocabulary (FD cost), with a loss scale.
  const int64_t Vs = 11;
  auto xs = randn(T * Vs, 172, 2.0f);
  std::vector<int32_t> ls = {5, -100, 10, 0, 7, -100};
  Tensor xst = tensor(xs, {T, Vs}), lst = ints(ls, {T}), lses = poisoned({T}), loss_s = poisoned({T});
  ops::cross_entropy_forward(ctx, xst, lst, wt, loss_s, lses);
  Tensor dl = poisoned({T, Vs});
  ops::cross_entropy_backward(ctx, xst, lst, wt, lses, 0.5f, dl);
  auto g = fd_grad([&](const std::vector<double>& v) { return 0.5 * sum(ce_ref(v, ls, to_d(w), Vs)); }, to_d(xs));
  expect_close(dl, g, 1e-5, 1e-7, "ce backward");

  Tensor bad = ints({5, -1, 0, 0, 0, 0}, {T});
  EXPECT_THROW(ops::cross_entropy_forward(ctx, xt, bad, wt, losses, lse), Error);
  Tensor too_big = ints({5, V, 0, 0, 0, 0}, {T});
  EXPECT_THROW(ops::cross_entropy_forward(ctx, xt, too_big, wt, losses, lse), Error);
}

TEST(CrossEntropy, MeanSumMaskAndNothingValid) {
  Context ctx;
  const int64_t T = 7, V = 9;
  auto x = randn(T * V, 180, 2.0f);
  std::vector<int32_t> labels = {1, 2, -100, 3, 8, 0, 4};
  std::vector<uint8_t> mask = {1, 0, 1, 1, 1, 0, 1};  // valid: t = 0, 3, 4, 6
  Tensor xt = tensor(x, {T, V}), lt = ints(labels, {T});
  Tensor mt = Tensor::empty({T}, DType::kU8);
  for (int64_t t = 0; t < T; ++t) mt.data<uint8_t>()[t] = mask[t];
  std::vector<double> keep(T);
  for (int64_t t = 0; t < T; ++t) keep[t] = mask[t] && labels[t] != -100 ? 1.0 : 0.0;
  const double total = sum(ce_ref(to_d(x), labels, keep, V));

  Tensor dsum = poisoned({T, V}), dmean = poisoned({T, V});
  const double s = ops::cross_entropy(ctx, xt, lt, mt, ops::Reduction::kSum, &dsum);
  const double m = ops::cross_entropy(ctx, xt, lt, mt, ops::Reduction::kMean, &dmean);
  EXPECT_NEAR(s, total, 1e-5);
  EXPECT_NEAR(m, total / 4.0, 1e-6);
  auto gs = fd_grad([&](const std::vector<double>& v) { return sum(ce_ref(v, labels, keep, V)); }, to_d(x));
  expect_close(dsum, gs, 1e-5, 1e-7, "ce sum gradient");
  for (auto& v : gs) v /= 4.0;
  expect_close(dmean, gs, 1e-5, 1e-7, "ce mean gradient");
  // Without a mask only -100 is excluded.
  std::vector<double> no_mask(T, 1.0);
  EXPECT_NEAR(ops::cross_entropy(ctx, xt, lt, Tensor(), ops::Reduction::kMean, nullptr),
              sum(ce_ref(to_d(x), labels, no_mask, V)) / 6.0, 1e-6);
  // Nothing valid: zero loss and zero gradient.
  Tensor all_ignored = ints(std::vector<int32_t>(T, -100), {T}), d0 = poisoned({T, V});
  EXPECT_EQ(ops::cross_entropy(ctx, xt, all_ignored, Tensor(), ops::Reduction::kMean, &d0), 0.0);
  expect_close(d0, std::vector<double>(T * V, 0.0), 0, 0, "no valid rows: zero gradient");
  Tensor mask_f32 = zeros({T});
  EXPECT_THROW(ops::cross_entropy(ctx, xt, lt, mask_f32, ops::Reduction::kMean, nullptr), Error);
}

TEST(AdamW, SeveralStepsMatchDoubleLoop) {
  Context ctx;
  ctx.set_num_threads(2);
  const int64_t n = 40003;
  auto w0 = randn(n, 190), g_seed = randn(n, 191);
  Tensor master = tensor(w0, {n}), m = zeros({n}), v = zeros({n}), compute = Tensor::empty({n}, DType::kBF16);
  std::vector<double> W = to_d(w0), M(n, 0.0), Vv(n, 0.0);
  ops::AdamWParams p;
  p.lr = 1e-2f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = randn(n, 200 + static_cast<uint32_t>(step), 0.5f + step);
    p.step = step;
    p.grad_scale = step == 3 ? 0.25f : 1.0f;
    ops::adamw_step(ctx, master, tensor(g, {n}), m, v, p, compute);
    const double b1 = p.beta1, b2 = p.beta2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * p.grad_scale;
      M[i] = b1 * M[i] + (1 - b1) * gi;
      Vv[i] = b2 * Vv[i] + (1 - b2) * gi * gi;
      const double mh = M[i] / (1 - std::pow(b1, step)), vh = Vv[i] / (1 - std::pow(b2, step));
      W[i] -= p.lr * (mh / (std::sqrt(vh) + p.eps) + p.weight_decay * W[i]);
    }
  }
  expect_close(m, M, 1e-5, 1e-6, "adamw m");
  expect_close(v, Vv, 1e-5, 1e-7, "adamw v");
  expect_close(master, W, 1e-5, 1e-5, "adamw master");
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(compute.data<uint16_t>()[i], float_to_bf16(master.data<float>()[i]));

  // f32 compute and no compute copy both work; wrong shapes and step 0 are rejected.
  Tensor c32 = poisoned({n}), none;
  ops::adamw_step(ctx, master, tensor(g_seed, {n}), m, v, p, c32);
  expect_close(c32, to_d(master), 0, 0, "f32 compute copy");
  ops::adamw_step(ctx, master, tensor(g_seed, {n}), m, v, p, none);
  Tensor short_m = zeros({n - 1});
  EXPECT_THROW(ops::adamw_step(ctx, master, tensor(g_seed, {n}), short_m, v, p, none), Error);
  p.step = 0;
  EXPECT_THROW(ops::adamw_step(ctx, master, tensor(g_seed, {n}), m, v, p, none), Error);
}

// adamw_step_many on the CPU: the same values as one adamw_step per target (a list of three, one
// with a bf16 compute copy), and mismatched lists or a bad target rejected before anything runs.
TEST(AdamW, ManyEqualsOneAtATime) {
  Context ctx;
  const int64_t sizes[] = {1001, 7, 64};
  std::vector<ops::AdamWTarget> many, one;
  std::vector<Tensor> grads;
  for (int i = 0; i < 3; ++i) {
    const int64_t n = sizes[i];
    const auto w0 = randn(n, 300 + i), g = randn(n, 310 + i);
    ops::AdamWTarget a, b;
    a.master = tensor(w0, {n});
    b.master = tensor(w0, {n});
    a.m = zeros({n});
    b.m = zeros({n});
    a.v = zeros({n});
    b.v = zeros({n});
    if (i == 1) {
      a.compute = Tensor::empty({n}, DType::kBF16);
      b.compute = Tensor::empty({n}, DType::kBF16);
    }
    a.params.lr = b.params.lr = 1e-2f * static_cast<float>(i + 1);
    a.params.weight_decay = b.params.weight_decay = i == 2 ? 0.0f : 0.1f;
    a.params.step = b.params.step = 2 + i;
    many.push_back(a);
    one.push_back(b);
    grads.push_back(tensor(g, {n}));
  }
  ops::adamw_step_many(ctx, many, grads);
  for (int i = 0; i < 3; ++i) {
    ops::adamw_step(ctx, one[i].master, grads[i], one[i].m, one[i].v, one[i].params, one[i].compute);
    expect_close(many[i].master, to_d(one[i].master.to_floats()), 0, 0, "adamw_step_many master");
    expect_close(many[i].m, to_d(one[i].m.to_floats()), 0, 0, "adamw_step_many m");
    expect_close(many[i].v, to_d(one[i].v.to_floats()), 0, 0, "adamw_step_many v");
  }
  EXPECT_EQ(many[1].compute.to_floats(), one[1].compute.to_floats());

  std::vector<Tensor> two(grads.begin(), grads.begin() + 2);
  EXPECT_THROW(ops::adamw_step_many(ctx, many, two), Error);
  const Tensor before = many[0].master.clone();
  many[2].m = zeros({sizes[2] - 1});  // the last target is bad: nothing may have been updated
  EXPECT_THROW(ops::adamw_step_many(ctx, many, grads), Error);
  expect_close(many[0].master, to_d(before.to_floats()), 0, 0, "no update before the error");

  // The same master twice (the updates may run at once) is refused.
  many[2].m = zeros({sizes[2]});
  many[1].master = many[0].master.slice(0, 0, sizes[1]);
  EXPECT_THROW(ops::adamw_step_many(ctx, many, grads), Error);
}
