// DPO pieces that need no trainer: the pair losses against formulas written out independently and
// their derivatives against central finite differences in double (sigmoid with and without label
// smoothing, IPO, extreme deltas), metrics, pair micro-batches (labels only on response tokens),
// the pair loader (permutation per epoch, resume, data-parallel striding) and the reference
// log-prob store (computed = per-pair forwards, reused, recomputed when data or model change).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <span>

#include <stdlib.h>

#include "core/check.h"
#include "data/indexed_dataset.h"
#include "io/safetensors.h"
#include "model/qwen3_model.h"
#include "train/dpo.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

// ---- losses -------------------------------------------------------------------------------------

// Plain formulas, no shared code: -log(1/(1+exp(-x))) written directly (inputs kept moderate).
double plain_loss(const DpoOptions& o, const PairLogps& p) {
  const double x = o.beta * ((p.chosen - p.ref_chosen) - (p.rejected - p.ref_rejected));
  if (o.loss_type == DpoLossType::kIpo) {
    const double u = x / o.beta - 1.0 / (2.0 * o.beta);
    return u * u;
  }
  const double e = o.label_smoothing;
  return -(1 - e) * std::log(1.0 / (1.0 + std::exp(-x))) - e * std::log(1.0 / (1.0 + std::exp(x)));
}

