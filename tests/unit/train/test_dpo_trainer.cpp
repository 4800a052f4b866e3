// The DPO objective as the trainer drives it: AdamW steps of dpo_forward_backward on one fixed
// batch of pairs reduce the DPO loss (sigmoid and IPO) and make every pair's margin positive; the
// `dpo:` config section (defaults, YAML, errors); the run picture's DPO panels.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "core/check.h"
#include "model/qwen3_model.h"
#include "optim/adamw.h"
#include "train/config.h"
#include "train/dpo.h"
#include "train/plot_svg.h"

using namespace moetrain;

namespace {

std::vector<PreferencePair> random_pairs(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(vocab) - 1);
  std::vector<PreferencePair> out;
  for (int i = 0; i < n; ++i) {
    PreferencePair p;
    const int np = 3 + i % 3, nc = 4 + i % 2, nr = 3 + (i + 1) % 3;
    for (int k = 0; k < np; ++k) p.chosen.push_back(tok(rng));
    p.rejected = p.chosen;
    for (int k = 0; k < nc; ++k) p.chosen.push_back(tok(rng));
    for (int k = 0; k < nr; ++k) p.rejected.push_back(tok(rng));
    p.chosen_mask.assign(p.chosen.size(), 1), p.rejected_mask.assign(p.rejected.size(), 1);
    std::fill(p.chosen_mask.begin(), p.chosen_mask.begin() + np, 0);
    std::fill(p.rejected_mask.begin(), p.rejected_mask.begin() + np, 0);
    out.push_back(p);
  }
  return out;
}

// Losses over `steps` AdamW updates on one fixed batch; the reference is the starting model.
std::vector<DpoMetrics> train_fixed_batch(const DpoOptions& opt, int steps) {
  Context ctx(Device::cpu(), 7);
  ModelConfig mc = ModelConfig::preset("tiny-moe");
  ModelParams params = ModelParams::allocate(mc, DType::kF32, Device::cpu());
  init_params_random(params, 11, 0.02f);
  ModelParams grads = allocate_gradients(mc, Device::cpu());
  ModelOptions mo;
  mo.aux_coef = 0.0f;
  Qwen3Model model(params, mo);
  std::map<std::string, Tensor> g;
  grads.for_each([&](const std::string& n, Tensor& t) { g[n] = t; });
  std::vector<OptimParam> ps;
  params.for_each([&](const std::string& n, Tensor& t) { ps.push_back({n, t, g.at(n)}); });
  AdamW adam(std::move(ps), AdamWConfig{});

  const std::vector<PreferencePair> pairs = random_pairs(4, mc.vocab_size, 3);
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  const PairBatch ref_pb = make_pair_batch(pairs, ids, Device::cpu());
  const std::vector<double> ref = sequence_logps(model.token_logprobs(ctx, ref_pb.batch), ref_pb.cu_seqlens);
  std::vector<double> rc, rr;
  for (size_t i = 0; 2 * i < ref.size(); ++i) rc.push_back(ref[2 * i]), rr.push_back(ref[2 * i + 1]);

  std::vector<DpoMetrics> out;
  for (int s = 0; s <= steps; ++s) {
    PairBatch pb = make_pair_batch(pairs, ids, Device::cpu());
    const DpoMicroResult r = dpo_forward_backward(ctx, model, grads, pb, rc, rr, opt, 1.0 / 4.0);
    out.push_back(r.metrics);
    if (s < steps) adam.step(ctx, 3e-3, 1.0);
    zero_gradients(grads);
  }
  return out;
}

}  // namespace

TEST(DpoTrainerSteps, SigmoidLossFallsAndMarginsGrow) {
  DpoOptions o;
  o.beta = 0.5;
  const std::vector<DpoMetrics> m = train_fixed_batch(o, 8);
  // Step 0: policy == reference, so delta is 0 and the loss log 2.
  EXPECT_NEAR(m.front().mean(m.front().loss), std::log(2.0), 1e-5);
  EXPECT_NEAR(m.front().mean(m.front().margin), 0.0, 1e-5);
  for (size_t i = 1; i < m.size(); ++i) EXPECT_LT(m[i].mean(m[i].loss), m[i - 1].mean(m[i - 1].loss)) << "step " << i;
  EXPECT_LT(m.back().mean(m.back().loss), 0.5);
  EXPECT_GT(m.back().mean(m.back().margin), 0.3);
  EXPECT_EQ(m.back().accuracy(), 1.0);
  EXPECT_GT(m.back().mean(m.back().reward_chosen), m.back().mean(m.back().reward_rejected));
}

