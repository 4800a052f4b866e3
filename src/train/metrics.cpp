// metrics.jsonl writer, expert-load summaries, peak-FLOPs lookup and console progress formatting
// (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/check.h"

namespace moetrain {

std::vector<nlohmann::json> read_metrics_file(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through_step) : path_(path) {
  namespace fs = std::filesystem;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  if (keep_through_step >= 0 && fs::exists(path)) {
    // Rewrite through a temporary file so a crash here cannot lose the kept lines.
    const std::string tmp = path + ".tmp";
    {
      std::ifstream in(path);
      std::ofstream out(tmp, std::ios::trunc);
      std::string line;
      while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.contains("step") && j["step"].is_number() && j["step"].get<int64_t>() > keep_through_step) continue;
        out << line << "\n";
      }
      MT_CHECK(out.good(), "[metrics] cannot write {}", tmp);
    }
    fs::rename(tmp, path);
  }
  file_ = std::fopen(path.c_str(), "ab");
  MT_CHECK(file_ != nullptr, "[metrics] cannot open {} for appending", path);
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  // Non-finite numbers have no JSON form; nlohmann writes them as null, which readers accept.
  const std::string line = record.dump() + "\n";
  MT_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size(), "[metrics] write to {} failed", path_);
  std::fflush(file_);
}

ExpertLoad summarize_expert_load(const std::vector<double>& counts) {
  ExpertLoad r;
  if (counts.empty()) return r;
  double sum = 0, mx = 0;
  for (double c : counts) {
    sum += c;
    mx = std::max(mx, c);
    if (c <= 0) ++r.idle_experts;
  }
  if (sum <= 0) return r;
  const double mean = sum / static_cast<double>(counts.size());
  r.max_over_mean = mx / mean;
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= (c / sum) * std::log(c / sum);
  r.load_entropy = counts.size() > 1 ? h / std::log(static_cast<double>(counts.size())) : 1.0;
  return r;
}

double device_peak_flops(const DeviceFacts& facts, double override_tflops) {
  if (override_tflops > 0) return override_tflops * 1e12;
  const std::string& n = facts.name;
  if (n.find("H100") != std::string::npos || n.find("H200") != std::string::npos || n.find("H800") != std::string::npos ||
      n.find("GH200") != std::string::npos)
    return 989e12;
  if (n.find("A100") != std::string::npos || n.find("A800") != std::string::npos) return 312e12;
  return 0.0;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

std::string ProgressLine::str() const {
  std::string s = fmt::format("step {}/{} | loss {:.4f}", step, total_steps, loss);
  if (aux != 0) s += fmt::format(" | aux {:.4f}", aux);
  if (z != 0) s += fmt::format(" | z {:.4f}", z);
  s += fmt::format(" | lr {:.3e} | gnorm {:.3f} | {:.0f} tok/s | {:.2f} TFLOP/s", lr, grad_norm, tokens_per_s, tflops);
  if (mfu > 0) s += fmt::format(" | MFU {:.1f}%", 100.0 * mfu);
  s += fmt::format(" | {:.3f} s/step | ETA {}", step_s, format_duration(eta_s));
  return s;
}

}  // namespace moetrain
