// `moetrain bench`: the proxy method of PERF.md. For each depth of --layers it drives the real
// Trainer (mock tokens, pretrain, AdamW; no eval or checkpoints) for warm-up + timed (+ profiled)
// steps and takes the median step time, the allocator's peak and the planner's prediction; two
// depths give per-layer = (t_b - t_a) / (L_b - L_a), fixed = t_a - L_a * per-layer and the
// full-depth projection, tokens/s, model TFLOP/s, MFU and % of the measured GEMM ceiling.
// --profile adds per-op tables, --kernels the microbenchmarks (bench_kernels.cpp). docs/bench.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "core/check.h"
#include "core/context.h"
#include "core/energy_meter.h"
#include "core/log.h"
#include "core/profiler.h"
#include "plan/plan.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace moetrain::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct BenchOptions {
  std::string model = "qwen3-30b-a3b", config;
  std::vector<int64_t> layers{2, 4};
  int64_t seq = 4096, mbs = 1, steps = 8, warmup = 3, profile_steps = 2;
  std::string device = "auto", recompute = "none";
  std::vector<std::string> sets;
  bool profile = false, kernels = false, no_steps = false, verbose = false;
  std::string json_path;
  double peak_tflops = 0;
  int64_t kernel_tokens = 0, kernel_doc = 1024, gemm_size = 0;
  std::vector<int64_t> ce_chunks;
  std::vector<std::string> kernel_groups;
  int reps = 0;
  double energy_s = 0;
};

// What one depth measured.
struct StepRun {
  int64_t layers = 0;
  std::vector<double> warmup_ms, step_ms, profile_step_ms;
  double median_ms = 0;
  double tokens = 0;          // per step
  double flops = 0;           // model FLOPs per step (the trainer's count)
  double s_avg = 0;           // mean attended keys per query behind that count
  double peak_bytes = 0;      // max over timed steps of the allocator's total peak
  double planned_peak = -1, planned_peak_expected = -1;
  std::string plan_note;
  std::vector<ProfileEntry> profile;  // totals over the profiled steps
  // The board's energy over the timed steps (NVML counter, first timed step's start to the last one's
  // end; the steps are synchronized, so the window is theirs): J per step and the mean power. -1: none.
  double joules_per_step = -1, mean_watts = -1, power_limit_w = -1, energy_window_s = 0;
};

ModelConfig base_model(const BenchOptions& o) {
  return o.config.empty() ? ModelConfig::preset(o.model) : ModelConfig::from_file(o.config);
}

Device resolve_device(const std::string& d) {
  const int n = cuda_device_count();
  if (d == "cuda") {
    MT_CHECK(n > 0, "[bench] --device cuda but no CUDA device is visible (use --device cpu or auto)");
    return Device::cuda(0);
  }
  MT_CHECK(d == "auto" || d == "cpu", "[bench] --device '{}': expected auto, cuda or cpu", d);
  return d == "auto" && n > 0 ? Device::cuda(0) : Device::cpu();
}

// The run's TrainConfig: the tests/gpu/proxy.yaml settings at depth L, then the --set overrides,
// then the keys the bench owns (step count, no checkpoints) forced back.
TrainConfig make_config(const BenchOptions& o, const Device& dev, int64_t L, int64_t total_steps, const std::string& dir) {
  const std::string model_key = o.config.empty() ? "preset: " + json(o.model).dump() : "config: " + json(o.config).dump();
  const std::string yaml = fmt::format(
      "model: {{{}, num_layers: {}}}\n"
      "data: {{mock_data: true}}\n"
      "training: {{objective: pretrain, seq_length: {}, micro_batch_size: {}, global_batch_size: {}, train_iters: {},\n"
      "           eval_interval: 0, eval_iters: 0, device: {}, bf16: true, recompute_granularity: {},\n"
      "           exit_signal_handler: false}}\n"
      "optimizer: {{lr: 1.0e-5}}\n"
      "checkpoint: {{save: {}, save_interval: 0, export_hf: false, load: none}}\n"
      "logging: {{run_dir: {}, log_interval: 1000000000, tensorboard: false, plot: false, peak_tflops: {}}}\n",
      model_key, L, o.seq, o.mbs, o.mbs, total_steps, dev.is_cuda() ? "cuda" : "cpu", json(o.recompute).dump(),
      json(dir + "/checkpoints").dump(), json(dir).dump(), o.peak_tflops);
  TrainConfig cfg = TrainConfig::from_yaml_string(yaml, "moetrain bench", o.sets);
  cfg.training.train_iters = total_steps;
  cfg.training.eval_interval = 0;
  cfg.checkpoint.save_interval = 0;
  cfg.checkpoint.export_hf = false;
  cfg.checkpoint.load = "none";
  cfg.logging.run_dir = dir;
  cfg.validate();
  return cfg;
}

