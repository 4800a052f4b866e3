// Resume checkpoints: <dir>/step_<N>/ holds model/ and optimizer/ (safetensors, tensors named
// globally, sharded like HF), trainer_state.json (step, scheduler, loader cursor, RNG seed,
// counters) and manifest.json (size and CRC32 of every file). A save is written to a hidden
// temporary directory, fsynced, renamed into place, and only then is <dir>/latest (a one-line
// file naming the step directory) replaced atomically (temp file + rename); the newest keep_last
// checkpoints are kept. A killed save leaves the previous checkpoint and pointer untouched.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace moetrain {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class CheckpointManager {
 public:
  // Creates `dir` when missing and removes temporary directories left by killed saves.
  CheckpointManager(std::string dir, int64_t keep_last);

  // Writes step_<step> and points `latest` at it; returns its path. `state` is stored as
  // trainer_state.json (the manager adds "step").
  std::string save(int64_t step, const NamedTensors& model, const NamedTensors& optimizer, const nlohmann::json& state);

  // The step directory `latest` names, when there is one.
  std::optional<std::string> latest() const;
  const std::string& dir() const { return dir_; }

  // Checks manifest.json against the files (presence, sizes, CRC32); throws an Error naming the
  // checkpoint and the missing, truncated or corrupt file.
  static void verify(const std::string& step_dir);
  // A checkpoints directory (with `latest`) or a step directory -> the step directory.
  static std::string resolve(const std::string& path);
  // Verifies, then copies every stored tensor into the given tensors (same names, shapes; dtype
  // converted when it differs) and returns trainer_state.json. Missing or extra tensors and
  // shape mismatches are errors naming the tensor.
  static nlohmann::json load(const std::string& step_dir, const NamedTensors& model, const NamedTensors& optimizer);

 private:
  void prune_(const std::string& keep);
  std::string dir_;
  int64_t keep_last_;
};

// Step number of a "step_<N>" directory name, or -1.
int64_t checkpoint_step_of(const std::string& dir_name);

// CRC32 (zlib polynomial) of a whole file, read in chunks.
uint32_t file_crc32(const std::string& path);

}  // namespace moetrain