TEST(DpoLoss, ValuesMatchPlainFormulasAndDerivativesMatchFiniteDifferences) {
  std::mt19937 rng(5);
  std::normal_distribution<double> n(0.0, 3.0);
  int checked = 0;
  for (DpoLossType t : {DpoLossType::kSigmoid, DpoLossType::kIpo}) {
    for (double beta : {0.05, 0.1, 0.5, 2.0}) {
      for (double eps : {0.0, 0.1, 0.3}) {
        if (t == DpoLossType::kIpo && eps != 0.0) continue;
        DpoOptions o{beta, eps, t};
        for (int k = 0; k < 6; ++k) {
          PairLogps p{-20 + n(rng), -22 + n(rng), -21 + n(rng), -21 + n(rng)};
          const PairLoss l = dpo_pair_loss(o, p);
          EXPECT_NEAR(l.loss, plain_loss(o, p), 1e-12 * std::max(1.0, l.loss));
          EXPECT_NEAR(l.reward_chosen, beta * (p.chosen - p.ref_chosen), 1e-12);
          EXPECT_NEAR(l.reward_rejected, beta * (p.rejected - p.ref_rejected), 1e-12);
          EXPECT_NEAR(l.delta, l.reward_chosen - l.reward_rejected, 1e-12);
          const double h = 1e-5;
          PairLogps a = p, b = p;
          a.chosen += h, b.chosen -= h;
          const double fd_c = (plain_loss(o, a) - plain_loss(o, b)) / (2 * h);
          a = p, b = p;
          a.rejected += h, b.rejected -= h;
          const double fd_r = (plain_loss(o, a) - plain_loss(o, b)) / (2 * h);
          EXPECT_NEAR(l.d_chosen, fd_c, 1e-7 * std::max(1.0, std::abs(fd_c)));
          EXPECT_NEAR(l.d_rejected, fd_r, 1e-7 * std::max(1.0, std::abs(fd_r)));
          // The reference log-probs enter with the opposite sign.
          a = p, b = p;
          a.ref_chosen += h, b.ref_chosen -= h;
          EXPECT_NEAR((plain_loss(o, a) - plain_loss(o, b)) / (2 * h), -fd_c, 1e-6 * std::max(1.0, std::abs(fd_c)));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * (3 * 4 + 4));
}

TEST(DpoLoss, KnownPointsAndExtremes) {
  DpoOptions o;
  o.beta = 0.1;
  PairLoss l = dpo_pair_loss(o, {-10, -10, -10, -10});  // policy == reference
  EXPECT_NEAR(l.loss, std::log(2.0), 1e-15);
  EXPECT_NEAR(l.d_chosen, -0.05, 1e-15);  // -beta * sigmoid(0)
  EXPECT_NEAR(l.d_rejected, 0.05, 1e-15);
  // Huge deltas: no overflow, loss -> 0 or -> -delta, gradients -> 0 or -> -beta.
  l = dpo_pair_loss(o, {0, -20000, 0, 0});  // delta = 2000
  EXPECT_EQ(l.loss, 0.0);
  EXPECT_EQ(l.d_chosen, -0.0);
  l = dpo_pair_loss(o, {-20000, 0, 0, 0});  // delta = -2000
  EXPECT_NEAR(l.loss, 2000.0, 1e-9);
  EXPECT_NEAR(l.d_chosen, -0.1, 1e-15);
  EXPECT_TRUE(std::isfinite(l.loss));
  // Label smoothing keeps a floor and pushes back when delta is large.
  o.label_smoothing = 0.2;
  l = dpo_pair_loss(o, {0, -2000, 0, 0});  // delta = 200
  EXPECT_NEAR(l.loss, 0.2 * 200, 1e-9);
  EXPECT_NEAR(l.d_chosen, 0.2 * 0.1, 1e-12);  // positive: pulls chosen back down
  // IPO: zero loss and zero gradient at delta/beta = 1/(2 beta).
  DpoOptions ipo{0.5, 0.0, DpoLossType::kIpo};
  l = dpo_pair_loss(ipo, {1.0, 0.0, 0.0, 0.0});  // delta/beta = 1 = 1/(2*0.5)
  EXPECT_NEAR(l.loss, 0.0, 1e-15);
  EXPECT_NEAR(l.d_chosen, 0.0, 1e-15);
  l = dpo_pair_loss(ipo, {0.0, 0.0, 0.0, 0.0});
  EXPECT_NEAR(l.loss, 1.0, 1e-15);
  EXPECT_NEAR(l.d_chosen, -2.0, 1e-15);  // 2 * (0 - 1)
}

TEST(DpoLoss, OptionsAreValidated) {
  EXPECT_NO_THROW((DpoOptions{0.1, 0.0, DpoLossType::kSigmoid}.validate("x.yaml")));
  EXPECT_THROW((DpoOptions{0.0, 0.0, DpoLossType::kSigmoid}.validate("x.yaml")), Error);
  EXPECT_THROW((DpoOptions{0.1, 0.5, DpoLossType::kSigmoid}.validate("x.yaml")), Error);
  EXPECT_THROW((DpoOptions{0.1, -0.1, DpoLossType::kSigmoid}.validate("x.yaml")), Error);
  EXPECT_THROW((DpoOptions{0.1, 0.1, DpoLossType::kIpo}.validate("x.yaml")), Error);
  try {
    DpoOptions{-1.0, 0.0, DpoLossType::kSigmoid}.validate("run.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.yaml"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("beta"), std::string::npos);
  }
  EXPECT_EQ(parse_dpo_loss_type("ipo"), DpoLossType::kIpo);
  EXPECT_EQ(parse_dpo_loss_type("sigmoid"), DpoLossType::kSigmoid);
  EXPECT_THROW(parse_dpo_loss_type("hinge"), Error);
  EXPECT_EQ(parse_dpo_reference("online"), DpoReference::kOnline);
  EXPECT_THROW(parse_dpo_reference("none"), Error);
}

TEST(DpoMetrics, MeansAccuracyAndMerge) {
  DpoOptions o;
  o.beta = 1.0;
  DpoMetrics a, b;
  const PairLogps p1{-1, -3, -2, -2}, p2{-5, -4, -5, -5}, p3{-2, -2, -2, -2};  // delta 2, -1, 0
  a.add(p1, dpo_pair_loss(o, p1));
  a.add(p2, dpo_pair_loss(o, p2));
  b.add(p3, dpo_pair_loss(o, p3));
  a.merge(b);
  EXPECT_EQ(a.pairs, 3);
  const nlohmann::json j = a.to_json();
  EXPECT_NEAR(j["rewards/accuracy"].get<double>(), 1.0 / 3.0, 1e-15);  // the tie counts as wrong
  EXPECT_NEAR(j["rewards/chosen"].get<double>(), (1 + 0 + 0) / 3.0, 1e-15);
  EXPECT_NEAR(j["rewards/rejected"].get<double>(), (-1 + 1 + 0) / 3.0, 1e-15);
  EXPECT_NEAR(j["rewards/margins"].get<double>(), (2 - 1 + 0) / 3.0, 1e-15);
  EXPECT_NEAR(j["logps/chosen"].get<double>(), -8.0 / 3.0, 1e-15);
  EXPECT_NEAR(j["logps/rejected"].get<double>(), -9.0 / 3.0, 1e-15);
  const double want = (-std::log(1 / (1 + std::exp(-2.0))) - std::log(1 / (1 + std::exp(1.0))) + std::log(2.0)) / 3;
  EXPECT_NEAR(j["loss"].get<double>(), want, 1e-12);
  EXPECT_EQ(a.scalars("train/").size(), 7u);
  EXPECT_EQ(a.scalars("train/")[0].first.rfind("train/", 0), 0u);
  EXPECT_EQ(DpoMetrics().to_json()["loss"].get<double>(), 0.0);  // no pairs: zeros, no NaN
}

// ---- pair batches -------------------------------------------------------------------------------

PreferencePair pair_of(std::vector<int32_t> c, std::vector<int32_t> cm, std::vector<int32_t> r,
                       std::vector<int32_t> rm) {
  return {std::move(c), std::move(r), std::move(cm), std::move(rm)};
}

TEST(DpoBatch, LabelsOnlyOnResponseTokensAndDocumentsInPairOrder) {
  const std::vector<PreferencePair> pairs = {
      pair_of({5, 6, 7, 8}, {0, 0, 1, 1}, {5, 6, 9}, {0, 0, 1}),
      pair_of({1, 2}, {0, 1}, {3, 4, 4, 4, 2}, {0, 1, 0, 1, 1}),  // a gap in the rejected mask
  };
  PairBatch pb = make_pair_batch(pairs, {10, 3}, Device::cpu());
  EXPECT_EQ(pb.cu_seqlens, (std::vector<int32_t>{0, 4, 7, 9, 14}));
  EXPECT_EQ(pb.num_pairs(), 2);
  EXPECT_EQ(pb.pair_ids, (std::vector<int64_t>{10, 3}));
  const int32_t I = kIgnoreLabel;
  EXPECT_EQ(pb.labels, (std::vector<int32_t>{I, 7, 8, I, I, 9, I, 2, I, 4, I, 4, 2, I}));
  EXPECT_EQ(pb.response_tokens, (std::vector<int64_t>{2, 1, 1, 3}));
  std::vector<int32_t> pos, lab;
  for (int64_t t = 0; t < pb.batch.num_tokens(); ++t) {
    pos.push_back(static_cast<int32_t>(pb.batch.positions.get(t)));
    lab.push_back(static_cast<int32_t>(pb.batch.labels.get(t)));
    EXPECT_EQ(pb.batch.loss_weights.get(t), 0.0);
  }
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4}));
  EXPECT_EQ(lab, pb.labels);
  EXPECT_EQ(pb.batch.max_seqlen, 5);
  EXPECT_NEAR(pair_batch_mean_attended(pb), (10.0 + 6 + 3 + 15) / 14.0, 1e-12);
  EXPECT_NO_THROW(pb.batch.validate(16));

  // Sequence sums and weights follow the documents.
  std::vector<float> lp(14);
  for (size_t t = 0; t < lp.size(); ++t) lp[t] = pb.labels[t] == I ? 0.0f : -0.25f * static_cast<float>(t + 1);
  const std::vector<double> s = sequence_logps(Tensor::from_floats(lp, {14}), pb.cu_seqlens);
  EXPECT_EQ(s, (std::vector<double>{-0.5 - 0.75, -1.5, -2.0, -2.5 - 3.0 - 3.25}));
  const std::vector<float> w = dpo_token_weights(pb, {1.0, -2.0, 0.5, 4.0});
  EXPECT_EQ(w, (std::vector<float>{0, -1, -1, 0, 0, 2, 0, -0.5f, 0, -4, 0, -4, -4, 0}));
  EXPECT_THROW(dpo_token_weights(pb, {1.0, 2.0}), Error);
}

