// Planner arithmetic against independent references: parameter counts against the model's real
// tensors (allocated, or their expected shapes) and hand-computed totals; the activation replay
// against the CPU allocator's per-category peaks while the real model runs forward + backward;
// the persistent optimizer tensors against a real AdamW; hand-computed per-GPU bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "core/allocator.h"
#include "core/context.h"
#include "model/batch.h"
#include "model/loss_head.h"
#include "model/params.h"
#include "model/qwen3_model.h"
#include "optim/adamw.h"
#include "plan/mem_trace.h"
#include "plan/plan.h"

namespace moetrain {
namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Groups of the expected shapes by name (an independent classification from the closed forms).
ParamCounts counts_from_shapes(const ModelConfig& c) {
  ParamCounts p;
  for (const auto& [name, shape] : ModelParams::expected_shapes(c)) {
    const int64_t n = numel(shape);
    p.total += n;
    if (name == "model.embed_tokens.weight") p.embed += n;
    else if (name == "lm_head.weight") p.lm_head += n;
    else if (name == "model.norm.weight") p.final_norm += n;
    else if (name.find("_proj.weight") != std::string::npos && name.find("self_attn") != std::string::npos) p.attention += n;
    else if (name.find("norm") != std::string::npos) p.norms += n;
    else if (name.find("mlp.gate.weight") != std::string::npos) p.router += n;
    else if (name.find("mlp.experts.") != std::string::npos) p.experts += n;
    else p.dense_mlp += n;
  }
  return p;
}

std::vector<ModelConfig> all_configs() {
  std::vector<ModelConfig> out;
  for (const auto& n : ModelConfig::preset_names()) out.push_back(ModelConfig::preset(n));
  const std::string dir = std::string(MT_SOURCE_DIR) + "/tests/reference/fixtures/model";
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (std::filesystem::exists(e.path() / "config.json")) out.push_back(ModelConfig::from_file((e.path() / "config.json").string()));
  return out;
}

TEST(PlanCounts, ParameterGroupsEqualTheModelsTensorShapes) {
  const auto cfgs = all_configs();
  ASSERT_GE(cfgs.size(), 8u);  // 5 presets + 4 fixture config.json files
  for (const auto& c : cfgs) {
    const ParamCounts p = count_parameters(c), s = counts_from_shapes(c);
    const std::string what = c.model_type + " H=" + std::to_string(c.hidden_size) + " L=" + std::to_string(c.num_hidden_layers);
    EXPECT_EQ(p.total, s.total) << what;
    EXPECT_EQ(p.embed, s.embed) << what;
    EXPECT_EQ(p.lm_head, s.lm_head) << what;
    EXPECT_EQ(p.final_norm, s.final_norm) << what;
    EXPECT_EQ(p.attention, s.attention) << what;
    EXPECT_EQ(p.norms, s.norms) << what;
    EXPECT_EQ(p.router, s.router) << what;
    EXPECT_EQ(p.experts, s.experts) << what;
    EXPECT_EQ(p.dense_mlp, s.dense_mlp) << what;
    EXPECT_EQ(p.total, c.num_parameters()) << what;
    EXPECT_EQ(p.active, c.num_active_parameters()) << what;
  }
}

TEST(PlanCounts, SmallModelsEqualAllocatedTensors) {
  for (const auto& c : all_configs()) {
    if (c.num_parameters() > 50'000'000) continue;  // qwen3-30b-a3b and qwen3-0.6b: shapes only
    ModelParams p = ModelParams::allocate(c, DType::kBF16, Device::cpu());
    int64_t n = 0;
    p.for_each([&](const std::string&, const Tensor& t) { n += t.numel(); });
    EXPECT_EQ(count_parameters(c).total, n) << c.model_type << " H=" << c.hidden_size;
  }
}

TEST(PlanCounts, HandComputedTotals) {
  // Qwen3-30B-A3B: 2 x 151936 x 2048 (embed, lm_head) + 2048 (final norm) + 48 x (18,874,368 attention
  // + 4,352 norms + 262,144 router + 603,979,776 experts).
  const ParamCounts q = count_parameters(ModelConfig::preset("qwen3-30b-a3b"));
  EXPECT_EQ(q.total, 30'532'122'624);
  EXPECT_EQ(q.active, 3'353'032'704);
  EXPECT_EQ(q.experts, 28'991'029'248);
  // Qwen3-0.6B: tied 151936 x 1024 + 1024 + 28 x (6,291,456 + 2,304 + 9,437,184).
  EXPECT_EQ(count_parameters(ModelConfig::preset("qwen3-0.6b")).total, 596'049'920);
}

TEST(PlanCounts, FrozenPatternsCountMatchedTensors) {
  const ModelConfig c = ModelConfig::preset("tiny-moe");
  const ParamCounts p = count_parameters(c, {"*.mlp.experts.*"});
  EXPECT_EQ(p.frozen, p.experts);
  EXPECT_EQ(count_parameters(c, {"model.embed_tokens.weight"}).frozen, 256 * 64);
}

// Saved bytes per token per layer, by hand, for Qwen3-30B-A3B in bf16:
// [T,H] x, a, h, b (4 x 2048) + q_raw, q, attn (3 x 4096) + k_raw, k, v (3 x 512) = 22,016 bf16;
// routed rows xp (8 x 2048) + gu (8 x 1536) + act (8 x 768) = 34,816 bf16 (the expert outputs are
// not saved: the routing weights scale act);
// f32: rstd_in, rstd_post (2) + q_rstd, lse (2 x 32) + k_rstd (4) + router logits, probs (2 x 128)
// + topk idx, w, row_of, token_of, row_w (5 x 8) = 366 x 4 bytes.
TEST(PlanTrace, SavedBytesPerTokenByHand) {
  const ModelConfig c = ModelConfig::preset("qwen3-30b-a3b");
  double sum = 0;
  for (const auto& [name, b] : saved_tensors_per_token(c, true, 2, false)) sum += b;
  EXPECT_EQ(sum, (22016 + 34816) * 2 + 366 * 4);
  double with_z = 0;
  for (const auto& [name, b] : saved_tensors_per_token(c, true, 2, true)) with_z += b;
  EXPECT_EQ(with_z, sum + 4);
  const ModelConfig d = ModelConfig::preset("qwen3-0.6b");  // dense: + gu, act (3 x 3072)
  double dense = 0;
  for (const auto& [name, b] : saved_tensors_per_token(d, false, 2, false)) dense += b;
  EXPECT_EQ(dense, (4 * 1024 + 3 * 2048 + 3 * 1024 + 3 * 3072) * 2 + (2 + 16 + 8 + 16) * 4);
}

TEST(PlanTrace, ActivationAndWorkspacePeaksOfTheFullModelByHand) {
  const ModelConfig c = ModelConfig::preset("qwen3-30b-a3b");
  TraceShape s;
  s.tokens = 4096;
  s.expert_rows = 4096 * 8;
  s.num_layers = 48;
  s.vocab_local = c.vocab_size;
  s.ce_chunk = 883;  // 256 MiB of bf16 logits: floor(268435456 / (151936 x 2))
  const TraceResult r = trace_micro_batch(c, s);
  const double T = 4096;
  // Activations peak when the head has written nll: every layer's saved tensors (x included),
  // the last output, final norm out + rstd, nll, the packed statistics and the batch.
  const double per_layer = 115'128 * T + (128 * 4 + 129 * 4);  // + counts, offsets
  const double head = T * 2048 * 2 * 2 + 2 * T * 4;
  const double stats = (1 + 48 * (2 * 128 + 3)) * 4 + 128 * 4;
  const double batch = 4 * T * 4 + 2 * 4;  // tokens, positions, labels, weights; cu_seqlens
  EXPECT_EQ(r.category_peak[static_cast<size_t>(MemCategory::kActivations)], 48 * per_layer + head + stats + batch);
  // Workspace peaks in the fused head: ce lse [T] f32 + d(final norm out) [T,H] + one logits
  // chunk [883,V]; the MoE backward's dh + db + dtopk_w + dgu + dxp (65,568 B/token = 268.6 MB)
  // stays below it.
  const double ws = (4 + 2 * 2048) * T + 883.0 * 151936 * 2;
  EXPECT_EQ(r.category_peak[static_cast<size_t>(MemCategory::kWorkspace)], ws);
  EXPECT_GT(ws, 65'568 * T);
}

struct TraceCase {
  const char* preset;
  Recompute rc;
  float z;
  std::vector<int> docs;
  bool fused = true;          // forward_backward (SFT) or forward + backward (DPO)
  int64_t chunk_tokens = 0;   // ModelOptions::ce_chunk_tokens
  bool router_stats = true;
  bool sums = false;          // the trainer's fused gradient norm (request_grad_sum_squares)
};

// The replay must equal the CPU allocator's accounting while the real model runs.
TEST(PlanTrace, ReplayEqualsTheAllocatorOnTheCpuModel) {
  const std::vector<TraceCase> cases = {{"tiny-moe", Recompute::kNone, 0.0f, {7, 12, 1}},
                                        {"tiny-moe", Recompute::kFull, 0.0f, {20}},
                                        {"tiny-moe", Recompute::kSelective, 0.0f, {9, 11}},
                                        {"tiny-moe", Recompute::kNone, 0.01f, {5, 9}, true, 4},
                                        {"tiny-moe", Recompute::kSelective, 0.01f, {6, 3}, false, 5},
                                        {"tiny-moe", Recompute::kFull, 0.0f, {8, 8}, false, 0, false},
                                        {"tiny-moe", Recompute::kNone, 0.0f, {7, 12, 1}, true, 0, true, true},
                                        {"tiny-moe", Recompute::kSelective, 0.0f, {6, 3}, false, 5, true, true},
                                        {"tiny-dense", Recompute::kNone, 0.0f, {13, 4}},
                                        {"tiny-dense", Recompute::kSelective, 0.0f, {10}, true, 3},
                                        {"tiny-dense", Recompute::kFull, 0.0f, {17}, false},
                                        {"tiny-dense", Recompute::kNone, 0.0f, {13, 4}, true, 0, true, true}};
  for (const auto& cs : cases) {
    const ModelConfig cfg = ModelConfig::preset(cs.preset);
    ModelParams p = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
    init_params_random(p, 7);
    ModelParams g = allocate_gradients(cfg, Device::cpu());
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> docs;
    int64_t T = 0;
    for (int n : cs.docs) {
      docs.emplace_back();
      for (int i = 0; i < n; ++i) docs.back().push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
      T += n;
    }
    const Batch batch = Batch::from_documents(docs);
    ModelOptions mo;
    mo.recompute = cs.rc;
    mo.zloss_coef = cs.z;
    mo.ce_chunk_tokens = cs.chunk_tokens;
    mo.router_stats = cs.router_stats;
    Qwen3Model model(p, mo);
    Context ctx;
    if (cs.sums) model.request_grad_sum_squares();
    Allocator& a = allocator_for(Device::cpu());
    a.reset_peaks();
    const MemStats before = a.stats();
    {
      if (cs.fused) {
        ForwardResult r = model.forward_backward(ctx, batch, g);
      } else {
        ForwardResult r = model.forward(ctx, batch, Pass::kTrain);
        model.backward(ctx, g);
      }
    }
    const MemStats after = a.stats();

    TraceShape s;
    s.tokens = T;
    s.expert_rows = T * cfg.num_experts_per_tok;
    s.num_docs = static_cast<int64_t>(cs.docs.size());
    s.num_layers = cfg.num_hidden_layers;
    s.vocab_local = cfg.vocab_size;
    s.ce_chunk = loss_head_chunk_rows(T, cfg.vocab_size, DType::kF32, cs.chunk_tokens, mo.ce_chunk_bytes,
                                      mo.head_grad_f32 || cfg.tie_word_embeddings);
    s.dtype_bytes = 4;
    s.fused_head = cs.fused;
    s.batch_on_device = false;
    s.on_cuda = false;
    s.router_stats = cs.router_stats;
    s.z_loss = cs.z != 0.0f;
    s.recompute = cs.rc;
    s.grad_sums = cs.sums;
    const TraceResult r = trace_micro_batch(cfg, s);
    const std::string what = std::string(cs.preset) + " recompute " + recompute_name(cs.rc) + " z " +
                             std::to_string(cs.z) + (cs.fused ? " fused" : " forward+backward") + " chunk " +
                             std::to_string(s.ce_chunk) + " of " + std::to_string(T) + (cs.sums ? " with sums" : "");
    for (MemCategory c : {MemCategory::kActivations, MemCategory::kWorkspace, MemCategory::kOther}) {
      const size_t i = static_cast<size_t>(c);
      EXPECT_EQ(r.category_peak[i], static_cast<double>(after.peak[i] - before.current[i]))
          << what << " category " << mem_category_name(c);
    }
    EXPECT_EQ(r.total_peak, static_cast<double>(after.total_peak - before.total_current)) << what;
    // Everything is freed but the gradient sum of squares, kept for the optimizer until the next pass.
    EXPECT_EQ(static_cast<double>(after.total_current - before.total_current), cs.sums ? 8.0 : 0.0) << what;
    if (cs.sums) {
      ASSERT_NE(model.grad_sum_squares(), nullptr) << what;
      a.reset_peaks();
      const MemStats mid = a.stats();
      { ForwardResult r2 = model.forward_backward(ctx, batch, g); }  // a new pass (no sums asked) releases it
      EXPECT_EQ(static_cast<double>(a.stats().total_current) - static_cast<double>(mid.total_current), -8.0) << what;
    }
  }
}

// The flash-attention backward's device workspace (flash::backward_workspace in
// kernels/cuda/attention_flash_launch.cuh), by hand for Qwen3-0.6B at T 4096 (16 / 8 heads of 128,
// 132 SMs), where it sets the workspace peak: each part 256-byte aligned, D [nh,T] f32 and the dK/dV
// partials [splits,T,nkv,d] f32 twice (sm80: 64 keys per CTA, 4 CTAs per SM, 2 splits); on Hopper
// also dq_acc [nh,T,d] f32 and nh * T/64 + 1 + T/64 i32 counters (128 keys per CTA, 2 CTAs per SM:
// 2 splits), and never less than the sm80 layout.
TEST(PlanTrace, AttentionBackwardWorkspaceOnHopper) {
  const ModelConfig cfg = ModelConfig::preset("qwen3-0.6b");
  TraceShape s;
  s.tokens = 4096;
  s.num_layers = 1;
  s.vocab_local = cfg.vocab_size;
  s.head = false;
  s.sm_count = 132;
  const double T = 4096, nh = 16, nkv = 8, d = 128;
  const double sm80 = nh * T * 4 + 2 * (2 * T * nkv * d * 4);
  const double sm90 = nh * T * 4 + 2 * (2 * T * nkv * d * 4) + nh * T * d * 4 + 4608;  // (16*64+1+64)*4, aligned
  auto workspace = [&](bool hopper) {
    s.hopper = hopper;
    return trace_micro_batch(cfg, s).category_peak[static_cast<size_t>(MemCategory::kWorkspace)];
  };
  EXPECT_EQ(workspace(true) - workspace(false), sm90 - sm80);
}

TEST(PlanTrace, SelectiveRecomputeSitsBetweenNoneAndFull) {
  const ModelConfig c = ModelConfig::preset("qwen3-30b-a3b");
  TraceShape s;
  s.tokens = 2048;
  s.expert_rows = 2048 * 8;
  s.num_layers = 4;
  s.vocab_local = c.vocab_size;
  s.ce_chunk = 883;
  auto act = [&](Recompute rc) {
    s.recompute = rc;
    return trace_micro_batch(c, s).category_peak[static_cast<size_t>(MemCategory::kActivations)];
  };
  const double none = act(Recompute::kNone), sel = act(Recompute::kSelective), full = act(Recompute::kFull);
  EXPECT_LT(sel, none);
  EXPECT_LT(full, sel);
  // Selective drops a, q, k, attn, lse, b, xp, act: (2048 + 4096 + 512 + 4096 + 2048 + 8 x 2048 + 8 x 768) x 2
  // + 32 x 4 bytes per token per layer. Without recompute the peak is at the head (4 whole layers +
  // last output, final norm out, rstd, nll: 8,200 B/token); with it, in the last layer's forward
  // before its drop (3 reduced layers + 1 whole + its output: 4,096 B/token).
  const double dropped = (2048 + 4096 + 512 + 4096 + 2048 + 8 * 2048 + 8 * 768) * 2.0 + 32 * 4;
  EXPECT_NEAR(none - sel, (3 * dropped + 8200 - 4096) * 2048, 1.0);
}

TEST(PlanMemory, PersistentBytesEqualARealAdamW) {
  const ModelConfig cfg = ModelConfig::preset("tiny-moe");
  const double n = static_cast<double>(cfg.num_parameters());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Allocator& a = allocator_for(Device::cpu());
    const MemStats before = a.stats();
    ModelParams p = ModelParams::allocate(cfg, dt, Device::cpu());
    ModelParams g = allocate_gradients(cfg, Device::cpu());
    std::vector<OptimParam> ps;
    std::map<std::string, Tensor> gm;
    g.for_each([&](const std::string& name, Tensor& t) { gm[name] = t; });
    p.for_each([&](const std::string& name, Tensor& t) { ps.push_back({name, t, gm[name]}); });
    AdamW opt(ps, AdamWConfig{});
    const MemStats after = a.stats();
    auto used = [&](MemCategory c) {
      return static_cast<double>(after.current[static_cast<size_t>(c)] - before.current[static_cast<size_t>(c)]);
    };
    PlanInput in;
    in.model = cfg;
    Hardware hw = dt == DType::kF32 ? Hardware::preset("cpu") : Hardware::preset("h100");
    const MemoryPlan m = plan_memory(in, hw);
    for (MemCategory c : {MemCategory::kWeights, MemCategory::kGradients, MemCategory::kMaster, MemCategory::kOptimizer})
      EXPECT_EQ(m.at_peak[static_cast<size_t>(c)], used(c)) << mem_category_name(c) << " " << dtype_name(dt);
    EXPECT_EQ(used(MemCategory::kOptimizer), 8 * n);
  }
}

// Every precision setting: the planned gradient, master and optimizer bytes equal what
// allocate_gradients + AdamW allocate (f32 weights = the CPU path, bf16 weights = a GPU's).
TEST(PlanMemory, PersistentBytesFollowThePrecisionDtypes) {
  for (const char* preset : {"tiny-moe", "tiny-dense"}) {
    const ModelConfig cfg = ModelConfig::preset(preset);
    for (DType wt : {DType::kF32, DType::kBF16})
      for (DType gd : {DType::kF32, DType::kBF16})
        for (DType main : {DType::kF32, DType::kBF16})
          for (auto [md, vd] : {std::pair{DType::kF32, DType::kF32}, std::pair{DType::kBF16, DType::kBF16},
                                std::pair{DType::kBF16, DType::kF32}}) {
            Allocator& a = allocator_for(Device::cpu());
            const MemStats before = a.stats();
            MemStats after;
            {
              ModelParams p = ModelParams::allocate(cfg, wt, Device::cpu());
              ModelParams g = allocate_gradients(cfg, Device::cpu(), gd);
              std::vector<OptimParam> ps;
              std::map<std::string, Tensor> gm;
              g.for_each([&](const std::string& name, Tensor& t) { gm[name] = t; });
              p.for_each([&](const std::string& name, Tensor& t) { ps.push_back({name, t, gm[name]}); });
              AdamWConfig ac;
              ac.main_params_dtype = main, ac.exp_avg_dtype = md, ac.exp_avg_sq_dtype = vd;
              AdamW opt(ps, ac);
              after = a.stats();
            }
            auto used = [&](MemCategory c) {
              return static_cast<double>(after.current[static_cast<size_t>(c)] - before.current[static_cast<size_t>(c)]);
            };
            PlanInput in;
            in.model = cfg;
            in.main_grads_dtype = gd, in.main_params_dtype = main, in.exp_avg_dtype = md, in.exp_avg_sq_dtype = vd;
            const Hardware hw = wt == DType::kF32 ? Hardware::preset("cpu") : Hardware::preset("h100");
            const MemoryPlan m = plan_memory(in, hw);
            const std::string what = fmt::format("{} weights {} grads {} main {} m {} v {}", preset, dtype_name(wt),
                                                 dtype_name(gd), dtype_name(main), dtype_name(md), dtype_name(vd));
            for (MemCategory c : {MemCategory::kWeights, MemCategory::kGradients, MemCategory::kMaster, MemCategory::kOptimizer})
              EXPECT_EQ(m.at_peak[static_cast<size_t>(c)], used(c)) << mem_category_name(c) << " " << what;
            // bf16 main params on bf16 weights: no master at all.
            if (wt == DType::kBF16 && main == DType::kBF16) EXPECT_EQ(used(MemCategory::kMaster), 0) << what;
          }
  }
  // Checkpoint size: bf16 main params drop the master, bf16 moments halve the state.
  PlanInput in;
  in.model = ModelConfig::preset("qwen3-30b-a3b");
  const double n = static_cast<double>(count_parameters(in.model).total);
  EXPECT_DOUBLE_EQ(plan_checkpoint(in).resume_bytes, n * (2 + 4 + 8));
  in.main_params_dtype = in.exp_avg_dtype = in.exp_avg_sq_dtype = DType::kBF16;
  EXPECT_DOUBLE_EQ(plan_checkpoint(in).resume_bytes, n * (2 + 0 + 4));
}

TEST(PlanMemory, HandComputedQwen3On8GpusExpertParallel) {
  // dp8 ep8, distributed optimizer: dense 1,541,093,376 params replicated (optimizer sharded by 8),
  // experts 28,991,029,248 / 8 = 3,623,878,656 per GPU (expert data parallel 1, no sharding).
  PlanInput in;
  in.model = ModelConfig::preset("qwen3-30b-a3b");
  in.layout = {8, 1, 1, 1, 8};
  in.seq_length = 4096;
  const Hardware hw = Hardware::preset("h200", 8);
  const MemoryPlan m = plan_memory(in, hw);
  auto cat = [&](MemCategory c) { return m.category_peak[static_cast<size_t>(c)]; };
  const double local = 1'541'093'376.0 + 3'623'878'656.0, owned = 1'541'093'376.0 / 8 + 3'623'878'656.0;
  EXPECT_EQ(cat(MemCategory::kWeights), 2 * local);
  EXPECT_EQ(cat(MemCategory::kGradients), 4 * local);
  EXPECT_EQ(cat(MemCategory::kMaster), 4 * owned);
  EXPECT_EQ(cat(MemCategory::kOptimizer), 8 * owned);
  // 8-bit AdamW: 2 bytes + 2 f32 absmax per 256 values; Muon: 4 bytes for 2-D hidden matrices.
  in.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_DOUBLE_EQ(plan_memory(in, hw).category_peak[static_cast<size_t>(MemCategory::kOptimizer)], (2 + 8.0 / 256) * owned);
  in.optimizer = OptimizerKind::kMuon;
  const ParamCounts p = count_parameters(in.model);
  const double dense_muon = static_cast<double>(p.attention + p.router), dense_adam = 1'541'093'376.0 - dense_muon;
  EXPECT_NEAR(plan_memory(in, hw).category_peak[static_cast<size_t>(MemCategory::kOptimizer)],
              4 * 3'623'878'656.0 + (4 * dense_muon + 8 * dense_adam) / 8, 1.0);
  in.optimizer = OptimizerKind::kAdamWOffload;
  const MemoryPlan off = plan_memory(in, hw);
  EXPECT_EQ(off.category_peak[static_cast<size_t>(MemCategory::kOptimizer)], 0);
  EXPECT_EQ(off.category_peak[static_cast<size_t>(MemCategory::kMaster)], 0);
  EXPECT_DOUBLE_EQ(off.host_per_node, 8 * (kHostProcessBytes + 16 * owned));
}

// optimizer.update_in_backward with one micro-batch: the expert weights have no gradient buffer,
// and on the two-op path (the CPU; bf16 masters on GPUs) each expert matrix's backward takes a
// workspace for its gradient. The replay equals the allocator, and the planned gradient bytes
// equal what the trainer allocates; with two micro-batches nothing changes.
TEST(PlanTrace, InBackwardUpdateWithoutExpertGradientsEqualsTheAllocator) {
  const ModelConfig cfg = ModelConfig::preset("tiny-moe");
  ModelParams p = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
  init_params_random(p, 7);
  Allocator& a = allocator_for(Device::cpu());
  const MemStats before_grads = a.stats();
  ModelParams g = allocate_gradients(cfg, Device::cpu(), DType::kF32, /*expert_matrices=*/false);
  const double grad_bytes = static_cast<double>(a.stats().current[static_cast<size_t>(MemCategory::kGradients)] -
                                                before_grads.current[static_cast<size_t>(MemCategory::kGradients)]);
  std::vector<OptimParam> ps;
  std::map<std::string, Tensor> gm;
  g.for_each([&](const std::string& name, Tensor& t) { gm[name] = t; });
  p.for_each([&](const std::string& name, Tensor& t) { ps.push_back({name, t, gm[name], !gm[name].defined()}); });
  AdamW opt(ps, AdamWConfig{});
  std::vector<Tensor> experts;
  for (LayerParams& l : p.layers)
    if (l.sparse) experts.push_back(l.experts_gate_up), experts.push_back(l.experts_down);
  ASSERT_FALSE(experts.empty());
  const Batch batch = Batch::from_documents({{3, 9, 4, 1, 7, 7, 2, 5, 8}, {6, 2, 2, 9}});
  const int64_t T = 13;
  Qwen3Model model(p, ModelOptions{});
  Context ctx;
  model.set_overwrite_matrix_grads();
  model.request_grad_sum_squares();  // as the trainer does with the update in backward
  model.request_in_backward_updates(opt.in_backward_targets(ctx, 1e-3, experts));
  a.reset_peaks();
  const MemStats before = a.stats();
  { ForwardResult r = model.forward_backward(ctx, batch, g); }
  const MemStats after = a.stats();
  EXPECT_EQ(model.updated_in_backward().size(), experts.size());

  TraceShape s;
  s.tokens = T;
  s.expert_rows = T * cfg.num_experts_per_tok;
  s.num_docs = 2;
  s.num_layers = cfg.num_hidden_layers;
  s.vocab_local = cfg.vocab_size;
  s.ce_chunk = loss_head_chunk_rows(T, cfg.vocab_size, DType::kF32, 0, ModelOptions{}.ce_chunk_bytes);
  s.dtype_bytes = 4;
  s.batch_on_device = false;
  s.on_cuda = false;
  s.expert_grad_scratch_bytes = 4;
  const TraceResult r = trace_micro_batch(cfg, s);
  for (MemCategory c : {MemCategory::kActivations, MemCategory::kWorkspace, MemCategory::kOther}) {
    const size_t i = static_cast<size_t>(c);
    EXPECT_EQ(r.category_peak[i], static_cast<double>(after.peak[i] - before.current[i])) << mem_category_name(c);
  }
  EXPECT_EQ(r.total_peak, static_cast<double>(after.total_peak - before.total_current));
  s.expert_grad_scratch_bytes = 0;  // the workspace is what the replay needed to match
  EXPECT_LT(trace_micro_batch(cfg, s).category_peak[static_cast<size_t>(MemCategory::kWorkspace)],
            r.category_peak[static_cast<size_t>(MemCategory::kWorkspace)]);

  PlanInput in;
  in.model = cfg;
  in.update_in_backward = true;
  const Hardware cpu = Hardware::preset("cpu");
  EXPECT_EQ(plan_memory(in, cpu).at_peak[static_cast<size_t>(MemCategory::kGradients)], grad_bytes);
  in.global_batch_size = 2;  // two micro-batches: the buffers are back
  EXPECT_EQ(plan_memory(in, cpu).at_peak[static_cast<size_t>(MemCategory::kGradients)],
            grad_bytes + 4.0 * static_cast<double>(experts.size() / 2) * 3 * cfg.num_experts * cfg.hidden_size *
                             cfg.moe_intermediate_size);
}

// With the update in backward and one micro-batch, the expert backward needs a gradient workspace
// unless the Hopper dW kernel fuses AdamW: f32 master and moments, or all-bf16 state (round 6);
// another mix (bf16 weights and m, f32 v) still borrows it.
TEST(PlanMemory, FusedInBackwardUpdateNeedsNoGradientWorkspaceOnHopper) {
  PlanInput in;
  in.model = ModelConfig::preset("qwen3-30b-a3b");
  in.model.num_hidden_layers = 2;
  in.seq_length = 4096;
  in.update_in_backward = true;
  in.ce_chunk_tokens = 820;  // below the expert gradient's workspace (1024-row chunks are the workspace peak)
  const Hardware h100 = Hardware::preset("h100", 1);
  auto workspace = [&](DType grads, DType main, DType m, DType v) {
    in.main_grads_dtype = grads, in.main_params_dtype = main, in.exp_avg_dtype = m, in.exp_avg_sq_dtype = v;
    return plan_memory(in, h100).category_peak[static_cast<size_t>(MemCategory::kWorkspace)];
  };
  const DType F = DType::kF32, B = DType::kBF16;
  const double all_bf16 = workspace(B, B, B, B), all_f32 = workspace(F, F, F, F), mixed = workspace(B, B, B, F);
  // Alike, the fused norm's per-tile sums of the dW included: one micro-batch writes the gradient (the
  // first step too), so an f32 one takes the bf16 one's 128 x 256 tiles.
  EXPECT_EQ(all_f32, all_bf16);
  // the mix borrows one expert matrix's bf16 gradient (gate_up: 128 x 1536 x 2048 x 2 B)
  EXPECT_GE(mixed - all_bf16, 2.0 * 128 * 1536 * 2048 - 1.0);
}

// The Hopper expert dW kernels' per-tile sums of squares (the fused gradient norm) are workspace while
// each dW runs. On an H200 (round 44, tests/gpu/plan_check.sh) the 2-layer Qwen3-30B-A3B proxy at seq
// 4096 with f32 gradients read 196,608 bytes of workspace over a plan without them: the gate_up dW's
// 128 experts x 12 x 16 tiles of 128 x 128, 8 bytes each, at the workspace peak (the first step's
// +=; since the first step writes too, a run of one micro-batch a step takes half that).
TEST(PlanTrace, ExpertDwSumPartialsAtTheWorkspacePeakOnHopper) {
  const ModelConfig cfg = ModelConfig::preset("qwen3-30b-a3b");
  TraceShape s;
  s.tokens = 4096;
  s.expert_rows = 4096 * cfg.num_experts_per_tok;
  s.num_layers = 2;
  s.vocab_local = cfg.vocab_size;
  // 820-row loss-head chunks (the default then), whose 238 MiB sit below the expert dW's workspace; the
  // 1024-row default chunk's 297 MiB are the workspace peak of this 2-layer proxy instead.
  s.ce_chunk = 820;
  s.hopper = true;
  const double ws0 = trace_micro_batch(cfg, s).category_peak[static_cast<size_t>(MemCategory::kWorkspace)];
  s.expert_dw_partials_gate_up = 8.0 * 128 * 12 * 16;
  s.expert_dw_partials_down = 8.0 * 128 * 16 * 6;
  const double ws1 = trace_micro_batch(cfg, s).category_peak[static_cast<size_t>(MemCategory::kWorkspace)];
  EXPECT_EQ(ws1 - ws0, 196608.0);
  s.grad_sums = false;  // no fused norm, no partials
  EXPECT_EQ(trace_micro_batch(cfg, s).category_peak[static_cast<size_t>(MemCategory::kWorkspace)], ws0 - 8.0);
  // What plan_memory puts there for that run (f32 gradients, AdamW after the step).
  PlanInput in;
  in.model = cfg;
  in.model.num_hidden_layers = 2;
  in.seq_length = 4096;
  in.ce_chunk_tokens = 820;
  const Hardware h200 = Hardware::preset("h200", 1);
  auto planned = [&](DType grads, int64_t global_batch) {
    in.main_grads_dtype = grads, in.global_batch_size = global_batch;
    return plan_memory(in, h200).category_peak[static_cast<size_t>(MemCategory::kWorkspace)];
  };
  // Every step's first pass writes the gradient (the first step's too, since the trainer starts with
  // the overwrite flag set): one micro-batch takes 128 x 256 tiles in f32 as in bf16.
  EXPECT_EQ(planned(DType::kF32, 1), planned(DType::kBF16, 1));
  // A second micro-batch adds to an f32 gradient on 128 x 128 tiles: twice the gate_up dW's partials.
  EXPECT_EQ(planned(DType::kF32, 2) - planned(DType::kBF16, 2), 8.0 * 128 * 12 * 8);
}

}  // namespace
}  // namespace moetrain
