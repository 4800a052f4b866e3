// Qwen3Model on tiny random models against the double-precision loop reference in
// test_model_ref.h: forward (loss parts, logits) to 1e-5, and every parameter tensor's gradient
// against central finite differences of the reference loss in double (several elements per
// tensor, the largest-gradient one included). Covers MoE + dense layers in one model, tied and
// untied heads, norm_topk_prob on/off, both aux forms, z-loss, one-token documents, ignored
// labels, all tokens on the same experts (zero router), recompute, accumulation and Batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "kernels/ops.h"
#include "model/qwen3_model.h"
#include "test_model_ref.h"
#include "tiny_models.h"

using namespace moetrain;

namespace {

ModelConfig tiny_config(bool tied, bool norm_topk) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 12;  // != hidden / heads
  c.intermediate_size = 12;
  c.moe_intermediate_size = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = norm_topk;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {1};  // layers 0 and 2 sparse, 1 dense
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000.0;
  c.tie_word_embeddings = tied;
  c.router_aux_loss_coef = 0.1;
  return c;
}

// Decisive routing (router std 1), O(1) activations, norm weights away from 1.
ModelParams random_params(const ModelConfig& c, uint32_t seed, double router_std = 1.0) {
  return test::random_test_params(c, seed, router_std, /*embed_std=*/0.5);
}
Batch tiny_batch(uint32_t seed, int64_t V, const std::vector<int>& lens) { return test::random_batch(seed, V, lens); }

struct Case {
  std::string name;
  bool tied, norm_topk;
  AuxLossType aux;
  float z;
  std::vector<int> docs;
};

testref::RefOptions ref_options(const Qwen3Model& m) {
  testref::RefOptions o;
  o.aux_coef = m.aux_coef();
  o.aux_per_layer = m.options().aux_type == AuxLossType::kPerLayer;
  o.z_coef = m.options().zloss_coef;
  return o;
}

