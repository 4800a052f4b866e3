// The training loop (see trainer.h). Determinism: the data order depends only on the seed and
// the loader cursor, the schedule only on the step, the CPU kernels are thread-count independent
// and parameters are updated in a fixed order, so N steps + resume + N steps reproduce 2N straight
// steps bit for bit. Aux and z coefficients are divided by the accumulation count so that a
// global batch weighs them once, like the CE, whose per-token weights are 1 / N_global.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "core/check.h"
#include "core/context.h"
#include "core/env.h"
#include "core/log.h"
#include "core/profiler.h"
#include "io/atomic_dir.h"
#include "model/hf_checkpoint.h"
#include "model/qwen3_model.h"
#include "optim/adamw.h"
#include "optim/name_pattern.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/data_setup.h"
#include "train/dpo.h"
#include "train/metrics.h"
#include "train/plot_svg.h"
#include "train/signals.h"
#include "train/tensorboard.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Device pick_device(const TrainConfig& cfg) {
  const int n = cuda_device_count();
  if (cfg.training.device == "cuda") {
    MT_CHECK(n > 0, "[train] {}: training.device is cuda but no CUDA device is visible", cfg.source);
    return Device::cuda(0);
  }
  if (cfg.training.device == "auto" && n > 0) return Device::cuda(0);
  return Device::cpu();
}

ModelConfig model_config_of(const TrainConfig& cfg) {
  ModelConfig mc;
  if (!cfg.model.path.empty()) {
    LoadOptions lo;
    lo.num_layers = cfg.model.num_layers;
    return load_hf_config(cfg.model.path, lo);
  }
  if (!cfg.model.preset.empty()) mc = ModelConfig::preset(cfg.model.preset);
  else mc = ModelConfig::from_file(cfg.model.config);
  if (cfg.model.num_layers > 0) {
    mc.num_hidden_layers = cfg.model.num_layers;
    mc.validate(cfg.source + " (model.num_layers)");
  }
  return mc;
}

// Mean number of keys a query attends over the real (non-padding) segments: sum L(L+1)/2 / sum L.
double mean_attended(const MicroBatch& mb) {
  double keys = 0, toks = 0;
  const int64_t segs = mb.num_segments() - (mb.num_padding > 0 ? 1 : 0);
  for (int64_t s = 0; s < segs; ++s) {
    const double L = mb.cu_seqlens[s + 1] - mb.cu_seqlens[s];
    keys += L * (L + 1) / 2, toks += L;
  }
  return toks > 0 ? keys / toks : 0.0;
}

