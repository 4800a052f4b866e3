// DPO pair losses (SPEC.md section 7, Rafailov et al. 2023) on sequence log-probs, in double:
// delta = beta * [(pi_c - ref_c) - (pi_r - ref_r)]; sigmoid: -(1-eps) log s(delta) - eps log s(-delta);
// IPO (Azar et al. 2023): (delta/beta - 1/(2 beta))^2. Each loss comes with its derivative with
// respect to the policy's sequence log-probs, which the objective turns into per-token weights.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain {

enum class DpoLossType : uint8_t { kSigmoid, kIpo };
const char* dpo_loss_type_name(DpoLossType t);     // "sigmoid" | "ipo"
DpoLossType parse_dpo_loss_type(const std::string& s);

struct DpoOptions {
  double beta = 0.1;
  double label_smoothing = 0.0;  // sigmoid loss only; in [0, 0.5)
  DpoLossType loss_type = DpoLossType::kSigmoid;
  // Throws naming `where` (e.g. the config file) when beta <= 0 or the smoothing is out of range.
  void validate(const std::string& where) const;
};

// Sequence log-probs (sums over response tokens) of one pair under the policy and the reference.
struct PairLogps {
  double chosen = 0, rejected = 0;          // policy
  double ref_chosen = 0, ref_rejected = 0;  // frozen reference
};

struct PairLoss {
  double loss = 0;
  double delta = 0;            // beta * (chosen log-ratio - rejected log-ratio)
  double reward_chosen = 0;    // beta * (chosen - ref_chosen)
  double reward_rejected = 0;  // beta * (rejected - ref_rejected)
  double d_chosen = 0;         // d loss / d chosen (policy)
  double d_rejected = 0;       // d loss / d rejected (policy); always -d_chosen
};

PairLoss dpo_pair_loss(const DpoOptions& o, const PairLogps& p);

// log(sigmoid(x)) without overflow for large |x|.
double log_sigmoid(double x);

// Sums over pairs; means on output. Accuracy counts delta > 0 (ties count as wrong, as TRL's
// chosen_rewards > rejected_rewards).
struct DpoMetrics {
  int64_t pairs = 0;
  double loss = 0, reward_chosen = 0, reward_rejected = 0, margin = 0, correct = 0;
  double logp_chosen = 0, logp_rejected = 0;

  void add(const PairLogps& p, const PairLoss& l);
  void merge(const DpoMetrics& m);
  double mean(double sum) const { return pairs > 0 ? sum / static_cast<double>(pairs) : 0.0; }
  double accuracy() const { return mean(correct); }
  // {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracy",
  //  "logps/chosen", "logps/rejected", "pairs"} (means over pairs).
  nlohmann::json to_json() const;
  // The same means as TensorBoard scalars named prefix + key (e.g. "train/rewards/chosen").
  std::vector<std::pair<std::string, float>> scalars(const std::string& prefix) const;
  // "loss 0.6931 | acc 0.500 | margin 0.0000 | r+ 0.0000 | r- 0.0000"
  std::string str() const;
};

}  // namespace moetrain
