// The model against transformers 5.17: each fixture (tests/reference/fixtures/model/<case>, made by
// tests/reference/make_model_fixtures.py) holds a random model as transformers saved it and the
// logits, loss (mean CE + router_aux_loss_coef * aux) and every parameter gradient transformers
// computed in fp32 for two or three packed documents. The CPU engine must match logits and loss
// to 1e-5 relative error and every gradient to 1e-4 relative to the reference tensor's norm.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "model/qwen3_model.h"

using namespace moetrain;

namespace {

const std::vector<std::string> kCases = {"moe_untied", "moe_tied_nonorm", "moe_sparse_step", "dense"};

std::string fixture_dir(const std::string& c) {
  return std::string(MT_SOURCE_DIR) + "/tests/reference/fixtures/model/" + c;
}

std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int32_t>(t.get(i));
  return v;
}

// ||a - b|| / ||b|| in double.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  double num = 0, den = 0;
  for (int64_t i = 0; i < bc.numel(); ++i) {
    const double x = ac.get(i), y = bc.get(i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Fixture {
  ModelParams params;
  std::shared_ptr<SafetensorsFile> ref;
  Batch batch;
};

Fixture load_fixture(const std::string& c) {
  Fixture f;
  f.params = load_hf_checkpoint(fixture_dir(c), DType::kF32, Device::cpu());
  f.ref = SafetensorsFile::open(fixture_dir(c) + "/reference.safetensors");
  // Rebuild the batch from the stored documents, then take the stored labels as they are
  // (the fixture masks one label inside the first document on top of the shifting).
  const std::vector<int32_t> ids = ints(f.ref->tensor("input_ids"));
  const std::vector<int32_t> cu = ints(f.ref->tensor("cu_seqlens"));
  std::vector<std::vector<int32_t>> docs;
  for (size_t d = 0; d + 1 < cu.size(); ++d) docs.emplace_back(ids.begin() + cu[d], ids.begin() + cu[d + 1]);
  f.batch = Batch::from_documents(docs);
  const std::vector<int32_t> labels = ints(f.ref->tensor("labels"));
  int64_t n = 0;
  for (int32_t l : labels) n += l != kIgnoreLabel;
  std::vector<float> w(labels.size());
  for (size_t t = 0; t < labels.size(); ++t) w[t] = labels[t] != kIgnoreLabel ? 1.0f / static_cast<float>(n) : 0.0f;
  f.batch.labels = Tensor::from_ints(labels, {static_cast<int64_t>(labels.size())});
  f.batch.loss_weights = Tensor::from_floats(w, {static_cast<int64_t>(w.size())});
  EXPECT_EQ(ints(f.batch.positions), ints(f.ref->tensor("positions")));
  return f;
}

// Gradients under transformers' names, cloned.
std::map<std::string, Tensor> hf_grads(const ModelParams& g) {
  std::map<std::string, Tensor> out;
  for_each_hf_named(g, [&](const std::string& n, const Tensor& t) { out[n] = t.contiguous(); });
  return out;
}

class ReferenceFixture : public testing::TestWithParam<std::string> {};

TEST_P(ReferenceFixture, LogitsLossAndGradientsMatchTransformers) {
  const std::string c = GetParam();
  Fixture f = load_fixture(c);
  Context ctx;
  Qwen3Model model(f.params);
  ModelParams grads = allocate_gradients(f.params.config, Device::cpu());
  ForwardResult r = model.forward_backward(ctx, f.batch, grads, /*return_logits=*/true);

  EXPECT_LT(rel_err(r.logits, f.ref->tensor("logits")), 1e-5) << c;
  const double ref_loss = f.ref->tensor("loss").get(0), ref_ce = f.ref->tensor("ce_loss").get(0);
  const double ref_aux = f.ref->tensor("aux_loss").get(0);
  EXPECT_NEAR(r.loss, ref_loss, 1e-5 * std::abs(ref_loss)) << c;
  EXPECT_NEAR(r.ce, ref_ce, 1e-5 * std::abs(ref_ce)) << c;
  EXPECT_NEAR(r.aux, ref_aux, 1e-5 * std::max(1.0, std::abs(ref_aux))) << c;
  if (f.params.config.is_moe()) EXPECT_GT(ref_aux, 0.5) << "aux must be exercised";

  // Every reference gradient has a counterpart and vice versa.
  std::set<std::string> ref_names;
  for (const auto& e : f.ref->entries()) {
    if (e.name.rfind("grad.", 0) == 0) ref_names.insert(e.name.substr(5));
  }
  auto got = hf_grads(grads);
  std::set<std::string> got_names;
  for (auto& [n, t] : got) got_names.insert(n);
  EXPECT_EQ(got_names, ref_names) << c;
  for (auto& [n, t] : got) {
    if (!ref_names.count(n)) continue;
    const Tensor ref = f.ref->tensor("grad." + n);
    const double e = rel_err(t, ref);
    EXPECT_LT(e, 1e-4) << c << " " << n;
  }
}

TEST_P(ReferenceFixture, RecomputeGivesTheSameGradients) {
  const std::string c = GetParam();
  Fixture f = load_fixture(c);
  Context ctx;
  Qwen3Model m0(f.params);
  ModelParams g0 = allocate_gradients(f.params.config, Device::cpu());
  ForwardResult r0 = m0.forward_backward(ctx, f.batch, g0);
  auto a = hf_grads(g0);
  for (Recompute rc : {Recompute::kSelective, Recompute::kFull}) {
    ModelOptions o;
    o.recompute = rc;
    Qwen3Model m1(f.params, o);
    ModelParams g1 = allocate_gradients(f.params.config, Device::cpu());
    ForwardResult r1 = m1.forward_backward(ctx, f.batch, g1);
    EXPECT_EQ(r0.loss, r1.loss) << recompute_name(rc);
    auto b = hf_grads(g1);
    for (auto& [n, t] : a) {
      EXPECT_EQ(t.to_floats(), b[n].to_floats()) << c << " " << recompute_name(rc) << " " << n;
    }
  }
}

TEST_P(ReferenceFixture, TokenLogprobsMatchReferenceLogits) {
  const std::string c = GetParam();
  Fixture f = load_fixture(c);
  Context ctx;
  Qwen3Model model(f.params);
  Tensor lp = model.token_logprobs(ctx, f.batch);
  const Tensor logits = f.ref->tensor("logits");
  const std::vector<int32_t> labels = ints(f.batch.labels);
  const int64_t V = logits.size(1);
  double sum_w = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
    if (labels[t] == kIgnoreLabel) {
      EXPECT_EQ(lp.get(t), 0.0);
      continue;
    }
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits.get(t * V + v));
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits.get(t * V + v) - mx);
    const double want = logits.get(t * V + labels[t]) - mx - std::log(s);
    EXPECT_NEAR(lp.get(t), want, 2e-5 * std::max(1.0, std::abs(want))) << c << " t=" << t;
    sum_w += -want;
  }
  // The mean of -logprob over labelled tokens is the reference CE.
  EXPECT_NEAR(sum_w / static_cast<double>(f.batch.num_labelled()), f.ref->tensor("ce_loss").get(0), 1e-5 * sum_w);
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceFixture, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace

namespace {

// The comparison discriminates: a 1% change of the aux coefficient, or routing weights not
// renormalized, moves loss or gradients past the tolerances above.
TEST(ReferenceFixtureSensitivity, SmallModelChangesAreDetected) {
  Fixture f = load_fixture("moe_untied");
  Context ctx;
  ModelOptions o;
  o.aux_coef = static_cast<float>(f.params.config.router_aux_loss_coef * 1.01);
  Qwen3Model m(f.params, o);
  ModelParams g = allocate_gradients(f.params.config, Device::cpu());
  ForwardResult r = m.forward_backward(ctx, f.batch, g);
  const double ref_loss = f.ref->tensor("loss").get(0);
  EXPECT_GT(std::abs(r.loss - ref_loss), 1e-5 * ref_loss);
  double worst = 0;
  for (auto& [n, t] : hf_grads(g)) worst = std::max(worst, rel_err(t, f.ref->tensor("grad." + n)));
  EXPECT_GT(worst, 1e-4);

  f.params.config.norm_topk_prob = false;
  Qwen3Model m2(f.params);
  ModelParams g2 = allocate_gradients(f.params.config, Device::cpu());
  ForwardResult r2 = m2.forward_backward(ctx, f.batch, g2, true);
  EXPECT_GT(rel_err(r2.logits, f.ref->tensor("logits")), 1e-3);
}

}  // namespace
