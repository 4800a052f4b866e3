// AdamW parameter bookkeeping (see adamw.h); the arithmetic is ops::adamw_step, which runs on the
// tensors' device. The update order over parameters is fixed (construction order), so results
// are deterministic.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "kernels/ops.h"
#include "optim/name_pattern.h"

namespace moetrain {

DType parse_precision_dtype(const std::string& s, const std::string& key) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  MT_FAIL("[config] {} is '{}', expected fp32 or bf16", key, s);
}

const char* precision_dtype_name(DType t) { return t == DType::kBF16 ? "bf16" : t == DType::kF32 ? "fp32" : dtype_name(t); }

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(grad_norm)) return 1.0;
  const double c = max_norm / (grad_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

AdamW::AdamW(std::vector<OptimParam> params, const AdamWConfig& cfg) : params_(std::move(params)), cfg_(cfg) {
  for (const auto& p : cfg_.freeze_patterns) validate_name_pattern(p, "model.freeze");
  for (const auto& p : cfg_.no_decay_patterns) validate_name_pattern(p, "optimizer.no_weight_decay");
  // A bf16 v holds 8 significant bits: v * beta2 rounds back to v when 1 - beta2 is below half an
  // ulp (2^-9), so v could grow but never decay.
  if (cfg_.exp_avg_sq_dtype == DType::kBF16 && 1.0 - cfg_.beta2 < 1.0 / 256.0)
    MT_LOG_WARN("[adamw] exp_avg_sq_dtype bf16 with adam_beta2 = {}: a bf16 second moment cannot register a decay of "
                "1 - beta2 = {:.2g} (below its resolution of ~0.004); use beta2 <= 0.99 or exp_avg_sq_dtype fp32",
                cfg_.beta2, 1.0 - cfg_.beta2);
  const size_t n = params_.size();
  roles_.resize(n);
  master_.resize(n);
  m_.resize(n);
  v_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto& p = params_[i];
    MT_CHECK(p.weight.defined(), "[adamw] parameter {} has no weight tensor", p.name);
    if (name_matches_any(cfg_.freeze_patterns, p.name)) {
      roles_[i] = ParamRole::kFrozen;
      continue;
    }
    MT_CHECK((!p.grad.defined() && p.in_backward_only) ||
                 (p.grad.defined() && (p.grad.dtype() == DType::kF32 || p.grad.dtype() == DType::kBF16) &&
                  p.grad.shape() == p.weight.shape()),
             "[adamw] gradient of {} must be f32 or bf16 {}, got {}", p.name, shape_str(p.weight.shape()),
             p.grad.defined() ? p.grad.desc() : std::string("undefined"));
    roles_[i] = (p.weight.dim() <= 1 || name_matches_any(cfg_.no_decay_patterns, p.name)) ? ParamRole::kNoDecay
                                                                                         : ParamRole::kDecay;
    const Device dev = p.weight.device();
    if (p.weight.dtype() == cfg_.main_params_dtype) {
      master_[i] = p.weight;  // the weights are the main copy, updated in place
    } else {
      master_[i] = Tensor::empty(p.weight.shape(), cfg_.main_params_dtype, dev, MemCategory::kMaster);
      if (dev.is_cpu()) {
        master_[i].copy_from(p.weight.to(cfg_.main_params_dtype));
      } else {
        Context ctx(dev);
        ops::cast(ctx, p.weight, master_[i]);
        ctx.synchronize();
      }
    }
    m_[i] = Tensor::zeros(p.weight.shape(), cfg_.exp_avg_dtype, dev, MemCategory::kOptimizer);
    v_[i] = Tensor::zeros(p.weight.shape(), cfg_.exp_avg_sq_dtype, dev, MemCategory::kOptimizer);
  }
}

double AdamW::grad_norm(Context& ctx, double scale, const Tensor& known_sum, const std::vector<Tensor>& known_grads) const {
  return norm_of(ctx, grad_sum_squares(ctx, known_sum, known_grads), scale);
}

double AdamW::norm_of(Context& ctx, const Tensor& acc, double scale) {
  if (!acc.defined()) return 0.0;
  if (acc.device().is_cuda()) ctx.synchronize();  // the one wait of the norm: then an 8-byte copy
  const Tensor host = acc.device().is_cpu() ? acc : acc.to(Device::cpu());
  return std::sqrt(host.data<double>()[0]) * std::abs(scale);
}

