// The gradient norm from sums of squares formed while the expert gradients are written
// (Qwen3Model::request_grad_sum_squares + AdamW::grad_norm's known sums) against the norm that
// reads every gradient: equal to rounding, for f32 and bf16 gradients, accumulation, frozen
// experts (the known sum is then ignored), and passes that invalidate it.
#include <gtest/gtest.h>

#include <cmath>

#include "model/qwen3_model.h"
#include "optim/adamw.h"

using namespace moetrain;

namespace {

struct TinyRun {
  ModelConfig cfg = ModelConfig::preset("tiny-moe");
  ModelParams params;
  ModelParams grads;
  std::unique_ptr<Qwen3Model> model;
  Batch batch;

  explicit TinyRun(DType grad_dtype) {
    params = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
    init_params_random(params, 11, 0.2f);
    grads = allocate_gradients(cfg, Device::cpu(), grad_dtype);
    model = std::make_unique<Qwen3Model>(params);
    std::vector<std::vector<int32_t>> docs = {{1, 5, 9, 2, 7, 3}, {4, 4, 8, 1}};
    batch = Batch::from_documents(docs);
  }
  AdamW optimizer(const std::vector<std::string>& freeze = {}) {
    std::vector<OptimParam> ps;
    params.for_each([&](const std::string& n, Tensor& t) { ps.push_back({n, t, Tensor()}); });
    size_t i = 0;
    grads.for_each([&](const std::string&, Tensor& t) { ps[i++].grad = t; });
    AdamWConfig ac;
    ac.freeze_patterns = freeze;
    return AdamW(std::move(ps), ac);
  }
};

double fused_norm(Context& ctx, const Qwen3Model& m, const AdamW& opt) {
  const Qwen3Model::GradSumSquares* k = m.grad_sum_squares();
  EXPECT_NE(k, nullptr);
  return k ? opt.grad_norm(ctx, 1.0, k->sum, k->grads) : -1.0;
}

}  // namespace

TEST(GradNorm, KnownExpertSumsMatchTheFullRead) {
  for (DType gdt : {DType::kF32, DType::kBF16}) {
    TinyRun s(gdt);
    Context ctx;
    AdamW opt = s.optimizer();
    ASSERT_GT(s.cfg.num_experts, 1);
    // Two micro-batches; only the last one's sums are valid, and they cover the accumulated value.
    EXPECT_EQ(s.model->grad_sum_squares(), nullptr);
    s.model->forward_backward(ctx, s.batch, s.grads);
    EXPECT_EQ(s.model->grad_sum_squares(), nullptr) << "not requested";
    s.model->request_grad_sum_squares();
    s.model->forward_backward(ctx, s.batch, s.grads);
    const Qwen3Model::GradSumSquares* k = s.model->grad_sum_squares();
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->grads.size(), 2u * static_cast<size_t>(s.cfg.num_hidden_layers));
    const double full = opt.grad_norm(ctx);
    const double fused = fused_norm(ctx, *s.model, opt);
    ASSERT_GT(full, 0.0);
    EXPECT_NEAR(fused, full, 1e-12 * full) << dtype_name(gdt);
    EXPECT_EQ(fused_norm(ctx, *s.model, opt), fused) << "the known sum is read, not consumed";
    // A later training pass without the request invalidates the sums.
    s.model->forward_backward(ctx, s.batch, s.grads);
    EXPECT_EQ(s.model->grad_sum_squares(), nullptr);
  }
}

TEST(GradNorm, OverwritePassAndFrozenExperts) {
  TinyRun s(DType::kF32);
  Context ctx;
  s.model->forward_backward(ctx, s.batch, s.grads);  // stale values the overwrite pass replaces
  zero_gradients(s.grads, /*matrices=*/false);
  s.model->set_overwrite_matrix_grads();
  s.model->request_grad_sum_squares();
  s.model->forward_backward(ctx, s.batch, s.grads);
  AdamW opt = s.optimizer();
  const double full = opt.grad_norm(ctx);
  EXPECT_NEAR(fused_norm(ctx, *s.model, opt), full, 1e-12 * full);
  // Frozen experts: their squares must not count, so the known sum is not used.
  AdamW frozen = s.optimizer({"*.mlp.experts.*"});
  const double trainable = frozen.grad_norm(ctx);
  EXPECT_LT(trainable, full);
  const double known = fused_norm(ctx, *s.model, frozen);
  EXPECT_DOUBLE_EQ(known, trainable);
}