Hardware bench_hardware(const Device& dev, double peak_flops) {
  if (dev.is_cpu()) return Hardware::preset("cpu");
  const DeviceFacts facts = Context(dev).facts();
  Hardware hw = hardware_from_device(facts.name, facts.total_memory, 1, peak_flops / 1e12);
  if (facts.sm_count > 0) hw.sm_count = facts.sm_count;
  return hw;
}

StepRun run_depth(const BenchOptions& o, const Device& dev, const Hardware& hw, int64_t L, const std::string& dir) {
  StepRun r;
  r.layers = L;
  const int64_t profiled = o.profile ? o.profile_steps : 0;
  const int64_t total = o.warmup + o.steps + profiled;
  const TrainConfig cfg = make_config(o, dev, L, total, dir);
  try {
    const PlanResult p = plan_run(cfg, hw);
    r.planned_peak = p.memory.allocator_peak;
    r.planned_peak_expected = p.memory.allocator_peak_expected;
    if (!p.verdict.fits) r.plan_note = "planner: " + p.verdict.summary;
  } catch (const std::exception& e) {
    r.plan_note = std::string("planner failed: ") + e.what();
  }
  if (!r.plan_note.empty()) std::fprintf(stderr, "[bench] L=%lld %s\n", static_cast<long long>(L), r.plan_note.c_str());

  std::vector<json> timed;
  const EnergyMeter meter(dev.is_cuda() ? cuda_pci_bus_id(dev.index) : std::string());
  std::optional<double> e0;
  std::chrono::steady_clock::time_point t0;
  TrainHooks hooks;
  hooks.before_step = [&](int64_t step) {
    if (step == o.warmup + 1) e0 = meter.joules(), t0 = std::chrono::steady_clock::now();
    if (profiled > 0 && step == o.warmup + o.steps + 1) Profiler::enable(true);
  };
  hooks.after_step = [&](int64_t step, const json& rec) {
    const double ms = rec.value("step_time_s", 0.0) * 1e3;
    const double peak = rec.contains("memory") ? rec["memory"]["total"].value("peak", 0.0) : 0.0;
    const char* phase = "timed";
    int64_t i = step, n = o.steps;
    if (step <= o.warmup) {
      phase = "warm-up", n = o.warmup;
      r.warmup_ms.push_back(ms);
    } else if (step <= o.warmup + o.steps) {
      i = step - o.warmup;
      r.step_ms.push_back(ms);
      timed.push_back(rec);
      if (step == o.warmup + o.steps && e0) {
        const std::optional<double> e1 = meter.joules();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (e1 && *e1 >= *e0 && s > 0) {
          r.joules_per_step = (*e1 - *e0) / static_cast<double>(o.steps);
          r.mean_watts = (*e1 - *e0) / s;
          r.power_limit_w = meter.power_limit_w().value_or(-1.0);
          r.energy_window_s = s;
        }
      }
    } else {
      phase = "profiled", i = step - o.warmup - o.steps, n = profiled;
      r.profile_step_ms.push_back(ms);
    }
    std::fprintf(stderr, "[bench] L=%lld %s step %lld/%lld: %.2f ms, peak %s\n", static_cast<long long>(L), phase,
                 static_cast<long long>(i), static_cast<long long>(n), ms, format_bytes(static_cast<size_t>(peak)).c_str());
    if (step == total && profiled > 0) {
      r.profile = Profiler::report();
      Profiler::enable(false);
    }
    return step < total;
  };
  const LogLevel level = log_level();
  if (!o.verbose) set_log_level(LogLevel::kWarn);
  try {
    run_training(cfg, hooks);
  } catch (...) {
    set_log_level(level);
    Profiler::enable(false);
    throw;
  }
  set_log_level(level);
  allocator_for(dev).empty_cache();
  MT_CHECK(!timed.empty(), "[bench] L={}: no timed step was recorded", L);
  r.median_ms = median_of(r.step_ms);
  const json& last = timed.back();
  r.tokens = last.value("tokens", 0.0);
  r.flops = last.value("tflops", 0.0) * 1e12 * last.value("step_time_s", 0.0);
  for (const json& rec : timed) r.peak_bytes = std::max(r.peak_bytes, rec["memory"]["total"].value("peak", 0.0));
  // The trainer's FLOPs are affine in the mean attended length: recover it for the projection.
  const ModelConfig mc = base_model(o).with_num_layers(L);
  const double f0 = mc.flops_per_token(0.0), f1 = mc.flops_per_token(1.0);
  if (r.tokens > 0 && f1 > f0) r.s_avg = (r.flops / r.tokens - f0) / (f1 - f0);
  return r;
}

