// `moetrain train CONFIG.yaml [section.key=value ...]`: loads and validates the YAML config,
// applies the overrides, plans the run's GPU memory (src/plan) and refuses one that will not fit
// unless --force, then runs the trainer. --print-config prints the resolved configuration and
// exits; --config-reference prints the Markdown table of every key (docs/config.md).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "core/context.h"
#include "core/env.h"
#include "core/log.h"
#include "core/profiler.h"
#include "plan/plan.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace moetrain::cli {
namespace {

// The planner's check before anything is allocated. CPU runs are never refused (host memory is
// the operating system's business). Returns false when the run must not start.
bool plan_allows(const TrainConfig& cfg, bool force) {
  const std::string& dev = cfg.training.device;
  if (dev == "cpu" || cuda_device_count() == 0) return true;  // "cuda" without a GPU fails in the trainer
  const DeviceFacts facts = Context(Device::cuda(0)).facts();
  // One process drives one GPU; an expert-parallel config needs ep of them.
  const int64_t gpus = std::max<int64_t>(1, cfg.parallel.expert_model_parallel_size);
  Hardware hw = hardware_from_device(facts.name, facts.total_memory, gpus, device_peak_flops(facts, cfg.logging.peak_tflops) / 1e12);
  if (facts.sm_count > 0) hw.sm_count = facts.sm_count;
  const PlanResult r = plan_run(cfg, hw);
  MT_LOG_INFO("[plan] {} on {} ({:.1f} GiB): {}", r.input.model_name, facts.name, hw.gpu_mem_bytes / 1073741824.0,
              r.verdict.summary);
  if (r.verdict.fits) return true;
  std::fputs(format_plan(r).c_str(), stderr);
  if (force) {
    MT_LOG_WARN("[plan] the run is predicted not to fit; starting anyway because of --force");
    return true;
  }
  std::fprintf(stderr, "moetrain train: %s: the planner predicts this run does not fit on %s (%s). Apply one of the "
               "changes above, or pass --force to start anyway.\n", cfg.source.c_str(), facts.name.c_str(),
               r.verdict.summary.c_str());
  return false;
}

void print_profile(int64_t steps) {
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(steps, 1));
  double total = 0;
  std::fprintf(stderr, "[profile] %-28s %10s %8s   (per step, over %lld steps)\n", "op", "ms", "calls",
               static_cast<long long>(steps));
  for (const ProfileEntry& e : Profiler::report()) {
    total += e.total_ms;
    std::fprintf(stderr, "[profile] %-28s %10.3f %8.1f\n", e.name.c_str(), e.total_ms * per,
                 static_cast<double>(e.calls) * per);
  }
  std::fprintf(stderr, "[profile] %-28s %10.3f\n", "sum", total * per);
}

int run_train(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false, reference = false, force = false;
  CLI::App app{"Train (pretrain or SFT) from a YAML config; overrides look like optimizer.lr=3e-4.", "moetrain train"};
  app.add_option("config", config_path, "YAML configuration file (see docs/config.md and examples/)");
  app.add_option("overrides", overrides, "section.key=value overrides applied after the file, in order");
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  app.add_flag("--config-reference", reference, "print the Markdown reference of every configuration key and exit");
  app.add_flag("--force", force, "start even when the memory planner predicts the run does not fit on the GPU");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (reference) {
    std::fputs(config_reference_markdown().c_str(), stdout);
    return 0;
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  const TrainConfig cfg = TrainConfig::load(config_path, overrides);
  if (print_config) {
    std::fputs(cfg.to_yaml().c_str(), stdout);
    return 0;
  }
  if (!plan_allows(cfg, force)) return 3;
  // MT_PROFILE=1: time every op of the whole run and print the totals per step at the end
  // (warm-up steps included; `moetrain bench --profile` gives the careful breakdown).
  const bool profile = env_int("MT_PROFILE", 0) != 0;
  if (profile) Profiler::enable(true);
  run_training(cfg);  // a stop by signal or exit_interval saved a checkpoint: a clean exit too
  if (profile) print_profile(cfg.training.train_iters);
  return 0;
}

}  // namespace

MT_COMMAND("train", "train a model (pretrain or SFT) from a YAML config, resuming from its latest checkpoint", run_train);

}  // namespace moetrain::cli
