// AdamW bookkeeping against a plain double-precision AdamW loop: weight-decay roles (none on 1-D
// tensors and on no_weight_decay patterns), freezing, gradient scaling, bf16 weights with an f32
// master, global gradient norm, and the names of the checkpointed state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/context.h"
#include "core/dtype.h"
#include "optim/adamw.h"

using namespace moetrain;

namespace {

std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct RefState {
  std::vector<double> w, m, v;
};

void ref_step(RefState& s, const std::vector<float>& g, double lr, double b1, double b2, double eps, double wd,
              int64_t step, double scale) {
  for (size_t i = 0; i < s.w.size(); ++i) {
    const double gi = g[i] * scale;
    s.m[i] = b1 * s.m[i] + (1 - b1) * gi;
    s.v[i] = b2 * s.v[i] + (1 - b2) * gi * gi;
    const double mh = s.m[i] / (1 - std::pow(b1, step)), vh = s.v[i] / (1 - std::pow(b2, step));
    s.w[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * s.w[i]);
  }
}

}  // namespace

TEST(AdamW, MatchesReferenceWithRolesAndFreezing) {
  Context ctx;
  const std::vector<std::string> names = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.input_layernorm.weight",
                                          "model.embed_tokens.weight", "model.layers.0.mlp.gate.weight"};
  const std::vector<Shape> shapes = {{5, 7}, {7}, {11, 3}, {4, 7}};
  std::vector<OptimParam> params;
  std::vector<RefState> ref;
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t n = shape_numel(shapes[i]);
    auto w0 = randv(n, 10 + i);
    params.push_back({names[i], Tensor::from_floats(w0, shapes[i]), Tensor::zeros(shapes[i], DType::kF32)});
    ref.push_back({std::vector<double>(w0.begin(), w0.end()), std::vector<double>(n, 0), std::vector<double>(n, 0)});
  }
  AdamWConfig cfg;
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.9;
  cfg.eps = 1e-6;
  cfg.weight_decay = 0.1;
  cfg.no_decay_patterns = {"*.embed_tokens.*"};
  cfg.freeze_patterns = {"*.mlp.gate.weight"};
  AdamW opt(params, cfg);
  EXPECT_EQ(opt.role(0), ParamRole::kDecay);
  EXPECT_EQ(opt.role(1), ParamRole::kNoDecay);  // 1-D
  EXPECT_EQ(opt.role(2), ParamRole::kNoDecay);  // pattern
  EXPECT_EQ(opt.role(3), ParamRole::kFrozen);
  EXPECT_EQ(opt.num_frozen_elements(), 28);
  EXPECT_EQ(opt.num_trainable_elements(), 35 + 7 + 33);
  const std::vector<double> wds = {0.1, 0.0, 0.0};

  for (int64_t step = 1; step <= 4; ++step) {
    double ss = 0;
    std::vector<std::vector<float>> grads;
    for (size_t i = 0; i < names.size(); ++i) {
      grads.push_back(randv(params[i].weight.numel(), 100 * step + i));
      params[i].grad.copy_from(Tensor::from_floats(grads[i], shapes[i]));
      if (i < 3)
        for (float g : grads[i]) ss += double(g) * g;
    }
    EXPECT_NEAR(opt.grad_norm(ctx), std::sqrt(ss), 1e-9 * std::sqrt(ss));  // frozen grads excluded
    EXPECT_NEAR(opt.grad_norm(ctx, 0.5), 0.5 * std::sqrt(ss), 1e-9 * std::sqrt(ss));
    const double lr = 0.01 * step, scale = 0.5;
    opt.step(ctx, lr, scale);
    for (size_t i = 0; i < 3; ++i) ref_step(ref[i], grads[i], lr, 0.8, 0.9, 1e-6, wds[i], step, scale);
  }
  EXPECT_EQ(opt.step_count(), 4);
  for (size_t i = 0; i < 3; ++i) {
    auto w = params[i].weight.to_floats();
    for (size_t j = 0; j < w.size(); ++j) ASSERT_NEAR(w[j], ref[i].w[j], 2e-5) << names[i] << " [" << j << "]";
  }
  // The frozen parameter is untouched.
  auto w3 = params[3].weight.to_floats();
  auto w3_0 = randv(28, 13);
  for (size_t j = 0; j < w3.size(); ++j) EXPECT_EQ(w3[j], w3_0[j]);

  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 6u);  // f32 weights are their own master: m and v only, frozen has none
  EXPECT_EQ(st[0].first, "exp_avg." + names[0]);
  EXPECT_EQ(st[1].first, "exp_avg_sq." + names[0]);
  auto m0 = st[0].second.to_floats();
  for (size_t j = 0; j < m0.size(); ++j) EXPECT_NEAR(m0[j], ref[0].m[j], 1e-5);
}

TEST(AdamW, Bf16WeightsKeepAnF32Master) {
  Context ctx;
  const Shape s = {3, 4};
  auto w0 = randv(12, 7);
  Tensor w = Tensor::from_floats(w0, s, DType::kBF16);
  std::vector<OptimParam> params = {{"w", w, Tensor::zeros(s, DType::kF32)}};
  AdamWConfig cfg;
  AdamW opt(params, cfg);
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].first, "master.w");
  EXPECT_EQ(st[0].second.dtype(), DType::kF32);
  EXPECT_EQ(st[0].second.category(), MemCategory::kMaster);
  // Many tiny updates: the master moves, bf16 weights follow the master rounded.
  auto g = randv(12, 8);
  params[0].grad.copy_from(Tensor::from_floats(g, s));
  for (int i = 0; i < 3; ++i) opt.step(ctx, 1e-3, 1.0);
  auto master = st[0].second.to_floats();
  auto wb = w.to_floats();
  for (size_t j = 0; j < 12; ++j) {
    EXPECT_EQ(wb[j], bf16_to_float(float_to_bf16(master[j])));
    EXPECT_NEAR(master[j], bf16_to_float(float_to_bf16(w0[j])) - 3e-3 * (g[j] > 0 ? 1 : -1), 2e-5);  // from the bf16 start, by ~lr * sign(g) per step
  }
  opt.zero_grad();
  EXPECT_EQ(opt.grad_norm(ctx), 0.0);
}

TEST(AdamW, RejectsMissingOrMistypedGradient) {
  std::vector<OptimParam> params = {{"w", Tensor::zeros({2, 2}, DType::kF32), Tensor::zeros({2, 3}, DType::kF32)}};
  EXPECT_THROW(AdamW(params, AdamWConfig{}), Error);
  params[0].grad = Tensor();
  EXPECT_THROW(AdamW(params, AdamWConfig{}), Error);
  AdamWConfig frozen;
  frozen.freeze_patterns = {"w"};
  EXPECT_NO_THROW(AdamW(params, frozen));  // frozen parameters need no gradient
}
