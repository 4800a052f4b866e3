// The trainer with reduced-precision optimizer settings on the CPU (tiny-moe): an all-bf16 run
// (bf16 matrix gradients, bf16 main params, bf16 m and v) learns a learnable prepared dataset
// about as well as fp32; N steps + exit + resume + N steps reproduce 2N straight steps bit for
// bit, with bf16 optimizer state in the checkpoint; resuming with other state dtypes converts the
// moments and refuses a master copy that exists on one side only; bad dtype values are config errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "data/indexed_dataset.h"
#include "io/safetensors.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kAllBf16 = {"optimizer.main_grads_dtype=bf16", "optimizer.main_params_dtype=bf16",
                                           "optimizer.exp_avg_dtype=bf16", "optimizer.exp_avg_sq_dtype=bf16"};

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  fs::remove_all(d);
  return d;
}

// Documents counting upwards mod 256 from random starts: the next token is the current one + 1,
// which a tiny model learns in a few dozen steps (random tokens, the mock data, cannot be learnt).
std::string counting_dataset() {
  const std::string dir = fresh("precision_counting_data");
  fs::create_directories(dir);
  const std::string prefix = dir + "/counting";
  IndexedDatasetWriter w(prefix, IdxDType::kI32);
  for (int d = 0; d < 256; ++d) {
    std::vector<int32_t> toks(40);
    for (int i = 0; i < 40; ++i) toks[i] = (d * 37 + i) % 256;
    w.add_sequence(toks);
    w.end_document();
  }
  w.commit();
  return prefix;
}

TrainConfig config(const std::string& run_dir, const std::string& data, const std::vector<std::string>& extra) {
  const std::string yaml = R"(model:
  preset: tiny-moe
training:
  objective: pretrain
  seq_length: 32
  micro_batch_size: 1
  global_batch_size: 2
  train_iters: 60
  eval_interval: 0
  device: cpu
optimizer:
  lr: 1.0e-2
  lr_decay_style: constant
  weight_decay: 0.01
  adam_beta2: 0.95
checkpoint:
  save_interval: 0
  export_hf: false
logging:
  tensorboard: false
  plot: false
)";
  std::vector<std::string> ov = {"logging.run_dir=" + run_dir, "data.data_path=[" + data + "]"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return TrainConfig::from_yaml_string(yaml, "precision.yaml", ov);
}

std::vector<nlohmann::json> train_records(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  for (auto& r : read_metrics_file(run_dir + "/metrics.jsonl"))
    if (r["type"] == "train") out.push_back(r);
  return out;
}

std::map<std::string, std::string> tensor_bytes(const std::string& dir) {
  auto ck = SafetensorsCheckpoint::open_dir(dir);
  std::map<std::string, std::string> out;
  for (const auto& n : ck.names()) {
    const auto& e = ck.entry(n);
    out[n] = std::string(reinterpret_cast<const char*>(ck.file_of(n).data(e)), e.end - e.begin);
  }
  return out;
}

double mean_loss(const std::vector<nlohmann::json>& recs, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += recs[i]["loss"].get<double>();
  return s / static_cast<double>(to - from);
}

struct QuietLogs {
  LogLevel old = log_level();
  QuietLogs() { set_log_level(LogLevel::kError); }
  ~QuietLogs() { set_log_level(old); }
};

}  // namespace