TEST(DpoBatch, BadPairsAreRejected) {
  // Only the first token is a response token: nothing can predict it.
  EXPECT_THROW(make_pair_batch({pair_of({1, 2, 3}, {1, 0, 0}, {1, 2}, {0, 1})}, {0}, Device::cpu()), Error);
  EXPECT_THROW(make_pair_batch({pair_of({1, 2, 3}, {0, 1}, {1, 2}, {0, 1})}, {0}, Device::cpu()), Error);
  EXPECT_THROW(make_pair_batch({pair_of({}, {}, {1, 2}, {0, 1})}, {0}, Device::cpu()), Error);
  try {
    make_pair_batch({pair_of({1, 2}, {0, 1}, {1, 2}, {0, 0})}, {42}, Device::cpu());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pair 42"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("rejected"), std::string::npos);
  }
}

// ---- pair loader --------------------------------------------------------------------------------

TEST(PairLoader, EachEpochIsASeededPermutationWithTheShortTailDropped) {
  PairLoaderOptions o;
  o.pairs_per_batch = 3;
  o.seed = 9;
  PairLoader l(10, o);
  std::vector<int64_t> ids;
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int b = 0; b < 6; ++b) {
    ASSERT_TRUE(l.next(&ids));
    (b < 3 ? epoch0 : epoch1).push_back(ids);
  }
  EXPECT_EQ(l.epoch(), 1);
  std::set<int64_t> seen0, seen1;
  for (auto& v : epoch0) {
    seen0.insert(v.begin(), v.end());
    EXPECT_EQ(v.size(), 3u);
  }
  for (auto& v : epoch1) seen1.insert(v.begin(), v.end());
  EXPECT_EQ(seen0.size(), 9u);  // 9 distinct pairs, the 10th (tail) dropped
  EXPECT_EQ(seen1.size(), 9u);
  EXPECT_NE(epoch0, epoch1);
  const std::vector<int64_t> ord = l.epoch_order(0);
  EXPECT_EQ(std::vector<int64_t>(ord.begin(), ord.begin() + 3), epoch0[0]);
  std::vector<int64_t> sorted = ord;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i);
  // Same seed, same order; another seed, another order.
  EXPECT_EQ(PairLoader(10, o).epoch_order(3), l.epoch_order(3));
  o.seed = 10;
  EXPECT_NE(PairLoader(10, o).epoch_order(0), ord);
}

