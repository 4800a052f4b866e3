// DPO against PyTorch: fixtures in tests/reference/fixtures/dpo/<case> (made on the GPU machine by
// tests/reference/make_dpo_fixtures.py, transformers 5.17, fp32) hold a small random Qwen3-MoE
// policy, pairs with response masks, reference and policy log-probs, the DPO loss written plainly
// in PyTorch, the aux loss and every gradient of loss + coef * aux. The CPU engine must match
// log-probs and losses to 1e-5 relative and every gradient to 1e-4 relative to its norm.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "train/dpo.h"

using namespace moetrain;

namespace {

const std::vector<std::string> kCases = {"sigmoid_smoothed", "ipo_tied"};

std::string fixture_dir(const std::string& c) {
  return std::string(MT_SOURCE_DIR) + "/tests/reference/fixtures/dpo/" + c;
}

std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int32_t>(t.get(i));
  return v;
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get(i);
  return v;
}

double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  double num = 0, den = 0;
  for (int64_t i = 0; i < bc.numel(); ++i) {
    const double x = ac.get(i), y = bc.get(i);
    num += (x - y) * (x - y), den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class DpoFixture : public testing::TestWithParam<std::string> {};

TEST_P(DpoFixture, LogprobsLossAndGradientsMatchPyTorch) {
  const std::string c = GetParam();
  ASSERT_TRUE(std::filesystem::exists(fixture_dir(c) + "/reference.safetensors"))
      << "missing fixture; regenerate with tests/reference/make_dpo_fixtures.py on the GPU machine";
  ModelParams params = load_hf_checkpoint(fixture_dir(c), DType::kF32, Device::cpu());
  auto ref = SafetensorsFile::open(fixture_dir(c) + "/reference.safetensors");
  const auto& md = ref->metadata();
  DpoOptions opt;
  opt.loss_type = parse_dpo_loss_type(md.at("loss_type"));
  opt.beta = std::stod(md.at("beta"));
  opt.label_smoothing = std::stod(md.at("label_smoothing"));
  const int64_t P = std::stoll(md.at("pairs"));
  std::vector<PreferencePair> pairs;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < P; ++i) {
    const std::string s = std::to_string(i);
    pairs.push_back({ints(ref->tensor("chosen_ids." + s)), ints(ref->tensor("rejected_ids." + s)),
                     ints(ref->tensor("chosen_mask." + s)), ints(ref->tensor("rejected_mask." + s))});
    ids.push_back(i);
  }
  PairBatch pb = make_pair_batch(pairs, ids, Device::cpu());
  const std::vector<double> refc = doubles(ref->tensor("ref_chosen")), refr = doubles(ref->tensor("ref_rejected"));
  const std::vector<double> polc = doubles(ref->tensor("policy_chosen")), polr = doubles(ref->tensor("policy_rejected"));

  Context ctx;
  Qwen3Model model(params);
  // The forward-only path the reference pass uses.
  const std::vector<double> seq = sequence_logps(model.token_logprobs(ctx, pb.batch), pb.cu_seqlens);
  for (int64_t i = 0; i < P; ++i) {
    EXPECT_NEAR(seq[2 * i], polc[i], 1e-5 * std::abs(polc[i])) << c << " pair " << i;
    EXPECT_NEAR(seq[2 * i + 1], polr[i], 1e-5 * std::abs(polr[i])) << c << " pair " << i;
  }

  ModelParams grads = allocate_gradients(params.config, Device::cpu());
  const DpoMicroResult r = dpo_forward_backward(ctx, model, grads, pb, refc, refr, opt, 1.0 / static_cast<double>(P));
  const double want_dpo = ref->tensor("dpo_loss").get(0), want_aux = ref->tensor("aux_loss").get(0);
  EXPECT_NEAR(r.metrics.mean(r.metrics.loss), want_dpo, 1e-5 * std::abs(want_dpo)) << c;
  EXPECT_NEAR(r.forward.aux, want_aux, 1e-5 * std::abs(want_aux)) << c;
  EXPECT_GT(want_aux, 0.5) << "aux must be exercised";
  const std::vector<double> rw_c = doubles(ref->tensor("rewards_chosen"));
  const std::vector<double> rw_r = doubles(ref->tensor("rewards_rejected"));
  double mc = 0, mr = 0, acc = 0;
  for (int64_t i = 0; i < P; ++i) mc += rw_c[i] / P, mr += rw_r[i] / P, acc += (rw_c[i] > rw_r[i]) / double(P);
  EXPECT_NEAR(r.metrics.mean(r.metrics.reward_chosen), mc, 1e-5 * std::max(1.0, std::abs(mc))) << c;
  EXPECT_NEAR(r.metrics.mean(r.metrics.reward_rejected), mr, 1e-5 * std::max(1.0, std::abs(mr))) << c;
  EXPECT_EQ(r.metrics.accuracy(), acc) << c;

  std::map<std::string, Tensor> got;
  for_each_hf_named(grads, [&](const std::string& n, const Tensor& t) { got[n] = t.contiguous(); });
  int compared = 0;
  for (const auto& e : ref->entries()) {
    if (e.name.rfind("grad.", 0) != 0) continue;
    const std::string n = e.name.substr(5);
    ASSERT_TRUE(got.count(n)) << c << " engine has no gradient " << n;
    EXPECT_LT(rel_err(got[n], ref->tensor(e.name)), 1e-4) << c << " " << n;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(got.size())) << c;

  // Discrimination: a 2% change of beta moves the gradients past the tolerance.
  DpoOptions off = opt;
  off.beta *= 1.02;
  ModelParams g2 = allocate_gradients(params.config, Device::cpu());
  PairBatch pb2 = make_pair_batch(pairs, ids, Device::cpu());
  dpo_forward_backward(ctx, model, g2, pb2, refc, refr, off, 1.0 / static_cast<double>(P));
  double worst = 0;
  for_each_hf_named(g2, [&](const std::string& n, const Tensor& t) {
    worst = std::max(worst, rel_err(t.contiguous(), ref->tensor("grad." + n)));
  });
  EXPECT_GT(worst, 1e-4) << c;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DpoFixture, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
