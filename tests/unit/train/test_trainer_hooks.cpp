// TrainHooks (trainer.h), the entry `moetrain bench` drives: before_step/after_step see every step
// in order with the same record metrics.jsonl gets; after_step returning false stops the loop at
// once (reason kHook) with no end-of-run validation, checkpoint or export; the profiler regions the
// step opens (forward_backward, grad_norm, optimizer, zero_grad) are recorded when it is on.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/profiler.h"
#include "model/config.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

TrainConfig hook_config(const std::string& run_dir, int64_t iters) {
  const std::string yaml = R"(model: {preset: tiny-moe}
data: {mock_data: true}
training: {objective: pretrain, seq_length: 16, micro_batch_size: 1, train_iters: 5, eval_interval: 2, eval_iters: 1,
           device: cpu, exit_signal_handler: false}
checkpoint: {save_interval: 0, export_hf: true}
logging: {tensorboard: false, plot: false}
)";
  return TrainConfig::from_yaml_string(yaml, "hooks.yaml",
                                       {"logging.run_dir=" + run_dir, "training.train_iters=" + std::to_string(iters)});
}

}  // namespace

TEST(TrainHooks, StopEarlyWithoutCheckpointOrExport) {
  const std::string dir = testing::TempDir() + "/hooks_stop";
  fs::remove_all(dir);
  std::vector<int64_t> before, after;
  std::vector<double> times;
  TrainHooks h;
  h.before_step = [&](int64_t s) { before.push_back(s); };
  h.after_step = [&](int64_t s, const nlohmann::json& rec) {
    after.push_back(s);
    EXPECT_EQ(rec.value("step", int64_t{-1}), s);
    EXPECT_EQ(rec.value("tokens", int64_t{0}), 16);
    EXPECT_GT(rec["memory"]["total"].value("peak", 0.0), 0.0);
    times.push_back(rec.value("step_time_s", -1.0));
    return s < 3;
  };
  const TrainResult r = run_training(hook_config(dir, 5), h);
  EXPECT_EQ(r.reason, StopReason::kHook);
  EXPECT_EQ(r.final_step, 3);
  EXPECT_EQ(before, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(after, (std::vector<int64_t>{1, 2, 3}));
  for (double t : times) EXPECT_GT(t, 0.0);
  EXPECT_TRUE(r.last_checkpoint.empty());
  // The checkpoint manager may create its directory up front; no step directory may be in it.
  EXPECT_TRUE(!fs::exists(dir + "/checkpoints") || fs::is_empty(dir + "/checkpoints"));
  EXPECT_FALSE(fs::exists(dir + "/hf"));
  // metrics.jsonl holds the same train records the hook saw (plus the step-0/2 validations).
  int64_t train = 0;
  for (const auto& rec : read_metrics_file(dir + "/metrics.jsonl")) train += rec.value("type", "") == "train";
  EXPECT_EQ(train, 3);
}

TEST(TrainHooks, RunningToTheEndStillSaves) {
  const std::string dir = testing::TempDir() + "/hooks_full";
  fs::remove_all(dir);
  int64_t calls = 0;
  TrainHooks h;
  h.after_step = [&](int64_t, const nlohmann::json&) { return ++calls > 0; };
  const TrainResult r = run_training(hook_config(dir, 2), h);
  EXPECT_EQ(r.reason, StopReason::kFinished);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(r.last_checkpoint.empty());
  EXPECT_TRUE(fs::exists(dir + "/hf/config.json"));
}

TEST(TrainHooks, ProfilerSeesStepRegions) {
  const std::string dir = testing::TempDir() + "/hooks_profile";
  fs::remove_all(dir);
  std::vector<ProfileEntry> rep;
  TrainHooks h;
  h.before_step = [&](int64_t s) {
    if (s == 2) Profiler::enable(true);
  };
  h.after_step = [&](int64_t s, const nlohmann::json&) {
    if (s == 2) rep = Profiler::report(), Profiler::enable(false);
    return s < 2;
  };
  const TrainConfig cfg = hook_config(dir, 4);
  run_training(cfg, h);
  const int64_t layers = ModelConfig::preset(cfg.model.preset).num_hidden_layers;
  ASSERT_GE(layers, 1);
  std::set<std::string> regions, ops;
  double op_ms = 0;
  for (const auto& e : rep) {
    if (e.kind == ProfileKind::kRegion) {
      regions.insert(e.name);
      // the trainer's regions once per step; the layer's projection regions once per layer
      EXPECT_EQ(e.calls, e.name.rfind("proj_", 0) == 0 ? layers : 1) << e.name;
    } else {
      ops.insert(e.name), op_ms += e.total_ms;
    }
  }
  for (const char* n : {"forward_backward", "grad_norm", "optimizer", "zero_grad", "proj_qkv_fwd", "proj_o_fwd",
                        "proj_o_bwd", "proj_qkv_bwd"})
    EXPECT_TRUE(regions.count(n)) << n;
  EXPECT_TRUE(ops.count("adamw_step_many"));  // AdamW::step updates its whole list in one call
  EXPECT_TRUE(ops.count("attention_forward"));
  EXPECT_GT(op_ms, 0.0);
  EXPECT_FALSE(Profiler::enabled());
}