TEST(DpoTrainerSteps, IpoLossFalls) {
  DpoOptions o;
  o.beta = 0.5;
  o.loss_type = DpoLossType::kIpo;
  const std::vector<DpoMetrics> m = train_fixed_batch(o, 6);
  EXPECT_NEAR(m.front().mean(m.front().loss), 1.0, 1e-4);  // (0 - 1/(2 beta))^2
  EXPECT_LT(m.back().mean(m.back().loss), 0.5 * m.front().mean(m.front().loss));
  EXPECT_GT(m.back().mean(m.back().margin), 0.0);
}

TEST(DpoConfig, SectionDefaultsYamlAndErrors) {
  const std::string base = "model: {preset: tiny-moe}\ndata: {mock_data: true}\ntraining: {objective: dpo}\n";
  TrainConfig d = TrainConfig::from_yaml_string(base, "t.yaml");
  EXPECT_EQ(d.dpo.beta, 0.1);
  EXPECT_EQ(d.dpo.loss_type, "sigmoid");
  EXPECT_EQ(d.dpo.label_smoothing, 0.0);
  EXPECT_EQ(d.dpo.reference, "precomputed");
  TrainConfig c = TrainConfig::from_yaml_string(
      base + "dpo: {beta: 0.25, loss_type: ipo, reference: online}\n", "t.yaml", {"dpo.beta=0.3"});
  EXPECT_EQ(c.dpo.beta, 0.3);
  EXPECT_EQ(c.dpo.loss_type, "ipo");
  EXPECT_EQ(c.dpo.reference, "online");
  const std::string y = c.to_yaml();
  EXPECT_NE(y.find("dpo:"), std::string::npos);
  EXPECT_EQ(TrainConfig::from_yaml_string(y, "resolved.yaml").dpo.loss_type, "ipo");
  auto err = [&](const std::string& extra) {
    try {
      TrainConfig::from_yaml_string(base + extra, "t.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("dpo: {loss_type: hinge}\n").find("dpo.loss_type is 'hinge', expected one of sigmoid, ipo"), std::string::npos);
  EXPECT_NE(err("dpo: {beta: 0}\n").find("dpo.beta must be > 0"), std::string::npos);
  EXPECT_NE(err("dpo: {label_smoothing: 0.5}\n").find("dpo.label_smoothing must be in [0, 0.5)"), std::string::npos);
  EXPECT_NE(err("dpo: {loss_type: ipo, label_smoothing: 0.1}\n").find("sigmoid only"), std::string::npos);
  EXPECT_NE(err("dpo: {refrence: online}\n").find("did you mean 'dpo.reference'"), std::string::npos);
  EXPECT_NE(config_reference_markdown().find("### dpo"), std::string::npos);
}

TEST(DpoPlot, AccuracyAndMarginPanelsOnlyForDpoRuns) {
  std::vector<nlohmann::json> recs = {
      {{"type", "train"}, {"step", 1}, {"loss", 0.69}, {"lr", 1e-3}, {"grad_norm", 1.0}},
      {{"type", "valid"}, {"step", 1}, {"loss", 0.69}}};
  const std::string plain = render_training_svg(plot_data_from_metrics(recs), "t");
  EXPECT_EQ(plain.find("preference accuracy"), std::string::npos);
  recs[0]["rewards/accuracy"] = 0.5, recs[0]["rewards/margins"] = 0.01;
  recs[1]["rewards/accuracy"] = 0.75, recs[1]["rewards/margins"] = 0.2;
  recs.push_back({{"type", "valid"}, {"step", 2}, {"loss", 0.6}, {"rewards/accuracy", 0.9}, {"rewards/margins", 0.4}});
  const PlotData d = plot_data_from_metrics(recs);
  ASSERT_EQ(d.val_accuracy.size(), 2u);
  EXPECT_EQ(d.val_accuracy[1].second, 0.9);
  EXPECT_EQ(d.train_margin[0].second, 0.01);
  const std::string svg = render_training_svg(d, "t");
  EXPECT_NE(svg.find("preference accuracy"), std::string::npos);
  EXPECT_NE(svg.find("class=\"validation margin\""), std::string::npos);
}