TEST(PrecisionTraining, AllBf16LearnsLikeFp32AndResumesBitIdentically) {
  QuietLogs quiet;
  const std::string data = counting_dataset();
  const std::string f = fresh("prec_fp32"), a = fresh("prec_bf16_straight"), b = fresh("prec_bf16_resumed");
  run_training(config(f, data, {}));
  run_training(config(a, data, kAllBf16));
  auto with = [&](std::vector<std::string> v, const std::string& x) { v.push_back(x); return v; };
  const TrainResult b1 = run_training(config(b, data, with(kAllBf16, "training.exit_interval=30")));
  EXPECT_EQ(b1.reason, StopReason::kExitInterval);
  const TrainResult b2 = run_training(config(b, data, kAllBf16));
  EXPECT_EQ(b2.start_step, 30);

  const auto rf = train_records(f), ra = train_records(a), rb = train_records(b);
  ASSERT_EQ(rf.size(), 60u);
  ASSERT_EQ(ra.size(), 60u);
  ASSERT_EQ(rb.size(), 60u);
  // Learns: the loss of the last 5 steps is far below the first 5 (ln 256 = 5.5 at the start),
  // and within 20% of the fp32 run's.
  const double start = mean_loss(ra, 0, 5), end_bf16 = mean_loss(ra, 55, 60), end_fp32 = mean_loss(rf, 55, 60);
  EXPECT_GT(start, 5.0);
  std::printf("counting data, mean loss of steps 1-5: %.3f; steps 56-60: bf16 %.3f, fp32 %.3f\n", start, end_bf16, end_fp32);
  EXPECT_LT(end_bf16, start - 2.0) << "fp32 reached " << end_fp32;
  EXPECT_LT(end_bf16, 1.2 * end_fp32 + 0.1);
  EXPECT_NE(ra[59]["loss"].get<double>(), rf[59]["loss"].get<double>());  // the settings took effect
  // Resume is bit-identical: losses, norms, model and optimizer tensors.
  for (size_t i = 0; i < 60; ++i) {
    EXPECT_EQ(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(ra[i]["grad_norm"].get<double>(), rb[i]["grad_norm"].get<double>()) << "step " << i + 1;
  }
  EXPECT_EQ(tensor_bytes(a + "/checkpoints/step_60/model"), tensor_bytes(b + "/checkpoints/step_60/model"));
  EXPECT_EQ(tensor_bytes(a + "/checkpoints/step_60/optimizer"), tensor_bytes(b + "/checkpoints/step_60/optimizer"));
  // The optimizer state is stored in its dtypes: bf16 moments and (CPU: f32 compute weights) a
  // bf16 master copy; the fp32 run's f32 weights are their own master.
  auto ck = SafetensorsCheckpoint::open_dir(a + "/checkpoints/step_60/optimizer");
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(ck.entry("exp_avg." + q).dtype, DType::kBF16);
  EXPECT_EQ(ck.entry("exp_avg_sq." + q).dtype, DType::kBF16);
  EXPECT_EQ(ck.entry("master." + q).dtype, DType::kBF16);
  EXPECT_FALSE(SafetensorsCheckpoint::open_dir(f + "/checkpoints/step_60/optimizer").contains("master." + q));
  // Memory: bf16 matrix gradients are smaller than the fp32 run's.
  EXPECT_LT(ra[0]["memory"]["gradients"]["current"].get<int64_t>(), rf[0]["memory"]["gradients"]["current"].get<int64_t>());
}

TEST(PrecisionTraining, ResumeAcrossStateDtypesConvertsMomentsAndRefusesMasterMismatch) {
  QuietLogs quiet;
  const std::string data = counting_dataset();
  const std::string r = fresh("prec_switch");
  run_training(config(r, data, {"training.train_iters=2"}));
  // fp32 moments into a bf16-moment run: converted (round to nearest even), training continues.
  TrainResult t = run_training(config(r, data, {"training.train_iters=4", "optimizer.exp_avg_dtype=bf16",
                                                "optimizer.exp_avg_sq_dtype=bf16", "optimizer.main_grads_dtype=bf16"}));
  EXPECT_EQ(t.start_step, 2);
  EXPECT_EQ(t.final_step, 4);
  // A bf16-main-params run keeps a bf16 master on the CPU (f32 weights); the fp32 checkpoint has none.
  try {
    run_training(config(r, data, {"training.train_iters=6", "optimizer.main_params_dtype=bf16"}));
    FAIL() << "a checkpoint without master copies resumed into a run that keeps one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("main_params_dtype"), std::string::npos) << e.what();
  }
}

TEST(PrecisionTraining, ConfigKeysValidateAndRoundTrip) {
  const std::string data = "/nonexistent";
  for (const char* bad : {"optimizer.main_grads_dtype=fp16", "optimizer.main_params_dtype=float32",
                          "optimizer.exp_avg_dtype=fp8", "optimizer.exp_avg_sq_dtype=bf32"}) {
    try {
      config(fresh("prec_cfg"), data, {bad});
      FAIL() << bad << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what(), key = std::string(bad).substr(0, std::string(bad).find('='));
      EXPECT_NE(m.find(key), std::string::npos) << m;
      EXPECT_NE(m.find("fp32, bf16"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(config(fresh("prec_cfg"), data, {"optimizer.stochastic_rounding=maybe"}), Error);
  const TrainConfig c = config(fresh("prec_cfg"), data, kAllBf16);
  EXPECT_EQ(c.optimizer.main_params_dtype, "bf16");
  EXPECT_TRUE(c.optimizer.stochastic_rounding);
  const TrainConfig back = TrainConfig::from_yaml_string(c.to_yaml(), "resolved.yaml");
  EXPECT_EQ(back.optimizer.exp_avg_sq_dtype, "bf16");
  EXPECT_EQ(back.optimizer.main_grads_dtype, "bf16");
  const TrainConfig d = config(fresh("prec_cfg"), data, {});
  EXPECT_EQ(d.optimizer.main_grads_dtype, "fp32");
  EXPECT_EQ(d.optimizer.exp_avg_dtype, "fp32");
}
