// The "overwrite" matrix-gradient mode at model level (CPU): after zero_gradients(g, false) and
// Qwen3Model::set_overwrite_matrix_grads(), a training pass over gradients full of garbage (huge
// values, NaN, inf) must leave every gradient tensor bit-identical to zeroing everything and
// accumulating as usual; so must 2-3 micro-batches (first written, the rest added), an expert that
// gets no token in the first micro-batch, bf16 matrix gradients, the split forward + backward path
// (DPO), recompute policies and chunked loss heads. Passes without the flag must accumulate.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "model/qwen3_model.h"
#include "tiny_models.h"

using namespace moetrain;

namespace {

ModelConfig ow_config(bool tied, bool dense_layer) { return test::small_moe_config(tied, 6, dense_layer); }
ModelParams ow_params(const ModelConfig& c, uint32_t seed) { return test::random_test_params(c, seed); }
Batch ow_batch(int64_t V, const std::vector<int>& lens, uint32_t seed) { return test::random_batch(seed, V, lens); }

// Huge values in every tensor; NaN and +-inf sprinkled over the matrices (2-D / 3-D).
void fill_garbage(ModelParams& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1e30, 1e30);
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  g.for_each([&](const std::string&, Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = u(rng);
      if (t.dim() >= 2) v = i % 5 == 0 ? nan : i % 7 == 0 ? (i % 2 ? inf : -inf) : v;
      t.set(i, v);
    }
  });
}

std::vector<std::pair<std::string, Tensor>> named(ModelParams& g) {
  std::vector<std::pair<std::string, Tensor>> out;
  g.for_each([&](const std::string& n, Tensor& t) { out.emplace_back(n, t); });
  return out;
}

// Every gradient tensor equal bit for bit (dtype, shape and raw bytes); names the first differing
// element of each tensor.
void expect_bitwise_equal(ModelParams& a, ModelParams& b, const std::string& tag) {
  auto x = named(a), y = named(b);
  ASSERT_EQ(x.size(), y.size()) << tag;
  for (size_t i = 0; i < x.size(); ++i) {
    const Tensor& s = x[i].second;
    const Tensor& t = y[i].second;
    ASSERT_EQ(x[i].first, y[i].first) << tag;
    ASSERT_EQ(s.dtype(), t.dtype()) << tag << " " << x[i].first;
    ASSERT_EQ(s.shape(), t.shape()) << tag << " " << x[i].first;
    ASSERT_TRUE(s.is_contiguous() && t.is_contiguous());
    if (std::memcmp(s.data_ptr(), t.data_ptr(), s.nbytes()) == 0) continue;
    const size_t es = s.element_size();
    const auto* p = static_cast<const unsigned char*>(s.data_ptr());
    const auto* q = static_cast<const unsigned char*>(t.data_ptr());
    int64_t first = 0;
    while (std::memcmp(p + first * es, q + first * es, es) == 0) ++first;
    ADD_FAILURE() << tag << ": " << x[i].first << " differs, first at element " << first << ": " << s.get(first)
                  << " vs " << t.get(first);
  }
}

void expect_all_finite(ModelParams& g, const std::string& tag) {
  for (auto& [n, t] : named(g)) {
    const std::vector<float> v = t.to_floats();
    int64_t bad = 0;
    for (float f : v) bad += !std::isfinite(f);
    EXPECT_EQ(bad, 0) << tag << " " << n;
  }
}

struct Runner {
  const ModelParams& p;
  ModelOptions opts;
  DType grad_dtype = DType::kF32;
  bool split = false;  // forward(kTrain) + backward() (the DPO path) instead of forward_backward

  void pass(Context& ctx, Qwen3Model& m, const Batch& b, ModelParams& g) const {
    if (split) {
      m.forward(ctx, b, Pass::kTrain);
      m.backward(ctx, g);
    } else {
      m.forward_backward(ctx, b, g);
    }
  }
  // The old way: every gradient zeroed, then every pass accumulates.
  ModelParams reference(const std::vector<Batch>& mbs) const {
    ModelParams g = allocate_gradients(p.config, Device::cpu(), grad_dtype);
    fill_garbage(g, 99);
    zero_gradients(g, /*matrices=*/true);
    Context ctx;
    Qwen3Model m(p, opts);
    for (const Batch& b : mbs) pass(ctx, m, b, g);
    return g;
  }
  // The trainer's way: garbage in the matrices, only the rest zeroed, the first pass writes.
  ModelParams overwrite(const std::vector<Batch>& mbs, uint32_t garbage_seed = 7) const {
    ModelParams g = allocate_gradients(p.config, Device::cpu(), grad_dtype);
    fill_garbage(g, garbage_seed);
    zero_gradients(g, /*matrices=*/false);
    Context ctx;
    Qwen3Model m(p, opts);
    m.set_overwrite_matrix_grads();
    for (const Batch& b : mbs) pass(ctx, m, b, g);
    return g;
  }
};

struct OwCase {
  bool tied, dense, bf16, split;
};

