// Learning-rate schedules with linear warmup and a min_lr floor, following Megatron-LM's
// OptimizerParamScheduler: constant, cosine, linear and warmup-stable-decay (WSD). One change:
// the update number is 1-based, so the first update already gets lr * 1 / warmup (not 0).
#pragma once
#include <cstdint>
#include <string>

namespace moetrain {

enum class LrDecayStyle : uint8_t { kConstant, kCosine, kLinear, kWsd };
enum class WsdDecayStyle : uint8_t { kLinear, kCosine, kExponential, kMinusSqrt };

LrDecayStyle parse_lr_decay_style(const std::string& s);   // constant|cosine|linear|wsd
WsdDecayStyle parse_wsd_decay_style(const std::string& s); // linear|cosine|exponential|minus_sqrt
const char* lr_decay_style_name(LrDecayStyle s);
const char* wsd_decay_style_name(WsdDecayStyle s);

struct LrSchedule {
  double max_lr = 1e-4;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;       // the step where the decay reaches min_lr (train_iters usually)
  LrDecayStyle style = LrDecayStyle::kCosine;
  int64_t wsd_decay_iters = 0;   // WSD: length of the final decay phase, ending at decay_iters
  WsdDecayStyle wsd_style = WsdDecayStyle::kLinear;

  // Learning rate of update number `step` (1-based). Pure function of the step, so resuming only
  // needs the step count.
  double lr_at(int64_t step) const;
  // Throws naming the offending key when the combination is inconsistent.
  void validate() const;
};

}  // namespace moetrain
