// optimizer.update_in_backward: AdamW applied to the expert weights as the last micro-batch's
// backward forms their gradients (ops::grouped_matmul_backward_adamw) must give the same bits as
// the ordinary step: weights, moments and the gradient norm, over several steps, with f32 and bf16
// gradients, a separate bf16 master with stochastic rounding, one or two micro-batches and frozen
// experts; the trainer end to end; and the refusals (clipping on, a gradient that is no expert's).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "core/log.h"
#include "data/indexed_dataset.h"
#include "io/safetensors.h"
#include "model/qwen3_model.h"
#include "optim/adamw.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

struct InBwdCase {
  DType grad_dtype = DType::kF32;
  DType master_dtype = DType::kF32;  // bf16: a separate master copy of the f32 CPU weights
  DType moments = DType::kF32;
  int micro_batches = 1;
  std::vector<std::string> freeze;
  bool no_expert_grads = false;  // the in-backward run has no expert gradient buffers (one micro-batch)
};

// One tiny-moe model + optimizer; `in_backward` runs the expert updates inside the last pass.
struct InBwdRun {
  ModelConfig cfg = ModelConfig::preset("tiny-moe");
  ModelParams params, grads;
  std::unique_ptr<Qwen3Model> model;
  std::unique_ptr<AdamW> opt;
  std::vector<Batch> batches;
  bool expert_grads = true;  // false: the expert gradients have no buffers

  InBwdRun(const InBwdCase& s, bool in_backward) {
    params = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
    init_params_random(params, 7, 0.2f);
    expert_grads = !(in_backward && s.no_expert_grads);
    grads = allocate_gradients(cfg, Device::cpu(), s.grad_dtype, expert_grads);
    model = std::make_unique<Qwen3Model>(params);
    std::vector<OptimParam> ps;
    params.for_each([&](const std::string& n, Tensor& t) { ps.push_back({n, t, Tensor()}); });
    size_t i = 0;
    grads.for_each([&](const std::string&, Tensor& t) {
      ps[i].grad = t;
      ps[i++].in_backward_only = !t.defined();
    });
    AdamWConfig ac;
    ac.weight_decay = 0.1;
    ac.beta2 = 0.95;
    ac.main_params_dtype = s.master_dtype;
    ac.exp_avg_dtype = ac.exp_avg_sq_dtype = s.moments;
    ac.freeze_patterns = s.freeze;
    opt = std::make_unique<AdamW>(std::move(ps), ac);
    batches.push_back(Batch::from_documents({{1, 5, 9, 2, 7, 3}, {4, 4, 8, 1}}));
    batches.push_back(Batch::from_documents({{3, 3, 6, 2, 9, 9, 1}}));
  }
  std::vector<Tensor> expert_weights() {
    std::vector<Tensor> out;
    for (LayerParams& l : params.layers)
      if (l.sparse) out.push_back(l.experts_gate_up), out.push_back(l.experts_down);
    return out;
  }
  // One optimizer step over `micro` passes; returns the gradient norm.
  double step(Context& ctx, int micro, bool in_backward, double lr) {
    zero_gradients(grads, /*matrices=*/false);
    model->set_overwrite_matrix_grads();
    for (int i = 0; i < micro; ++i) {
      if (i == micro - 1) {
        model->request_grad_sum_squares();
        if (in_backward) model->request_in_backward_updates(opt->in_backward_targets(ctx, lr, expert_weights()));
      }
      model->forward_backward(ctx, batches[static_cast<size_t>(i) % batches.size()], grads);
    }
    const auto* k = model->grad_sum_squares();
    EXPECT_NE(k, nullptr);
    // In-backward, the known sums cover exactly the updated (trainable) expert matrices, so the
    // norm never reads their buffers (which the fused Hopper kernel leaves unwritten); without
    // buffers there is nothing to name.
    if (in_backward) EXPECT_EQ(k->grads.size(), expert_grads ? model->updated_in_backward().size() : 0u);
    const double norm = opt->grad_norm(ctx, 1.0, k->sum, k->grads);
    EXPECT_EQ(model->updated_in_backward().size(), in_backward ? opt->in_backward_targets(ctx, lr, expert_weights()).size() : 0u);
    opt->step(ctx, lr, 1.0, model->updated_in_backward());
    return norm;
  }
};

std::string bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()); }

void expect_same_state(InBwdRun& a, InBwdRun& b, const std::string& what) {
  std::map<std::string, std::string> pa, pb;
  a.params.for_each([&](const std::string& n, Tensor& t) { pa[n] = bytes(t); });
  b.params.for_each([&](const std::string& n, Tensor& t) { pb[n] = bytes(t); });
  for (const auto& [n, v] : pa) EXPECT_TRUE(v == pb[n]) << what << ": weight " << n;
  const auto sa = a.opt->state_tensors(), sb = b.opt->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(bytes(sa[i].second) == bytes(sb[i].second)) << what << ": " << sa[i].first;
}

}  // namespace

