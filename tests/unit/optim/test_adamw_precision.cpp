// AdamW precision settings (optimizer.main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype, bf16
// gradients): which master copy exists and in which dtype, that bf16 main params update the bf16
// weights in place with the (parameter, step) Philox stream, that f32 compute weights follow a
// bf16 master exactly, the one-read gradient norm over f32 and bf16 gradients, and dtype parsing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/context.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "optim/adamw.h"

using namespace moetrain;

namespace {

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

AdamWConfig all_bf16(bool sr) {
  AdamWConfig c;
  c.main_params_dtype = c.exp_avg_dtype = c.exp_avg_sq_dtype = DType::kBF16;
  c.stochastic_rounding = sr;
  c.weight_decay = 0.1;
  return c;
}

}  // namespace

TEST(AdamWPrecision, Bf16MainParamsUpdateBf16WeightsInPlace) {
  Context ctx(Device::cpu(), 21);
  const Shape s = {17, 9};
  const auto w0 = randv(153, 1, 0.05f), g = randv(153, 2);
  Tensor w = Tensor::from_floats(w0, s, DType::kBF16);
  Tensor grad = Tensor::from_floats(g, s, DType::kBF16);
  AdamW opt({{"model.layers.0.self_attn.q_proj.weight", w, grad}}, all_bf16(true));
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 2u);  // no master: the bf16 weights are the main copy
  EXPECT_EQ(st[0].first, "exp_avg.model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(st[0].second.dtype(), DType::kBF16);
  EXPECT_EQ(st[1].second.dtype(), DType::kBF16);
  EXPECT_EQ(st[0].second.category(), MemCategory::kOptimizer);

  // The same update through the op with the documented stream: rng(purpose + index, step).
  Tensor w_ref = Tensor::from_floats(w0, s, DType::kBF16), m_ref = Tensor::zeros(s, DType::kBF16),
         v_ref = Tensor::zeros(s, DType::kBF16), none;
  for (int64_t step = 1; step <= 3; ++step) {
    opt.step(ctx, 1e-3, 0.5);
    ops::AdamWParams p;
    p.lr = 1e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-8f, p.weight_decay = 0.1f, p.step = step, p.grad_scale = 0.5f;
    p.stochastic_rounding = true;
    p.rng = ctx.rng(kRngPurposeAdamWRounding + 0, static_cast<uint64_t>(step));
    ops::adamw_step(ctx, w_ref, grad, m_ref, v_ref, p, none);
  }
  EXPECT_EQ(std::memcmp(w.data_ptr(), w_ref.data_ptr(), w.nbytes()), 0);
  EXPECT_EQ(std::memcmp(st[0].second.data_ptr(), m_ref.data_ptr(), m_ref.nbytes()), 0);
  // The weights moved by about lr per step against the gradient (Adam's normalized step).
  int moved = 0;
  for (int64_t i = 0; i < 153; ++i) moved += w.get(i) != static_cast<double>(bf16_to_float(float_to_bf16(w0[i])));
  EXPECT_GT(moved, 140);
}

TEST(AdamWPrecision, F32WeightsFollowABf16Master) {
  // The CPU path computes with f32 weights: bf16 main params are a bf16 master copy, and the f32
  // weights hold exactly its widened values after each step.
  Context ctx;
  const Shape s = {5, 11};
  const auto w0 = randv(55, 3, 0.05f);
  Tensor w = Tensor::from_floats(w0, s);
  std::vector<OptimParam> ps = {{"w", w, Tensor::from_floats(randv(55, 4), s)}};
  AdamW opt(ps, all_bf16(false));
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].first, "master.w");
  EXPECT_EQ(st[0].second.dtype(), DType::kBF16);
  EXPECT_EQ(st[0].second.category(), MemCategory::kMaster);
  opt.step(ctx, 1e-2, 1.0);
  opt.step(ctx, 1e-2, 1.0);
  for (int64_t i = 0; i < 55; ++i) {
    EXPECT_EQ(w.get(i), st[0].second.get(i)) << i;
    EXPECT_NE(w.get(i), static_cast<double>(w0[i])) << i;
  }
}

TEST(AdamWPrecision, GradNormOverF32AndBf16GradientsReadsOnce) {
  Context ctx;
  const auto a = randv(300, 5), b = randv(41, 6, 3.0f);
  Tensor ga = Tensor::from_floats(a, {300}), gb = Tensor::from_floats(b, {41}, DType::kBF16);
  AdamW opt({{"model.norm.weight", Tensor::zeros({300}, DType::kF32), ga},
             {"lm_head.weight", Tensor::zeros({41}, DType::kF32), gb}},
            AdamWConfig{});
  double ss = 0;
  for (float x : a) ss += double(x) * x;
  for (int64_t i = 0; i < 41; ++i) ss += gb.get(i) * gb.get(i);
  EXPECT_NEAR(opt.grad_norm(ctx), std::sqrt(ss), 1e-12 * std::sqrt(ss));
  EXPECT_NEAR(opt.grad_norm(ctx, -2.0), 2 * std::sqrt(ss), 1e-12 * std::sqrt(ss));
  opt.zero_grad();
  EXPECT_EQ(opt.grad_norm(ctx), 0.0);
}

TEST(AdamWPrecision, ParsesPrecisionNames) {
  EXPECT_EQ(parse_precision_dtype("fp32", "k"), DType::kF32);
  EXPECT_EQ(parse_precision_dtype("bf16", "k"), DType::kBF16);
  EXPECT_STREQ(precision_dtype_name(DType::kBF16), "bf16");
  try {
    parse_precision_dtype("fp16", "optimizer.exp_avg_dtype");
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("optimizer.exp_avg_dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("fp32 or bf16"), std::string::npos) << m;
  }
}
