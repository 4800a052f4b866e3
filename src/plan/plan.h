// The memory and time planner behind `moetrain plan` (and the check `moetrain train` runs before
// allocating): per-GPU memory by allocator category, host memory, checkpoint size, FLOPs, step and
// total time, a verdict with the largest micro-batch that fits, and a layout search. Activation
// memory comes from replaying the allocation order of model/qwen3_model.cpp + decoder_layer.cpp
// (plan/mem_trace.cpp); docs/design/planner.md lists every tensor counted.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "model/config.h"
#include "model/qwen3_model.h"

namespace moetrain {

struct TrainConfig;

enum class OptimizerKind : uint8_t { kAdamW, kAdamW8bit, kMuon, kAdamWOffload };
const char* optimizer_kind_name(OptimizerKind k);
// "adamw", "adamw8bit" (also adamw_8bit), "muon", "adamw_offload" (also cpu_adamw).
OptimizerKind parse_optimizer_kind(const std::string& s);

enum class Objective : uint8_t { kPretrain, kSft, kDpo, kGrpo };
const char* objective_name(Objective o);
Objective parse_objective(const std::string& s);

// Planning constants (documented in docs/design/planner.md; change them there too).
// 0: up to 1024 rows that fit kCeChunkBytes, twice both with an f32 lm_head gradient (ModelOptions' default)
inline constexpr int64_t kCeChunkTokens = 0;
inline constexpr size_t kCeChunkBytes = size_t{512} << 20;  // ModelOptions::ce_chunk_bytes
inline constexpr double kDefaultImbalance = 1.5;       // worst-case max/mean routed rows per EP rank
inline constexpr double kFragmentation = 0.05;         // caching-allocator slack, fraction of the dynamic peak
inline constexpr double kCudaRuntimeBytes = 768.0 * (1 << 20);    // CUDA context, cuBLAS/cuDNN handles, module images
inline constexpr double kCublasWorkspaceBytes = 32.0 * (1 << 20); // cuBLAS(Lt) workspace on Hopper
inline constexpr double kNcclBaseBytes = 512.0 * (1 << 20);       // NCCL channel buffers per communicator set
inline constexpr double kNcclPerPeerBytes = 32.0 * (1 << 20);     // all-to-all p2p buffers per EP peer
inline constexpr double kGradBucketBytes = 256.0 * (1 << 20);     // DP reduce-scatter bucket (two in flight)
inline constexpr double kOffloadBucketBytes = 128.0 * (1 << 20);  // offload: gradient/weight staging per bucket
inline constexpr double kHostProcessBytes = 6.0 * (1 << 30);      // per rank: runtime, loader, pinned staging
inline constexpr int64_t kEightBitBlock = 256;         // 8-bit AdamW: one f32 absmax per block, per state
inline constexpr int64_t kMuonBatch = 32;              // Muon Newton-Schulz: expert matrices per batched call

struct Hardware {
  std::string name = "custom";
  int64_t num_gpus = 1;
  int64_t gpus_per_node = 8;
  double gpu_mem_bytes = 0;   // what the device reports as total
  double host_mem_bytes = 0;  // per node; 0 = not checked
  double peak_tflops = 0;     // dense bf16
  double mfu = 0.30;          // model-FLOPs utilization assumed (or measured) for the time estimate
  bool cpu = false;           // plan the CPU reference path (f32 weights, everything in host memory)
  int sm_count = 132;         // streaming multiprocessors (flash-attention backward scratch); H100/H200: 132

  // "h100" (80 GB, 989), "h200" (141 GB, 989), "mi300x" (192 GB, 1307), "a100" (80 GB, 312), "cpu".
  static Hardware preset(const std::string& name, int64_t num_gpus = 1);
  static std::vector<std::string> preset_names();
};
// What `moetrain train` knows at start: the device's name and total memory, the world size.
Hardware hardware_from_device(const std::string& device_name, size_t total_memory, int64_t num_gpus,
                              double peak_tflops, double mfu = 0.30);

// A parallel layout. world = tp * pp * cp * dp; experts are split over ep ranks carved out of
// tp * cp * dp (expert tensor parallel 1), so expert data parallel = tp * cp * dp / ep.
struct Layout {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int64_t world() const { return dp * tp * pp * cp; }
  int64_t expert_dp() const { return dp * tp * cp / ep; }
  bool runnable() const { return tp == 1 && pp == 1 && cp == 1; }  // moetrain runs DP and EP
  std::string str() const;  // "dp8 ep8" / "dp2 tp2 pp2 (planning-only)"
};

// One run to plan: the parts of a TrainConfig (plus hardware-dependent choices) that cost memory/time.
struct PlanInput {
  ModelConfig model;
  std::string model_name;          // for messages (preset, path or config file)
  Objective objective = Objective::kSft;
  int64_t micro_batch_size = 1;    // sequences (DPO: pairs) per micro-batch
  int64_t seq_length = 4096;
  int64_t global_batch_size = 0;   // sequences (DPO: pairs) per step; 0 = micro_batch_size * dp
  Recompute recompute = Recompute::kNone;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  Layout layout;
  bool distributed_optimizer = true;
  bool z_loss = false;
  bool router_stats = true;        // logging.log_expert_load (device reductions need a little scratch)
  double imbalance = kDefaultImbalance;
  int64_t ce_chunk_tokens = kCeChunkTokens;
  double token_budget = 0;         // tokens to train on (0: train_iters * tokens per step)
  int64_t train_iters = 0;
  int64_t keep_last = 3;
  std::vector<std::string> freeze;  // parameter-name patterns without gradients' optimizer state
  // Precision (optimizer.*_dtype): matrix-weight gradients, AdamW's main weights (a master copy
  // exists only when it differs from the weights' dtype: f32 on the CPU path, bf16 on GPUs), m, v.
  DType main_grads_dtype = DType::kF32;
  DType main_params_dtype = DType::kF32;
  DType exp_avg_dtype = DType::kF32;
  DType exp_avg_sq_dtype = DType::kF32;
  bool update_in_backward = false;  // optimizer.update_in_backward (with one micro-batch: no expert gradients)

