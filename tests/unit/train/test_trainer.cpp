// The trainer end to end on the CPU with a tiny random Qwen3-MoE on mock data: 2N steps straight
// equal N steps + exit + resume + N steps bit for bit (losses, gradient norms and weights);
// gradient accumulation normalizes by the tokens of the whole global batch; frozen parameters
// stay put; the run directory holds everything it should.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny_config(const std::string& run_dir, const std::vector<std::string>& extra = {}) {
  const std::string yaml = R"(model:
  preset: tiny-moe
  moe_z_loss_coeff: 0.001
data:
  mock_data: true
training:
  objective: pretrain
  seq_length: 24
  micro_batch_size: 1
  global_batch_size: 2
  train_iters: 6
  eval_interval: 3
  eval_iters: 1
  device: cpu
optimizer:
  lr: 3.0e-3
  lr_warmup_iters: 2
  weight_decay: 0.1
checkpoint:
  save_interval: 2
  export_hf: false
logging:
  tensorboard: true
)";
  std::vector<std::string> ov = {"logging.run_dir=" + run_dir};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return TrainConfig::from_yaml_string(yaml, "tiny.yaml", ov);
}

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  fs::remove_all(d);
  return d;
}

std::vector<nlohmann::json> train_records(const std::string& run_dir, const char* type = "train") {
  std::vector<nlohmann::json> out;
  for (auto& r : read_metrics_file(run_dir + "/metrics.jsonl"))
    if (r["type"] == type) out.push_back(r);
  return out;
}

// Every tensor of a checkpoint's model/ as raw bytes.
std::map<std::string, std::string> model_bytes(const std::string& step_dir) {
  auto ck = SafetensorsCheckpoint::open_dir(step_dir + "/model");
  std::map<std::string, std::string> out;
  for (const auto& n : ck.names()) {
    const auto& e = ck.entry(n);
    out[n] = std::string(reinterpret_cast<const char*>(ck.file_of(n).data(e)), e.end - e.begin);
  }
  return out;
}

struct QuietLogs {
  LogLevel old = log_level();
  QuietLogs() { set_log_level(LogLevel::kWarn); }
  ~QuietLogs() { set_log_level(old); }
};

}  // namespace

