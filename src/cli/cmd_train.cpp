// `moetrain train CONFIG.yaml [section.key=value ...]`: loads and validates the YAML config,
// applies the overrides, and runs the trainer. --print-config prints the resolved configuration
// and exits; --config-reference prints the Markdown table of every key (docs/config.md).
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "train/config.h"
#include "train/trainer.h"

namespace moetrain::cli {
namespace {

int run_train(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false, reference = false;
  CLI::App app{"Train (pretrain or SFT) from a YAML config; overrides look like optimizer.lr=3e-4.", "moetrain train"};
  app.add_option("config", config_path, "YAML configuration file (see docs/config.md and examples/)");
  app.add_option("overrides", overrides, "section.key=value overrides applied after the file, in order");
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  app.add_flag("--config-reference", reference, "print the Markdown reference of every configuration key and exit");
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
  run_training(cfg);  // a stop by signal or exit_interval saved a checkpoint: a clean exit too
  return 0;
}

}  // namespace

MT_COMMAND("train", "train a model (pretrain or SFT) from a YAML config, resuming from its latest checkpoint", run_train);

}  // namespace moetrain::cli
