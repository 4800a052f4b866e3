// Hugging Face checkpoint directories <-> ModelParams.
// Load: config.json + safetensors (single, sharded, per-expert or fused experts, bf16/f16/f32 on
// disk) into params of any dtype/device, checked completely (missing, extra, wrong shape or
// dtype -> one error naming the file and tensor) before any parameter is written; tensors are
// copied in parallel by internal tensor.
// Export: config.json, generation_config.json, sharded safetensors (+ index) with per-expert
// names, tokenizer files, written into a temporary directory that is renamed into place.
#pragma once
#include <string>

#include "io/atomic_dir.h"
#include "model/params.h"
#include "model/weight_map.h"

namespace moetrain {

struct LoadOptions {
  // > 0: a depth proxy holding the first num_layers layers; the checkpoint's other layers are
  // skipped instead of being reported as extra tensors.
  int64_t num_layers = 0;
  int threads = 0;  // 0 = MT_NUM_THREADS
};

// Reads dir/config.json (with opt.num_layers applied).
ModelConfig load_hf_config(const std::string& dir, const LoadOptions& opt = {});
// Allocates params (dtype, device, category kWeights) and fills them from `dir`.
ModelParams load_hf_checkpoint(const std::string& dir, DType dtype, Device device, const LoadOptions& opt = {});
// Fills existing params (their config decides what is expected; opt.num_layers is ignored and
// checkpoint layers beyond params.config's are skipped).
void load_hf_weights(const std::string& dir, ModelParams& params, const LoadOptions& opt = {});

struct ExportOptions {
  DType dtype = DType::kBF16;                          // kBF16 or kF32 (kF16 allowed)
  ExpertLayout expert_layout = ExpertLayout::kPerExpert;
  uint64_t max_shard_bytes = 5000000000ull;
  std::string tokenizer_dir;      // when set, tokenizer files found there are copied
  std::string source_dir;         // when set, its generation_config.json is copied if present
  Overwrite overwrite = Overwrite::kRefuse;
  int threads = 0;
};
// Tokenizer files copied by export (those that exist).
const std::vector<std::string>& hf_tokenizer_files();

void export_hf_checkpoint(const ModelParams& params, const std::string& out_dir, const ExportOptions& opt = {});

}  // namespace moetrain
