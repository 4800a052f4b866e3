// SVG rendering of the training picture (see plot_svg.h). Line panels map (step, value) into a
// plot box with "nice" axis ticks; non-finite values are skipped. Long series are thinned to at
// most kMaxPoints and the heat map is binned to at most kMaxColumns columns so files stay small.
#include "train/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/check.h"

namespace moetrain {

namespace {

constexpr size_t kMaxPoints = 1500;
constexpr size_t kMaxColumns = 240;
constexpr double kWidth = 1000, kHeight = 780;
constexpr double kDpoRow = 270;  // extra height of the DPO panels (accuracy, margins)

struct Box {
  double x, y, w, h;
};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) { return fmt::format("{:.4g}", v); }

std::vector<std::pair<int64_t, double>> finite_thinned(const std::vector<std::pair<int64_t, double>>& s) {
  std::vector<std::pair<int64_t, double>> f;
  for (const auto& p : s)
    if (std::isfinite(p.second)) f.push_back(p);
  if (f.size() <= kMaxPoints) return f;
  std::vector<std::pair<int64_t, double>> t;
  const double stride = static_cast<double>(f.size() - 1) / static_cast<double>(kMaxPoints - 1);
  for (size_t i = 0; i < kMaxPoints; ++i) t.push_back(f[static_cast<size_t>(std::llround(i * stride))]);
  return t;
}

struct Series {
  std::vector<std::pair<int64_t, double>> pts;
  std::string color, label;
  bool markers = false;
};

void line_panel(std::string& svg, const Box& b, const std::string& title, const std::vector<Series>& series) {
  svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#fff" stroke="#999"/>)", b.x, b.y, b.w, b.h);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" font-weight="bold">{}</text>)", b.x, b.y - 6, esc(title));
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (const auto& [x, y] : s.pts) {
      x0 = std::min(x0, double(x)), x1 = std::max(x1, double(x));
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) {
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="12" fill="#888">no data yet</text>)", b.x + b.w / 2 - 30, b.y + b.h / 2);
    return;
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1), y0 -= (y1 - y0);
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return b.x + (x - x0) / (x1 - x0) * b.w; };
  auto py = [&](double y) { return b.y + b.h - (y - y0) / (y1 - y0) * b.h; };
  for (int i = 0; i <= 4; ++i) {  // y ticks and grid
    const double v = y0 + (y1 - y0) * i / 4.0;
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#eee"/>)", b.x, py(v), b.x + b.w, py(v));
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" text-anchor="end">{}</text>)", b.x - 4, py(v) + 3, num(v));
  }
  for (int i = 0; i <= 4; ++i) {
    const double v = x0 + (x1 - x0) * i / 4.0;
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" text-anchor="middle">{}</text>)", px(v), b.y + b.h + 12,
                       static_cast<int64_t>(std::llround(v)));
  }
  double ly = b.y + 14;
  for (const auto& s : series) {
    if (s.pts.empty()) continue;
    std::string pts;
    for (const auto& [x, y] : s.pts) pts += fmt::format("{:.1f},{:.1f} ", px(double(x)), py(y));
    svg += fmt::format(R"(<polyline class="{}" fill="none" stroke="{}" stroke-width="1.5" points="{}"/>)", esc(s.label), s.color, pts);
    if (s.markers)
      for (const auto& [x, y] : s.pts)
        svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="2.5" fill="{}"/>)", px(double(x)), py(y), s.color);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" fill="{}" text-anchor="end">{}</text>)", b.x + b.w - 6, ly,
                       s.color, esc(s.label));
    ly += 13;
  }
}

// Blue (balanced, ratio 1) to red (ratio >= hi).
std::string heat_color(double ratio, double hi) {
  double t = std::isfinite(ratio) ? std::clamp((ratio - 1.0) / std::max(hi - 1.0, 1e-9), 0.0, 1.0) : 0.0;
  const int r = static_cast<int>(std::lround(40 + 215 * t)), g = static_cast<int>(std::lround(90 + 60 * (1 - std::abs(2 * t - 1)))),
            bl = static_cast<int>(std::lround(220 * (1 - t) + 30));
  return fmt::format("#{:02x}{:02x}{:02x}", r, g, bl);
}

