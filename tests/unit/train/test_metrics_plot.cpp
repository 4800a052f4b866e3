// metrics.jsonl (append, resume truncation, torn lines), expert-load summaries against hand
// values, progress formatting, and the SVG picture built from metrics records.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "train/metrics.h"
#include "train/plot_svg.h"

using namespace moetrain;

namespace {
size_t count_of(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + 1)) ++n;
  return n;
}
}  // namespace

TEST(Metrics, JsonlAppendAndResumeTruncation) {
  const std::string path = testing::TempDir() + "/metrics_test/metrics.jsonl";
  std::filesystem::remove_all(testing::TempDir() + "/metrics_test");
  {
    MetricsWriter w(path);
    for (int s = 1; s <= 5; ++s) w.write({{"type", "train"}, {"step", s}, {"loss", 1.0 / s}});
    w.write({{"type", "valid"}, {"step", 5}, {"loss", 0.3}});
  }
  {  // a torn last line, as a kill in the middle of a write leaves
    std::ofstream out(path, std::ios::app);
    out << "{\"type\": \"train\", \"st";
  }
  EXPECT_EQ(read_metrics_file(path).size(), 6u);
  {
    MetricsWriter w(path, 3);  // resumed from step 3: steps 4, 5 and the torn line go
    w.write({{"type", "train"}, {"step", 4}, {"loss", 0.9}});
  }
  auto recs = read_metrics_file(path);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs[2]["step"], 3);
  EXPECT_EQ(recs[3]["step"], 4);
  EXPECT_DOUBLE_EQ(recs[3]["loss"].get<double>(), 0.9);
}

TEST(Metrics, ExpertLoadSummary) {
  auto r = summarize_expert_load({4, 0, 2, 2});
  EXPECT_DOUBLE_EQ(r.max_over_mean, 2.0);
  EXPECT_EQ(r.idle_experts, 1);
  const double h = -(0.5 * std::log(0.5) + 2 * 0.25 * std::log(0.25));
  EXPECT_NEAR(r.load_entropy, h / std::log(4.0), 1e-12);
  auto even = summarize_expert_load({3, 3, 3});
  EXPECT_DOUBLE_EQ(even.max_over_mean, 1.0);
  EXPECT_NEAR(even.load_entropy, 1.0, 1e-12);
  auto one = summarize_expert_load({0, 0, 9, 0});  // all tokens on one expert
  EXPECT_DOUBLE_EQ(one.max_over_mean, 4.0);
  EXPECT_EQ(one.idle_experts, 3);
  EXPECT_NEAR(one.load_entropy, 0.0, 1e-12);
  auto none = summarize_expert_load({0, 0});
  EXPECT_EQ(none.max_over_mean, 0.0);
  EXPECT_EQ(none.idle_experts, 2);
}

TEST(Metrics, PeakFlopsAndFormatting) {
  DeviceFacts f;
  f.name = "NVIDIA H100 80GB HBM3";
  EXPECT_DOUBLE_EQ(device_peak_flops(f), 989e12);
  f.name = "cpu";
  EXPECT_DOUBLE_EQ(device_peak_flops(f), 0.0);
  EXPECT_DOUBLE_EQ(device_peak_flops(f, 2.5), 2.5e12);
  EXPECT_EQ(format_duration(5), "5s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(NAN), "?");
  ProgressLine p;
  p.step = 3, p.total_steps = 10, p.loss = 2.5, p.lr = 1e-4, p.grad_norm = 0.5, p.tokens_per_s = 1000, p.tflops = 1.5;
  p.mfu = 0.25, p.step_s = 0.1, p.eta_s = 0.7;
  const std::string s = p.str();
  EXPECT_NE(s.find("step 3/10 | loss 2.5000"), std::string::npos) << s;
  EXPECT_NE(s.find("MFU 25.0%"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 1s"), std::string::npos) << s;
}

TEST(Plot, SvgFromMetricsRecords) {
  std::vector<nlohmann::json> recs;
  for (int s = 1; s <= 30; ++s) {
    nlohmann::json r = {{"type", "train"}, {"step", s}, {"loss", 3.0 - 0.05 * s}, {"lr", 1e-4}, {"grad_norm", 1.0}};
    r["expert_load"]["max_over_mean"] = {1.0 + 0.01 * s, 2.0, 1.5};
    recs.push_back(r);
    if (s % 10 == 0) recs.push_back({{"type", "valid"}, {"step", s}, {"loss", 2.9 - 0.05 * s}});
  }
  recs.push_back({{"type", "train"}, {"step", 31}, {"loss", nullptr}});  // NaN losses are written as null
  auto d = plot_data_from_metrics(recs);
  EXPECT_EQ(d.train_loss.size(), 30u);
  EXPECT_EQ(d.val_loss.size(), 3u);
  ASSERT_EQ(d.load.size(), 30u);
  EXPECT_EQ(d.load[0].size(), 3u);
  const std::string svg = render_training_svg(d, "run <x>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count_of(svg, "</svg>"), 1u);
  EXPECT_NE(svg.find("run &lt;x&gt;"), std::string::npos);  // escaped title
  EXPECT_EQ(count_of(svg, "<polyline"), 4u);  // train, validation, lr, grad norm
  EXPECT_EQ(count_of(svg, "<circle"), 3u);    // validation markers
  EXPECT_EQ(count_of(svg, "class=\"cell\""), 30u * 3u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  // Thinning keeps long runs small.
  PlotData big;
  for (int s = 0; s < 100000; ++s) big.train_loss.emplace_back(s, std::sin(s * 0.001));
  for (int s = 0; s < 5000; ++s) big.load_steps.push_back(s), big.load.push_back({1.0, 1.2});
  const std::string svg2 = render_training_svg(big, "big");
  EXPECT_LT(svg2.size(), 400000u);
  EXPECT_EQ(count_of(svg2, "class=\"cell\""), 240u * 2u);
  // Empty data still renders.
  const std::string svg3 = render_training_svg(PlotData{}, "empty");
  EXPECT_NE(svg3.find("no data yet"), std::string::npos);
  const std::string path = testing::TempDir() + "/plot_test.svg";
  write_training_svg(path, d, "t");
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}