TEST(UpdateInBackward, SameBitsAsTheOrdinaryStep) {
  const std::vector<std::pair<std::string, InBwdCase>> cases = {
      {"f32", {}},
      {"bf16 grads, two micro-batches", {DType::kBF16, DType::kF32, DType::kF32, 2, {}}},
      {"bf16 master (stochastic) + bf16 moments", {DType::kBF16, DType::kBF16, DType::kBF16, 1, {}}},
      {"f32, three micro-batches, layer 1 experts frozen", {DType::kF32, DType::kF32, DType::kF32, 3, {"layers.1.mlp.experts.*"}}},
      {"f32, no expert gradient buffers", {DType::kF32, DType::kF32, DType::kF32, 1, {}, true}},
      {"bf16 everything, no expert gradient buffers", {DType::kBF16, DType::kBF16, DType::kBF16, 1, {}, true}},
  };
  for (const auto& [name, s] : cases) {
    Context ca, cb;
    InBwdRun a(s, false), b(s, true);
    for (const LayerParams& l : b.grads.layers)  // the case builds what it says
      if (l.sparse) EXPECT_EQ(l.experts_gate_up.defined() || l.experts_down.defined(), !s.no_expert_grads) << name;
    ASSERT_GT(a.expert_weights().size(), 0u);
    for (int st = 1; st <= 3; ++st) {
      const double lr = 1e-2 * st;  // a changing learning rate must reach the in-backward targets too
      const double na = a.step(ca, s.micro_batches, false, lr), nb = b.step(cb, s.micro_batches, true, lr);
      EXPECT_EQ(na, nb) << name << ", step " << st;
      expect_same_state(a, b, name + ", step " + std::to_string(st));
    }
    EXPECT_EQ(a.opt->step_count(), b.opt->step_count());
  }
}

TEST(UpdateInBackward, TheUpdateHappensInTheLastPassOnly) {
  Context ctx;
  InBwdRun r(InBwdCase{}, true);
  const Tensor w = r.params.layers[0].experts_down;
  const std::string before = bytes(w);
  // Requested, then a pass: the expert weights change during backward, before any step().
  r.model->request_in_backward_updates(r.opt->in_backward_targets(ctx, 1e-2, r.expert_weights()));
  r.model->forward_backward(ctx, r.batches[0], r.grads);
  EXPECT_NE(bytes(w), before);
  EXPECT_EQ(r.model->updated_in_backward().size(), r.expert_weights().size());
  // The next pass without a request updates nothing and clears the list.
  const std::string after = bytes(w);
  r.model->forward_backward(ctx, r.batches[0], r.grads);
  EXPECT_EQ(bytes(w), after);
  EXPECT_TRUE(r.model->updated_in_backward().empty());
}

// Without expert gradient buffers, each way of reaching a missing gradient fails with a message:
// a pass without the update, a norm without backward's sums, a step that would read the gradient.
TEST(UpdateInBackward, WithoutGradientBuffersEveryMissedUpdateIsRefused) {
  Context ctx;
  InBwdCase c;
  c.no_expert_grads = true;
  InBwdRun r(c, true);
  auto expect_error = [](const std::function<void()>& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { r.model->forward_backward(ctx, r.batches[0], r.grads); },
               "has no gradient buffer and no in-backward update");
  r.model->request_in_backward_updates(r.opt->in_backward_targets(ctx, 1e-2, r.expert_weights()));
  r.model->forward_backward(ctx, r.batches[0], r.grads);
  expect_error([&] { r.opt->grad_norm(ctx); }, "needs its sum of squares from backward");
  expect_error([&] { r.opt->step(ctx, 1e-2, 1.0); }, "must be updated in backward");
}

TEST(UpdateInBackward, RefusesAWeightThatIsNoExperts) {
  Context ctx;
  InBwdRun r(InBwdCase{}, true);
  auto targets = r.opt->in_backward_targets(ctx, 1e-2, {r.params.layers[0].q_proj});
  ASSERT_EQ(targets.size(), 1u);
  r.model->request_in_backward_updates(std::move(targets));
  try {
    r.model->forward_backward(ctx, r.batches[0], r.grads);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not an expert weight of this model"), std::string::npos) << e.what();
  }
}

TEST(UpdateInBackward, ConfigNeedsClippingOff) {
  const std::string yaml = "model:\n  preset: tiny-moe\ndata:\n  mock_data: true\ntraining:\n  device: cpu\n";
  try {
    TrainConfig::from_yaml_string(yaml, "in_bwd.yaml", {"optimizer.update_in_backward=true"});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.update_in_backward needs optimizer.clip_grad 0"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(TrainConfig::from_yaml_string(yaml, "in_bwd.yaml",
                                                {"optimizer.update_in_backward=true", "optimizer.clip_grad=0"}));
}