std::string case_name(const testing::TestParamInfo<OwCase>& i) {
  const OwCase& c = i.param;
  return std::string(c.tied ? "tied" : "untied") + (c.dense ? "_dense" : "_moe") + (c.bf16 ? "_bf16" : "_f32") +
         (c.split ? "_split" : "_fused");
}

std::vector<OwCase> all_cases() {
  std::vector<OwCase> v;
  for (bool tied : {false, true})
    for (bool dense : {false, true})
      for (bool bf16 : {false, true})
        for (bool split : {false, true}) v.push_back({tied, dense, bf16, split});
  return v;
}

class OverwriteGrads : public testing::TestWithParam<OwCase> {
 protected:
  void SetUp() override {
    const OwCase& c = GetParam();
    cfg_ = ow_config(c.tied, c.dense);
    params_ = ow_params(cfg_, 11);
    opts_.ce_chunk_tokens = 3;  // several loss-head chunks: only the first may write lm_head
  }
  Runner runner() const {
    return Runner{params_, opts_, GetParam().bf16 ? DType::kBF16 : DType::kF32, GetParam().split};
  }
  ModelConfig cfg_;
  ModelParams params_;
  ModelOptions opts_;
};

TEST_P(OverwriteGrads, OnePassOverGarbageEqualsZeroThenAccumulate) {
  Runner r = runner();
  const std::vector<Batch> mbs = {ow_batch(cfg_.vocab_size, {5, 1, 4}, 3)};
  ModelParams ref = r.reference(mbs);
  ModelParams got = r.overwrite(mbs);
  expect_all_finite(ref, "reference");
  expect_bitwise_equal(got, ref, "one pass");
  // The gradient set really has the dtype under test (bf16 matrices, f32 norms and embedding).
  const LayerParams& l0 = got.layers[0];
  EXPECT_EQ(l0.q_proj.dtype(), r.grad_dtype);
  EXPECT_EQ(l0.experts_gate_up.dtype(), r.grad_dtype);
  EXPECT_EQ(l0.router.dtype(), r.grad_dtype);
  EXPECT_EQ(l0.input_norm.dtype(), DType::kF32);
  EXPECT_EQ(got.embed.dtype(), DType::kF32);
  if (!cfg_.tie_word_embeddings) EXPECT_EQ(got.lm_head.dtype(), r.grad_dtype);
}

TEST_P(OverwriteGrads, MicroBatchesWriteThenAccumulate) {
  Runner r = runner();
  const std::vector<Batch> mbs = {ow_batch(cfg_.vocab_size, {4, 3}, 5), ow_batch(cfg_.vocab_size, {7}, 6),
                                  ow_batch(cfg_.vocab_size, {2, 1, 5}, 8)};
  for (size_t n : {2, 3}) {
    const std::vector<Batch> some(mbs.begin(), mbs.begin() + static_cast<std::ptrdiff_t>(n));
    ModelParams ref = r.reference(some);
    expect_all_finite(ref, "reference");
    ModelParams got = r.overwrite(some, 100 + static_cast<uint32_t>(n));
    expect_bitwise_equal(got, ref, std::to_string(n) + " micro-batches");
  }
}

// Micro-batch 1 has 2 tokens (4 picks over 6 experts), so some expert of layer 0 gets none; pick
// a micro-batch 2 that routes tokens to it. That expert's gradient must be exactly zero after
// pass 1 (written zeros, not the garbage) and equal to micro-batch 2's gradient alone after pass 2.
TEST_P(OverwriteGrads, ExpertWithoutTokensInFirstMicroBatch) {
  Runner r = runner();
  Context ctx;
  Qwen3Model probe(params_, opts_);
  const Batch mb1 = ow_batch(cfg_.vocab_size, {2}, 12);
  const ForwardResult f1 = probe.forward(ctx, mb1, Pass::kEval);
  ASSERT_FALSE(f1.router.empty());
  ASSERT_EQ(f1.router[0].layer, 0);
  int64_t idle = -1;
  for (int64_t e = 0; e < cfg_.num_experts && idle < 0; ++e)
    if (f1.router[0].tokens_per_expert[e] == 0.0f) idle = e;
  ASSERT_GE(idle, 0) << "4 picks over 6 experts leave some expert idle";
  auto expert = [&](ModelParams& g, bool gate_up) {
    const Tensor& t = gate_up ? g.layers[0].experts_gate_up : g.layers[0].experts_down;
    return t.select(0, idle).contiguous().to_floats();
  };
  auto l1 = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += std::abs(x);
    return s;
  };
  // The expert must get a token whose output matters (a document's last token has no label and
  // nothing after it, so its expert gradient is exactly zero).
  Batch mb2;
  ModelParams only2;
  bool found = false;
  for (uint32_t seed = 0; seed < 50 && !found; ++seed) {
    mb2 = ow_batch(cfg_.vocab_size, {4, 2}, 200 + seed);
    if (probe.forward(ctx, mb2, Pass::kEval).router[0].tokens_per_expert[idle] == 0.0f) continue;
    only2 = r.reference({mb2});
    found = l1(expert(only2, true)) > 0.0 && l1(expert(only2, false)) > 0.0;
  }
  ASSERT_TRUE(found) << "no second micro-batch gives expert " << idle << " a gradient";

  // After pass 1 alone: zeros in place of the garbage.
  ModelParams one = r.overwrite({mb1});
  for (bool gu : {true, false})
    for (float v : expert(one, gu)) ASSERT_EQ(std::bit_cast<uint32_t>(v), 0u) << "expert " << idle << " " << gu;
  ModelParams ref1 = r.reference({mb1});
  expect_bitwise_equal(one, ref1, "pass 1");
  // After both passes: the reference, and for the idle expert micro-batch 2's gradient alone.
  ModelParams two = r.overwrite({mb1, mb2});
  ModelParams ref2 = r.reference({mb1, mb2});
  expect_bitwise_equal(two, ref2, "passes 1+2");
  for (bool gu : {true, false}) EXPECT_EQ(expert(two, gu), expert(only2, gu)) << "expert " << idle << " " << gu;
}

