// The training loop behind `moetrain train`: builds the model (HF directory or random init),
// data, AdamW and schedule from a TrainConfig, resumes from the latest checkpoint, then runs
// steps of gradient accumulation (CE normalized by the trained tokens of the whole global
// batch), clipping and AdamW; logs metrics (console, metrics.jsonl, TensorBoard, SVG), validates,
// checkpoints (interval, end, SIGTERM/SIGINT) and exports the final model in HF format.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "train/config.h"

namespace moetrain {

enum class StopReason : uint8_t { kFinished, kSignal, kExitInterval, kHook };

struct TrainResult {
  int64_t start_step = 0;  // step resumed from (0 for a fresh run)
  int64_t final_step = 0;  // last completed step
  StopReason reason = StopReason::kFinished;
  double last_loss = 0.0;
  double last_valid_loss = -1.0;  // -1 when never validated
  std::string run_dir;
  std::string last_checkpoint;  // "" when none was written
};

TrainResult run_training(const TrainConfig& cfg);

// Callbacks for a program that drives the loop (moetrain bench). before_step(step) runs before
// step `step` (1-based) starts; after_step(step, record) gets the step's metrics.jsonl record
// (step_time_s, tokens, tflops, memory, ...) and returns false to stop at once: no validation,
// checkpoint or export follows (result reason kHook).
struct TrainHooks {
  std::function<void(int64_t step)> before_step;
  std::function<bool(int64_t step, const nlohmann::json& record)> after_step;
};
TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks);

}  // namespace moetrain
