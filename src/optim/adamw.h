// AdamW over a named parameter set with configurable precision (Megatron's precision-aware
// optimizer keys): the main weights are the compute weights themselves when their dtype equals
// main_params_dtype (f32 weights with fp32 main params, or bf16 weights with bf16 main params:
// the update writes them in place, rounded stochastically or to nearest), else a separate master
// copy in main_params_dtype whose update is copied into the compute weights. Moments m, v are f32
// or bf16; gradients f32 or bf16. No weight decay on 1-D tensors (norms, biases) or names
// matching optimizer.no_weight_decay patterns; frozen parameters get no state and no update.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace moetrain {

struct OptimParam {
  std::string name;
  Tensor weight;  // compute weights (model-owned storage; updated in place)
  Tensor grad;    // f32 or bf16, same shape, same device; accumulated by backward
  // No gradient buffer (grad undefined): the weight is updated only in backward (in_backward_targets,
  // optimizer.update_in_backward with one micro-batch); grad_norm takes its sum of squares from
  // known_sum, and step() must find it in `done`.
  bool in_backward_only = false;
};

// "fp32" -> kF32, "bf16" -> kBF16 (the optimizer.*_dtype keys); anything else throws naming `key`.
DType parse_precision_dtype(const std::string& s, const std::string& key);
const char* precision_dtype_name(DType t);  // kF32 -> "fp32", kBF16 -> "bf16"

// Philox purpose of the stochastic-rounding stream of parameter i at a step (Context::rng).
inline constexpr uint64_t kRngPurposeAdamWRounding = 0x520000;

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  std::vector<std::string> no_decay_patterns;  // besides the 1-D rule
  std::vector<std::string> freeze_patterns;
  DType main_params_dtype = DType::kF32;  // master dtype (equal to the weights' dtype: no copy)
  DType exp_avg_dtype = DType::kF32;
  DType exp_avg_sq_dtype = DType::kF32;
  bool stochastic_rounding = true;  // bf16 main params: stochastic (true) or nearest-even rounding
};

enum class ParamRole : uint8_t { kDecay, kNoDecay, kFrozen };

// Clipping factor for a global gradient norm: min(1, max_norm / (norm + 1e-6)); 1 when max_norm
// is 0 (clipping off).
double clip_coefficient(double grad_norm, double max_norm);

class AdamW {
 public:
  AdamW(std::vector<OptimParam> params, const AdamWConfig& cfg);

  // Global L2 norm over the gradients of trainable parameters, accumulated in fp64 on the
  // device and read once (one host synchronization), times `scale` (the factor the gradients
  // will be multiplied by, e.g. a loss normalization). known_sum ([1] f64, same device) may carry
  // the sum of squares of some gradients already (known_grads, matched by storage, e.g. from
  // Qwen3Model::grad_sum_squares()): those are not read again (known_sum is read, not changed).
  // It is ignored (everything is read) unless every known gradient is a trainable parameter's.
  double grad_norm(Context& ctx, double scale = 1.0, const Tensor& known_sum = Tensor(),
                   const std::vector<Tensor>& known_grads = {}) const;
  // grad_norm in two halves, so that work which does not need the norm (a step without clipping)
  // can be queued between them: grad_sum_squares queues the sums and returns the [1] f64 total on
  // the device (undefined when there is nothing to sum); norm_of waits for it and reads it.
  Tensor grad_sum_squares(Context& ctx, const Tensor& known_sum = Tensor(),
                          const std::vector<Tensor>& known_grads = {}) const;
  static double norm_of(Context& ctx, const Tensor& sum_squares, double scale = 1.0);
  // One update with learning rate `lr`; every gradient is multiplied by grad_scale first.
  // Parameters whose weights are in `done` (matched by storage) were updated in backward this
  // step (in_backward_targets) and are left alone; the step count advances either way.
  void step(Context& ctx, double lr, double grad_scale, const std::vector<Tensor>& done = {});
  // The coming step's update (step_count() + 1, learning rate lr, no gradient scaling) of each
  // trainable parameter among `weights` (matched by storage; frozen ones are left out), as
  // (weight, target) pairs for a kernel that applies AdamW while it forms the gradient
  // (ops::grouped_matmul_backward_adamw, optimizer.update_in_backward). Bits equal step()'s.
  std::vector<std::pair<Tensor, ops::AdamWTarget>> in_backward_targets(Context& ctx, double lr,
                                                                      const std::vector<Tensor>& weights) const;
  void zero_grad();  // zeroes every gradient (frozen ones too)

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  ParamRole role(size_t i) const { return roles_[i]; }
  const std::vector<OptimParam>& params() const { return params_; }
  int64_t num_trainable_elements() const;
  int64_t num_frozen_elements() const;

  // Optimizer state named globally for checkpoints: "exp_avg.<name>", "exp_avg_sq.<name>" and,
  // when the master is a separate copy, "master.<name>", each in its own dtype. Loading copies
  // into these tensors.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;

 private:
  std::vector<OptimParam> params_;
  std::vector<ParamRole> roles_;
  ops::AdamWParams params_for_(Context& ctx, size_t i, double lr, double grad_scale, int64_t step) const;
  // Parameter i's state and settings as adamw_step takes them (compute: its weight when it is not
  // its own master).
  ops::AdamWTarget target_for_(Context& ctx, size_t i, double lr, double grad_scale, int64_t step) const;
  std::vector<Tensor> master_, m_, v_;  // undefined for frozen params; master_ may alias the weights
  AdamWConfig cfg_;
  int64_t step_ = 0;
};

}  // namespace moetrain
