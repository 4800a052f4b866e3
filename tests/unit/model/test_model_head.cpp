// The chunked loss head and the recompute policies on the CPU: chunk sizes (1 token, a size that
// does not divide T, the whole batch) give the same loss, logits and gradients as one chunk; the
// fused head of forward_backward equals forward(kTrain) + backward(); the three recompute
// policies give bit-identical results; token_logprobs and ForwardResult::nll agree with logits;
// memory is accounted under activations/workspace/gradients. Independent reference: the
// double-precision model in test_model_ref.h.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/allocator.h"
#include "model/loss_head.h"
#include "model/qwen3_model.h"
#include "test_model_ref.h"
#include "tiny_models.h"

using namespace moetrain;

namespace {

ModelConfig head_config(bool tied) { return test::small_moe_config(tied, 5, /*dense_layer=*/true); }
ModelParams params_for(const ModelConfig& c, uint32_t seed) { return test::random_test_params(c, seed); }
Batch batch_for(int64_t V, const std::vector<int>& lens, uint32_t seed) { return test::random_batch(seed, V, lens); }

double rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.contiguous().to_floats(), y = b.contiguous().to_floats();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * double(x[i] - y[i]), den += double(y[i]) * y[i];
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<std::pair<std::string, Tensor>> named(ModelParams& g) {
  std::vector<std::pair<std::string, Tensor>> out;
  g.for_each([&](const std::string& n, Tensor& t) { out.emplace_back(n, t); });
  return out;
}

struct RunOut {
  ForwardResult r;
  ModelParams g;
};

RunOut run_model(const ModelParams& p, const Batch& b, ModelOptions o, bool split = false) {
  Context ctx;
  Qwen3Model m(p, o);
  RunOut out{{}, allocate_gradients(p.config, Device::cpu())};
  if (split) {
    out.r = m.forward(ctx, b, Pass::kTrain, true);
    m.backward(ctx, out.g);
  } else {
    out.r = m.forward_backward(ctx, b, out.g, true);
  }
  return out;
}

TEST(LossHead, ChunkRowsFollowTokensOrBytes) {
  EXPECT_EQ(loss_head_chunk_rows(100, 1000, DType::kBF16, 7, 0), 7);
  EXPECT_EQ(loss_head_chunk_rows(5, 1000, DType::kBF16, 7, 0), 5);             // never more than T
  EXPECT_EQ(loss_head_chunk_rows(100, 1000, DType::kBF16, 0, 2000 * 10), 10);  // 10 rows of 2000 B
  EXPECT_EQ(loss_head_chunk_rows(100, 1000, DType::kF32, 0, 100), 1);          // at least one row
  // Qwen3 vocabulary, bf16, the 256 MiB default: 883 rows per chunk.
  EXPECT_EQ(loss_head_chunk_rows(1 << 20, 151936, DType::kBF16, 0, size_t{256} << 20), 883);
  // Even chunks: 4096 rows at 883 per chunk need 5 chunks, so 820 rows each (not 4 x 883 + 564).
  EXPECT_EQ(loss_head_chunk_rows(4096, 151936, DType::kBF16, 0, size_t{256} << 20), 820);
  EXPECT_EQ(loss_head_chunk_rows(100, 1000, DType::kBF16, 0, 2000 * 30), 25);  // 30 fit: 4 chunks of 25
  // The default (512 MiB, at most 1024 rows): 1024-row chunks at the Qwen3 vocabulary (297 MiB),
  // 4 at seq 4096 and 8 at 8192; a vocabulary of 512 Ki entries fits 512 rows.
  const size_t def = ModelOptions{}.ce_chunk_bytes;
  EXPECT_EQ(loss_head_chunk_rows(4096, 151936, DType::kBF16, 0, def), 1024);
  EXPECT_EQ(loss_head_chunk_rows(8192, 151936, DType::kBF16, 0, def), 1024);
  EXPECT_EQ(loss_head_chunk_rows(4000, 151936, DType::kBF16, 0, def), 1000);  // 4 even chunks
  EXPECT_EQ(loss_head_chunk_rows(4096, 512 * 1024, DType::kBF16, 0, def), 512);
  EXPECT_EQ(loss_head_chunk_rows(1 << 20, 1000, DType::kBF16, 0, def), kCeChunkMaxRows);
  // With an f32 lm_head gradient both limits double: 2048-row chunks (594 MiB), 2 at seq 4096 and 4 at
  // 8192; a short sequence is one chunk; an explicit size is kept; f32 logits (the CPU) fit 1766 rows
  // of 1 GiB, so 4096 tokens take three even chunks.
  EXPECT_EQ(loss_head_chunk_rows(4096, 151936, DType::kBF16, 0, def, true), 2048);
  EXPECT_EQ(loss_head_chunk_rows(8192, 151936, DType::kBF16, 0, def, true), 2048);
  EXPECT_EQ(loss_head_chunk_rows(1500, 151936, DType::kBF16, 0, def, true), 1500);
  EXPECT_EQ(loss_head_chunk_rows(4096, 151936, DType::kBF16, 700, def, true), 700);
  EXPECT_EQ(loss_head_chunk_rows(4096, 151936, DType::kF32, 0, def, true), 1366);
  EXPECT_EQ(loss_head_chunk_rows(1 << 20, 1000, DType::kBF16, 0, def, true), 2 * kCeChunkMaxRows);
}

class HeadChunks : public testing::TestWithParam<bool> {};

TEST_P(HeadChunks, AnyChunkSizeGivesTheSameLossLogitsAndGradients) {
  const bool tied = GetParam();
  ModelConfig cfg = head_config(tied);
  ModelParams p = params_for(cfg, 21);
  Batch b = batch_for(cfg.vocab_size, {5, 1, 7}, 4);  // T = 13
  ModelOptions whole;
  whole.ce_chunk_tokens = 1000;
  RunOut ref = run_model(p, b, whole);
  // The engine's single-chunk result against the double reference model.
  testref::RefOptions ro;
  ro.aux_coef = static_cast<float>(cfg.router_aux_loss_coef);
  auto dref = testref::ref_forward(testref::RefParams::from(p), b, ro);
  EXPECT_NEAR(ref.r.loss, dref.loss, 1e-5 * std::abs(dref.loss));
  EXPECT_NEAR(ref.r.ce, dref.ce, 1e-5 * std::abs(dref.ce));
  for (int64_t chunk : {1, 4, 13}) {
    ModelOptions o;
    o.ce_chunk_tokens = chunk;
    for (bool split : {false, true}) {
      RunOut r = run_model(p, b, o, split);
      const std::string tag = "chunk " + std::to_string(chunk) + (split ? " split" : " fused");
      EXPECT_NEAR(r.r.loss, ref.r.loss, 1e-6 * std::abs(ref.r.loss)) << tag;
      EXPECT_NEAR(r.r.ce, ref.r.ce, 1e-6 * std::abs(ref.r.ce)) << tag;
      EXPECT_LT(rel(r.r.logits, ref.r.logits), 1e-6) << tag;
      EXPECT_LT(rel(r.r.nll, ref.r.nll), 1e-6) << tag;
      auto a = named(r.g), c = named(ref.g);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(rel(a[i].second, c[i].second), 1e-6) << tag << " " << a[i].first;
    }
  }
  // The per-token nll is the CE of the reference logits.
  const std::vector<int32_t> labels = testref::host_ints(b.labels);
  const int64_t V = cfg.vocab_size;
  double wsum = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
    if (labels[t] == kIgnoreLabel) {
      EXPECT_EQ(ref.r.nll.get(t), 0.0);
      continue;
    }
    double mx = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, dref.logits[t * V + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(dref.logits[t * V + v] - mx);
    const double nll = mx + std::log(s) - dref.logits[t * V + labels[t]];
    EXPECT_NEAR(ref.r.nll.get(t), nll, 1e-5 * std::max(1.0, nll)) << t;
    wsum += nll * b.loss_weights.get(t);
  }
  EXPECT_NEAR(ref.r.ce, wsum, 1e-5 * wsum);
}

INSTANTIATE_TEST_SUITE_P(Model, HeadChunks, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "tied" : "untied"; });

