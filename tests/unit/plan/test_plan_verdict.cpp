// Planner time model, verdicts, suggested changes, the layout search order, input parsing and the
// TrainConfig entry point (plan_run), against hand-computed values and the planner's own
// invariants (a suggested change must fit; the largest micro-batch fits and one more does not).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/check.h"
#include "plan/plan.h"
#include "train/config.h"

namespace moetrain {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

PlanInput qwen30b(int64_t gpus, int64_t ep, int64_t seq) {
  PlanInput in;
  in.model = ModelConfig::preset("qwen3-30b-a3b");
  in.model_name = "qwen3-30b-a3b";
  in.layout = {gpus, 1, 1, 1, ep};
  in.seq_length = seq;
  return in;
}

TEST(PlanTime, HandComputedFlopsAndTime) {
  // SPEC.md section 10: 18.25 GFLOP matmul + 4.83 GFLOP attention per token at S = 4096.
  PlanInput in = qwen30b(8, 8, 4096);
  in.global_batch_size = 64;
  in.token_budget = 300e6;
  Hardware hw = Hardware::preset("h100", 8);
  hw.mfu = 0.25;
  const TimePlan t = plan_time(in, hw);
  EXPECT_NEAR(t.model_flops_per_token / 1e9, 23.08, 0.01);
  EXPECT_EQ(t.tokens_per_step, 64.0 * 4096);
  EXPECT_EQ(t.grad_accum, 8);
  const double rate = 8 * 989e12 * 0.25;
  EXPECT_NEAR(t.step_time_s, 64.0 * 4096 * t.model_flops_per_token / rate, 1e-9);
  EXPECT_EQ(t.steps, std::ceil(300e6 / (64.0 * 4096)));
  EXPECT_NEAR(t.total_time_s, t.steps * t.step_time_s, 1e-6);
  // Full recompute runs the layers' forward again: + (F - 6 V H) / 3.
  in.recompute = Recompute::kFull;
  const double head = 6.0 * 151936 * 2048;
  EXPECT_NEAR(plan_time(in, hw).hw_flops_per_token, t.model_flops_per_token + (t.model_flops_per_token - head) / 3, 1.0);
  // Selective recompute repeats only the attention core's forward: 4.83 / 3 GFLOP per token.
  in.recompute = Recompute::kSelective;
  EXPECT_NEAR((plan_time(in, hw).hw_flops_per_token - t.model_flops_per_token) / 1e9, 4.83 / 3, 0.005);
  // DPO: pairs double the tokens per step; the reference pass adds one forward over the budget.
  in.recompute = Recompute::kNone;
  in.objective = Objective::kDpo;
  const TimePlan d = plan_time(in, hw);
  EXPECT_EQ(d.tokens_per_step, 2 * 64.0 * 4096);
  EXPECT_NEAR(d.total_time_s, d.steps * d.step_time_s + 300e6 * t.model_flops_per_token / 3 / rate, 1e-6);
  // Pipeline bubble (p - 1) / (m + p - 1).
  in.objective = Objective::kSft;
  in.layout = {4, 1, 2, 1, 4};
  EXPECT_NEAR(plan_time(in, hw).pipeline_bubble, 1.0 / (16 + 1), 1e-12);
}

// The time estimate's MFU is an assumption; the plan says beside it what one H200 measured at the
// run's precision (docs/plan.md), so a default-precision user is not left with 0.30 alone.
TEST(PlanTime, NotesTheMeasuredMfuOfTheRunsPrecision) {
  PlanInput in = qwen30b(8, 8, 4096);
  const Hardware hw = Hardware::preset("h100", 8);
  auto noted = [&](const std::string& what) {
    for (const std::string& n : plan(in, hw).notes)
      if (n.find(what) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(noted("with f32 master weights or moments: MFU about 0.21"));
  in.main_params_dtype = in.exp_avg_dtype = in.exp_avg_sq_dtype = in.main_grads_dtype = DType::kBF16;
  EXPECT_TRUE(noted("with bf16 weights, gradients and moments: MFU 0.31-0.33"));
  EXPECT_FALSE(noted("MFU about 0.21"));
  EXPECT_FALSE([&] {  // a CPU plan has no such note
    for (const std::string& n : plan(in, Hardware::preset("cpu", 1)).notes)
      if (n.find("measured on one H200") != std::string::npos) return true;
    return false;
  }());
}

TEST(PlanVerdict, DoesNotFitOnOneGpuAndSuggestsChangesThatFit) {
  PlanInput in = qwen30b(1, 1, 8192);
  const Hardware hw = Hardware::preset("h100", 1);
  const PlanResult r = plan(in, hw);
  EXPECT_FALSE(r.verdict.fits);
  EXPECT_EQ(r.verdict.max_micro_batch, 0);
  EXPECT_NE(r.verdict.summary.find("does not fit"), std::string::npos) << r.verdict.summary;
  ASSERT_FALSE(r.verdict.changes.empty());
  bool more_gpus = false;
  for (const auto& c : r.verdict.changes) {
    EXPECT_NE(c.find("GiB per GPU"), std::string::npos) << c;
    more_gpus |= c.find(" GPUs (") != std::string::npos;
  }
  EXPECT_TRUE(more_gpus);
  EXPECT_NE(format_plan(r).find("does not fit"), std::string::npos);
}

TEST(PlanVerdict, SuggestedRecomputeActuallyFits) {
  // 8 x H100, SFT at 8K with 8-bit AdamW: without recompute the saved activations (~58 GiB) do not fit.
  PlanInput in = qwen30b(8, 8, 8192);
  in.optimizer = OptimizerKind::kAdamW8bit;
  const Hardware hw = Hardware::preset("h100", 8);
  const PlanResult r = plan(in, hw);
  ASSERT_FALSE(r.verdict.fits) << format_plan(r);
  ASSERT_FALSE(r.verdict.changes.empty());
  EXPECT_EQ(r.verdict.changes[0].rfind("training.recompute_granularity=full:", 0), 0u) << r.verdict.changes[0];
  in.recompute = Recompute::kFull;
  const PlanResult f = plan(in, hw);
  EXPECT_TRUE(f.verdict.fits) << format_plan(f);
  EXPECT_LE(f.memory.device_total, hw.gpu_mem_bytes);
}

TEST(PlanVerdict, LargestMicroBatchFitsAndTheNextDoesNot) {
  PlanInput in;
  in.model = ModelConfig::preset("qwen3-0.6b");
  in.seq_length = 4096;
  in.recompute = Recompute::kFull;
  const Hardware hw = Hardware::preset("h100", 1);
  const PlanResult r = plan(in, hw);
  ASSERT_TRUE(r.verdict.fits);
  const int64_t m = r.verdict.max_micro_batch;
  ASSERT_GT(m, 1);
  ASSERT_LT(m, 1024);
  in.micro_batch_size = m;
  EXPECT_LE(plan_memory(in, hw).device_total, hw.gpu_mem_bytes);
  in.micro_batch_size = m + 1;
  EXPECT_GT(plan_memory(in, hw).device_total, hw.gpu_mem_bytes);
  EXPECT_EQ(r.verdict.summary.rfind("fits:", 0), 0u) << r.verdict.summary;
}

TEST(PlanMemory, ActivationsGrowWithTokensAndShrinkWithRecompute) {
  PlanInput in = qwen30b(8, 8, 4096);
  const Hardware hw = Hardware::preset("h200", 8);
  auto act = [&](const PlanInput& p) {
    return plan_memory(p, hw).category_peak[static_cast<size_t>(MemCategory::kActivations)];
  };
  const double a1 = act(in);
  PlanInput dpo = in;
  dpo.objective = Objective::kDpo;  // chosen + rejected: twice the tokens
  EXPECT_NEAR(act(dpo) / a1, 2.0, 0.01);
  PlanInput sel = in, full = in;
  sel.recompute = Recompute::kSelective;
  full.recompute = Recompute::kFull;
  EXPECT_LT(act(sel), a1);
  EXPECT_LT(act(full), act(sel));
  // Worst-case routing costs more than balanced routing only with expert parallelism.
  const MemoryPlan m = plan_memory(in, hw);
  EXPECT_GT(m.allocator_peak, m.allocator_peak_expected);
  in.imbalance = 1.0;
  const MemoryPlan b = plan_memory(in, hw);
  EXPECT_DOUBLE_EQ(b.allocator_peak, b.allocator_peak_expected);
  PlanInput one = qwen30b(8, 1, 4096);
  const MemoryPlan o = plan_memory(one, hw);
  EXPECT_DOUBLE_EQ(o.allocator_peak, o.allocator_peak_expected);
}

TEST(PlanSearch, OrderIsRunnableFirstThenFasterAndEverythingFits) {
  PlanInput in;
  in.model = ModelConfig::preset("demo-moe");
  in.seq_length = 2048;
  Hardware hw = Hardware::preset("h100", 4);
  hw.gpu_mem_bytes = 6 * kGiB;
  const auto rs = search_layouts(in, hw, 4);
  ASSERT_GT(rs.size(), 4u);
  bool seen_planning_only = false;
  for (size_t i = 0; i < rs.size(); ++i) {
    const auto& r = rs[i];
    EXPECT_LE(r.memory.device_total, hw.gpu_mem_bytes);
    EXPECT_EQ(r.input.layout.world(), 4);
    if (!r.input.layout.runnable()) seen_planning_only = true;
    else EXPECT_FALSE(seen_planning_only) << "runnable layout after a planning-only one at row " << i;
  }
  EXPECT_TRUE(rs[0].input.layout.runnable());
  EXPECT_EQ(rs[0].input.recompute, Recompute::kNone);  // no recompute is fastest when it fits
  // Among runnable rows with the same recompute, time per token never decreases down the list.
  for (size_t i = 1; i < rs.size(); ++i) {
    const auto &a = rs[i - 1], &b = rs[i];
    if (a.input.layout.runnable() && b.input.layout.runnable() && a.input.recompute != Recompute::kSelective &&
        b.input.recompute != Recompute::kSelective)
      EXPECT_LE(a.time.step_time_s / a.time.tokens_per_step, b.time.step_time_s / b.time.tokens_per_step * (1 + 1e-9));
  }
  EXPECT_NE(format_search(rs).find("dp"), std::string::npos);
  hw.gpu_mem_bytes = 0.5 * kGiB;  // nothing fits in half a GiB with the runtime reserve
  EXPECT_TRUE(search_layouts(in, hw, 4).empty());
}

TEST(PlanInputs, ParsingAndErrors) {
  EXPECT_DOUBLE_EQ(parse_memory_size("80", "--gpu-mem"), 80 * kGiB);
  EXPECT_DOUBLE_EQ(parse_memory_size("80GB", "--gpu-mem"), 80e9);
  EXPECT_DOUBLE_EQ(parse_memory_size("141GiB", "--gpu-mem"), 141 * kGiB);
  EXPECT_DOUBLE_EQ(parse_memory_size("512MiB", "--gpu-mem"), 512.0 * 1024 * 1024);
  EXPECT_THROW(parse_memory_size("lots", "--gpu-mem"), Error);
  EXPECT_THROW(parse_memory_size("80XB", "--gpu-mem"), Error);
  EXPECT_EQ(parse_optimizer_kind("adamw_8bit"), OptimizerKind::kAdamW8bit);
  try {
    parse_optimizer_kind("sgd");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw8bit"), std::string::npos);
  }
  EXPECT_THROW(Hardware::preset("tpu"), Error);
  PlanInput in = qwen30b(8, 3, 4096);  // 3 does not divide 128 experts
  EXPECT_THROW(plan_memory(in, Hardware::preset("h100", 8)), Error);
  in = qwen30b(8, 8, 4096);
  EXPECT_THROW(plan(in, Hardware::preset("h100", 4)), Error);  // layout of 8 on 4 GPUs
}

TEST(PlanInputs, MeasuredMfuIsTheMedianAfterWarmup) {
  const std::string path = testing::TempDir() + "/plan_metrics.jsonl";
  {
    std::ofstream f(path);
    f << R"({"type":"train","step":1,"mfu":0.01})" << "\n"
      << R"({"type":"valid","step":1,"loss":2.0})" << "\n"
      << R"({"type":"train","step":2,"mfu":0.30})" << "\n"
      << R"({"type":"train","step":3,"mfu":0.34})" << "\n"
      << R"({"type":"train","step":4,"tflops":316.48})" << "\n";
  }
  EXPECT_NEAR(measured_mfu(path, 989), 0.32, 1e-9);  // median of 0.30, 0.34, 0.32
  std::remove(path.c_str());
}

TEST(PlanRun, FromATrainConfig) {
  const TrainConfig cfg = TrainConfig::from_yaml_string(
      "model:\n  preset: qwen3-30b-a3b\ndata:\n  mock_data: true\ntraining:\n  seq_length: 4096\n"
      "  micro_batch_size: 2\n  global_batch_size: 64\n  train_iters: 10\n  recompute_granularity: full\n"
      "parallel:\n  expert_model_parallel_size: 8\n",
      "test.yaml");
  const PlanResult r = plan_run(cfg, Hardware::preset("h200", 8));
  EXPECT_EQ(r.input.layout.dp, 8);
  EXPECT_EQ(r.input.layout.ep, 8);
  EXPECT_EQ(r.input.micro_batch_size, 2);
  EXPECT_EQ(r.input.recompute, Recompute::kFull);
  EXPECT_EQ(r.time.grad_accum, 4);
  EXPECT_EQ(r.time.token_budget, 10 * 64.0 * 4096);
  EXPECT_TRUE(r.verdict.fits) << format_plan(r);
  const auto j = plan_to_json(r);
  EXPECT_EQ(j["memory"]["category_peak"].size(), kNumMemCategories);
  EXPECT_TRUE(j["memory"]["category_peak"].contains("activations"));
  EXPECT_DOUBLE_EQ(j["memory"]["device_total"].get<double>(), r.memory.device_total);

  // model.ce_chunk_tokens reaches the plan: one 4096-token logits chunk instead of 256 MiB ones
  // raises the planned workspace peak (the chunk buffer is workspace).
  TrainConfig big = cfg;
  big.model.ce_chunk_tokens = 4096;
  const PlanResult rb = plan_run(big, Hardware::preset("h200", 8));
  EXPECT_EQ(rb.input.ce_chunk_tokens, 4096);
  const size_t ws = static_cast<size_t>(MemCategory::kWorkspace);
  EXPECT_GT(rb.memory.category_peak[ws], r.memory.category_peak[ws]);
}

}  // namespace
}  // namespace moetrain