Batch to_batch(const MicroBatch& mb, float weight_scale, Device dev) {
  const int64_t T = static_cast<int64_t>(mb.tokens.size());
  Batch b;
  b.tokens = Tensor::from_ints(mb.tokens, {T});
  b.positions = Tensor::from_ints(mb.positions, {T});
  b.cu_seqlens = Tensor::from_ints(mb.cu_seqlens, {static_cast<int64_t>(mb.cu_seqlens.size())});
  b.labels = Tensor::from_ints(mb.labels, {T});
  std::vector<float> w(mb.loss_mask.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = mb.loss_mask[i] * weight_scale;
  b.loss_weights = Tensor::from_floats(w, {T});
  for (size_t i = 0; i + 1 < mb.cu_seqlens.size(); ++i)
    b.max_seqlen = std::max(b.max_seqlen, mb.cu_seqlens[i + 1] - mb.cu_seqlens[i]);
  return dev.is_cpu() ? b : b.to(dev);
}

// Router statistics summed over the micro-batches of a step.
struct RouterAccum {
  std::map<int64_t, std::vector<double>> counts;  // layer -> [E]
  std::map<int64_t, double> entropy;               // layer -> sum of per-micro-batch means
  int64_t batches = 0;
  void add(const std::vector<RouterLayerStats>& st) {
    for (const auto& l : st) {
      auto& c = counts[l.layer];
      c.resize(l.tokens_per_expert.size(), 0.0);
      for (size_t e = 0; e < c.size(); ++e) c[e] += l.tokens_per_expert[e];
      entropy[l.layer] += l.entropy;
    }
    ++batches;
  }
};

class Trainer {
 public:
  explicit Trainer(const TrainConfig& cfg, TrainHooks hooks = {})
      : cfg_(cfg), run_dir_(cfg.logging.run_dir), device_(pick_device(cfg)),
        ctx_(device_, static_cast<uint64_t>(cfg.training.seed)), hooks_(std::move(hooks)) {}
  TrainResult run();

 private:
  void setup_model_();
  void setup_optimizer_();
  std::vector<Tensor> expert_weights_();  // the MoE layers' expert weights (update_in_backward)
  std::optional<std::string> resume_source_();
  void resume_(const std::string& step_dir);
  void train_step_(int64_t step);
  void setup_dpo_();
  void evaluate_dpo_(int64_t step);
  void evaluate_(int64_t step);
  std::string save_(int64_t step);
  NamedTensors model_tensors_();
  bool next_micro_batch_(MicroBatch& mb);
  void refresh_plot_();

  TrainConfig cfg_;
  std::string run_dir_;
  Device device_;
  Context ctx_;
  ModelConfig mc_;
  ModelParams params_, grads_;
  std::unique_ptr<Qwen3Model> model_;
  ModelOptions model_opts_;
  std::unique_ptr<DpoObjective> dpo_;  // objective dpo only
  std::unique_ptr<AdamW> opt_;
  LrSchedule sched_;
  TrainData data_;
  std::unique_ptr<CheckpointManager> ckpt_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<TensorBoardWriter> tb_;
  int64_t accum_ = 1;
  int64_t step_ = 0;
  int64_t consumed_tokens_ = 0, consumed_trained_ = 0, skipped_steps_ = 0;
  double peak_flops_ = 0;
  double time_in_steps_ = 0;
  int64_t steps_timed_ = 0;
  TrainResult result_;
  TrainHooks hooks_;
  nlohmann::json last_record_;  // the last step's metrics record (for hooks_.after_step)
};

void Trainer::setup_model_() {
  mc_ = model_config_of(cfg_);
  const DType dtype = device_.is_cuda() && cfg_.training.bf16 ? DType::kBF16 : DType::kF32;
  if (!cfg_.model.path.empty()) {
    LoadOptions lo;
    lo.num_layers = cfg_.model.num_layers;
    params_ = load_hf_checkpoint(cfg_.model.path, dtype, device_, lo);
  } else {
    params_ = ModelParams::allocate(mc_, dtype, device_);
    init_params_random(params_, static_cast<uint64_t>(cfg_.training.seed), static_cast<float>(cfg_.model.init_method_std));
  }
  // optimizer.update_in_backward with one micro-batch per step: a trainable expert weight's
  // gradient is formed and consumed inside its backward op, so it gets no buffer (1.2 GB per
  // Qwen3-30B-A3B layer in bf16); frozen expert weights keep theirs (backward still writes them).
  const DType gdt = parse_precision_dtype(cfg_.optimizer.main_grads_dtype, "optimizer.main_grads_dtype");
  const bool expert_grads = !cfg_.optimizer.update_in_backward || accum_ != 1;
  grads_ = allocate_gradients(mc_, device_, gdt, expert_grads);
  for (size_t l = 0; l < grads_.layers.size() && !expert_grads; ++l) {
    LayerParams& g = grads_.layers[l];
    if (!g.sparse) continue;
    const std::string pre = "model.layers." + std::to_string(l) + ".mlp.experts.";
    const LayerParams& w = params_.layers[l];
    if (name_matches_any(cfg_.model.freeze, pre + "gate_up_proj"))
      g.experts_gate_up = Tensor::zeros(w.experts_gate_up.shape(), gdt, device_, MemCategory::kGradients);
    if (name_matches_any(cfg_.model.freeze, pre + "down_proj"))
      g.experts_down = Tensor::zeros(w.experts_down.shape(), gdt, device_, MemCategory::kGradients);
  }
  ModelOptions mo;
  mo.aux_coef = static_cast<float>(cfg_.model.moe_aux_loss_coeff / static_cast<double>(accum_));
  mo.zloss_coef = static_cast<float>(cfg_.model.moe_z_loss_coeff / static_cast<double>(accum_));
  mo.aux_type = parse_aux_loss_type(cfg_.model.moe_aux_loss_type);
  mo.recompute = parse_recompute(cfg_.training.recompute_granularity);
  mo.router_stats = cfg_.logging.log_expert_load;
  mo.ce_chunk_tokens = cfg_.model.ce_chunk_tokens;
  mo.head_grad_f32 = gdt == DType::kF32;  // (a tied embedding's gradient is f32 whatever this says)
  model_opts_ = mo;
  model_ = std::make_unique<Qwen3Model>(params_, mo);
  // The gradients start at zero, so the first step's first pass writes the matrix gradients as
  // every later step's does (the same values; step 1 then runs the same kernels and scratch).
  model_->set_overwrite_matrix_grads();
}

// Objective dpo: the pairs loader and the reference log-probs of the starting weights (params_
// must not hold a resumed checkpoint yet: the reference is the model the run started from).
void Trainer::setup_dpo_() {
  DpoSettings s;
  s.loss.beta = cfg_.dpo.beta;
  s.loss.label_smoothing = cfg_.dpo.label_smoothing;
  s.loss.loss_type = parse_dpo_loss_type(cfg_.dpo.loss_type);
  s.reference = parse_dpo_reference(cfg_.dpo.reference);
  s.source = cfg_.source;
  PairLoaderOptions lo;
  lo.pairs_per_batch = cfg_.training.micro_batch_size;
  lo.seed = static_cast<uint64_t>(cfg_.training.seed);
  lo.shuffle = true;
  lo.max_epochs = 0;
  dpo_ = std::make_unique<DpoObjective>(s, data_.train_prefix, data_.valid_prefix, lo, run_dir_, device_);
  MT_LOG_INFO("[dpo] {} training pairs{} | beta {} | loss {} | label smoothing {} | reference {}", dpo_->num_train_pairs(),
              dpo_->has_validation() ? ", validation pairs from " + data_.valid_prefix : ", no validation pairs",
              cfg_.dpo.beta, cfg_.dpo.loss_type, cfg_.dpo.label_smoothing, cfg_.dpo.reference);
  const auto t0 = Clock::now();
  dpo_->prepare_reference(ctx_, params_, reference_model_fingerprint(cfg_),
                          2 * cfg_.training.micro_batch_size * cfg_.training.seq_length, model_opts_);
  MT_LOG_INFO("[dpo] reference log-probs ready ({:.1f} s)", seconds_since(t0));
}

void Trainer::setup_optimizer_() {
  std::map<std::string, Tensor> grad_of;
  grads_.for_each([&](const std::string& n, Tensor& t) { grad_of[n] = t; });
  std::vector<OptimParam> ps;
  params_.for_each([&](const std::string& n, Tensor& t) {
    auto it = grad_of.find(n);
    MT_CHECK(it != grad_of.end(), "[train] no gradient tensor for parameter {}", n);
    ps.push_back({n, t, it->second, !it->second.defined()});  // undefined: updated in backward only
  });
  AdamWConfig ac;
  ac.beta1 = cfg_.optimizer.adam_beta1;
  ac.beta2 = cfg_.optimizer.adam_beta2;
  ac.eps = cfg_.optimizer.adam_eps;
  ac.weight_decay = cfg_.optimizer.weight_decay;
  ac.no_decay_patterns = cfg_.optimizer.no_weight_decay;
  ac.freeze_patterns = cfg_.model.freeze;
  ac.main_params_dtype = parse_precision_dtype(cfg_.optimizer.main_params_dtype, "optimizer.main_params_dtype");
  ac.exp_avg_dtype = parse_precision_dtype(cfg_.optimizer.exp_avg_dtype, "optimizer.exp_avg_dtype");
  ac.exp_avg_sq_dtype = parse_precision_dtype(cfg_.optimizer.exp_avg_sq_dtype, "optimizer.exp_avg_sq_dtype");
  ac.stochastic_rounding = cfg_.optimizer.stochastic_rounding;
  opt_ = std::make_unique<AdamW>(std::move(ps), ac);
  if (!cfg_.model.freeze.empty()) {
    MT_CHECK(opt_->num_frozen_elements() > 0, "[config] {}: model.freeze patterns match no parameter (names look like "
             "model.layers.0.mlp.gate.weight)", cfg_.source);
    MT_CHECK(opt_->num_trainable_elements() > 0, "[config] {}: model.freeze freezes every parameter", cfg_.source);
  }
  sched_.max_lr = cfg_.optimizer.lr;
  sched_.min_lr = cfg_.optimizer.min_lr;
  sched_.warmup_iters = cfg_.optimizer.lr_warmup_iters;
  sched_.decay_iters = cfg_.decay_iters();
  sched_.style = parse_lr_decay_style(cfg_.optimizer.lr_decay_style);
  sched_.wsd_decay_iters = cfg_.optimizer.lr_wsd_decay_iters;
  sched_.wsd_style = parse_wsd_decay_style(cfg_.optimizer.lr_wsd_decay_style);
  sched_.validate();
}

NamedTensors Trainer::model_tensors_() {
  NamedTensors out;
  params_.for_each([&](const std::string& n, Tensor& t) { out.emplace_back(n, t); });
  return out;
}

std::optional<std::string> Trainer::resume_source_() {
  const std::string& load = cfg_.checkpoint.load;
  if (load == "none") return std::nullopt;
  if (!load.empty()) return CheckpointManager::resolve(load);
  return ckpt_->latest();
}

void Trainer::resume_(const std::string& step_dir) {
  MT_LOG_INFO("[train] resuming from {}", step_dir);
  nlohmann::json st = CheckpointManager::load(step_dir, model_tensors_(), opt_->state_tensors());
  step_ = st.at("step").get<int64_t>();
  opt_->set_step_count(st.value("optimizer_step", step_));
  consumed_tokens_ = st.value("consumed_tokens", int64_t{0});
  consumed_trained_ = st.value("consumed_trained_tokens", int64_t{0});
  skipped_steps_ = st.value("skipped_steps", int64_t{0});
  if (st.contains("data") && !cfg_.data.mock_data == !st.value("mock_data", false)) data_.train->load_state(st["data"]);
  else MT_FAIL("[train] checkpoint {} was written with different data settings (mock_data); use checkpoint.load=none", step_dir);
  if (dpo_) {
    MT_CHECK(st.contains("dpo_data"), "[train] checkpoint {} holds no DPO pair-loader state (dpo_data): it was not written "
             "by an objective dpo run; start a fresh run directory or set checkpoint.load=none", step_dir);
    dpo_->load_state(st["dpo_data"]);
  }
  if (st.value("seed", cfg_.training.seed) != cfg_.training.seed)
    MT_LOG_WARN("[train] the checkpoint was written with seed {}, this run uses {}", st.value("seed", int64_t{0}),
                cfg_.training.seed);
  MT_CHECK(step_ <= cfg_.training.train_iters, "[train] checkpoint {} is at step {}, beyond training.train_iters = {}",
           step_dir, step_, cfg_.training.train_iters);
}

std::string Trainer::save_(int64_t step) {
  nlohmann::json st;
  st["optimizer_step"] = opt_->step_count();
  st["consumed_tokens"] = consumed_tokens_;
  st["consumed_trained_tokens"] = consumed_trained_;
  st["skipped_steps"] = skipped_steps_;
  st["seed"] = cfg_.training.seed;
  st["mock_data"] = cfg_.data.mock_data;
  st["data"] = data_.train->state();
  if (dpo_) st["dpo_data"] = dpo_->state();
  st["scheduler"] = {{"lr_decay_style", cfg_.optimizer.lr_decay_style}, {"lr", sched_.lr_at(step)}};
  // Random streams are counter-based: (seed, rank, purpose, step) names each one, so the seed and
  // the step are the whole RNG state.
  st["rng"] = {{"seed", cfg_.training.seed}, {"kind", "philox4x32 counter streams"}};
  st["model_config"] = mc_.to_json();
  result_.last_checkpoint = ckpt_->save(step, model_tensors_(), opt_->state_tensors(), st);
  return result_.last_checkpoint;
}

bool Trainer::next_micro_batch_(MicroBatch& mb) {
  mb = MicroBatch{};
  for (int64_t r = 0; r < cfg_.training.micro_batch_size; ++r) {
    MicroBatch row;
    if (!data_.train->next(row)) return false;
    append_micro_batch(mb, row);
  }
  return true;
}

std::vector<Tensor> Trainer::expert_weights_() {
  std::vector<Tensor> out;
  for (const LayerParams& l : params_.layers)
    if (l.sparse) out.push_back(l.experts_gate_up), out.push_back(l.experts_down);
  return out;
}

void Trainer::train_step_(int64_t step) {
  const auto t0 = Clock::now();
  allocator_for(device_).reset_peaks();
  int64_t trained = 0, tokens = 0;
  double flops = 0;
  double ce = 0, aux = 0, z = 0;
  RouterAccum router;
  DpoMetrics dm;  // objective dpo: sums over the global batch's pairs
  // The last micro-batch's backward also sums the squares of the expert gradients it writes, so
  // the norm below need not read them again (MT_FUSED_GRAD_NORM=0 turns it off, for comparisons).
  static const bool fused_norm_env = env_int("MT_FUSED_GRAD_NORM", 1) != 0;
  // optimizer.update_in_backward: the expert weights get their AdamW update as the last
  // micro-batch's backward forms their gradients (the norm then needs the fused sums).
  const bool in_backward = cfg_.optimizer.update_in_backward;
  const bool fused_norm = fused_norm_env || in_backward;
  const double lr = sched_.lr_at(step);
  auto before_last_pass = [&] {
    if (fused_norm) model_->request_grad_sum_squares();
    if (in_backward) model_->request_in_backward_updates(opt_->in_backward_targets(ctx_, lr, expert_weights_()));
  };
  if (dpo_) {
    // All micro-batches first, so that each pair weighs 1 / (pairs of the global batch).
    std::vector<PairBatch> pbs(static_cast<size_t>(accum_));
    int64_t pairs = 0;
    for (auto& pb : pbs) {
      MT_CHECK(dpo_->next_batch(&pb), "[train] the preference pairs ran out at step {}", step);
      pairs += pb.num_pairs();
      for (int64_t n : pb.response_tokens) trained += n;
      const int64_t real = pb.cu_seqlens.empty() ? 0 : pb.cu_seqlens.back();
      tokens += real;
      flops += mc_.flops_per_token(pair_batch_mean_attended(pb)) * static_cast<double>(real);
    }
    const double pair_scale = 1.0 / static_cast<double>(std::max<int64_t>(pairs, 1));
    for (auto& pb : pbs) {
      if (&pb == &pbs.back()) before_last_pass();
      DpoMicroResult r = dpo_->forward_backward(ctx_, *model_, grads_, pb, pair_scale);
      dm.merge(r.metrics);
      aux += r.forward.aux, z += r.forward.z;
      router.add(r.forward.router);
    }
  } else {
    std::vector<MicroBatch> mbs(static_cast<size_t>(accum_));
    for (auto& mb : mbs) {
      MT_CHECK(next_micro_batch_(mb), "[train] the training data ran out at step {}", step);
      trained += mb.num_trained_tokens;
      const int64_t real = static_cast<int64_t>(mb.tokens.size()) - mb.num_padding;
      tokens += real;
      flops += mc_.flops_per_token(mean_attended(mb)) * static_cast<double>(real);
    }
    // Every trained token of the global batch weighs 1 / N, so the accumulated CE is the global mean.
    const float scale = 1.0f / static_cast<float>(std::max<int64_t>(trained, 1));
    const ProfileScope region(ctx_, "forward_backward", ProfileKind::kRegion);
    for (const auto& mb : mbs) {
      if (&mb == &mbs.back()) before_last_pass();
      ForwardResult r = model_->forward_backward(ctx_, to_batch(mb, scale, device_), grads_);
      ce += r.ce, aux += r.aux, z += r.z;
      router.add(r.router);
    }
  }
  aux /= static_cast<double>(accum_), z /= static_cast<double>(accum_);
  // DPO: the objective is the mean pair loss (the forward's CE weights were zero, so ce is 0).
  const double objective = dpo_ ? dm.mean(dm.loss) : ce;
  const double loss = objective + cfg_.model.moe_aux_loss_coeff * aux + cfg_.model.moe_z_loss_coeff * z;
  std::optional<ProfileScope> region(std::in_place, ctx_, "grad_norm", ProfileKind::kRegion);
  const Qwen3Model::GradSumSquares* known = model_->grad_sum_squares();
  const Tensor sum_squares =
      known ? opt_->grad_sum_squares(ctx_, known->sum, known->grads) : opt_->grad_sum_squares(ctx_);
  region.reset();
  // With the update in backward (clip_grad 0, and a non-finite step stops the run rather than being
  // skipped) the rest of the update needs neither the norm nor the finiteness test: it is queued
  // before the norm is read, so the GPU does not wait on the host's read of 8 bytes.
  if (in_backward) {
    const ProfileScope opt_region(ctx_, "optimizer", ProfileKind::kRegion);
    opt_->step(ctx_, lr, 1.0, model_->updated_in_backward());  // clip_grad is 0 (config check)
  }
  const double gnorm = AdamW::norm_of(ctx_, sum_squares);
  const bool finite = std::isfinite(gnorm) && std::isfinite(loss);
  const double clip = clip_coefficient(gnorm, cfg_.optimizer.clip_grad);
  MT_CHECK(finite || !in_backward,
           "[train] step {}: non-finite loss or gradient norm ({}, {}) with optimizer.update_in_backward: the "
           "weights were updated during backward and after it, so the step cannot be skipped; resume from the last "
           "checkpoint (with update_in_backward false, such steps are skipped)", step, loss, gnorm);
  if (!in_backward && finite) {  // (with the update in backward, the step was queued above)
    const ProfileScope opt_region(ctx_, "optimizer", ProfileKind::kRegion);
    opt_->step(ctx_, lr, clip, model_->updated_in_backward());
  } else if (!in_backward) {
    ++skipped_steps_;
    MT_LOG_WARN("[train] step {}: non-finite loss or gradient norm ({}, {}); update skipped", step, loss, gnorm);
  }
  region.emplace(ctx_, "zero_grad", ProfileKind::kRegion);
  // Matrix gradients are not zeroed: the next step's first pass writes them (beta 0).
  zero_gradients(grads_, /*matrices=*/false);
  model_->set_overwrite_matrix_grads();
  region.reset();
  ctx_.synchronize();
  const double dt = seconds_since(t0);
  consumed_tokens_ += tokens;
  consumed_trained_ += trained;
  if (step > result_.start_step + 1 || cfg_.training.train_iters == result_.start_step + 1) time_in_steps_ += dt, ++steps_timed_;

  const double tflops = flops / dt / 1e12;
  nlohmann::json rec = {{"type", "train"}, {"step", step}, {"loss", loss}, {"ce", ce}, {"aux", aux}, {"z", z},
                        {"grad_norm", gnorm}, {"clip_coef", clip}, {"lr", lr}, {"tokens", tokens},
                        {"trained_tokens", trained}, {"step_time_s", dt}, {"tokens_per_s", tokens / dt},
                        {"tflops", tflops}, {"consumed_tokens", consumed_tokens_}, {"skipped_steps", skipped_steps_}};
  if (peak_flops_ > 0) rec["mfu"] = flops / dt / peak_flops_;
  if (dpo_) {  // rewards/*, logps/*, pairs; the DPO loss alone as dpo_loss ("loss" adds aux and z)
    const nlohmann::json dj = dm.to_json();  // named: items() of a temporary would dangle
    for (const auto& [k, v] : dj.items()) rec[k == "loss" ? "dpo_loss" : k] = v;
  }
  const MemStats ms = allocator_for(device_).stats();
  for (size_t c = 0; c < kNumMemCategories; ++c)
    rec["memory"][mem_category_name(static_cast<MemCategory>(c))] = {{"current", ms.current[c]}, {"peak", ms.peak[c]}};
  rec["memory"]["total"] = {{"current", ms.total_current}, {"peak", ms.total_peak}, {"reserved", ms.reserved}};
  std::vector<std::pair<std::string, float>> tbv = {
      {"train/loss", float(loss)}, {"train/ce", float(ce)}, {"train/grad_norm", float(gnorm)}, {"train/lr", float(lr)},
      {"perf/tokens_per_s", float(tokens / dt)}, {"perf/tflops", float(tflops)}, {"perf/step_time_s", float(dt)},
      {"memory/peak_gib", float(ms.total_peak / 1073741824.0)}};
  if (mc_.is_moe()) tbv.push_back({"train/aux", float(aux)}), tbv.push_back({"train/z", float(z)});
  if (peak_flops_ > 0) tbv.push_back({"perf/mfu", float(flops / dt / peak_flops_)});
  if (dpo_)
    for (auto& [k, v] : dm.scalars("train/")) tbv.push_back({k == "train/loss" ? "train/dpo_loss" : k, v});
  if (!router.counts.empty()) {
    nlohmann::json el = {{"layers", nlohmann::json::array()}, {"max_over_mean", nlohmann::json::array()},
                         {"idle_experts", nlohmann::json::array()}, {"load_entropy", nlohmann::json::array()},
                         {"router_entropy", nlohmann::json::array()}};
    for (const auto& [layer, counts] : router.counts) {
      const ExpertLoad s = summarize_expert_load(counts);
      const double ent = router.entropy[layer] / static_cast<double>(router.batches);
      el["layers"].push_back(layer);
      el["max_over_mean"].push_back(s.max_over_mean);
      el["idle_experts"].push_back(s.idle_experts);
      el["load_entropy"].push_back(s.load_entropy);
      el["router_entropy"].push_back(ent);
      tbv.push_back({fmt::format("moe/max_over_mean/layer_{:02d}", layer), float(s.max_over_mean)});
      tbv.push_back({fmt::format("moe/idle_experts/layer_{:02d}", layer), float(s.idle_experts)});
      tbv.push_back({fmt::format("moe/router_entropy/layer_{:02d}", layer), float(ent)});
    }
    rec["expert_load"] = el;
  }
  metrics_->write(rec);
  if (hooks_.after_step) last_record_ = rec;
  if (tb_) tb_->add_scalars(step, tbv), tb_->flush();
  result_.last_loss = loss;

  if (step % cfg_.logging.log_interval == 0 || step == cfg_.training.train_iters) {
    ProgressLine p;
    p.step = step, p.total_steps = cfg_.training.train_iters, p.loss = loss, p.aux = aux, p.z = z, p.lr = lr;
    p.grad_norm = gnorm, p.tokens_per_s = tokens / dt, p.tflops = tflops, p.step_s = dt;
    p.mfu = peak_flops_ > 0 ? flops / dt / peak_flops_ : 0;
    const double avg = steps_timed_ > 0 ? time_in_steps_ / steps_timed_ : dt;
    p.eta_s = avg * static_cast<double>(cfg_.training.train_iters - step);
    if (dpo_)
      MT_LOG_INFO("{} | acc {:.3f} | margin {:.4f} | r+ {:.4f} | r- {:.4f} | logp+ {:.2f} | logp- {:.2f}", p.str(),
                  dm.accuracy(), dm.mean(dm.margin), dm.mean(dm.reward_chosen), dm.mean(dm.reward_rejected),
                  dm.mean(dm.logp_chosen), dm.mean(dm.logp_rejected));
    else
      MT_LOG_INFO("{}", p.str());
  }
}

void Trainer::evaluate_dpo_(int64_t step) {
  if (!dpo_->has_validation() || cfg_.training.eval_iters == 0) return;
  const auto t0 = Clock::now();
  const DpoMetrics m = dpo_->evaluate(ctx_, *model_, cfg_.training.eval_iters);
  if (m.pairs == 0) {
    MT_LOG_WARN("[train] the validation split holds no preference pair; skipping validation");
    return;
  }
  nlohmann::json rec = {{"type", "valid"}, {"step", step}};
  const nlohmann::json mj = m.to_json();  // named: items() of a temporary would dangle
  for (const auto& [k, v] : mj.items()) rec[k] = v;
  rec["time_s"] = seconds_since(t0);
  metrics_->write(rec);
  if (tb_) tb_->add_scalars(step, m.scalars("valid/")), tb_->flush();
  MT_LOG_INFO("validation at step {}: dpo loss {:.4f} | accuracy {:.3f} | margin {:.4f} | r+ {:.4f} | r- {:.4f} | "
              "logp+ {:.2f} | logp- {:.2f} | {} pairs", step, m.mean(m.loss), m.accuracy(), m.mean(m.margin),
              m.mean(m.reward_chosen), m.mean(m.reward_rejected), m.mean(m.logp_chosen), m.mean(m.logp_rejected), m.pairs);
  result_.last_valid_loss = m.mean(m.loss);
  refresh_plot_();
}

void Trainer::evaluate_(int64_t step) {
  if (dpo_) return evaluate_dpo_(step);
  auto loader = open_valid_loader(cfg_, data_, mc_.vocab_size);
  if (!loader || cfg_.training.eval_iters == 0) return;
  const auto t0 = Clock::now();
  std::vector<MicroBatch> mbs;
  int64_t trained = 0;
  for (int64_t i = 0; i < cfg_.training.eval_iters; ++i) {
    MicroBatch mb;
    bool ok = true;
    for (int64_t r = 0; r < cfg_.training.micro_batch_size && ok; ++r) {
      MicroBatch row;
      ok = loader->next(row);
      if (ok) append_micro_batch(mb, row);
    }
    if (mb.tokens.empty()) break;
    trained += mb.num_trained_tokens;
    mbs.push_back(std::move(mb));
    if (!ok) break;
  }
  if (trained == 0) {
    MT_LOG_WARN("[train] validation data has no trained tokens; skipping validation");
    return;
  }
  const float scale = 1.0f / static_cast<float>(trained);
  double ce = 0;
  for (const auto& mb : mbs) ce += model_->forward(ctx_, to_batch(mb, scale, device_), Pass::kEval).ce;
  const double ppl = std::exp(std::min(ce, 700.0));
  metrics_->write({{"type", "valid"}, {"step", step}, {"loss", ce}, {"ppl", ppl}, {"batches", mbs.size()},
                   {"trained_tokens", trained}, {"time_s", seconds_since(t0)}});
  if (tb_) tb_->add_scalars(step, {{"valid/loss", float(ce)}, {"valid/ppl", float(ppl)}}), tb_->flush();
  MT_LOG_INFO("validation at step {}: loss {:.4f} | ppl {:.3f} | {} micro-batches, {} tokens", step, ce, ppl, mbs.size(),
              trained);
  result_.last_valid_loss = ce;
  refresh_plot_();
}

void Trainer::refresh_plot_() {
  if (!cfg_.logging.plot) return;
  write_training_svg(run_dir_ + "/training.svg", plot_data_from_metrics(read_metrics_file(metrics_->path())),
                     fmt::format("{} ({} {})", run_dir_, cfg_.training.objective,
                                 !cfg_.model.path.empty() ? cfg_.model.path : cfg_.model.preset + cfg_.model.config));
}

TrainResult Trainer::run() {
  MT_CHECK(cfg_.training.objective == "pretrain" || cfg_.training.objective == "sft" || cfg_.training.objective == "dpo",
           "[train] {}: training.objective '{}' is not implemented yet (pretrain, sft and dpo are)", cfg_.source,
           cfg_.training.objective);
  MT_CHECK(cfg_.parallel.expert_model_parallel_size == 1,
           "[train] {}: parallel.expert_model_parallel_size = {} needs a multi-rank launch, which this build does not run yet",
           cfg_.source, cfg_.parallel.expert_model_parallel_size);
  fs::create_directories(run_dir_);
  const std::string yaml = cfg_.to_yaml();
  write_text_file(run_dir_ + "/resolved_config.yaml", yaml);
  MT_LOG_INFO("resolved configuration ({} -> {}/resolved_config.yaml):\n{}", cfg_.source, run_dir_, yaml);
  accum_ = cfg_.grad_accum_steps(1);
  result_.run_dir = run_dir_;
  setup_model_();
  setup_optimizer_();
  data_ = open_train_data(cfg_, mc_.vocab_size, run_dir_);
  ckpt_ = std::make_unique<CheckpointManager>(cfg_.checkpoint_dir(), cfg_.checkpoint.keep_last);
  if (cfg_.training.objective == "dpo") setup_dpo_();  // before resume_: the reference is the starting model
  if (auto src = resume_source_()) resume_(*src);
  result_.start_step = step_;
  peak_flops_ = device_peak_flops(ctx_.facts(), cfg_.logging.peak_tflops);
  metrics_ = std::make_unique<MetricsWriter>(run_dir_ + "/metrics.jsonl", step_);
  if (cfg_.logging.tensorboard) tb_ = std::make_unique<TensorBoardWriter>(cfg_.tensorboard_dir());
  MT_LOG_INFO("[train] {} on {} | model {} ({} layers, {:.3f} B parameters, {:.3f} B active) | {} trainable, {} frozen",
              cfg_.training.objective, device_.str(), mc_.model_type, mc_.num_hidden_layers, mc_.num_parameters() / 1e9,
              mc_.num_active_parameters() / 1e9, opt_->num_trainable_elements(), opt_->num_frozen_elements());
  MT_LOG_INFO("[train] data: {} | global batch {} x {} tokens = {} micro-batches of {} | steps {} -> {}", data_.description,
              accum_ * cfg_.training.micro_batch_size, cfg_.training.seq_length, accum_, cfg_.training.micro_batch_size,
              step_, cfg_.training.train_iters);

  // The stop handler goes in before the starting validation: that validation writes the first line
  // of metrics.jsonl, and a SIGTERM that arrived after it but before the handler killed the run
  // (exit 143, no checkpoint). A signal from here on is honoured after the next step.
  std::optional<StopSignal> stop;
  if (cfg_.training.exit_signal_handler) stop.emplace();
  // Validation of the starting model, so the curve shows where it began (for DPO: accuracy ~0.5,
  // policy == reference).
  if (step_ == 0 && cfg_.training.eval_interval > 0) evaluate_(0);
  int64_t last_saved = step_ > 0 ? step_ : -1, last_eval = -1;
  while (step_ < cfg_.training.train_iters) {
    const int64_t step = step_ + 1;
    if (hooks_.before_step) hooks_.before_step(step);
    train_step_(step);
    step_ = step;
    result_.final_step = step;
    if (hooks_.after_step && !hooks_.after_step(step, last_record_)) {
      result_.reason = StopReason::kHook;
      return result_;
    }
    if (cfg_.training.eval_interval > 0 && step % cfg_.training.eval_interval == 0) evaluate_(step), last_eval = step;
    if (cfg_.checkpoint.save_interval > 0 && step % cfg_.checkpoint.save_interval == 0) save_(step), last_saved = step;
    if (stop && stop->requested()) {
      MT_LOG_WARN("[train] signal {} received: saving at step {} and exiting", stop->signal_number(), step);
      if (last_saved != step) save_(step);
      result_.reason = StopReason::kSignal;
      return result_;
    }
    if (cfg_.training.exit_interval > 0 && step % cfg_.training.exit_interval == 0 && step < cfg_.training.train_iters) {
      if (last_saved != step) save_(step);
      MT_LOG_INFO("[train] exit_interval {} reached at step {}: checkpoint saved, exiting", cfg_.training.exit_interval, step);
      result_.reason = StopReason::kExitInterval;
      return result_;
    }
  }
  result_.final_step = step_;
  if (last_eval != step_) evaluate_(step_);
  refresh_plot_();
  if (last_saved != step_) save_(step_);
  if (cfg_.checkpoint.export_hf) {
    ExportOptions eo;
    eo.dtype = DType::kBF16;
    eo.source_dir = cfg_.model.path;
    eo.tokenizer_dir = !cfg_.model.tokenizer.empty() ? cfg_.model.tokenizer : cfg_.model.path;
    eo.overwrite = Overwrite::kReplace;
    export_hf_checkpoint(params_, run_dir_ + "/hf", eo);
    MT_LOG_INFO("[train] exported the final model to {}/hf", run_dir_);
  }
  MT_LOG_INFO("[train] done: {} steps, final loss {:.4f}{}", step_, result_.last_loss,
              result_.last_valid_loss >= 0 ? fmt::format(", validation loss {:.4f}", result_.last_valid_loss) : "");
  return result_;
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg) {
  Trainer t(cfg);
  return t.run();
}

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks) {
  Trainer t(cfg, hooks);
  return t.run();
}

}  // namespace moetrain