TEST(Recompute, PoliciesAreBitIdenticalWithZLossAndPerLayerAux) {
  ModelConfig cfg = head_config(false);
  cfg.mlp_only_layers = {};  // both layers sparse
  ModelParams p = params_for(cfg, 5);
  Batch b = batch_for(cfg.vocab_size, {6, 1, 4}, 8);
  ModelOptions o;
  o.zloss_coef = 0.01f;
  o.aux_type = AuxLossType::kPerLayer;
  o.ce_chunk_tokens = 4;
  RunOut none = run_model(p, b, o);
  EXPECT_GT(none.r.z, 0.0);
  for (Recompute rc : {Recompute::kSelective, Recompute::kFull}) {
    o.recompute = rc;
    for (bool split : {false, true}) {
      RunOut r = run_model(p, b, o, split);
      const std::string tag = std::string(recompute_name(rc)) + (split ? " split" : " fused");
      EXPECT_EQ(r.r.loss, none.r.loss) << tag;
      EXPECT_EQ(r.r.z, none.r.z) << tag;
      ASSERT_EQ(r.r.router.size(), none.r.router.size());
      for (size_t l = 0; l < r.r.router.size(); ++l) {
        EXPECT_EQ(r.r.router[l].tokens_per_expert, none.r.router[l].tokens_per_expert) << tag;
        EXPECT_EQ(r.r.router[l].entropy, none.r.router[l].entropy) << tag;
      }
      auto a = named(r.g), c = named(none.g);
      // The split path recomputes the head (same chunks): still bitwise equal.
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_floats(), c[i].second.to_floats()) << tag << " " << a[i].first;
    }
  }
}

