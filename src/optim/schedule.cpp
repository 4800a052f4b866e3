// Learning-rate schedules (see schedule.h): warmup ramps linearly from 0 to max_lr over
// warmup_iters updates, then the decay style moves from max_lr to min_lr by decay_iters; after
// that the rate stays at min_lr (constant stays at max_lr).
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace moetrain {

LrDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LrDecayStyle::kConstant;
  if (s == "cosine") return LrDecayStyle::kCosine;
  if (s == "linear") return LrDecayStyle::kLinear;
  if (s == "wsd" || s == "WSD") return LrDecayStyle::kWsd;
  MT_FAIL("[schedule] lr_decay_style '{}' is not one of constant, cosine, linear, wsd", s);
}

WsdDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "linear") return WsdDecayStyle::kLinear;
  if (s == "cosine") return WsdDecayStyle::kCosine;
  if (s == "exponential") return WsdDecayStyle::kExponential;
  if (s == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  MT_FAIL("[schedule] lr_wsd_decay_style '{}' is not one of linear, cosine, exponential, minus_sqrt", s);
}

const char* lr_decay_style_name(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::kConstant: return "constant";
    case LrDecayStyle::kCosine: return "cosine";
    case LrDecayStyle::kLinear: return "linear";
    case LrDecayStyle::kWsd: return "wsd";
  }
  return "?";
}

const char* wsd_decay_style_name(WsdDecayStyle s) {
  switch (s) {
    case WsdDecayStyle::kLinear: return "linear";
    case WsdDecayStyle::kCosine: return "cosine";
    case WsdDecayStyle::kExponential: return "exponential";
    case WsdDecayStyle::kMinusSqrt: return "minus_sqrt";
  }
  return "?";
}

void LrSchedule::validate() const {
  MT_CHECK(max_lr >= 0 && std::isfinite(max_lr), "[schedule] optimizer.lr must be a finite number >= 0, got {}", max_lr);
  MT_CHECK(min_lr >= 0 && min_lr <= max_lr, "[schedule] optimizer.min_lr ({}) must be in [0, lr = {}]", min_lr, max_lr);
  MT_CHECK(warmup_iters >= 0, "[schedule] optimizer.lr_warmup_iters must be >= 0, got {}", warmup_iters);
  if (style != LrDecayStyle::kConstant) {
    MT_CHECK(decay_iters > warmup_iters,
             "[schedule] optimizer.lr_decay_iters ({}; 0 means training.train_iters) must exceed lr_warmup_iters ({}) for decay style {}",
             decay_iters, warmup_iters, lr_decay_style_name(style));
  }
  if (style == LrDecayStyle::kWsd) {
    MT_CHECK(wsd_decay_iters > 0 && wsd_decay_iters <= decay_iters - warmup_iters,
             "[schedule] optimizer.lr_wsd_decay_iters ({}) must be in [1, lr_decay_iters - lr_warmup_iters = {}]",
             wsd_decay_iters, decay_iters - warmup_iters);
  }
}

double LrSchedule::lr_at(int64_t step) const {
  if (warmup_iters > 0 && step <= warmup_iters)
    return max_lr * static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(warmup_iters);
  if (style == LrDecayStyle::kConstant) return max_lr;
  if (step > decay_iters) return min_lr;
  const double span = max_lr - min_lr;
  if (style == LrDecayStyle::kWsd) {
    const int64_t anneal_start = decay_iters - wsd_decay_iters;
    if (step <= anneal_start) return max_lr;
    const double r = static_cast<double>(step - anneal_start) / static_cast<double>(wsd_decay_iters);
    double coeff = 1.0;
    switch (wsd_style) {
      case WsdDecayStyle::kLinear: coeff = 1.0 - r; break;
      case WsdDecayStyle::kCosine: coeff = 0.5 * (std::cos(M_PI * r) + 1.0); break;
      case WsdDecayStyle::kExponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
      case WsdDecayStyle::kMinusSqrt: coeff = 1.0 - std::sqrt(r); break;
    }
    return min_lr + coeff * span;
  }
  const double r = static_cast<double>(step - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  if (style == LrDecayStyle::kLinear) return max_lr - span * r;
  return min_lr + 0.5 * span * (1.0 + std::cos(M_PI * r));  // cosine
}

}  // namespace moetrain
