// The DPO gradient through the whole model on the CPU: dpo_forward_backward (one forward, per-token
// weights, the model's weighted-CE backward) against central finite differences in double of an
// independent loss: the double-precision loop model of tests/unit/model/test_model_ref.h gives
// logits, log-softmax sums over response tokens give sequence log-probs, and the DPO loss is
// written out plainly (mean over pairs, plus the router aux and z losses of the same forward).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <map>
#include <random>

#include "train/dpo.h"
#include "unit/model/test_model_ref.h"

using namespace moetrain;

namespace {

ModelConfig tiny_config(bool tied) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 12;
  c.intermediate_size = 12;
  c.moe_intermediate_size = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers = {1};  // a dense layer between two sparse ones
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000.0;
  c.tie_word_embeddings = tied;
  c.router_aux_loss_coef = 0.1;
  return c;
}

// O(1) activations and decisive routing, so few perturbations flip a top-k choice.
ModelParams random_params(const ModelConfig& c, uint32_t seed) {
  ModelParams p = ModelParams::allocate(c, DType::kF32, Device::cpu());
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  p.for_each([&](const std::string& name, Tensor& t) {
    const bool norm = name.find("norm.weight") != std::string::npos;
    const bool router = name.find("mlp.gate.weight") != std::string::npos;
    const bool emb = name.find("embed_tokens") != std::string::npos;
    const double sd = router ? 1.0 : emb ? 0.5 : 1.0 / std::sqrt(static_cast<double>(t.size(-1)));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, norm ? 1.0 + 0.2 * n(rng) : sd * n(rng));
  });
  return p;
}

// Pairs sharing a prompt (mask 0) with responses (mask 1) of different lengths, one of a single
// token, and one rejected side that repeats the chosen prefix.
std::vector<PreferencePair> make_pairs(uint32_t seed, int64_t V) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  auto seq = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(tok(rng));
    return v;
  };
  std::vector<PreferencePair> out;
  const std::vector<std::array<int, 3>> shapes = {{3, 4, 2}, {2, 1, 5}, {4, 3, 3}};  // prompt, chosen, rejected
  for (const auto& [np, nc, nr] : shapes) {
    PreferencePair p;
    const std::vector<int32_t> prompt = seq(np);
    p.chosen = prompt, p.rejected = prompt;
    const std::vector<int32_t> c = seq(nc), r = seq(nr);
    p.chosen.insert(p.chosen.end(), c.begin(), c.end());
    p.rejected.insert(p.rejected.end(), r.begin(), r.end());
    p.chosen_mask.assign(p.chosen.size(), 1), p.rejected_mask.assign(p.rejected.size(), 1);
    std::fill(p.chosen_mask.begin(), p.chosen_mask.begin() + np, 0);
    std::fill(p.rejected_mask.begin(), p.rejected_mask.begin() + np, 0);
    out.push_back(p);
  }
  out[2].rejected[out[2].rejected.size() - 3] = out[2].chosen[out[2].chosen.size() - 3];
  return out;
}

