// `moetrain init`: a random Qwen3 / Qwen3-MoE model from a preset or a config.json, written as a
// Hugging Face directory (config.json, safetensors, generation config, optional tokenizer files).
// Weights follow transformers' init (normal(0, 0.02), ones for norms), deterministic per --seed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/command.h"
#include "cli/model_io_args.h"
#include "core/check.h"
#include "core/log.h"
#include "model/hf_checkpoint.h"

namespace moetrain::cli {
namespace {

int run_init(int argc, char** argv) {
  std::string preset, config, output, tokenizer, dtype = "bf16", layout = "per-expert", shard = "5GB";
  int64_t num_layers = 0;
  uint64_t seed = 1234;
  bool overwrite = false;
  CLI::App app{"Create a randomly initialized model and write it as a Hugging Face directory.", "moetrain init"};
  auto* o_preset = app.add_option("--preset", preset, "model preset: " + fmt::format("{}", fmt::join(ModelConfig::preset_names(), ", ")));
  auto* o_config = app.add_option("--config", config, "a Hugging Face config.json (qwen3 or qwen3_moe)");
  o_preset->excludes(o_config);
  app.add_option("--num-layers", num_layers, "keep only the first N layers (a depth proxy)")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "initialization seed (default 1234)");
  app.add_option("--dtype", dtype, "weight dtype on disk: bf16 (default) or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--expert-layout", layout, "per-expert (default, what inference engines read) or fused")
      ->check(CLI::IsMember({"per-expert", "fused"}));
  app.add_option("--max-shard-size", shard, "largest safetensors shard, e.g. 5GB (default), 500MB");
  app.add_option("--tokenizer", tokenizer, "directory whose tokenizer files are copied into the output");
  app.add_option("--output", output, "output directory (must not exist or be empty)")->required();
  app.add_flag("--overwrite", overwrite, "replace an existing output directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(!preset.empty() || !config.empty(), "[init] give --preset NAME or --config config.json");
  ModelConfig cfg = preset.empty() ? ModelConfig::from_file(config) : ModelConfig::preset(preset);
  if (num_layers > 0) {
    MT_CHECK(num_layers <= cfg.num_hidden_layers, "[init] --num-layers {} exceeds the model's {} layers", num_layers,
             cfg.num_hidden_layers);
    cfg = cfg.with_num_layers(num_layers);
  }
  ExportOptions opt;
  opt.dtype = dtype == "f32" ? DType::kF32 : DType::kBF16;
  opt.expert_layout = layout == "fused" ? ExpertLayout::kFused : ExpertLayout::kPerExpert;
  opt.max_shard_bytes = parse_byte_size(shard, "--max-shard-size");
  opt.tokenizer_dir = tokenizer;
  opt.overwrite = overwrite ? Overwrite::kReplace : Overwrite::kRefuse;
  check_output_dir(output, opt.overwrite);
  MT_LOG_INFO("[init] {} model: {} layers, {:.2f}M parameters ({:.2f}M active), seed {}", cfg.model_type,
              cfg.num_hidden_layers, cfg.num_parameters() / 1e6, cfg.num_active_parameters() / 1e6, seed);
  // Values are drawn in f32 and rounded once, so a bf16 model equals the f32 one rounded.
  ModelParams params = ModelParams::allocate(cfg, opt.dtype, Device::cpu());
  init_params_random(params, seed);
  export_hf_checkpoint(params, output, opt);
  return 0;
}

}  // namespace

MT_COMMAND("init", "create a random model (preset or config.json, optional depth proxy) as an HF directory",
           run_init);

}  // namespace moetrain::cli