  // Tokens in one micro-batch on one GPU before splitting by tp/cp (DPO: chosen + rejected).
  int64_t micro_batch_tokens() const;
  // Fills every field from `cfg`; the layout gets dp = num_gpus / (tp*pp*cp) and cfg's ep.
  static PlanInput from_config(const TrainConfig& cfg, const Hardware& hw);
};

// Parameters by role, whole model (layer-resolved where the layout needs it).
struct ParamCounts {
  int64_t total = 0, active = 0;
  int64_t embed = 0, lm_head = 0, final_norm = 0;
  int64_t attention = 0, norms = 0, router = 0, experts = 0, dense_mlp = 0;  // summed over layers
  int64_t muon = 0;    // 2-D hidden matrices (attention, router, experts, dense MLP): Muon's share
  int64_t frozen = 0;  // matched by freeze patterns
};
ParamCounts count_parameters(const ModelConfig& cfg, const std::vector<std::string>& freeze = {});

enum class MemWhere : uint8_t { kDevice, kHost };
struct MemItem {
  std::string name;
  MemCategory category = MemCategory::kOther;
  double bytes = 0;
  std::string note;
};

struct MemoryPlan {
  // Per GPU (the worst pipeline stage), in bytes, like MemStats: per-category peaks and the peak
  // of the sum, both of the allocator; then what the device must hold on top.
  std::array<double, kNumMemCategories> category_peak{};
  std::array<double, kNumMemCategories> at_peak{};  // split of allocator_peak by category
  double allocator_peak = 0;       // worst-case routing
  double allocator_peak_expected = 0;  // balanced routing
  std::string peak_phase;          // where in the step the peak falls
  std::vector<MemItem> items;      // persistent tensors and the dynamic peak's main parts
  double fragmentation = 0;        // reserved - allocated allowance
  double runtime = 0;              // CUDA context + library workspaces (outside the allocator)
  double comm = 0;                 // NCCL buffers (outside the allocator)
  double device_total = 0;         // allocator_peak + fragmentation + runtime + comm
  double device_total_expected = 0;
  std::vector<MemItem> host_items;  // per node
  double host_per_node = 0;
};

struct CheckpointPlan {
  double resume_bytes = 0;  // one checkpoints/step_N directory (weights, master, optimizer state)
  double export_bytes = 0;  // the bf16 Hugging Face export
  double disk_bytes = 0;    // keep_last resume checkpoints + the export
};

struct TimePlan {
  double model_flops_per_token = 0;  // SPEC.md section 10
  double hw_flops_per_token = 0;     // + recompute work + the DPO reference pass
  double tokens_per_step = 0;
  double step_time_s = 0;
  double tokens_per_s_per_gpu = 0;
  double token_budget = 0;
  double steps = 0;
  double total_time_s = 0;
  double pipeline_bubble = 0;        // fraction of step time idle (pp > 1)
  int64_t grad_accum = 1;
};

struct Verdict {
  bool fits = false;
  bool host_fits = true;
  int64_t max_micro_batch = 0;       // largest micro-batch that fits (0: not even 1)
  std::vector<std::string> changes;  // what to change when it does not fit (each one checked)
  std::string summary;
};

struct PlanResult {
  PlanInput input;
  Hardware hw;
  ParamCounts params;
  MemoryPlan memory;
  CheckpointPlan checkpoint;
  TimePlan time;
  Verdict verdict;
  std::vector<std::string> notes;  // planning-only parts, assumptions
};

// The whole plan for one input: memory, time, verdict (with the micro-batch search and the
// suggested changes). Throws a user-facing Error for an impossible layout.
PlanResult plan(const PlanInput& in, const Hardware& hw);
// What `moetrain train` calls before allocating.
PlanResult plan_run(const TrainConfig& cfg, const Hardware& hw);
// Memory only (no verdict search): the building block of plan() and search_layouts().
MemoryPlan plan_memory(const PlanInput& in, const Hardware& hw);
TimePlan plan_time(const PlanInput& in, const Hardware& hw);
CheckpointPlan plan_checkpoint(const PlanInput& in);

// Every layout of hw.num_gpus GPUs (tp, pp, cp in powers of two, ep dividing the experts),
// recompute none/selective/full and micro-batches up to `max_micro_batch`; returns those that
// fit, best first: runnable by moetrain now, then shortest step time per token, then larger
// micro-batch, fewer model-parallel ranks, less memory.
std::vector<PlanResult> search_layouts(const PlanInput& base, const Hardware& hw, int64_t max_micro_batch = 8);

std::string format_plan(const PlanResult& r);
std::string format_search(const std::vector<PlanResult>& rs, size_t max_rows = 20);
nlohmann::json plan_to_json(const PlanResult& r);

// Size strings for --gpu-mem/--host-mem: "80" (GiB), "80GB", "80GiB", "512MiB", "1.5TB".
double parse_memory_size(const std::string& s, const std::string& what);
// The median MFU (or TFLOP/s / peak) of the train records of a metrics.jsonl.
double measured_mfu(const std::string& metrics_jsonl, double peak_tflops);

}  // namespace moetrain