namespace {
std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  fs::remove_all(d);
  return d;
}
std::map<std::string, std::string> checkpoint_bytes(const std::string& dir) {
  auto ck = SafetensorsCheckpoint::open_dir(dir);
  std::map<std::string, std::string> out;
  for (const auto& n : ck.names()) {
    const auto& e = ck.entry(n);
    out[n] = std::string(reinterpret_cast<const char*>(ck.file_of(n).data(e)), e.end - e.begin);
  }
  return out;
}
}  // namespace

TEST(UpdateInBackward, TrainerRunsMatchBitForBit) {
  const LogLevel old = log_level();
  set_log_level(LogLevel::kError);
  const std::string data_dir = fresh("inbwd_data");
  fs::create_directories(data_dir);
  {
    IndexedDatasetWriter w(data_dir + "/d", IdxDType::kI32);
    for (int d = 0; d < 64; ++d) {
      std::vector<int32_t> toks(40);
      for (int i = 0; i < 40; ++i) toks[i] = (d * 37 + i * 5) % 256;
      w.add_sequence(toks);
      w.end_document();
    }
    w.commit();
  }
  const std::string yaml = R"(model:
  preset: tiny-moe
training:
  objective: pretrain
  seq_length: 32
  micro_batch_size: 1
  global_batch_size: 2
  train_iters: 6
  eval_interval: 0
  device: cpu
optimizer:
  lr: 1.0e-2
  clip_grad: 0
  weight_decay: 0.01
checkpoint:
  save_interval: 0
  export_hf: false
logging:
  tensorboard: false
  plot: false
)";
  // global batch 2: two micro-batches, expert gradient buffers kept; 1: none (the op's workspace).
  for (const auto& [bf16, global_batch] : std::vector<std::pair<bool, int>>{{false, 2}, {true, 2}, {false, 1}, {true, 1}}) {
    std::vector<std::string> ov = {"data.data_path=[" + data_dir + "/d]",
                                   "training.global_batch_size=" + std::to_string(global_batch)};
    if (bf16)
      for (const char* k : {"optimizer.main_grads_dtype=bf16", "optimizer.main_params_dtype=bf16",
                            "optimizer.exp_avg_dtype=bf16", "optimizer.exp_avg_sq_dtype=bf16"})
        ov.push_back(k);
    const std::string a = fresh("inbwd_off"), b = fresh("inbwd_on");
    auto with = [&](const std::string& dir, bool on) {
      auto v = ov;
      v.push_back("logging.run_dir=" + dir);
      v.push_back(std::string("optimizer.update_in_backward=") + (on ? "true" : "false"));
      return TrainConfig::from_yaml_string(yaml, "in_bwd.yaml", v);
    };
    run_training(with(a, false));
    run_training(with(b, true));
    std::vector<nlohmann::json> ra, rb;
    for (auto& r : read_metrics_file(a + "/metrics.jsonl"))
      if (r["type"] == "train") ra.push_back(r);
    for (auto& r : read_metrics_file(b + "/metrics.jsonl"))
      if (r["type"] == "train") rb.push_back(r);
    ASSERT_EQ(ra.size(), 6u);
    ASSERT_EQ(rb.size(), 6u);
    // With one micro-batch the in-backward run holds no expert gradients: exactly their bytes less.
    const ModelConfig mc = ModelConfig::preset("tiny-moe");
    int64_t expert_grad_bytes = 0;
    for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
      if (mc.is_sparse_layer(l))
        expert_grad_bytes += 3 * mc.num_experts * mc.moe_intermediate_size * mc.hidden_size * (bf16 ? 2 : 4);
    const char* grad_cat = mem_category_name(MemCategory::kGradients);
    const int64_t ga = ra[0]["memory"][grad_cat]["current"].get<int64_t>(),
                  gb = rb[0]["memory"][grad_cat]["current"].get<int64_t>();
    EXPECT_EQ(ga - gb, global_batch == 1 ? expert_grad_bytes : 0) << "bf16 " << bf16 << ", global batch " << global_batch;
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(ra[i]["loss"].get<double>(), rb[i]["loss"].get<double>()) << "bf16 " << bf16 << ", step " << i + 1;
      EXPECT_EQ(ra[i]["grad_norm"].get<double>(), rb[i]["grad_norm"].get<double>()) << "step " << i + 1;
    }
    for (const char* part : {"model", "optimizer"}) {
      const auto ca = checkpoint_bytes(a + "/checkpoints/step_6/" + part);
      const auto cb = checkpoint_bytes(b + "/checkpoints/step_6/" + part);
      ASSERT_EQ(ca.size(), cb.size()) << part;
      for (const auto& [n, v] : ca) EXPECT_TRUE(cb.count(n) && cb.at(n) == v) << part << " tensor " << n << " differs";
    }
  }
  set_log_level(old);
}
