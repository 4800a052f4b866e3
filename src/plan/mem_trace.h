// Replays, as a list of alloc/free events with byte sizes, the device allocations of one training
// micro-batch (forward, chunked loss head, backward) in the order model/qwen3_model.cpp,
// decoder_layer.cpp and loss_head.cpp make them (plus the CUDA ops' internal scratch), then reads
// the per-category and total peaks off the replay. Keep it in step with those files;
// docs/design/planner.md lists the tensors.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "model/config.h"
#include "model/qwen3_model.h"

namespace moetrain {

// What the allocations of one micro-batch depend on, on one GPU.
struct TraceShape {
  int64_t tokens = 0;        // T: tokens of the micro-batch on this GPU (after tp/cp splits)
  int64_t expert_rows = 0;   // R: routed rows this GPU's experts receive (T*k when ep == 1)
  int64_t num_docs = 1;      // documents in the micro-batch (cu_seqlens length - 1)
  int64_t first_layer = 0;   // layers [first_layer, first_layer + num_layers) of this stage
  int64_t num_layers = 0;
  int64_t vocab_local = 0;   // logits width on this GPU (vocab / tp)
  int64_t width_div = 1;     // tp: head-split widths (q, k, v, attention, dense MLP) divide by it
  int64_t ep = 1;
  int64_t in_flight = 1;     // micro-batches whose activations are held at once (pipeline stage 0)
  int64_t batches_held = 1;  // micro-batches whose Batch tensors are alive at once (DPO: all of a step's)
  int64_t ce_chunk = 0;      // loss-head rows per chunk (loss_head_chunk_rows); 0: all T rows
  int dtype_bytes = 2;       // activation dtype: 2 (bf16 on GPU) or 4 (f32 CPU path)
  bool head = true;          // final norm + lm_head + CE on this stage
  bool fused_head = true;    // forward_backward (SFT/pretrain); false: forward + backward (DPO)
  bool batch_on_device = true;  // the trainer's Batch tensors are allocated inside the step
  bool on_cuda = true;       // CUDA ops' scratch counted; false: CPU path (batch and host temps in kOther)
  int sm_count = 132;        // flash-attention backward splits depend on it (H100/H200: 132)
  bool hopper = false;       // cc 9.0: the fused sm90 attention backward's workspace
  bool router_stats = true;  // ModelOptions::router_stats (logging.log_expert_load)
  bool z_loss = false;
  // > 0: each expert matrix's backward takes a gradient workspace of this many bytes per element
  // while it runs (optimizer.update_in_backward without gradient buffers, on the two-op path).
  int expert_grad_scratch_bytes = 0;
  // The trainer's fused gradient norm: the last micro-batch's backward sums the expert gradients'
  // squares into one f64 workspace scalar, alive from the layers' backward to the optimizer step.
  bool grad_sums = true;
  // Bytes of the per-tile sum-of-squares partials that the Hopper expert dW kernels write while they
  // run with grad_sums (dispatch_dw / dispatch_dw_adamw: 8 bytes a tile); 0 where none.
  double expert_dw_partials_gate_up = 0, expert_dw_partials_down = 0;
  Recompute recompute = Recompute::kNone;
};

// Groups for the breakdown shown to users.
enum class TraceGroup : uint8_t {
  kSaved, kRecomputed, kHead, kHeadGrad, kLayerTemp, kBatch, kRouterStats, kDispatch, kCount
};
const char* trace_group_name(TraceGroup g);

struct TraceResult {
  std::array<double, kNumMemCategories> category_peak{};  // bytes above the state before the step
  std::array<double, kNumMemCategories> at_peak{};        // split of total_peak
  std::array<double, static_cast<size_t>(TraceGroup::kCount)> groups_at_peak{};
  double total_peak = 0;
  std::string peak_phase;
  size_t events = 0;
};

TraceResult trace_micro_batch(const ModelConfig& cfg, const TraceShape& s);

// Bytes saved per token by one layer under Recompute::kNone (both layer kinds), for the docs
// and tests: (tensor, bytes per token) with the routed-row tensors at T*k rows.
std::vector<std::pair<std::string, double>> saved_tensors_per_token(const ModelConfig& cfg, bool sparse,
                                                                    int dtype_bytes, bool z_loss);

}  // namespace moetrain