struct Case {
  std::string name;
  DpoOptions opt;
  bool tied;
  float z;
  int64_t ce_chunk_tokens = 0;  // > 0: the loss head runs (and is recomputed) in chunks of this many rows
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Independent DPO loss of the double reference model.
struct RefDpo {
  double loss = 0, dpo = 0, aux = 0, z = 0;
  std::vector<double> seq;  // per document
  std::vector<int> routing;
};

RefDpo ref_dpo(const testref::RefParams& P, const Batch& b, const testref::RefOptions& o, const DpoOptions& d,
               const std::vector<double>& refc, const std::vector<double>& refr) {
  const testref::RefResult rr = testref::ref_forward(P, b, o);  // CE weights are 0: loss = aux + z terms
  const auto lab = testref::host_ints(b.labels), cu = testref::host_ints(b.cu_seqlens);
  const int64_t V = P.cfg.vocab_size;
  RefDpo out;
  out.routing = rr.routing;
  for (size_t doc = 0; doc + 1 < cu.size(); ++doc) {
    double s = 0;
    for (int32_t t = cu[doc]; t < cu[doc + 1]; ++t) {
      if (lab[t] == kIgnoreLabel) continue;
      double mx = -1e300, den = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, rr.logits[t * V + v]);
      for (int64_t v = 0; v < V; ++v) den += std::exp(rr.logits[t * V + v] - mx);
      s += rr.logits[t * V + lab[t]] - mx - std::log(den);
    }
    out.seq.push_back(s);
  }
  const size_t P2 = out.seq.size() / 2;
  for (size_t i = 0; i < P2; ++i) {
    const double x = d.beta * ((out.seq[2 * i] - refc[i]) - (out.seq[2 * i + 1] - refr[i]));
    double l;
    if (d.loss_type == DpoLossType::kIpo) {
      l = std::pow(x / d.beta - 1.0 / (2.0 * d.beta), 2);
    } else {
      l = -(1 - d.label_smoothing) * std::log(1 / (1 + std::exp(-x))) - d.label_smoothing * std::log(1 / (1 + std::exp(x)));
    }
    out.dpo += l / static_cast<double>(P2);
  }
  out.aux = rr.aux, out.z = rr.z;
  out.loss = out.dpo + rr.loss;
  return out;
}

class DpoThroughModel : public testing::TestWithParam<Case> {};