void heat_panel(std::string& svg, const Box& b, const PlotData& d) {
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" font-weight="bold">expert load per layer (max/mean tokens per expert; 1 = balanced)</text>)",
                     b.x, b.y - 6);
  size_t layers = 0;
  for (const auto& row : d.load) layers = std::max(layers, row.size());
  if (d.load.empty() || layers == 0) {
    svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#fff" stroke="#999"/>)", b.x, b.y, b.w, b.h);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="12" fill="#888">no expert-load data (dense model or no steps yet)</text>)",
                       b.x + 10, b.y + b.h / 2);
    return;
  }
  const size_t n = d.load.size(), cols = std::min(n, kMaxColumns);
  std::vector<std::vector<double>> grid(cols, std::vector<double>(layers, 0.0));
  std::vector<std::vector<int>> cnt(cols, std::vector<int>(layers, 0));
  double hi = 2.0;
  for (size_t i = 0; i < n; ++i) {
    const size_t c = i * cols / n;
    for (size_t l = 0; l < d.load[i].size(); ++l)
      if (std::isfinite(d.load[i][l])) grid[c][l] += d.load[i][l], cnt[c][l]++;
  }
  for (size_t c = 0; c < cols; ++c)
    for (size_t l = 0; l < layers; ++l)
      if (cnt[c][l]) grid[c][l] /= cnt[c][l], hi = std::max(hi, grid[c][l]);
  const double cw = b.w / static_cast<double>(cols), ch = b.h / static_cast<double>(layers);
  for (size_t c = 0; c < cols; ++c)
    for (size_t l = 0; l < layers; ++l)
      svg += fmt::format(R"(<rect class="cell" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}"/>)", b.x + c * cw,
                         b.y + l * ch, cw + 0.3, ch + 0.3, cnt[c][l] ? heat_color(grid[c][l], hi) : std::string("#ddd"));
  svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)", b.x, b.y, b.w, b.h);
  svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="10" text-anchor="end">layer 0</text>)", b.x - 4, b.y + ch / 2 + 3);
  svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="10" text-anchor="end">layer {}</text>)", b.x - 4, b.y + b.h - ch / 2 + 3,
                     layers - 1);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="10">step {}</text>)", b.x, b.y + b.h + 12, d.load_steps.front());
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="10" text-anchor="end">step {}</text>)", b.x + b.w, b.y + b.h + 12,
                     d.load_steps.back());
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="10" fill="{}">blue = 1.0</text>)", b.x + b.w / 2 - 80, b.y + b.h + 12,
                     heat_color(1.0, hi));
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="10" fill="{}">red = {}</text>)", b.x + b.w / 2 + 20, b.y + b.h + 12,
                     heat_color(hi, hi), num(hi));
}

}  // namespace

PlotData plot_data_from_metrics(const std::vector<nlohmann::json>& records) {
  PlotData d;
  auto num_of = [](const nlohmann::json& j, const char* k, double* out) {
    if (!j.contains(k) || !j[k].is_number()) return false;
    *out = j[k].get<double>();
    return true;
  };
  for (const auto& r : records) {
    if (!r.contains("step") || !r["step"].is_number_integer()) continue;
    const int64_t step = r["step"].get<int64_t>();
    const std::string type = r.value("type", "");
    double v;
    if (type == "train") {
      if (num_of(r, "loss", &v)) d.train_loss.emplace_back(step, v);
      if (num_of(r, "lr", &v)) d.lr.emplace_back(step, v);
      if (num_of(r, "grad_norm", &v)) d.grad_norm.emplace_back(step, v);
      if (num_of(r, "rewards/accuracy", &v)) d.train_accuracy.emplace_back(step, v);
      if (num_of(r, "rewards/margins", &v)) d.train_margin.emplace_back(step, v);
      if (r.contains("expert_load") && r["expert_load"].contains("max_over_mean")) {
        std::vector<double> row;
        for (const auto& x : r["expert_load"]["max_over_mean"]) row.push_back(x.is_number() ? x.get<double>() : NAN);
        if (!row.empty()) d.load_steps.push_back(step), d.load.push_back(std::move(row));
      }
    } else if (type == "valid") {
      if (num_of(r, "loss", &v)) d.val_loss.emplace_back(step, v);
      if (num_of(r, "rewards/accuracy", &v)) d.val_accuracy.emplace_back(step, v);
      if (num_of(r, "rewards/margins", &v)) d.val_margin.emplace_back(step, v);
    }
  }
  return d;
}

std::string render_training_svg(const PlotData& d, const std::string& title) {
  const double extra = d.has_dpo() ? kDpoRow : 0.0, height = kHeight + extra;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)", kWidth,
      height);
  svg += fmt::format(R"(<rect width="{}" height="{}" fill="#fafafa"/>)", kWidth, height);
  svg += fmt::format(R"(<text x="20" y="24" font-size="16" font-weight="bold">{}</text>)", esc(title));
  line_panel(svg, {70, 60, 400, 220}, "loss",
             {{finite_thinned(d.train_loss), "#1f77b4", "train", false}, {finite_thinned(d.val_loss), "#ff7f0e", "validation", true}});
  line_panel(svg, {570, 60, 400, 220}, "learning rate", {{finite_thinned(d.lr), "#2ca02c", "lr", false}});
  line_panel(svg, {70, 330, 900, 160}, "gradient norm (before clipping)",
             {{finite_thinned(d.grad_norm), "#9467bd", "grad norm", false}});
  if (d.has_dpo()) {
    line_panel(svg, {70, 550, 400, 200}, "preference accuracy (chosen reward > rejected)",
               {{finite_thinned(d.train_accuracy), "#1f77b4", "train acc", false},
                {finite_thinned(d.val_accuracy), "#ff7f0e", "validation acc", true}});
    line_panel(svg, {570, 550, 400, 200}, "reward margin (chosen - rejected)",
               {{finite_thinned(d.train_margin), "#1f77b4", "train margin", false},
                {finite_thinned(d.val_margin), "#ff7f0e", "validation margin", true}});
  }
  heat_panel(svg, {70, 550 + extra, 900, 190}, d);
  svg += "</svg>\n";
  return svg;
}

void write_training_svg(const std::string& path, const PlotData& data, const std::string& title) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << render_training_svg(data, title);
    MT_CHECK(out.good(), "[plot] cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace moetrain