Tensor AdamW::grad_sum_squares(Context& ctx, const Tensor& known_sum, const std::vector<Tensor>& known_grads) const {
  Tensor acc;  // [1] f64 on the gradients' device, read once
  std::vector<bool> known(params_.size(), false);
  if (known_sum.defined()) {
    MT_CHECK(known_sum.dtype() == DType::kF64 && known_sum.numel() == 1, "[adamw] known_sum is {}, expected [1] f64",
             known_sum.desc());
    size_t matched = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (roles_[i] == ParamRole::kFrozen || !params_[i].grad.defined()) continue;
      for (const Tensor& g : known_grads)
        if (g.data_ptr() == params_[i].grad.data_ptr() && g.numel() == params_[i].grad.numel()) {
          known[i] = true;
          ++matched;
          break;
        }
    }
    if (matched == known_grads.size()) {
      acc = Tensor::zeros({1}, DType::kF64, known_sum.device(), MemCategory::kWorkspace);
      ops::sum_accumulate(ctx, known_sum, acc);  // known_sum itself is left as it is
      for (size_t i = 0; i < params_.size(); ++i) known[i] = known[i] || !params_[i].grad.defined();
    } else {
      std::fill(known.begin(), known.end(), false);
    }
  }
  std::vector<Tensor> rest;  // summed together: a few launches on CUDA instead of two per tensor
  for (size_t i = 0; i < params_.size(); ++i) {
    if (roles_[i] == ParamRole::kFrozen || known[i]) continue;
    MT_CHECK(params_[i].grad.defined(), "[adamw] {} has no gradient buffer (updated in backward), so the gradient norm "
             "needs its sum of squares from backward (known_sum{})", params_[i].name,
             known_sum.defined() ? ", which named a gradient that is not a trainable parameter's" : " was not given");
    if (!acc.defined()) acc = Tensor::zeros({1}, DType::kF64, params_[i].grad.device(), MemCategory::kWorkspace);
    rest.push_back(params_[i].grad);
  }
  if (!rest.empty()) ops::sum_squares_accumulate_many(ctx, rest, acc);
  return acc;
}

ops::AdamWParams AdamW::params_for_(Context& ctx, size_t i, double lr, double grad_scale, int64_t step) const {
  ops::AdamWParams ap;
  ap.lr = static_cast<float>(lr);
  ap.beta1 = static_cast<float>(cfg_.beta1);
  ap.beta2 = static_cast<float>(cfg_.beta2);
  ap.eps = static_cast<float>(cfg_.eps);
  ap.weight_decay = roles_[i] == ParamRole::kDecay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
  ap.step = step;
  ap.grad_scale = static_cast<float>(grad_scale);
  // One stream per (parameter, step); element j of the parameter reads the 16-bit half j % 8 of
  // the 7-round Philox call j / 8 (adamw_math::random_word).
  ap.stochastic_rounding = cfg_.stochastic_rounding && master_[i].dtype() == DType::kBF16;
  ap.rng = ctx.rng(kRngPurposeAdamWRounding + i, static_cast<uint64_t>(step));
  return ap;
}

ops::AdamWTarget AdamW::target_for_(Context& ctx, size_t i, double lr, double grad_scale, int64_t step) const {
  ops::AdamWTarget t;
  t.master = master_[i];
  t.m = m_[i];
  t.v = v_[i];
  if (master_[i].storage() != params_[i].weight.storage()) t.compute = params_[i].weight;
  t.params = params_for_(ctx, i, lr, grad_scale, step);
  return t;
}

namespace {
bool in_list(const std::vector<Tensor>& list, const Tensor& x) {
  for (const Tensor& t : list)
    if (t.defined() && t.data_ptr() == x.data_ptr() && t.numel() == x.numel()) return true;
  return false;
}
}  // namespace

void AdamW::step(Context& ctx, double lr, double grad_scale, const std::vector<Tensor>& done) {
  ++step_;
  // One adamw_step_many call (the same bits as one adamw_step per parameter): on the GPU the small
  // tensors (norm weights, the router) share launches with the large ones.
  std::vector<ops::AdamWTarget> targets;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (roles_[i] == ParamRole::kFrozen || in_list(done, params_[i].weight)) continue;
    MT_CHECK(params_[i].grad.defined(), "[adamw] step {}: {} has no gradient buffer, so it must be updated in backward "
             "(optimizer.update_in_backward), but it was not", step_, params_[i].name);
    targets.push_back(target_for_(ctx, i, lr, grad_scale, step_));
    grads.push_back(params_[i].grad);
  }
  ops::adamw_step_many(ctx, targets, grads);
}

std::vector<std::pair<Tensor, ops::AdamWTarget>> AdamW::in_backward_targets(Context& ctx, double lr,
                                                                           const std::vector<Tensor>& weights) const {
  std::vector<std::pair<Tensor, ops::AdamWTarget>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (roles_[i] == ParamRole::kFrozen || !in_list(weights, params_[i].weight)) continue;
    out.emplace_back(params_[i].weight, target_for_(ctx, i, lr, 1.0, step_ + 1));
  }
  return out;
}

void AdamW::zero_grad() {
  for (auto& p : params_)
    if (p.grad.defined()) p.grad.zero_();
}

int64_t AdamW::num_trainable_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (roles_[i] != ParamRole::kFrozen) n += params_[i].weight.numel();
  return n;
}

int64_t AdamW::num_frozen_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (roles_[i] == ParamRole::kFrozen) n += params_[i].weight.numel();
  return n;
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (roles_[i] == ParamRole::kFrozen) continue;
    if (master_[i].storage() != params_[i].weight.storage()) out.emplace_back("master." + params_[i].name, master_[i]);
    out.emplace_back("exp_avg." + params_[i].name, m_[i]);
    out.emplace_back("exp_avg_sq." + params_[i].name, v_[i]);
  }
  return out;
}

}  // namespace moetrain