TEST_P(DpoThroughModel, GradientMatchesFiniteDifferencesOfTheDoubleReference) {
  const Case cs = GetParam();
  const ModelConfig cfg = tiny_config(cs.tied);
  ModelParams p = random_params(cfg, 21);
  const std::vector<PreferencePair> pairs = make_pairs(8, cfg.vocab_size);
  PairBatch pb = make_pair_batch(pairs, {0, 1, 2}, Device::cpu());
  ModelOptions mo;
  mo.zloss_coef = cs.z;
  mo.ce_chunk_tokens = cs.ce_chunk_tokens;
  Qwen3Model m(p, mo);
  testref::RefOptions ro;
  ro.aux_coef = m.aux_coef();
  ro.z_coef = cs.z;
  testref::RefParams ref = testref::RefParams::from(p);
  const Batch ref_batch = pb.batch;  // zero CE weights (copied before the engine writes its own)
  Batch rb = ref_batch;
  rb.loss_weights = Tensor::zeros({pb.batch.num_tokens()}, DType::kF32);

  // Reference log-probs: the policy's own values shifted so that deltas take both signs.
  const RefDpo base0 = ref_dpo(ref, rb, ro, cs.opt, {0, 0, 0}, {0, 0, 0});
  const std::vector<double> refc = {base0.seq[0] + 0.8, base0.seq[2] - 1.1, base0.seq[4] + 0.3};
  const std::vector<double> refr = {base0.seq[1] - 0.5, base0.seq[3] + 0.9, base0.seq[5] + 0.2};
  const RefDpo base = ref_dpo(ref, rb, ro, cs.opt, refc, refr);

  Context ctx;
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  const DpoMicroResult r = dpo_forward_backward(ctx, m, g, pb, refc, refr, cs.opt, 1.0 / 3.0);
  EXPECT_EQ(r.metrics.pairs, 3);
  EXPECT_NEAR(r.metrics.loss / 3.0, base.dpo, 2e-5 * std::abs(base.dpo)) << cs.name;
  EXPECT_NEAR(r.metrics.logp_chosen, base.seq[0] + base.seq[2] + base.seq[4], 1e-4) << cs.name;
  EXPECT_NEAR(r.forward.aux, base.aux, 1e-5 * std::abs(base.aux)) << cs.name;
  EXPECT_EQ(r.forward.ce, 0.0);  // the forward ran with zero CE weights
  EXPECT_GT(std::abs(r.metrics.mean(r.metrics.margin)), 0.01);
  EXPECT_GT(r.metrics.correct, 0.0);
  EXPECT_LT(r.metrics.correct, 3.0);  // both signs of delta present

  std::mt19937 rng(3);
  int checked = 0, skipped = 0;
  g.for_each([&](const std::string& name, const Tensor& gt) {
    std::vector<int64_t> idx;
    int64_t amax = 0;
    for (int64_t i = 0; i < gt.numel(); ++i) {
      if (std::abs(gt.get(i)) > std::abs(gt.get(amax))) amax = i;
    }
    idx.push_back(amax);
    for (int k = 0; k < 3; ++k) idx.push_back(std::uniform_int_distribution<int64_t>(0, gt.numel() - 1)(rng));
    const double gmax = std::abs(gt.get(amax));
    for (int64_t i : idx) {
      testref::Vec& w = ref.w.at(name);
      const double orig = w[i], h = 1e-5 * std::max(1.0, std::abs(orig));
      w[i] = orig + h;
      const RefDpo up = ref_dpo(ref, rb, ro, cs.opt, refc, refr);
      w[i] = orig - h;
      const RefDpo dn = ref_dpo(ref, rb, ro, cs.opt, refc, refr);
      w[i] = orig;
      if (up.routing != base.routing || dn.routing != base.routing) {
        ++skipped;
        continue;
      }
      const double fd = (up.loss - dn.loss) / (2 * h);
      EXPECT_NEAR(gt.get(i), fd, 2e-4 * std::abs(fd) + 2e-5 * gmax + 1e-7) << cs.name << " " << name << "[" << i << "]";
      ++checked;
    }
  });
  EXPECT_GT(checked, 40) << cs.name;
  EXPECT_LE(skipped, checked / 10) << cs.name;
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, DpoThroughModel,
    testing::Values(Case{"sigmoid_untied", {0.5, 0.0, DpoLossType::kSigmoid}, false, 0.0f},
                    Case{"sigmoid_smoothed_tied_z", {0.3, 0.15, DpoLossType::kSigmoid}, true, 0.01f},
                    Case{"ipo_untied_chunked_head", {0.4, 0.0, DpoLossType::kIpo}, false, 0.0f, 5}),
    [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

// Accumulation: two micro-batches of the same pairs at pair_scale 1/2 give the gradient of one.
TEST(DpoThroughModelAccumulation, MicroBatchesAddUpToTheGlobalMean) {
  const ModelConfig cfg = tiny_config(false);
  ModelParams p = random_params(cfg, 5);
  ModelOptions mo;
  mo.aux_coef = 0.0f;
  Qwen3Model m(p, mo);
  const std::vector<PreferencePair> pairs = make_pairs(2, cfg.vocab_size);
  Context ctx;
  const DpoOptions o{0.2, 0.0, DpoLossType::kSigmoid};
  const std::vector<double> rc = {-30, -25, -20}, rr = {-28, -27, -19};
  ModelParams g_all = allocate_gradients(cfg, Device::cpu()), g_acc = allocate_gradients(cfg, Device::cpu());
  PairBatch all = make_pair_batch(pairs, {0, 1, 2}, Device::cpu());
  dpo_forward_backward(ctx, m, g_all, all, rc, rr, o, 1.0 / 3.0);
  PairBatch a = make_pair_batch({pairs[0], pairs[1]}, {0, 1}, Device::cpu());
  PairBatch b = make_pair_batch({pairs[2]}, {2}, Device::cpu());
  dpo_forward_backward(ctx, m, g_acc, a, {rc[0], rc[1]}, {rr[0], rr[1]}, o, 1.0 / 3.0);
  dpo_forward_backward(ctx, m, g_acc, b, {rc[2]}, {rr[2]}, o, 1.0 / 3.0);
  double num = 0, den = 0;
  std::map<std::string, std::vector<float>> va;
  g_all.for_each([&](const std::string& n, const Tensor& t) { va[n] = t.to_floats(); });
  g_acc.for_each([&](const std::string& n, const Tensor& t) {
    const auto v = t.to_floats();
    for (size_t i = 0; i < v.size(); ++i) num += std::pow(v[i] - va[n][i], 2), den += std::pow(va[n][i], 2);
  });
  EXPECT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

}  // namespace
