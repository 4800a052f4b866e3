// The DPO objective on the packed-batch model: pairs of a preference dataset go through the
// policy as two documents of one micro-batch; sequence log-probs are sums over response tokens;
// the pair loss (dpo_loss.h) gives d loss / d logp per sequence, which becomes a per-token CE
// weight (logp_t = -CE_t, so w_t = -coef) for the model's ordinary weighted-CE backward.
// Reference log-probs are precomputed once (dpo_reference.h) or taken online from a frozen copy.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/qwen3_model.h"
#include "train/dpo_batch.h"
#include "train/dpo_loss.h"
#include "train/dpo_reference.h"

namespace moetrain {

enum class DpoReference : uint8_t { kPrecomputed, kOnline };
const char* dpo_reference_name(DpoReference r);  // "precomputed" | "online"
DpoReference parse_dpo_reference(const std::string& s);

struct DpoSettings {
  DpoOptions loss;
  DpoReference reference = DpoReference::kPrecomputed;
  std::string source;  // the config file, for messages
};

// Mean number of keys a query attends in the micro-batch (sum L(L+1)/2 / sum L over its
// documents), for the model-FLOPs count of SPEC.md section 10.
double pair_batch_mean_attended(const PairBatch& pb);

struct DpoMicroResult {
  DpoMetrics metrics;
  ForwardResult forward;  // the policy forward (ce is 0: the DPO loss lives in metrics; aux, z, router)
};

// One micro-batch of training: policy forward (kTrain), sequence log-probs, pair losses against
// the reference sums (indexed like pb.pair_ids' positions: ref_chosen[i] is pair i of the batch),
// per-token weights scaled by `pair_scale` (1 / pairs in the global batch, so that accumulated
// micro-batches give the gradient of the global mean loss) written into pb.batch.loss_weights,
// then backward accumulating into `grads`.
DpoMicroResult dpo_forward_backward(Context& ctx, Qwen3Model& policy, ModelParams& grads, PairBatch& pb,
                                    const std::vector<double>& ref_chosen, const std::vector<double>& ref_rejected,
                                    const DpoOptions& opt, double pair_scale);

// Forward-only metrics of one micro-batch (validation).
DpoMetrics dpo_evaluate_batch(Context& ctx, Qwen3Model& policy, const PairBatch& pb,
                              const std::vector<double>& ref_chosen, const std::vector<double>& ref_rejected,
                              const DpoOptions& opt);

// A copy of `p` (same dtype and device), e.g. the frozen reference of online DPO.
ModelParams clone_params(const ModelParams& p, MemCategory cat = MemCategory::kWeights);

// What the trainer drives: data (train pairs + optional validation pairs), the reference and the
// per-micro-batch step. Reference files live in <run_dir>/dpo_reference/{train,valid}.safetensors.
class DpoObjective {
 public:
  DpoObjective(const DpoSettings& s, const std::string& train_prefix, const std::string& valid_prefix,
               const PairLoaderOptions& loader, const std::string& run_dir, Device device);
  ~DpoObjective();

  // Call once with the starting weights, before loading a resume checkpoint into them.
  // Precomputed: loads or computes the reference files (packing up to max_tokens per forward).
  // Online: keeps a frozen copy of `start`.
  void prepare_reference(Context& ctx, const ModelParams& start, const std::string& model_fingerprint,
                         int64_t max_tokens, const ModelOptions& model_options = {});

  bool next_batch(PairBatch* out);  // this rank's next training micro-batch
  DpoMicroResult forward_backward(Context& ctx, Qwen3Model& policy, ModelParams& grads, PairBatch& pb,
                                  double pair_scale);
  // Metrics over the first `max_batches` micro-batches of the validation pairs (all when <= 0).
  // Pairs with no validation split: metrics with pairs == 0.
  DpoMetrics evaluate(Context& ctx, Qwen3Model& policy, int64_t max_batches);

  bool has_validation() const { return valid_ != nullptr; }
  int64_t num_train_pairs() const;
  nlohmann::json state() const { return loader_->state(); }
  void load_state(const nlohmann::json& st) { loader_->load_state(st); }
  const DpoSettings& settings() const { return s_; }

 private:
  void reference_of(Context& ctx, const PairBatch& pb, bool valid, std::vector<double>* c, std::vector<double>* r);

  DpoSettings s_;
  std::string train_prefix_, valid_prefix_, run_dir_;
  Device device_;
  PairLoaderOptions loader_opt_;
  std::unique_ptr<PreferenceDataset> train_, valid_;
  std::unique_ptr<PairLoader> loader_;
  bool prepared_ = false;
  ReferenceLogps ref_train_, ref_valid_;       // precomputed
  ModelParams frozen_;                         // online
  std::unique_ptr<Qwen3Model> frozen_model_;   // online
};

}  // namespace moetrain