json profile_json(const StepRun& r) {
  const double n = static_cast<double>(std::max<size_t>(r.profile_step_ms.size(), 1));
  json ops = json::array(), regions = json::array();
  double sum = 0;
  for (const ProfileEntry& e : r.profile) {
    json j = {{"name", e.name}, {"ms_per_step", e.total_ms / n}, {"calls_per_step", static_cast<double>(e.calls) / n}};
    if (e.kind == ProfileKind::kOp) sum += e.total_ms / n, ops.push_back(j);
    else regions.push_back(j);
  }
  const double step = median_of(r.profile_step_ms);
  return {{"steps", r.profile_step_ms.size()}, {"step_ms", step}, {"op_sum_ms", sum}, {"gap_ms", step - sum},
          {"ops", ops}, {"regions", regions}};
}

void print_profile(const StepRun& r, const json& p) {
  std::printf("\nper-op profile, L=%lld (%d profiled steps, per step)\n", static_cast<long long>(r.layers),
              p["steps"].get<int>());
  std::printf("  %-30s %10s %8s %7s\n", "op", "ms", "calls", "share");
  const double step = p["step_ms"].get<double>();
  for (const json& e : p["ops"])
    std::printf("  %-30s %10.3f %8.1f %6.1f%%\n", e["name"].get<std::string>().c_str(), e["ms_per_step"].get<double>(),
                e["calls_per_step"].get<double>(), step > 0 ? 100.0 * e["ms_per_step"].get<double>() / step : 0.0);
  std::printf("  %-30s %10.3f\n  %-30s %10.3f\n  %-30s %10.3f  (launch gaps, host work, unprofiled work)\n",
              "sum of ops", p["op_sum_ms"].get<double>(), "step (profiled)", step, "step - sum",
              p["gap_ms"].get<double>());
  for (const json& e : p["regions"])
    std::printf("  region %-23s %10.3f %8.1f\n", e["name"].get<std::string>().c_str(), e["ms_per_step"].get<double>(),
                e["calls_per_step"].get<double>());
}

// Per-op split between the layers and the fixed part from two profiled depths.
json profile_attribution(const StepRun& a, const json& pa, const StepRun& b, const json& pb) {
  const double dl = static_cast<double>(b.layers - a.layers);
  std::map<std::string, std::pair<double, double>> ms;  // name -> (a, b)
  std::vector<std::string> order;
  for (const char* key : {"ops", "regions"})
    for (const auto* p : {&pa, &pb})
      for (const json& e : (*p)[key]) {
        const std::string n = (std::string(key) == "regions" ? "region " : "") + e["name"].get<std::string>();
        if (!ms.count(n)) order.push_back(n);
        (p == &pa ? ms[n].first : ms[n].second) = e["ms_per_step"].get<double>();
      }
  order.push_back("sum of ops"), ms["sum of ops"] = {pa["op_sum_ms"].get<double>(), pb["op_sum_ms"].get<double>()};
  order.push_back("step (profiled)"), ms["step (profiled)"] = {pa["step_ms"].get<double>(), pb["step_ms"].get<double>()};
  order.push_back("step - sum"), ms["step - sum"] = {pa["gap_ms"].get<double>(), pb["gap_ms"].get<double>()};
  json rows = json::array();
  for (const std::string& n : order) {
    const auto [ta, tb] = ms[n];
    const double per = (tb - ta) / dl;
    rows.push_back({{"name", n}, {"ms_a", ta}, {"ms_b", tb}, {"per_layer_ms", per}, {"fixed_ms", ta - per * a.layers}});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const json& x, const json& y) {
    const bool sx = x["name"].get<std::string>().rfind("region ", 0) == 0 || x["name"] == "sum of ops" ||
                    x["name"] == "step (profiled)" || x["name"] == "step - sum";
    const bool sy = y["name"].get<std::string>().rfind("region ", 0) == 0 || y["name"] == "sum of ops" ||
                    y["name"] == "step (profiled)" || y["name"] == "step - sum";
    if (sx != sy) return !sx;
    return !sx && x["per_layer_ms"].get<double>() > y["per_layer_ms"].get<double>();
  });
  std::printf("\nper-op attribution: per layer = (L%lld - L%lld) / %g, fixed = L%lld - %lld * per layer (ms per step)\n",
              static_cast<long long>(b.layers), static_cast<long long>(a.layers), dl, static_cast<long long>(a.layers),
              static_cast<long long>(a.layers));
  std::printf("  %-30s %10s %10s %12s %10s\n", "op", "L_a", "L_b", "per layer", "fixed");
  for (const json& e : rows)
    std::printf("  %-30s %10.3f %10.3f %12.3f %10.3f\n", e["name"].get<std::string>().c_str(), e["ms_a"].get<double>(),
                e["ms_b"].get<double>(), e["per_layer_ms"].get<double>(), e["fixed_ms"].get<double>());
  return rows;
}