TEST(PairLoader, StateRestoresTheStreamAndChecksTheData) {
  PairLoaderOptions o;
  o.pairs_per_batch = 2;
  PairLoader a(7, o);
  std::vector<int64_t> ids;
  for (int b = 0; b < 5; ++b) a.next(&ids);
  const nlohmann::json st = a.state();
  std::vector<std::vector<int64_t>> rest_a, rest_b;
  for (int b = 0; b < 6; ++b) a.next(&ids), rest_a.push_back(ids);
  PairLoader b(7, o);
  b.load_state(st);
  for (int i = 0; i < 6; ++i) b.next(&ids), rest_b.push_back(ids);
  EXPECT_EQ(rest_a, rest_b);
  PairLoader other(8, o);
  EXPECT_THROW(other.load_state(st), Error);
  o.pairs_per_batch = 3;
  PairLoader other2(7, o);
  EXPECT_THROW(other2.load_state(st), Error);
}

TEST(PairLoader, DataParallelRanksSplitTheGlobalStream) {
  PairLoaderOptions o;
  o.pairs_per_batch = 2;
  o.seed = 4;
  PairLoader single(11, o);
  std::vector<std::vector<int64_t>> global;
  std::vector<int64_t> ids;
  for (int b = 0; b < 9; ++b) single.next(&ids), global.push_back(ids);
  for (int r = 0; r < 3; ++r) {
    o.dp_rank = r, o.dp_size = 3;
    PairLoader l(11, o);
    for (int b = 0; b < 3; ++b) {
      ASSERT_TRUE(l.next(&ids));
      EXPECT_EQ(ids, global[b * 3 + r]) << "rank " << r << " batch " << b;
    }
  }
}