// Engine gradient vs central differences of the double reference, for a few elements of every
// parameter tensor. Elements whose perturbation flips a top-k choice are skipped (counted).
void check_gradients(const ModelParams& p, const ModelParams& g, const Batch& batch, const testref::RefOptions& o,
                     const std::string& tag, bool skip_router = false) {
  testref::RefParams ref = testref::RefParams::from(p);
  const std::vector<int> base_routing = testref::ref_forward(ref, batch, o).routing;
  std::mt19937 rng(7);
  int checked = 0, skipped = 0;
  g.for_each([&](const std::string& name, const Tensor& gt) {
    if (skip_router && name.find("mlp.gate.weight") != std::string::npos) return;
    std::vector<int64_t> idx;
    int64_t amax = 0;
    for (int64_t i = 0; i < gt.numel(); ++i) {
      if (std::abs(gt.get(i)) > std::abs(gt.get(amax))) amax = i;
    }
    idx.push_back(amax);
    for (int r = 0; r < 3; ++r) idx.push_back(std::uniform_int_distribution<int64_t>(0, gt.numel() - 1)(rng));
    double gmax = std::abs(gt.get(amax));
    for (int64_t i : idx) {
      testref::Vec& w = ref.w.at(name);
      const double orig = w[i];
      const double h = 1e-5 * std::max(1.0, std::abs(orig));
      w[i] = orig + h;
      auto up = testref::ref_forward(ref, batch, o);
      w[i] = orig - h;
      auto dn = testref::ref_forward(ref, batch, o);
      w[i] = orig;
      if (up.routing != base_routing || dn.routing != base_routing) {
        ++skipped;
        continue;
      }
      const double fd = (up.loss - dn.loss) / (2 * h);
      const double an = gt.get(i);
      EXPECT_NEAR(an, fd, 2e-4 * std::abs(fd) + 2e-5 * gmax + 1e-7) << tag << " " << name << "[" << i << "]";
      ++checked;
    }
  });
  EXPECT_GT(checked, 40) << tag;
  EXPECT_LE(skipped, checked / 10) << tag;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ModelVsReference : public testing::TestWithParam<Case> {};

TEST_P(ModelVsReference, ForwardAndFiniteDifferenceGradients) {
  const Case cs = GetParam();
  ModelConfig cfg = tiny_config(cs.tied, cs.norm_topk);
  ModelParams p = random_params(cfg, 11);
  Batch batch = tiny_batch(3, cfg.vocab_size, cs.docs);
  ModelOptions mo;
  mo.aux_type = cs.aux;
  mo.zloss_coef = cs.z;
  Qwen3Model m(p, mo);
  Context ctx;
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  ForwardResult r = m.forward_backward(ctx, batch, g, true);

  const testref::RefOptions o = ref_options(m);
  auto ref = testref::ref_forward(testref::RefParams::from(p), batch, o);
  EXPECT_NEAR(r.loss, ref.loss, 1e-5 * std::abs(ref.loss)) << cs.name;
  EXPECT_NEAR(r.ce, ref.ce, 1e-5 * std::abs(ref.ce)) << cs.name;
  EXPECT_NEAR(r.aux, ref.aux, 1e-5 * std::abs(ref.aux)) << cs.name;
  if (cs.z != 0.0f) {
    EXPECT_NEAR(r.z, ref.z, 1e-5 * std::abs(ref.z)) << cs.name;
    EXPECT_GT(r.z, 0.1);
  } else {
    EXPECT_EQ(r.z, 0.0);  // not computed when off
  }
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(ref.logits[i]));
    max_diff = std::max(max_diff, std::abs(r.logits.get(static_cast<int64_t>(i)) - ref.logits[i]));
  }
  EXPECT_LT(max_diff, 1e-5 * max_abs) << cs.name;

  // Router statistics agree with the reference counts.
  ASSERT_EQ(r.router.size(), ref.counts.size());
  for (size_t l = 0; l < r.router.size(); ++l) {
    const auto& st = r.router[l];
    double total = 0;
    for (size_t e = 0; e < st.tokens_per_expert.size(); ++e) {
      EXPECT_EQ(st.tokens_per_expert[e], ref.counts[l][e]);
      total += st.tokens_per_expert[e];
    }
    EXPECT_EQ(total, static_cast<double>(batch.num_tokens() * cfg.num_experts_per_tok));
    EXPECT_GE(st.max_mean_load, 1.0);
    EXPECT_GT(st.entropy, 0.0);
    EXPECT_LE(st.entropy, std::log(static_cast<double>(cfg.num_experts)) + 1e-9);
    EXPECT_GT(st.frac_active, 0.0);
    EXPECT_LE(st.frac_active, 1.0);
  }
  check_gradients(p, g, batch, o, cs.name);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, ModelVsReference,
    testing::Values(Case{"untied_norm_global", false, true, AuxLossType::kGlobal, 0.0f, {6, 1, 5}},
                    Case{"tied_nonorm_perlayer_z", true, false, AuxLossType::kPerLayer, 0.01f, {4, 7}},
                    Case{"untied_nonorm_global_z_single_doc", false, false, AuxLossType::kGlobal, 0.05f, {9}},
                    Case{"tied_norm_one_token_docs", true, true, AuxLossType::kGlobal, 0.0f, {1, 1, 3, 1}}),
    [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

// Zero router weights: every probability is 1/E, ties go to the lowest expert indices, so all
// tokens land on experts 0..k-1 and the others get none.
TEST(Model, ZeroRouterSendsEveryTokenToTheFirstExperts) {
  ModelConfig cfg = tiny_config(false, true);
  ModelParams p = random_params(cfg, 5);
  for (auto& L : p.layers) {
    if (L.sparse) L.router.zero_();
  }
  Batch batch = tiny_batch(9, cfg.vocab_size, {5, 4});
  Qwen3Model m(p);
  Context ctx;
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  ForwardResult r = m.forward_backward(ctx, batch, g);
  for (const auto& st : r.router) {
    EXPECT_EQ(st.tokens_per_expert[0], 9.0f);
    EXPECT_EQ(st.tokens_per_expert[1], 9.0f);
    EXPECT_EQ(st.tokens_per_expert[2], 0.0f);
    EXPECT_EQ(st.tokens_per_expert[3], 0.0f);
    EXPECT_DOUBLE_EQ(st.frac_active, 0.5);
    EXPECT_NEAR(st.max_mean_load, 2.0, 1e-12);
    EXPECT_NEAR(st.entropy, std::log(4.0), 1e-6);
  }
  const testref::RefOptions o = ref_options(m);
  auto ref = testref::ref_forward(testref::RefParams::from(p), batch, o);
  EXPECT_NEAR(r.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_NEAR(r.aux, 2.0, 1e-6);  // E * sum_e f_e P_e = 4 * (2 * 0.5 * 0.25)
  // Unused experts get exactly zero gradient.
  for (auto& L : g.layers) {
    if (!L.sparse) continue;
    for (int64_t e = 2; e < 4; ++e) {
      EXPECT_EQ(L.experts_gate_up.select(0, e).contiguous().to_floats(),
                std::vector<float>(static_cast<size_t>(L.experts_gate_up.select(0, e).numel()), 0.0f));
    }
  }
  check_gradients(p, g, batch, o, "zero_router", /*skip_router=*/true);
}

TEST(Model, AllLabelsIgnoredLeavesOnlyRouterLosses) {
  ModelConfig cfg = tiny_config(true, true);
  ModelParams p = random_params(cfg, 2);
  Batch batch = tiny_batch(4, cfg.vocab_size, {1, 1, 1});  // one-token documents: no labels
  EXPECT_EQ(batch.num_labelled(), 0);
  Qwen3Model m(p);
  Context ctx;
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  ForwardResult r = m.forward_backward(ctx, batch, g);
  EXPECT_EQ(r.ce, 0.0);
  EXPECT_GT(r.aux, 0.0);
  EXPECT_NEAR(r.loss, m.aux_coef() * r.aux, 1e-9);
  EXPECT_EQ(ops::sum_squares(ctx, g.final_norm), 0.0);  // no CE path
  check_gradients(p, g, batch, ref_options(m), "no_labels");
}

TEST(Model, GradientsAccumulateAcrossCalls) {
  ModelConfig cfg = tiny_config(false, true);
  ModelParams p = random_params(cfg, 8);
  Batch batch = tiny_batch(1, cfg.vocab_size, {5, 6});
  Qwen3Model m(p);
  Context ctx;
  ModelParams g1 = allocate_gradients(cfg, Device::cpu()), g2 = allocate_gradients(cfg, Device::cpu());
  m.forward_backward(ctx, batch, g1);
  m.forward_backward(ctx, batch, g2);
  m.forward_backward(ctx, batch, g2);
  g1.for_each([&](const std::string& n, Tensor& a) {
    Tensor b;
    g2.for_each([&](const std::string& n2, Tensor& t) {
      if (n2 == n) b = t;
    });
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_FLOAT_EQ(2.0f * static_cast<float>(a.get(i)), b.get(i)) << n;
  });
}

// The fused q|k|v projection (one GEMM each way, q, k, v as column blocks) against three GEMMs, on
// the CPU where it is off by default: the loss and gradients within f32 rounding (the CPU GEMM
// may block a wider output differently, and the input gradient's three products are summed in
// another order), for MoE and dense layers and both
// recompute policies that rerun the projections' consumers.
TEST(Model, FusedQkvProjectionMatchesThreeGemms) {
  for (const bool moe : {true, false}) {
    for (const Recompute rc : {Recompute::kNone, Recompute::kSelective}) {
      ModelConfig cfg = tiny_config(false, moe);
      ModelParams p = random_params(cfg, 21);
      ASSERT_TRUE(p.layers[0].qkv_proj.defined());
      EXPECT_EQ(p.layers[0].k_proj.data_ptr(),
                static_cast<char*>(p.layers[0].qkv_proj.data_ptr()) + p.layers[0].q_proj.nbytes());
      Batch batch = tiny_batch(1, cfg.vocab_size, {5, 6});
      ModelOptions o;
      o.recompute = rc;
      Qwen3Model m(p, o);
      Context ctx;
      ModelParams g1 = allocate_gradients(cfg, Device::cpu()), g2 = allocate_gradients(cfg, Device::cpu());
      EXPECT_FALSE(uses_fused_qkv(p.layers[0]));  // the default fuses on CUDA only
      set_qkv_fusion(QkvFusion::kNever);
      EXPECT_FALSE(uses_fused_qkv(p.layers[0]));
      const double l1 = m.forward_backward(ctx, batch, g1).loss;
      set_qkv_fusion(QkvFusion::kAlways);
      EXPECT_TRUE(uses_fused_qkv(p.layers[0]));
      EXPECT_TRUE(uses_fused_qkv(g2.layers[0]));
      const double l2 = m.forward_backward(ctx, batch, g2).loss;
      set_qkv_fusion(QkvFusion::kCuda);
      EXPECT_NEAR(l1, l2, 1e-6 * std::abs(l1));
      std::map<std::string, Tensor> b;
      g2.for_each([&](const std::string& n, Tensor& t) { b[n] = t; });
      g1.for_each([&](const std::string& n, Tensor& a) {
        double amax = 0.0;
        for (int64_t i = 0; i < a.numel(); ++i) amax = std::max(amax, std::abs(a.get(i)));
        for (int64_t i = 0; i < a.numel(); ++i)
          ASSERT_NEAR(a.get(i), b.at(n).get(i), 1e-5 * amax + 1e-7) << n << "[" << i << "] moe " << moe;
      });
    }
  }
}

// A layer whose k_proj was rebound to a tensor of its own (new values, not the fused tensor's rows)
// falls back to three GEMMs: the fused path would read the stale rows.
TEST(Model, FusedQkvFallsBackWhenAWeightIsRebound) {
  ModelConfig cfg = tiny_config(false, true);
  ModelParams p = random_params(cfg, 22);
  Tensor k = Tensor::empty(p.layers[0].k_proj.shape(), p.layers[0].k_proj.dtype());
  for (int64_t i = 0; i < k.numel(); ++i) k.set(i, 0.05 * std::sin(0.7 * static_cast<double>(i)));
  p.layers[0].k_proj = k;
  Batch batch = tiny_batch(1, cfg.vocab_size, {5, 6});
  Qwen3Model m(p);
  Context ctx;
  ModelParams g1 = allocate_gradients(cfg, Device::cpu()), g2 = allocate_gradients(cfg, Device::cpu());
  set_qkv_fusion(QkvFusion::kAlways);
  EXPECT_FALSE(uses_fused_qkv(p.layers[0]));
  EXPECT_TRUE(uses_fused_qkv(p.layers[1]));
  const double fused = m.forward_backward(ctx, batch, g1).loss;
  set_qkv_fusion(QkvFusion::kNever);
  const double three = m.forward_backward(ctx, batch, g2).loss;
  set_qkv_fusion(QkvFusion::kCuda);
  EXPECT_NEAR(fused, three, 1e-6 * std::abs(three));
  const Tensor& a = g1.layers[0].k_proj;
  const Tensor& b = g2.layers[0].k_proj;
  double amax = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) amax = std::max(amax, std::abs(b.get(i)));
  EXPECT_GT(amax, 0.0);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.get(i), b.get(i), 1e-5 * amax + 1e-7) << "k_proj grad [" << i << "]";
}