json run_json(const StepRun& r, double peak_flops) {
  json j = {{"layers", r.layers}, {"step_ms", r.median_ms}, {"step_ms_all", r.step_ms}, {"warmup_ms", r.warmup_ms},
            {"tokens_per_step", r.tokens}, {"flops_per_step", r.flops}, {"mean_attended", r.s_avg},
            {"tokens_per_s", r.median_ms > 0 ? r.tokens / (r.median_ms * 1e-3) : 0.0},
            {"model_tflops", r.median_ms > 0 ? r.flops / (r.median_ms * 1e-3) / 1e12 : 0.0}, {"peak_bytes", r.peak_bytes}};
  j["mfu"] = peak_flops > 0 && r.median_ms > 0 ? json(r.flops / (r.median_ms * 1e-3) / peak_flops) : json();
  j["planned_peak_bytes"] = r.planned_peak >= 0 ? json(r.planned_peak) : json();
  j["planned_peak_expected_bytes"] = r.planned_peak_expected >= 0 ? json(r.planned_peak_expected) : json();
  if (!r.plan_note.empty()) j["plan_note"] = r.plan_note;
  j["joules_per_step"] = r.joules_per_step >= 0 ? json(r.joules_per_step) : json();
  j["mean_watts"] = r.mean_watts >= 0 ? json(r.mean_watts) : json();
  j["power_limit_w"] = r.power_limit_w >= 0 ? json(r.power_limit_w) : json();
  j["energy_window_s"] = r.energy_window_s;
  return j;
}

std::string pct(double x) { return fmt::format("{:.1f}%", 100.0 * x); }

