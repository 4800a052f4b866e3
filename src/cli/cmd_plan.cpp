// `moetrain plan`: memory per GPU by category, host memory, checkpoint size, FLOPs and time of a
// training run before it is launched, with a verdict (fits, largest micro-batch, what to change)
// and a search over parallel layouts. Reads the same YAML as `moetrain train` (or a model alone);
// hardware is a preset (--gpu) or given (--gpu-mem, --peak-tflops). --json for machines.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cctype>
#include <iostream>

#include "cli/command.h"
#include "core/check.h"
#include "plan/plan.h"
#include "train/config.h"

namespace moetrain::cli {
namespace {

// "300M", "1.5B", "2e9", "4T" -> tokens.
double parse_count(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    MT_FAIL("[plan] --tokens '{}' is not a count (examples: 300M, 1.5B, 2e9)", s);
  }
  const std::string u = s.substr(pos);
  double mul = 1;
  if (u == "K" || u == "k") mul = 1e3;
  else if (u == "M" || u == "m") mul = 1e6;
  else if (u == "B" || u == "b" || u == "G") mul = 1e9;
  else if (u == "T" || u == "t") mul = 1e12;
  else MT_CHECK(u.empty(), "[plan] --tokens '{}': unknown suffix '{}' (use K, M, B or T)", s, u);
  MT_CHECK(v > 0, "[plan] --tokens must be positive, got '{}'", s);
  return v * mul;
}

int run_plan(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string model, gpu, gpu_mem, host_mem, optimizer, mfu_from, tokens;
  int64_t gpus = 0, gpus_per_node = 0, tp = 0, pp = 0, cp = 0, ep = 0, max_mbs = 8, ce_chunk = -1;
  double peak = 0, mfu = 0, imbalance = 0;
  bool search = false, json = false, strict = false;
  CLI::App app{"Plan memory and time of a training run: per-GPU memory by category, host memory, checkpoint size, "
               "step and total time, and whether it fits.",
               "moetrain plan"};
  app.add_option("config", positional, "CONFIG.yaml (as for moetrain train), then section.key=value overrides");
  app.add_option("--model", model, "plan a model without a YAML: a preset name or a config.json");
  app.add_option("--gpu", gpu, "GPU preset: h100, h200, mi300x, a100, cpu (default h100)");
  app.add_option("--gpus", gpus, "number of GPUs (default 1)")->check(CLI::PositiveNumber);
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs per node, for host memory (default 8)")->check(CLI::PositiveNumber);
  app.add_option("--gpu-mem", gpu_mem, "memory per GPU: 80 (GiB), 80GB, 141GiB ...");
  app.add_option("--host-mem", host_mem, "host memory per node: 2048 (GiB), 1.5TB ...");
  app.add_option("--peak-tflops", peak, "dense bf16 peak TFLOP/s per GPU")->check(CLI::PositiveNumber);
  app.add_option("--mfu", mfu, "model-FLOPs utilization for the time estimate (default 0.30)")->check(CLI::Range(0.001, 1.0));
  app.add_option("--mfu-from", mfu_from, "take the MFU from a run's metrics.jsonl (median of its steps)");
  app.add_option("--tokens", tokens, "token budget: 300M, 1.5B ... (default: train_iters x tokens per step)");
  app.add_option("--optimizer", optimizer, "adamw, adamw8bit, muon or adamw_offload (default: the config's)");
  app.add_option("--tp", tp, "tensor parallel size (planning-only)")->check(CLI::PositiveNumber);
  app.add_option("--pp", pp, "pipeline parallel size (planning-only)")->check(CLI::PositiveNumber);
  app.add_option("--cp", cp, "context parallel size (planning-only)")->check(CLI::PositiveNumber);
  app.add_option("--ep", ep, "expert parallel size (default: parallel.expert_model_parallel_size)")->check(CLI::PositiveNumber);
  app.add_option("--imbalance", imbalance, "worst-case routed rows per EP rank over the mean (default 1.5)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--ce-chunk", ce_chunk,
                 "tokens per loss-head chunk (0: the model's default, up to 1024 that fit 512 MiB of logits; "
                 "2048 in 1 GiB with an f32 lm_head gradient)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--search", search, "list the layouts (dp/tp/pp/cp/ep, recompute, micro-batch) that fit, best first");
  app.add_option("--max-micro-batch", max_mbs, "largest micro-batch the search tries (default 8)")->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print the plan as JSON (bytes, seconds, FLOPs; categories as in metrics.jsonl)");
  app.add_flag("--strict", strict, "exit with status 2 when the run does not fit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::string config_path;
  std::vector<std::string> overrides;
  for (const auto& p : positional) {
    if (p.find('=') != std::string::npos) overrides.push_back(p);
    else {
      MT_CHECK(config_path.empty(), "[plan] two config files given ('{}' and '{}'); overrides look like section.key=value",
               config_path, p);
      config_path = p;
    }
  }
  MT_CHECK(!config_path.empty() || !model.empty(), "[plan] give CONFIG.yaml or --model PRESET|config.json");
  TrainConfig cfg;
  if (!config_path.empty()) {
    MT_CHECK(model.empty(), "[plan] give either CONFIG.yaml or --model, not both (override model.* keys instead)");
    cfg = TrainConfig::load(config_path, overrides);
  } else {
    const bool is_file = model.find('/') != std::string::npos || model.find(".json") != std::string::npos;
    const std::string yaml = fmt::format("model:\n  {}: \"{}\"\ndata:\n  mock_data: true\n", is_file ? "config" : "preset", model);
    cfg = TrainConfig::from_yaml_string(yaml, "--model " + model, overrides);
  }

  Hardware hw = Hardware::preset(gpu.empty() ? (cfg.training.device == "cpu" ? "cpu" : "h100") : gpu, gpus > 0 ? gpus : 1);
  if (gpus > 0 && !hw.cpu) hw.num_gpus = gpus;
  if (gpus_per_node > 0) hw.gpus_per_node = gpus_per_node;
  if (!gpu_mem.empty()) {
    hw.gpu_mem_bytes = parse_memory_size(gpu_mem, "--gpu-mem");
    if (gpu.empty()) hw.name = "custom";
  }
  if (!host_mem.empty()) hw.host_mem_bytes = parse_memory_size(host_mem, "--host-mem");
  if (cfg.logging.peak_tflops > 0) hw.peak_tflops = cfg.logging.peak_tflops;
  if (peak > 0) hw.peak_tflops = peak;
  if (!mfu_from.empty()) hw.mfu = measured_mfu(mfu_from, hw.peak_tflops);
  if (mfu > 0) hw.mfu = mfu;

  // The YAML validator accepts only what the trainer runs; planning-only choices come as flags.
  if (!optimizer.empty()) cfg.optimizer.optimizer = optimizer;
  if (tp > 0) cfg.parallel.tensor_model_parallel_size = tp;
  if (pp > 0) cfg.parallel.pipeline_model_parallel_size = pp;
  if (cp > 0) cfg.parallel.context_parallel_size = cp;
  if (ep > 0) cfg.parallel.expert_model_parallel_size = ep;
  PlanInput in = PlanInput::from_config(cfg, hw);
  if (!tokens.empty()) in.token_budget = parse_count(tokens);
  if (imbalance > 0) in.imbalance = imbalance;
  if (ce_chunk >= 0) in.ce_chunk_tokens = ce_chunk;

  if (search) {
    const auto rs = search_layouts(in, hw, max_mbs);
    if (json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& r : rs) arr.push_back(plan_to_json(r));
      std::cout << arr.dump(2) << "\n";
    } else {
      std::cout << fmt::format("layouts of {} x {} ({:.1f} GiB) for {} at {} x {} tokens, optimizer {}, best first:\n",
                               hw.num_gpus, hw.name, hw.gpu_mem_bytes / (1024.0 * 1024 * 1024), in.model_name,
                               in.objective == Objective::kDpo ? "2 x micro-batch" : "micro-batch", in.seq_length,
                               optimizer_kind_name(in.optimizer))
                << format_search(rs);
    }
    return rs.empty() && strict ? 2 : 0;
  }
  const PlanResult r = plan(in, hw);
  std::cout << (json ? plan_to_json(r).dump(2) + "\n" : format_plan(r));
  return !r.verdict.fits && strict ? 2 : 0;
}

}  // namespace

MT_COMMAND("plan", "memory per GPU, time and a fits/doesn't-fit verdict for a training config (and a layout search)",
           run_plan);

}  // namespace moetrain::cli