TEST(Model, EvalPassMatchesTrainPassAndKeepsNothing) {
  ModelConfig cfg = tiny_config(false, false);
  ModelParams p = random_params(cfg, 12);
  Batch batch = tiny_batch(2, cfg.vocab_size, {4, 4});
  Qwen3Model m(p);
  Context ctx;
  ForwardResult a = m.forward(ctx, batch, Pass::kEval);
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  EXPECT_THROW(m.backward(ctx, g), Error);  // nothing saved
  ForwardResult b = m.forward(ctx, batch, Pass::kTrain);
  EXPECT_EQ(a.loss, b.loss);
  m.backward(ctx, g);
  EXPECT_THROW(m.backward(ctx, g), Error);  // released
}

TEST(Model, OptionsAndBadInputsAreRejected) {
  ModelConfig cfg = tiny_config(false, true);
  ModelParams p = random_params(cfg, 1);
  ModelOptions no_chunk;
  no_chunk.ce_chunk_bytes = 0;  // and ce_chunk_tokens 0: no chunk size
  EXPECT_THROW(Qwen3Model(p, no_chunk), Error);
  EXPECT_EQ(parse_recompute("selective"), Recompute::kSelective);
  EXPECT_EQ(parse_recompute("full"), Recompute::kFull);
  EXPECT_THROW(parse_recompute("some"), Error);
  EXPECT_EQ(parse_aux_loss_type("per_layer"), AuxLossType::kPerLayer);
  Qwen3Model m(p);
  Context ctx;
  Batch bad = Batch::from_documents({{1, 2, 99}});  // 99 >= vocab 40
  EXPECT_THROW(m.forward(ctx, bad), Error);
  Batch b = Batch::from_documents({{1, 2, 3}, {4, 5}});
  b.positions = Tensor::from_ints({0, 1, 2, 3, 4}, {5});  // does not restart for document 2
  EXPECT_THROW(m.forward(ctx, b), Error);
  ModelConfig other = cfg;
  other.mlp_only_layers = {};
  ModelParams mismatched = random_params(other, 1);
  mismatched.config = cfg;  // layer 1 sparse in params, dense in config
  EXPECT_THROW(Qwen3Model{mismatched}, Error);
}