int run_bench(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"Training-step benchmark (PERF.md proxy method) and kernel microbenchmarks; see docs/bench.md.",
               "moetrain bench"};
  app.add_option("--model", o.model, "model preset (qwen3-30b-a3b, qwen3-0.6b, tiny-moe, ...)")->capture_default_str();
  app.add_option("--config", o.config, "a Hugging Face config.json instead of --model");
  app.add_option("--layers", o.layers, "depths to time, comma separated; two give the projection, one is measured as is")
      ->delimiter(',')->capture_default_str();
  app.add_option("--seq", o.seq, "sequence length (tokens per packed row)")->capture_default_str();
  app.add_option("--mbs", o.mbs, "micro-batch size (rows per step)")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per depth (the median is reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--device", o.device, "auto, cuda or cpu")->capture_default_str();
  app.add_option("--recompute", o.recompute, "activation recompute: none, selective or full")->capture_default_str();
  app.add_option("--set", o.sets, "section.key=value TrainConfig override (repeatable), e.g. optimizer.weight_decay=0");
  app.add_flag("--profile", o.profile, "after the timed steps, profile more steps and print per-op tables");
  app.add_option("--profile-steps", o.profile_steps, "steps profiled by --profile")->capture_default_str();
  app.add_flag("--kernels", o.kernels, "run the kernel microbenchmarks at the model's shapes");
  app.add_flag("--no-steps", o.no_steps, "skip the training steps (with --kernels: microbenchmarks only)");
  app.add_option("--kernel-tokens", o.kernel_tokens, "tokens of the kernel cases (default: --seq)");
  app.add_option("--kernel-groups", o.kernel_groups, "with --kernels: only these case groups, comma separated "
                 "(gmm, attn, proj, head; default all)")->delimiter(',');
  app.add_option("--kernel-doc", o.kernel_doc, "document length of the packed attention case")->capture_default_str();
  app.add_option("--ce-chunks", o.ce_chunks, "loss-head rows per chunk to time, comma separated (default: the model's)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--reps", o.reps, "timed repetitions per kernel case (default 10 on the GPU, 3 on the CPU)");
  app.add_option("--energy-s", o.energy_s, "with --kernels: also run each case about this many seconds (2 or more) "
                 "between two reads of the board's energy counter (NVML): J per call and mean W")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gemm-size", o.gemm_size, "n of the n^3 GEMM ceiling (default 8192 on the GPU, 256 on the CPU)");
  app.add_option("--json", o.json_path, "write every result to this JSON file");
  app.add_option("--peak-tflops", o.peak_tflops, "peak dense TFLOP/s for MFU (default: 989 on H100/H200, else none)");
  app.add_flag("--verbose", o.verbose, "keep the trainer's own log lines");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(o.seq >= 1 && o.mbs >= 1 && o.steps >= 1 && o.warmup >= 0 && o.profile_steps >= 1,
           "[bench] --seq {}, --mbs {}, --steps {}, --warmup {}, --profile-steps {}: expected seq, mbs, steps, "
           "profile-steps >= 1 and warmup >= 0", o.seq, o.mbs, o.steps, o.warmup, o.profile_steps);
  MT_CHECK(o.energy_s == 0 || o.kernels, "[bench] --energy-s {} applies to the kernel cases: add --kernels (the step "
           "rows always report their energy when NVML is there)", o.energy_s);
  MT_CHECK(o.kernel_groups.empty() || o.kernels, "[bench] --kernel-groups applies to the kernel cases: add --kernels");
  check_kernel_groups(o.kernel_groups);  // before any timing, so that a typo costs no run
  std::sort(o.layers.begin(), o.layers.end());
  o.layers.erase(std::unique(o.layers.begin(), o.layers.end()), o.layers.end());
  for (int64_t L : o.layers) MT_CHECK(L >= 1, "[bench] --layers: depth {} must be >= 1", L);
  MT_CHECK(o.no_steps || !o.layers.empty(), "[bench] --layers is empty");
  const ModelConfig mc = base_model(o);
  const Device dev = resolve_device(o.device);

  json out;
  std::string cmd = "moetrain bench";
  for (int i = 1; i < argc; ++i) cmd += std::string(" ") + argv[i];
  out["command"] = cmd;
  double peak_flops = 0;
  {
    Context ctx(dev);
    const DeviceFacts& f = ctx.facts();
    peak_flops = device_peak_flops(f, o.peak_tflops);
    out["device"] = {{"type", dev.is_cuda() ? "cuda" : "cpu"}, {"name", f.name}, {"sm_count", f.sm_count},
                     {"total_memory", f.total_memory}};
    out["peak_tflops"] = peak_flops > 0 ? json(peak_flops / 1e12) : json();
    const int64_t n = o.gemm_size > 0 ? o.gemm_size : (dev.is_cuda() ? 8192 : 256);
    const GemmCeiling g = measure_gemm_ceiling(ctx, n, 10);
    out["gemm_ceiling"] = {{"n", g.n}, {"dtype", g.dtype}, {"ms", g.ms}, {"tflops", g.tflops}};
    std::printf("device %s | model %s (%lld layers) | seq %lld x mbs %lld | recompute %s | GEMM %lld^3 %s: %.3f ms, "
                "%.1f TFLOP/s | peak %s\n", f.name.c_str(), o.config.empty() ? o.model.c_str() : o.config.c_str(),
                static_cast<long long>(mc.num_hidden_layers), static_cast<long long>(o.seq), static_cast<long long>(o.mbs),
                o.recompute.c_str(), static_cast<long long>(n), g.dtype.c_str(), g.ms, g.tflops,
                peak_flops > 0 ? fmt::format("{:.0f} TFLOP/s", peak_flops / 1e12).c_str() : "unknown (no MFU)");
    std::fflush(stdout);
  }
  const double ceiling = out["gemm_ceiling"]["tflops"].get<double>();
  out["settings"] = {{"model", o.config.empty() ? o.model : o.config}, {"num_hidden_layers", mc.num_hidden_layers},
                     {"layers", o.layers}, {"seq", o.seq}, {"mbs", o.mbs}, {"steps", o.steps}, {"warmup", o.warmup},
                     {"recompute", o.recompute}, {"set", o.sets}, {"profile", o.profile}};

  std::vector<StepRun> runs;
  std::vector<json> profiles;
  if (!o.no_steps) {
    const Hardware hw = bench_hardware(dev, peak_flops);
    const std::string base = (fs::temp_directory_path() / fmt::format("moetrain-bench-{}", ::getpid())).string();
    try {
      for (int64_t L : o.layers) runs.push_back(run_depth(o, dev, hw, L, fmt::format("{}/L{}", base, L)));
    } catch (...) {
      fs::remove_all(base);
      throw;
    }
    fs::remove_all(base);
    out["runs"] = json::array();
    std::printf("\n%-7s %10s %12s %10s %8s %12s %12s %9s %8s %8s\n", "layers", "step ms", "tokens/s", "TFLOP/s", "MFU",
                "peak", "plan", "meas/plan", "J/step", "mean W");
    for (const StepRun& r : runs) {
      json j = run_json(r, peak_flops);
      std::printf("%-7lld %10.2f %12.0f %10.1f %8s %12s %12s %9s %8s %8s\n", static_cast<long long>(r.layers), r.median_ms,
                  j["tokens_per_s"].get<double>(), j["model_tflops"].get<double>(),
                  j["mfu"].is_null() ? "-" : pct(j["mfu"].get<double>()).c_str(),
                  format_bytes(static_cast<size_t>(r.peak_bytes)).c_str(),
                  r.planned_peak >= 0 ? format_bytes(static_cast<size_t>(r.planned_peak)).c_str() : "-",
                  r.planned_peak > 0 ? pct(r.peak_bytes / r.planned_peak).c_str() : "-",
                  r.joules_per_step >= 0 ? fmt::format("{:.2f}", r.joules_per_step).c_str() : "-",
                  r.mean_watts >= 0 ? fmt::format("{:.0f}", r.mean_watts).c_str() : "-");
      if (o.profile) {
        profiles.push_back(profile_json(r));
        j["profile"] = profiles.back();
      }
      out["runs"].push_back(j);
    }
    // NVML's counter moves in steps (100 ms on the H100s here): each end of the window can be off by
    // one step, so a short window gives joules that are only a rough guide.
    double shortest = 0;
    for (const StepRun& r : runs)
      if (r.joules_per_step >= 0) shortest = shortest > 0 ? std::min(shortest, r.energy_window_s) : r.energy_window_s;
    if (shortest > 0 && shortest < 2.0)
      std::printf("note: the energy window is %.2f s at the shortest; NVML's counter moves in steps of up to 0.1 s, so "
                  "J/step may be off by up to %.0f%% (--steps %lld or more for about 5%%)\n", shortest, 20.0 / shortest,
                  static_cast<long long>(o.steps * std::ceil(4.0 / shortest)));
    out["projection"] = json();
    if (runs.size() >= 2) {
      const StepRun &a = runs.front(), &b = runs.back();
      const int64_t N = mc.num_hidden_layers;
      const double per = (b.median_ms - a.median_ms) / static_cast<double>(b.layers - a.layers);
      const double fixed = a.median_ms - per * static_cast<double>(a.layers);
      const double proj = fixed + per * static_cast<double>(N);
      const double fpt = mc.flops_per_token(b.s_avg);
      const double tps = proj > 0 ? b.tokens / (proj * 1e-3) : 0.0, tflops = tps * fpt / 1e12;
      json p = {{"layers_a", a.layers}, {"layers_b", b.layers}, {"full_layers", N}, {"per_layer_ms", per},
                {"fixed_ms", fixed}, {"step_ms", proj}, {"tokens_per_step", b.tokens}, {"tokens_per_s", tps},
                {"flops_per_token", fpt}, {"model_tflops", tflops}};
      p["mfu"] = peak_flops > 0 ? json(tflops * 1e12 / peak_flops) : json();
      p["pct_of_gemm_ceiling"] = ceiling > 0 ? json(100.0 * tflops / ceiling) : json();
      // Energy, the same way as time: per layer = (E_b - E_a) / (L_b - L_a) J per step.
      const bool energy = a.joules_per_step >= 0 && b.joules_per_step >= 0;
      const double per_j = energy ? (b.joules_per_step - a.joules_per_step) / static_cast<double>(b.layers - a.layers) : 0;
      p["per_layer_joules"] = energy ? json(per_j) : json();
      p["step_joules"] = energy ? json(a.joules_per_step - per_j * static_cast<double>(a.layers) +
                                       per_j * static_cast<double>(N)) : json();
      out["projection"] = p;
      std::printf("\nprojection to %lld layers: per layer %.3f ms = (t%lld - t%lld) / %lld, fixed %.3f ms, step %.2f ms\n"
                  "  %.0f tokens/s/GPU | %.2f GFLOP/token | %.1f model TFLOP/s | MFU %s | %.1f%% of the %.1f TFLOP/s GEMM "
                  "ceiling\n", static_cast<long long>(N), per, static_cast<long long>(b.layers),
                  static_cast<long long>(a.layers), static_cast<long long>(b.layers - a.layers), fixed, proj, tps,
                  fpt / 1e9, tflops, p["mfu"].is_null() ? "-" : pct(p["mfu"].get<double>()).c_str(),
                  ceiling > 0 ? 100.0 * tflops / ceiling : 0.0, ceiling);
      if (energy)
        std::printf("  energy (NVML): %.3f J per layer per step, %.1f J per projected step, %.0f tokens/J; mean power "
                    "%.0f / %.0f W at %lld / %lld layers, limit %.0f W\n", per_j, p["step_joules"].get<double>(),
                    p["step_joules"].get<double>() > 0 ? b.tokens / p["step_joules"].get<double>() : 0.0, a.mean_watts,
                    b.mean_watts, static_cast<long long>(a.layers), static_cast<long long>(b.layers), b.power_limit_w);
    } else {
      const json& j = out["runs"][0];
      std::printf("\nmeasured at %lld layers (no projection): %.0f tokens/s/GPU, %.1f model TFLOP/s, %.1f%% of the GEMM "
                  "ceiling\n", static_cast<long long>(runs[0].layers), j["tokens_per_s"].get<double>(),
                  j["model_tflops"].get<double>(), ceiling > 0 ? 100.0 * j["model_tflops"].get<double>() / ceiling : 0.0);
    }
    if (o.profile) {
      for (size_t i = 0; i < runs.size(); ++i) print_profile(runs[i], profiles[i]);
      if (runs.size() >= 2) out["profile_attribution"] = profile_attribution(runs.front(), profiles.front(), runs.back(),
                                                                             profiles.back());
    }
  }

  if (o.kernels) {
    Context ctx(dev);
    KernelBenchOptions ko;
    ko.tokens = o.kernel_tokens > 0 ? o.kernel_tokens : o.seq;
    ko.doc = o.kernel_doc;
    ko.ce_chunks = o.ce_chunks;
    ko.reps = o.reps > 0 ? o.reps : (dev.is_cuda() ? 10 : 3);
    ko.warmup = dev.is_cuda() ? 3 : 1;
    ko.ceiling_tflops = ceiling;
    ko.energy_s = o.energy_s;
    ko.groups = o.kernel_groups;
    std::printf("\nkernel microbenchmarks (%s shapes, T %lld, median of %d)\n",
                o.config.empty() ? o.model.c_str() : o.config.c_str(), static_cast<long long>(ko.tokens), ko.reps);
    out["kernels"] = run_kernel_benchmarks(ctx, mc, ko);
  }

  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    MT_CHECK(f.good(), "[bench] cannot write --json {}", o.json_path);
    f << out.dump(1) << "\n";
    MT_CHECK(f.good(), "[bench] writing --json {} failed", o.json_path);
    std::fprintf(stderr, "[bench] results written to %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace

MT_COMMAND("bench", "time training steps (PERF.md proxy method), per-op profile and kernel microbenchmarks", run_bench);

}  // namespace moetrain::cli
