// DPO pair losses and their derivatives (see dpo_loss.h). With x = delta:
//   sigmoid: L = -(1-eps) log s(x) - eps log s(-x),  dL/dx = -(1-eps) s(-x) + eps s(x)
//   IPO:     L = (x/beta - 1/(2 beta))^2,            dL/dx = 2 (x/beta - 1/(2 beta)) / beta
// and dx/d chosen = beta, dx/d rejected = -beta.
#include "train/dpo_loss.h"

#include <cmath>

#include <fmt/format.h>

#include "core/check.h"

namespace moetrain {

const char* dpo_loss_type_name(DpoLossType t) { return t == DpoLossType::kSigmoid ? "sigmoid" : "ipo"; }

DpoLossType parse_dpo_loss_type(const std::string& s) {
  if (s == "sigmoid") return DpoLossType::kSigmoid;
  if (s == "ipo") return DpoLossType::kIpo;
  MT_FAIL("[dpo] loss type '{}' is not one of sigmoid, ipo", s);
}

void DpoOptions::validate(const std::string& where) const {
  MT_CHECK(std::isfinite(beta) && beta > 0, "[config] {}: dpo beta must be > 0, got {}", where, beta);
  MT_CHECK(label_smoothing >= 0 && label_smoothing < 0.5, "[config] {}: dpo label_smoothing must be in [0, 0.5), got {}",
           where, label_smoothing);
  MT_CHECK(label_smoothing == 0 || loss_type == DpoLossType::kSigmoid,
           "[config] {}: dpo label_smoothing applies to the sigmoid loss only (loss type is {})", where,
           dpo_loss_type_name(loss_type));
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

namespace {
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}
}  // namespace

PairLoss dpo_pair_loss(const DpoOptions& o, const PairLogps& p) {
  PairLoss r;
  r.reward_chosen = o.beta * (p.chosen - p.ref_chosen);
  r.reward_rejected = o.beta * (p.rejected - p.ref_rejected);
  // Differences of differences first: the reference and policy sums are large and close.
  r.delta = o.beta * ((p.chosen - p.ref_chosen) - (p.rejected - p.ref_rejected));
  double dx = 0;
  if (o.loss_type == DpoLossType::kSigmoid) {
    const double eps = o.label_smoothing;
    r.loss = -(1 - eps) * log_sigmoid(r.delta) - eps * log_sigmoid(-r.delta);
    dx = -(1 - eps) * sigmoid(-r.delta) + eps * sigmoid(r.delta);
  } else {
    const double u = r.delta / o.beta - 1.0 / (2.0 * o.beta);
    r.loss = u * u;
    dx = 2.0 * u / o.beta;
  }
  r.d_chosen = o.beta * dx;
  r.d_rejected = -o.beta * dx;
  return r;
}

void DpoMetrics::add(const PairLogps& p, const PairLoss& l) {
  ++pairs;
  loss += l.loss;
  reward_chosen += l.reward_chosen;
  reward_rejected += l.reward_rejected;
  margin += l.reward_chosen - l.reward_rejected;
  correct += l.delta > 0 ? 1.0 : 0.0;
  logp_chosen += p.chosen;
  logp_rejected += p.rejected;
}

void DpoMetrics::merge(const DpoMetrics& m) {
  pairs += m.pairs;
  loss += m.loss;
  reward_chosen += m.reward_chosen;
  reward_rejected += m.reward_rejected;
  margin += m.margin;
  correct += m.correct;
  logp_chosen += m.logp_chosen;
  logp_rejected += m.logp_rejected;
}

nlohmann::json DpoMetrics::to_json() const {
  return {{"loss", mean(loss)},
          {"rewards/chosen", mean(reward_chosen)},
          {"rewards/rejected", mean(reward_rejected)},
          {"rewards/margins", mean(margin)},
          {"rewards/accuracy", accuracy()},
          {"logps/chosen", mean(logp_chosen)},
          {"logps/rejected", mean(logp_rejected)},
          {"pairs", pairs}};
}

std::vector<std::pair<std::string, float>> DpoMetrics::scalars(const std::string& prefix) const {
  std::vector<std::pair<std::string, float>> out;
  const nlohmann::json j = to_json();  // named: items() of a temporary would dangle
  for (const auto& [k, v] : j.items()) {
    if (k != "pairs") out.emplace_back(prefix + k, v.get<float>());
  }
  return out;
}

std::string DpoMetrics::str() const {
  return fmt::format("loss {:.4f} | acc {:.3f} | margin {:.4f} | r+ {:.4f} | r- {:.4f}", mean(loss), accuracy(),
                     mean(margin), mean(reward_chosen), mean(reward_rejected));
}

}  // namespace moetrain