TEST(Batch, FromDocumentsShiftsLabelsInsideDocuments) {
  std::vector<std::vector<uint8_t>> mask = {{1, 0, 1, 1}, {1, 1}, {1}};
  Batch b = Batch::from_documents({{10, 11, 12, 13}, {20, 21}, {30}}, Device::cpu(), &mask);
  EXPECT_EQ(testref::host_ints(b.tokens), (std::vector<int32_t>{10, 11, 12, 13, 20, 21, 30}));
  EXPECT_EQ(testref::host_ints(b.positions), (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 0}));
  EXPECT_EQ(testref::host_ints(b.cu_seqlens), (std::vector<int32_t>{0, 4, 6, 7}));
  // mask[0][1] == 0: the prediction of token 11 (label at t=0) is not trained.
  EXPECT_EQ(testref::host_ints(b.labels), (std::vector<int32_t>{-100, 12, 13, -100, 21, -100, -100}));
  EXPECT_EQ(b.max_seqlen, 4);
  EXPECT_EQ(b.num_labelled(), 3);
  const std::vector<float> w = b.loss_weights.to_floats();
  EXPECT_EQ(w, (std::vector<float>{0, 1.0f / 3, 1.0f / 3, 0, 1.0f / 3, 0, 0}));
  Batch g = Batch::from_documents({{1, 2, 3}}, Device::cpu(), nullptr, 0.125f);
  EXPECT_EQ(g.loss_weights.to_floats(), (std::vector<float>{0.125f, 0.125f, 0}));
  EXPECT_THROW(Batch::from_documents({{1}, {}}), Error);
  EXPECT_THROW(Batch::from_documents({}), Error);
}

TEST(Model, HfNamedViewsSplitDenseMlp) {
  ModelConfig cfg = tiny_config(true, true);
  ModelParams p = random_params(cfg, 4);
  std::vector<std::string> names;
  for_each_hf_named(p, [&](const std::string& n, const Tensor& t) {
    names.push_back(n);
    if (n == "model.layers.1.mlp.up_proj.weight") {
      EXPECT_EQ(t.shape(), (Shape{12, 16}));
      EXPECT_EQ(t.get(0), p.layers[1].mlp_gate_up.get(12 * 16));
    }
  });
  EXPECT_EQ(std::count(names.begin(), names.end(), "model.layers.1.mlp.gate_proj.weight"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "model.layers.0.mlp.experts.gate_up_proj"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);  // tied
}

}  // namespace