// The flag survives evaluation passes (kEval forward, token_logprobs: the trainer may evaluate
// between steps) and is consumed by exactly one training pass.
TEST_P(OverwriteGrads, EvalPassesDoNotConsumeTheFlag) {
  Runner r = runner();
  const Batch b = ow_batch(cfg_.vocab_size, {6, 3}, 31), ev = ow_batch(cfg_.vocab_size, {5}, 32);
  ModelParams g = allocate_gradients(cfg_, Device::cpu(), r.grad_dtype);
  fill_garbage(g, 33);
  zero_gradients(g, false);
  Context ctx;
  Qwen3Model m(params_, opts_);
  m.set_overwrite_matrix_grads();
  m.forward(ctx, ev, Pass::kEval);
  m.token_logprobs(ctx, ev);
  r.pass(ctx, m, b, g);
  ModelParams ref = r.reference({b});
  expect_bitwise_equal(g, ref, "after eval passes");
}

INSTANTIATE_TEST_SUITE_P(Model, OverwriteGrads, testing::ValuesIn(all_cases()), case_name);

// Recompute policies, per-layer aux and z-loss (every router-gradient path), one-row loss chunks.
TEST(OverwriteGradsRecompute, PoliciesMatchZeroThenAccumulate) {
  ModelConfig cfg = ow_config(false, true);
  ModelParams p = ow_params(cfg, 17);
  const std::vector<Batch> mbs = {ow_batch(cfg.vocab_size, {3, 4}, 41), ow_batch(cfg.vocab_size, {6}, 42)};
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (bool split : {false, true}) {
      ModelOptions o;
      o.recompute = rc;
      o.zloss_coef = 0.01f;
      o.aux_type = AuxLossType::kPerLayer;
      o.ce_chunk_tokens = 1;
      Runner r{p, o, DType::kF32, split};
      ModelParams got = r.overwrite(mbs), ref = r.reference(mbs);
      expect_bitwise_equal(got, ref, std::string(recompute_name(rc)) + (split ? " split" : " fused"));
    }
  }
}

// Without the flag, a pass adds to what the gradients hold (a fresh model, and a model whose
// flagged pass is over): G0 + pass == (zeros + pass) + G0 up to f32 rounding, never the pass alone.
TEST(OverwriteGradsOff, PassesWithoutTheFlagAccumulate) {
  ModelConfig cfg = ow_config(false, true);
  ModelParams p = ow_params(cfg, 19);
  const Batch b = ow_batch(cfg.vocab_size, {5, 4}, 51);
  ModelOptions o;
  o.ce_chunk_tokens = 4;
  Runner r{p, o, DType::kF32, false};
  ModelParams d = r.reference({b});  // the pass's own gradient
  auto start = [&](ModelParams& g) {  // G0: O(1) random values everywhere
    std::mt19937 rng(52);
    std::normal_distribution<double> n(0.0, 1.0);
    g.for_each([&](const std::string&, Tensor& t) {
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(rng));
    });
  };
  for (int variant = 0; variant < 2; ++variant) {
    ModelParams g0 = allocate_gradients(cfg, Device::cpu());
    start(g0);
    ModelParams g = allocate_gradients(cfg, Device::cpu());
    start(g);
    Context ctx;
    Qwen3Model m(p, o);
    if (variant == 1) {  // a flagged pass into a scratch set first: the flag must be spent by it
      ModelParams scratch = allocate_gradients(cfg, Device::cpu());
      m.set_overwrite_matrix_grads();
      m.forward_backward(ctx, b, scratch);
    }
    m.forward_backward(ctx, b, g);
    auto gv = named(g), g0v = named(g0), dv = named(d);
    for (size_t i = 0; i < gv.size(); ++i) {
      const std::vector<float> x = gv[i].second.to_floats(), a = g0v[i].second.to_floats(),
                               c = dv[i].second.to_floats();
      for (size_t j = 0; j < x.size(); ++j) {
        const double want = double(a[j]) + c[j];
        ASSERT_NEAR(x[j], want, 1e-5 * (std::abs(a[j]) + std::abs(c[j]) + 1e-3))
            << "variant " << variant << " " << gv[i].first << " [" << j << "]";
      }
    }
  }
}

}  // namespace
