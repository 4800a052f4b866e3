// `moetrain export`: re-export a Hugging Face model directory (any expert layout, bf16/f16/f32,
// sharded or not) as per-expert (or fused) safetensors in bf16 or f32, with config.json,
// generation_config.json and the tokenizer files of the input (or of --tokenizer).
#include <filesystem>

#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "cli/model_io_args.h"
#include "core/check.h"
#include "core/log.h"
#include "model/hf_checkpoint.h"

namespace moetrain::cli {
namespace {

int run_export(int argc, char** argv) {
  std::string input, output, tokenizer, dtype = "bf16", layout = "per-expert", shard = "5GB";
  int64_t num_layers = 0;
  bool overwrite = false;
  CLI::App app{"Re-export a Hugging Face model directory (e.g. fused experts -> per-expert, dtype change).",
               "moetrain export"};
  app.add_option("--input", input, "input model directory (config.json + safetensors)")->required();
  app.add_option("--output", output, "output directory (must not exist or be empty)")->required();
  app.add_option("--dtype", dtype, "weight dtype on disk: bf16 (default) or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--expert-layout", layout, "per-expert (default) or fused")
      ->check(CLI::IsMember({"per-expert", "fused"}));
  app.add_option("--max-shard-size", shard, "largest safetensors shard, e.g. 5GB (default), 500MB");
  app.add_option("--num-layers", num_layers, "keep only the first N layers (a depth proxy)")->check(CLI::PositiveNumber);
  app.add_option("--tokenizer", tokenizer, "copy tokenizer files from this directory (default: the input's)");
  app.add_flag("--overwrite", overwrite, "replace an existing output directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  namespace fs = std::filesystem;
  MT_CHECK(fs::weakly_canonical(input) != fs::weakly_canonical(output),
           "[export] --output {} is the input directory; choose another", output);
  ExportOptions opt;
  opt.dtype = dtype == "f32" ? DType::kF32 : DType::kBF16;
  opt.expert_layout = layout == "fused" ? ExpertLayout::kFused : ExpertLayout::kPerExpert;
  opt.max_shard_bytes = parse_byte_size(shard, "--max-shard-size");
  opt.source_dir = input;
  opt.tokenizer_dir = tokenizer;
  if (tokenizer.empty() && fs::is_regular_file(fs::path(input) / "tokenizer.json")) opt.tokenizer_dir = input;
  opt.overwrite = overwrite ? Overwrite::kReplace : Overwrite::kRefuse;
  check_output_dir(output, opt.overwrite);
  LoadOptions lo;
  lo.num_layers = num_layers;
  // Loading straight into the output dtype rounds once, exactly as converting at write time would.
  ModelParams params = load_hf_checkpoint(input, opt.dtype, Device::cpu(), lo);
  MT_LOG_INFO("[export] loaded {} ({} layers, {:.2f}M parameters)", input, params.config.num_hidden_layers,
              params.config.num_parameters() / 1e6);
  export_hf_checkpoint(params, output, opt);
  return 0;
}

}  // namespace

MT_COMMAND("export", "re-export an HF model directory (expert layout, dtype, sharding, depth proxy)", run_export);

}  // namespace moetrain::cli
