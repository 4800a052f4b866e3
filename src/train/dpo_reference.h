// Reference log-probs for DPO: one forward-only pass of the frozen starting model over every pair
// of a preference dataset, stored in the run directory as a safetensors file (F64 tensors
// "chosen" and "rejected", [pairs]) whose metadata holds the dataset and reference-model
// fingerprints. A later run (resume) reuses the file when both fingerprints match and recomputes
// it when either changed, so no second model has to stay resident during training.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/context.h"
#include "model/params.h"
#include "train/config.h"

namespace moetrain {

class PreferenceDataset;
class Qwen3Model;

struct ReferenceLogps {
  std::vector<double> chosen, rejected;  // [pairs] sequence log-probs (sums over response tokens)
  std::string data_fingerprint, model_fingerprint;
  int64_t size() const { return static_cast<int64_t>(chosen.size()); }
};

// 64-bit content hash (16 hex digits) of a dataset's files: PREFIX.idx/.bin and PREFIX_mask.idx/.bin.
std::string dataset_fingerprint(const std::string& prefix);
// Identity of an HF checkpoint directory without reading every weight: config.json bytes, and per
// *.safetensors file its name, size, header and 3 x 64 KiB of data (start, middle, end).
std::string hf_checkpoint_fingerprint(const std::string& dir);
// Content hash of parameters in memory (host copies of every tensor); for small models and tests.
std::string params_fingerprint(const ModelParams& p);
// The starting model of a training run: the HF directory's fingerprint, or for random init the
// preset/config, seed and init std; plus num_layers. Independent of checkpoints it resumes from.
std::string reference_model_fingerprint(const TrainConfig& cfg);

void save_reference_logps(const std::string& path, const ReferenceLogps& r);
// The stored log-probs when `path` exists and its fingerprints equal the given ones; nullopt when
// it is missing or stale (the reason is logged). A corrupt file is an error naming it.
std::optional<ReferenceLogps> load_reference_logps(const std::string& path, const std::string& data_fingerprint,
                                                   const std::string& model_fingerprint);

// Forward-only pass of `model` over every pair, in dataset order, packing pairs into micro-batches
// of at most `max_tokens` tokens (a pair longer than that goes alone).
ReferenceLogps compute_reference_logps(Context& ctx, Qwen3Model& model, const PreferenceDataset& data,
                                       int64_t max_tokens, Device device);

// Load-or-compute: reuses `path` when valid, else computes with `model` (which must hold the
// starting weights) and saves. `data_fingerprint` is dataset_fingerprint(prefix) when empty.
ReferenceLogps ensure_reference_logps(Context& ctx, Qwen3Model& model, const std::string& prefix,
                                      const std::string& model_fingerprint, const std::string& path,
                                      int64_t max_tokens, Device device, std::string data_fingerprint = "");

}  // namespace moetrain