TEST(PairLoader, UnshuffledOnePassKeepsTheTail) {
  PairLoaderOptions o;
  o.pairs_per_batch = 4;
  o.shuffle = false;
  o.max_epochs = 1;
  PairLoader l(6, o);
  std::vector<int64_t> ids;
  ASSERT_TRUE(l.next(&ids));
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2, 3}));
  ASSERT_TRUE(l.next(&ids));
  EXPECT_EQ(ids, (std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(l.next(&ids));
  EXPECT_THROW(PairLoader(0, o), Error);
}

// ---- reference store ----------------------------------------------------------------------------

ModelConfig small_config() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.intermediate_size = 12;
  c.moe_intermediate_size = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000.0;
  c.tie_word_embeddings = false;
  c.router_aux_loss_coef = 0.01;
  return c;
}

struct TmpDir {
  std::string path;
  TmpDir() {
    char t[] = "/tmp/mt_dpo_XXXXXX";
    path = ::mkdtemp(t);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// Writes PREFIX (+ _mask) with `n` pairs of random lengths; prompt masked 0, response 1.
std::vector<PreferencePair> write_pairs(const std::string& prefix, int n, uint32_t seed, int64_t V) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1), len(1, 5);
  IndexedDatasetWriter w(prefix, IdxDType::kU16), m(mask_prefix(prefix), IdxDType::kU8);
  std::vector<PreferencePair> out;
  for (int i = 0; i < n; ++i) {
    PreferencePair p;
    const int prompt = len(rng);
    std::vector<int32_t> pr;
    for (int k = 0; k < prompt; ++k) pr.push_back(tok(rng));
    for (int side = 0; side < 2; ++side) {
      std::vector<int32_t> ids = pr, mask(pr.size(), 0);
      for (int k = len(rng); k > 0; --k) ids.push_back(tok(rng)), mask.push_back(1);
      std::vector<uint8_t> m8(mask.begin(), mask.end());
      w.add_sequence(std::span<const int32_t>(ids));
      m.add_sequence(std::span<const uint8_t>(m8));
      (side == 0 ? p.chosen : p.rejected) = ids;
      (side == 0 ? p.chosen_mask : p.rejected_mask) = mask;
    }
    w.end_document(), m.end_document();
    out.push_back(p);
  }
  w.commit(), m.commit();
  return out;
}

ModelParams random_model(const ModelConfig& c, uint64_t seed) {
  ModelParams p = ModelParams::allocate(c, DType::kF32, Device::cpu());
  init_params_random(p, seed, 0.5f);
  return p;
}

