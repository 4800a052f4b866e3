// AdamW parameter bookkeeping (see adamw.h); the arithmetic is ops::adamw_step, which runs on the
// tensors' device. The update order over parameters is fixed (construction order), so results
// are deterministic.
#include "optim/adamw.h"

#include <cmath>

#include "kernels/ops.h"
#include "optim/name_pattern.h"

namespace moetrain {

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(grad_norm)) return 1.0;
  const double c = max_norm / (grad_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

AdamW::AdamW(std::vector<OptimParam> params, const AdamWConfig& cfg) : params_(std::move(params)), cfg_(cfg) {
  for (const auto& p : cfg_.freeze_patterns) validate_name_pattern(p, "model.freeze");
  for (const auto& p : cfg_.no_decay_patterns) validate_name_pattern(p, "optimizer.no_weight_decay");
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
    MT_CHECK(p.grad.defined() && p.grad.dtype() == DType::kF32 && p.grad.shape() == p.weight.shape(),
             "[adamw] gradient of {} must be f32 {}, got {}", p.name, shape_str(p.weight.shape()),
             p.grad.defined() ? p.grad.desc() : std::string("undefined"));
    roles_[i] = (p.weight.dim() <= 1 || name_matches_any(cfg_.no_decay_patterns, p.name)) ? ParamRole::kNoDecay
                                                                                         : ParamRole::kDecay;
    const Device dev = p.weight.device();
    if (p.weight.dtype() == DType::kF32) {
      master_[i] = p.weight;
    } else {
      master_[i] = Tensor::empty(p.weight.shape(), DType::kF32, dev, MemCategory::kMaster);
      if (dev.is_cpu()) {
        master_[i].copy_from(p.weight.to(DType::kF32));
      } else {
        Context ctx(dev);
        ops::cast(ctx, p.weight, master_[i]);
      }
    }
    m_[i] = Tensor::zeros(p.weight.shape(), DType::kF32, dev, MemCategory::kOptimizer);
    v_[i] = Tensor::zeros(p.weight.shape(), DType::kF32, dev, MemCategory::kOptimizer);
  }
}

double AdamW::grad_norm(Context& ctx, double scale) const {
  double ss = 0.0;
  for (size_t i = 0; i < params_.size(); ++i)
    if (roles_[i] != ParamRole::kFrozen) ss += ops::sum_squares(ctx, params_[i].grad);
  return std::sqrt(ss) * std::abs(scale);
}

void AdamW::step(Context& ctx, double lr, double grad_scale) {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (roles_[i] == ParamRole::kFrozen) continue;
    ops::AdamWParams ap;
    ap.lr = static_cast<float>(lr);
    ap.beta1 = static_cast<float>(cfg_.beta1);
    ap.beta2 = static_cast<float>(cfg_.beta2);
    ap.eps = static_cast<float>(cfg_.eps);
    ap.weight_decay = roles_[i] == ParamRole::kDecay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    ap.step = step_;
    ap.grad_scale = static_cast<float>(grad_scale);
    Tensor compute = master_[i].storage() == params_[i].weight.storage() ? Tensor() : params_[i].weight;
    ops::adamw_step(ctx, master_[i], params_[i].grad, m_[i], v_[i], ap, compute);
  }
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
