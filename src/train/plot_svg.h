// A self-contained SVG picture of a run: train and validation loss, learning rate, gradient norm,
// for DPO runs preference accuracy and reward margins (train and validation), and a heat map of expert load (max/mean tokens per expert) per layer over time. Rebuilt from
// the metrics records, so it survives resumes; written atomically (temp file + rename).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain {

struct PlotData {
  std::vector<std::pair<int64_t, double>> train_loss, val_loss, lr, grad_norm;
  std::vector<int64_t> load_steps;          // one entry per heat-map sample
  std::vector<std::vector<double>> load;    // [sample][layer] max/mean expert load ratio
  // DPO runs ("rewards/accuracy", "rewards/margins" in the records); empty otherwise.
  std::vector<std::pair<int64_t, double>> train_accuracy, val_accuracy, train_margin, val_margin;
  bool has_dpo() const { return !train_accuracy.empty() || !val_accuracy.empty(); }
};

// From metrics.jsonl records: {"type":"train","step","loss","lr","grad_norm",
// "expert_load":{"max_over_mean":[...]}} and {"type":"valid","step","loss"}; DPO records add
// "rewards/accuracy" and "rewards/margins".
PlotData plot_data_from_metrics(const std::vector<nlohmann::json>& records);

std::string render_training_svg(const PlotData& data, const std::string& title);
void write_training_svg(const std::string& path, const PlotData& data, const std::string& title);

}  // namespace moetrain