TEST(DpoReference, ComputedPackedEqualsOnePairAtATimeAndIsReusedOrRecomputed) {
  TmpDir dir;
  const ModelConfig cfg = small_config();
  const std::string prefix = dir.path + "/pairs";
  const std::vector<PreferencePair> pairs = write_pairs(prefix, 7, 1, cfg.vocab_size);
  ModelParams p = random_model(cfg, 3);
  Qwen3Model model(p);
  Context ctx;
  const std::string path = dir.path + "/ref/train.safetensors";
  const std::string fp = params_fingerprint(p);
  ReferenceLogps r = ensure_reference_logps(ctx, model, prefix, fp, path, /*max_tokens=*/20, Device::cpu());
  ASSERT_EQ(r.size(), 7);
  ASSERT_TRUE(fs::exists(path));
  for (int i = 0; i < 7; ++i) {
    PairBatch one = make_pair_batch({pairs[i]}, {i}, Device::cpu());
    const std::vector<double> s = sequence_logps(model.token_logprobs(ctx, one.batch), one.cu_seqlens);
    EXPECT_NEAR(r.chosen[i], s[0], 1e-5 * std::abs(s[0])) << i;
    EXPECT_NEAR(r.rejected[i], s[1], 1e-5 * std::abs(s[1])) << i;
    EXPECT_LT(r.chosen[i], 0.0);
  }
  // Reused: a model with other weights but the same claimed fingerprint gets the stored values.
  ModelParams p2 = random_model(cfg, 4);
  Qwen3Model model2(p2);
  ReferenceLogps again = ensure_reference_logps(ctx, model2, prefix, fp, path, 20, Device::cpu());
  EXPECT_EQ(again.chosen, r.chosen);
  EXPECT_EQ(again.rejected, r.rejected);
  // Another model fingerprint: recomputed with that model.
  const std::string fp2 = params_fingerprint(p2);
  EXPECT_NE(fp2, fp);
  ReferenceLogps r2 = ensure_reference_logps(ctx, model2, prefix, fp2, path, 1000, Device::cpu());
  EXPECT_NE(r2.chosen, r.chosen);
  EXPECT_EQ(load_reference_logps(path, dataset_fingerprint(prefix), fp2)->chosen, r2.chosen);
  EXPECT_FALSE(load_reference_logps(path, dataset_fingerprint(prefix), fp).has_value());
  // Other data under the same prefix: another dataset fingerprint, recomputed.
  const std::string dfp = dataset_fingerprint(prefix);
  fs::remove(idx_path(prefix)), fs::remove(bin_path(prefix));
  fs::remove(idx_path(mask_prefix(prefix))), fs::remove(bin_path(mask_prefix(prefix)));
  write_pairs(prefix, 7, 2, cfg.vocab_size);
  EXPECT_NE(dataset_fingerprint(prefix), dfp);
  EXPECT_FALSE(load_reference_logps(path, dataset_fingerprint(prefix), fp2).has_value());
  ReferenceLogps r3 = ensure_reference_logps(ctx, model2, prefix, fp2, path, 1000, Device::cpu());
  EXPECT_NE(r3.chosen, r2.chosen);
  EXPECT_EQ(load_reference_logps(path, dataset_fingerprint(prefix), fp2)->rejected, r3.rejected);
  // A file that is not a reference store is an error naming it.
  std::ofstream(dir.path + "/bad.safetensors") << "garbage";
  EXPECT_THROW(load_reference_logps(dir.path + "/bad.safetensors", "a", "b"), Error);
}

TEST(DpoReference, FingerprintsSeeContentChanges) {
  TmpDir dir;
  const ModelConfig cfg = small_config();
  ModelParams p = random_model(cfg, 3);
  const std::string a = params_fingerprint(p);
  EXPECT_EQ(params_fingerprint(p), a);
  p.layers[1].experts_down.set(5, p.layers[1].experts_down.get(5) + 1e-3);
  EXPECT_NE(params_fingerprint(p), a);
  // HF directory: config bytes and safetensors content (inside the sampled chunks) count.
  const std::string d = dir.path + "/hf";
  fs::create_directories(d);
  std::ofstream(d + "/config.json") << "{\"a\": 1}";
  write_safetensors(d + "/model.safetensors", {tensor_write_spec("w", p.embed)});
  const std::string h1 = hf_checkpoint_fingerprint(d);
  EXPECT_EQ(hf_checkpoint_fingerprint(d), h1);
  p.embed.set(0, p.embed.get(0) + 1.0);
  write_safetensors(d + "/model.safetensors", {tensor_write_spec("w", p.embed)});
  const std::string h2 = hf_checkpoint_fingerprint(d);
  EXPECT_NE(h2, h1);
  std::ofstream(d + "/config.json") << "{\"a\": 2}";
  EXPECT_NE(hf_checkpoint_fingerprint(d), h2);
  // The starting model of a run: random init depends on the seed, not on anything resumed.
  TrainConfig tc;
  tc.model.preset = "tiny-moe";
  const std::string r1 = reference_model_fingerprint(tc);
  tc.optimizer.lr = 1.0;
  EXPECT_EQ(reference_model_fingerprint(tc), r1);
  tc.training.seed = 99;
  EXPECT_NE(reference_model_fingerprint(tc), r1);
}

