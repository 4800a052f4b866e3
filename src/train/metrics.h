// Training metrics: metrics.jsonl (one JSON object per line, appended and flushed; on resume the
// lines past the resumed step are dropped), throughput and MFU (SPEC section 10), per-layer expert
// load statistics, and the one-line console progress with ETA.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"

namespace moetrain {

class MetricsWriter {
 public:
  // Opens `path` for appending. When keep_through_step >= 0 and the file exists, lines whose
  // "step" exceeds it (written by a run that died after its last checkpoint) are removed first.
  MetricsWriter(const std::string& path, int64_t keep_through_step = -1);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const nlohmann::json& record);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads every JSON line of a metrics file (malformed lines, e.g. a torn last line, are skipped).
std::vector<nlohmann::json> read_metrics_file(const std::string& path);

// Load statistics of one MoE layer from per-expert pick counts.
struct ExpertLoad {
  double max_over_mean = 0.0;   // max count / mean count (1 = perfectly balanced)
  int64_t idle_experts = 0;     // experts that received no token
  double load_entropy = 0.0;    // entropy of counts / sum, normalized by log(E) to [0, 1]
};
ExpertLoad summarize_expert_load(const std::vector<double>& counts);

// Dense bf16 peak of the device in FLOP/s (H100/H200 989e12, A100 312e12); 0 when unknown
// (MFU is then not reported). `override_tflops` > 0 wins.
double device_peak_flops(const DeviceFacts& facts, double override_tflops = 0.0);

// "1h02m", "3m05s", "12s"
std::string format_duration(double seconds);

struct ProgressLine {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, tflops = 0, mfu = 0, step_s = 0, eta_s = 0;
  double aux = 0, z = 0;
  std::string str() const;
};

}  // namespace moetrain