// Router entropy from device sums (mean lse - sum p*logit) against -sum p log p in double.
TEST(RouterStats, EntropyMatchesTheHostFormula) {
  ModelConfig cfg = head_config(true);
  ModelParams p = params_for(cfg, 9);
  Batch b = batch_for(cfg.vocab_size, {9, 3}, 2);
  testref::RefOptions ro;
  ro.aux_coef = static_cast<float>(cfg.router_aux_loss_coef);
  RunOut r = run_model(p, b, ModelOptions{});
  ASSERT_EQ(r.r.router.size(), 1u);
  auto ref = testref::ref_forward(testref::RefParams::from(p), b, ro);
  ASSERT_EQ(ref.entropy.size(), 1u);
  EXPECT_NEAR(r.r.router[0].entropy, ref.entropy[0], 1e-5);
  EXPECT_GT(ref.entropy[0], 0.1);
  EXPECT_EQ(r.r.num_labelled, b.num_labelled());
}

TEST(Model, TokenLogprobsAreMinusNll) {
  ModelConfig cfg = head_config(false);
  ModelParams p = params_for(cfg, 3);
  Batch b = batch_for(cfg.vocab_size, {4, 6}, 1);
  Context ctx;
  ModelOptions o;
  o.ce_chunk_tokens = 3;
  Qwen3Model m(p, o);
  Tensor lp = m.token_logprobs(ctx, b);
  ForwardResult r = m.forward(ctx, b, Pass::kEval);
  for (int64_t t = 0; t < b.num_tokens(); ++t) EXPECT_EQ(lp.get(t), -r.nll.get(t)) << t;
}

TEST(Model, MemoryIsAccountedByCategory) {
  ModelConfig cfg = head_config(false);
  ModelParams p = params_for(cfg, 3);
  Batch b = batch_for(cfg.vocab_size, {8, 8}, 1);
  Allocator& a = allocator_for(Device::cpu());
  ModelParams g = allocate_gradients(cfg, Device::cpu());
  a.reset_peaks();
  const MemStats before = a.stats();
  Context ctx;
  Qwen3Model m(p);
  m.forward_backward(ctx, b, g);
  const MemStats s = a.stats();
  auto idx = [](MemCategory c) { return static_cast<size_t>(c); };
  EXPECT_GT(s.peak[idx(MemCategory::kActivations)], before.current[idx(MemCategory::kActivations)]);
  EXPECT_GT(s.peak[idx(MemCategory::kWorkspace)], before.current[idx(MemCategory::kWorkspace)]);
  EXPECT_GT(s.current[idx(MemCategory::kGradients)], 0u);
  // Nothing of the step stays behind (activations are released by backward).
  EXPECT_EQ(s.current[idx(MemCategory::kActivations)], before.current[idx(MemCategory::kActivations)]);
  EXPECT_NE(s.summary().find("activations"), std::string::npos);
}

}  // namespace