TEST(DpoObjective, OnlineReferenceEqualsPrecomputedAndEvaluationIsDeterministic) {
  TmpDir dir;
  const ModelConfig cfg = small_config();
  write_pairs(dir.path + "/train", 6, 11, cfg.vocab_size);
  write_pairs(dir.path + "/valid", 5, 12, cfg.vocab_size);
  ModelParams start = random_model(cfg, 7);
  PairLoaderOptions lo;
  lo.pairs_per_batch = 2;
  Context ctx;
  DpoSettings s;
  s.loss.beta = 0.2;
  DpoObjective pre(s, dir.path + "/train", dir.path + "/valid", lo, dir.path + "/run", Device::cpu());
  pre.prepare_reference(ctx, start, params_fingerprint(start), 64);
  EXPECT_TRUE(fs::exists(dir.path + "/run/dpo_reference/train.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path + "/run/dpo_reference/valid.safetensors"));
  s.reference = DpoReference::kOnline;
  DpoObjective onl(s, dir.path + "/train", dir.path + "/valid", lo, dir.path + "/run2", Device::cpu());
  onl.prepare_reference(ctx, start, "unused", 64);
  EXPECT_FALSE(fs::exists(dir.path + "/run2/dpo_reference"));

  // The policy starts at the reference: zero rewards, loss log 2, accuracy 0.
  ModelParams policy = clone_params(start);
  Qwen3Model pm(policy);
  const DpoMetrics m0 = pre.evaluate(ctx, pm, 0);
  EXPECT_EQ(m0.pairs, 5);
  EXPECT_NEAR(m0.mean(m0.loss), std::log(2.0), 1e-5);
  EXPECT_NEAR(m0.mean(m0.margin), 0.0, 1e-5);
  // Move the policy: online and precomputed agree, and evaluation repeats exactly.
  policy.final_norm.set(3, policy.final_norm.get(3) * 1.5);
  policy.embed.set(7, policy.embed.get(7) - 0.3);
  const DpoMetrics a = pre.evaluate(ctx, pm, 0), b = onl.evaluate(ctx, pm, 0), c = pre.evaluate(ctx, pm, 0);
  EXPECT_GT(std::abs(a.mean(a.margin)), 1e-4);
  EXPECT_NEAR(a.mean(a.loss), b.mean(b.loss), 1e-5);
  EXPECT_NEAR(a.mean(a.margin), b.mean(b.margin), 1e-5);
  EXPECT_EQ(a.to_json(), c.to_json());
  EXPECT_EQ(pre.evaluate(ctx, pm, 1).pairs, 2);  // first micro-batch only

  // Training batches: the loader state resumes the same stream.
  PairBatch b1, b2;
  ASSERT_TRUE(pre.next_batch(&b1));
  const nlohmann::json st = pre.state();
  ASSERT_TRUE(pre.next_batch(&b1));
  onl.load_state(st);
  ASSERT_TRUE(onl.next_batch(&b2));
  EXPECT_EQ(b1.pair_ids, b2.pair_ids);
  // Online and precomputed give the same gradients.
  ModelParams g1 = allocate_gradients(cfg, Device::cpu()), g2 = allocate_gradients(cfg, Device::cpu());
  const DpoMicroResult r1 = pre.forward_backward(ctx, pm, g1, b1, 0.5);
  const DpoMicroResult r2 = onl.forward_backward(ctx, pm, g2, b2, 0.5);
  EXPECT_NEAR(r1.metrics.loss, r2.metrics.loss, 1e-5);
  double num = 0, den = 0;
  std::vector<float> v2;
  g2.for_each([&](const std::string&, const Tensor& t) {
    for (float x : t.to_floats()) v2.push_back(x);
  });
  size_t k = 0;
  g1.for_each([&](const std::string&, const Tensor& t) {
    for (float x : t.to_floats()) num += (x - v2[k]) * (x - v2[k]), den += double(x) * x, ++k;
  });
  EXPECT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

}  // namespace