TEST(Trainer, ResumeIsBitIdentical) {
  QuietLogs quiet;
  const std::string a = fresh("trainer_straight"), b = fresh("trainer_resumed");
  TrainResult ra = run_training(tiny_config(a));
  EXPECT_EQ(ra.reason, StopReason::kFinished);
  EXPECT_EQ(ra.final_step, 6);
  TrainResult rb1 = run_training(tiny_config(b, {"training.exit_interval=3"}));
  EXPECT_EQ(rb1.reason, StopReason::kExitInterval);
  EXPECT_EQ(rb1.final_step, 3);
  EXPECT_TRUE(fs::exists(b + "/checkpoints/step_3"));  // saved on exit although save_interval is 2
  TrainResult rb2 = run_training(tiny_config(b));
  EXPECT_EQ(rb2.start_step, 3);
  EXPECT_EQ(rb2.final_step, 6);

  auto ta = train_records(a), tb = train_records(b);
  ASSERT_EQ(ta.size(), 6u);
  ASSERT_EQ(tb.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(ta[i]["step"], tb[i]["step"]);
    EXPECT_EQ(ta[i]["loss"].get<double>(), tb[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(ta[i]["grad_norm"].get<double>(), tb[i]["grad_norm"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(ta[i]["lr"].get<double>(), tb[i]["lr"].get<double>());
  }
  EXPECT_EQ(model_bytes(a + "/checkpoints/step_6"), model_bytes(b + "/checkpoints/step_6"));
  // Training does something: the loss falls from about ln(256) on random tokens... at least the
  // weights moved and the loss is finite and near ln(V).
  EXPECT_NEAR(ta[0]["loss"].get<double>(), std::log(256.0), 0.5);
  EXPECT_NE(model_bytes(a + "/checkpoints/step_2"), model_bytes(a + "/checkpoints/step_6"));
  // Validation ran at steps 0 (the starting model), 3 and 6 in both runs with the same results.
  auto va = train_records(a, "valid"), vb = train_records(b, "valid");
  ASSERT_EQ(va.size(), 3u);
  ASSERT_EQ(vb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(va[i]["step"], vb[i]["step"]);
    EXPECT_EQ(va[i]["loss"].get<double>(), vb[i]["loss"].get<double>()) << "validation " << i;
  }
  EXPECT_EQ(va[0]["step"].get<int64_t>(), 0);
  EXPECT_NEAR(va[0]["loss"].get<double>(), std::log(256.0), 0.5);
  EXPECT_NEAR(va[2]["ppl"].get<double>(), std::exp(va[2]["loss"].get<double>()), 1e-9);
  // The run directory.
  EXPECT_TRUE(fs::exists(a + "/resolved_config.yaml"));
  EXPECT_TRUE(fs::exists(a + "/training.svg"));
  EXPECT_TRUE(fs::exists(a + "/tensorboard"));
  EXPECT_EQ(*CheckpointManager(a + "/checkpoints", 3).latest(), a + "/checkpoints/step_6");
  EXPECT_FALSE(fs::exists(a + "/checkpoints/step_2") && fs::exists(a + "/checkpoints/step_4") &&
               fs::exists(a + "/checkpoints/step_6") && fs::exists(a + "/checkpoints/step_3"));
  // Per-step metrics carry the expert load of both MoE layers and memory by category.
  ASSERT_TRUE(ta[0].contains("expert_load"));
  EXPECT_EQ(ta[0]["expert_load"]["max_over_mean"].size(), 2u);
  EXPECT_GE(ta[0]["expert_load"]["max_over_mean"][0].get<double>(), 1.0);
  EXPECT_GT(ta[0]["memory"]["weights"]["current"].get<int64_t>(), 0);
  EXPECT_EQ(ta[0]["tokens"], 48);
}

TEST(Trainer, AccumulationNormalizesByGlobalTokens) {
  QuietLogs quiet;
  // The same 2 sequences as 2 micro-batches of 1 or 1 micro-batch of 2: same loss and gradient.
  const std::string a = fresh("trainer_accum2"), b = fresh("trainer_accum1");
  run_training(tiny_config(a, {"training.train_iters=1", "training.eval_iters=0", "optimizer.lr_warmup_iters=0",
                               "optimizer.lr_decay_style=constant"}));
  run_training(tiny_config(b, {"training.train_iters=1", "training.eval_iters=0", "optimizer.lr_warmup_iters=0",
                               "optimizer.lr_decay_style=constant", "training.micro_batch_size=2"}));
  auto ta = train_records(a), tb = train_records(b);
  ASSERT_EQ(ta.size(), 1u);
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_NEAR(ta[0]["ce"].get<double>(), tb[0]["ce"].get<double>(), 1e-5);
  EXPECT_NEAR(ta[0]["grad_norm"].get<double>(), tb[0]["grad_norm"].get<double>(), 1e-4 * tb[0]["grad_norm"].get<double>());
  EXPECT_EQ(ta[0]["trained_tokens"], tb[0]["trained_tokens"]);
}

TEST(Trainer, FrozenParametersDoNotMove) {
  QuietLogs quiet;
  const std::string a = fresh("trainer_frozen");
  run_training(tiny_config(a, {"training.train_iters=2", "optimizer.lr_warmup_iters=1", "model.freeze=['*.mlp.gate.weight', 're:model\\.norm\\..*']"}));
  auto s2 = model_bytes(a + "/checkpoints/step_2");
  // Random init is deterministic per (seed, name): a zero-step reference is a fresh init.
  const std::string ref = fresh("trainer_frozen_ref");
  run_training(tiny_config(ref, {"training.train_iters=1", "optimizer.lr_warmup_iters=0", "optimizer.lr=0", "optimizer.min_lr=0", "optimizer.weight_decay=0"}));
  auto s0 = model_bytes(ref + "/checkpoints/step_1");
  EXPECT_EQ(s2["model.layers.0.mlp.gate.weight"], s0["model.layers.0.mlp.gate.weight"]);
  EXPECT_EQ(s2["model.layers.1.mlp.gate.weight"], s0["model.layers.1.mlp.gate.weight"]);
  EXPECT_EQ(s2["model.norm.weight"], s0["model.norm.weight"]);
  EXPECT_NE(s2["model.layers.0.self_attn.q_proj.weight"], s0["model.layers.0.self_attn.q_proj.weight"]);
  // The optimizer state holds no entry for frozen parameters.
  auto opt = SafetensorsCheckpoint::open_dir(a + "/checkpoints/step_2/optimizer");
  EXPECT_FALSE(opt.contains("exp_avg.model.layers.0.mlp.gate.weight"));
  EXPECT_TRUE(opt.contains("exp_avg.model.layers.0.self_attn.q_proj.weight"));
  // A pattern that matches nothing is a user error.
  EXPECT_THROW(run_training(tiny_config(fresh("trainer_frozen_bad"), {"model.freeze=['*.no_such.weight']"})), Error);
}
