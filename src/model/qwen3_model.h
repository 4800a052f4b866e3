// Qwen3Model: the Qwen3 / Qwen3-MoE causal LM forward and backward over a packed Batch, layer by
// layer with explicit saved activations (no autograd). Loss (SPEC.md sections 2-3):
//   loss = sum_t w_t * CE_t + aux_coef * aux + zloss_coef * z
// aux: HF global form by default (E * sum_e f_e P_e with statistics over the rows of all sparse
// layers together), or the Megatron per-layer form averaged over sparse layers; z: the mean over
// sparse layers of mean_t logsumexp(router logits_t)^2. Gradients accumulate (+=) in f32 into a
// ModelParams-shaped set (allocate_gradients); with tied embeddings the lm_head gradient lands in
// embed. Parameters are borrowed: the model holds a reference and must not outlive them.
// Device work: a step reads the device once, at the end (ForwardResult's scalars and router
// statistics come from one packed f32 buffer); the lm_head + CE run in token chunks (loss_head.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "model/batch.h"
#include "model/decoder_layer.h"
#include "model/params.h"

namespace moetrain {

enum class AuxLossType : uint8_t { kGlobal, kPerLayer };
// kNone saves every activation; kSelective drops the attention core, SwiGLU and the cheap
// elementwise outputs and rebuilds them in backward (no matmul repeated; see LayerActs); kFull
// saves each layer's input only and re-runs the layer's forward during backward. All three give
// bit-identical losses and gradients (deterministic ops).
enum class Recompute : uint8_t { kNone, kSelective, kFull };

const char* recompute_name(Recompute r);
Recompute parse_recompute(const std::string& s);  // "none" | "selective" | "full"
const char* aux_loss_type_name(AuxLossType t);
AuxLossType parse_aux_loss_type(const std::string& s);  // "global" | "per_layer"

struct ModelOptions {
  float aux_coef = -1.0f;  // < 0: take router_aux_loss_coef from the config
  AuxLossType aux_type = AuxLossType::kGlobal;
  float zloss_coef = 0.0f;
  Recompute recompute = Recompute::kNone;
  bool router_stats = true;  // per-layer health metrics, incl. entropy (device reductions, read once)
  // Loss head chunking: rows per chunk (> 0), or 0 for chunks of at most kCeChunkMaxRows (1024)
  // rows whose logits fit `ce_chunk_bytes` each, twice both when the lm_head gradient is f32
  // (loss_head_chunk_rows). head_grad_f32: whether it is (a tied embedding's always is; the trainer
  // sets it from optimizer.main_grads_dtype), so that every pass of the model, with or without
  // gradients, chunks alike, as `moetrain plan` counts it.
  int64_t ce_chunk_tokens = 0;
  size_t ce_chunk_bytes = size_t{512} << 20;
  bool head_grad_f32 = true;
};

// Router health of one sparse layer for one forward.
struct RouterLayerStats {
  int64_t layer = 0;
  std::vector<float> tokens_per_expert;  // [E] (token, slot) picks per expert
  double max_mean_load = 0.0;   // max over experts of picks / mean picks (1 = perfectly balanced)
  double frac_active = 0.0;     // fraction of experts with at least one pick
  double entropy = 0.0;         // mean over tokens of -sum_e p log p (nats)
  double aux = 0.0;             // this layer's load-balancing value (per-layer form)
  double z = 0.0;               // mean_t lse^2 (0 when the z-loss is off)
};

struct ForwardResult {
  double loss = 0.0;  // ce + aux_coef * aux + zloss_coef * z
  double ce = 0.0;    // sum_t w_t CE_t
  double aux = 0.0;   // unscaled aux (the selected form)
  double z = 0.0;     // unscaled z
  int64_t num_labelled = 0;
  std::vector<RouterLayerStats> router;  // one per sparse layer
  Tensor logits;      // [T,V] compute dtype, when requested (the only time [T,V] is materialized)
  Tensor nll;         // [T] f32 on the model's device: -log p(label_t), 0 where label_t == -100
};

enum class Pass : uint8_t { kTrain, kEval };  // kTrain saves activations for backward

class Qwen3Model {
 public:
  Qwen3Model(const ModelParams& params, ModelOptions opts = {});
  ~Qwen3Model();

  const ModelConfig& config() const { return params_.config; }
  const ModelOptions& options() const { return opts_; }
  float aux_coef() const { return aux_coef_; }

  // One forward. kTrain keeps what backward() needs until backward() or release(). Reads the
  // device once at the end (the scalars and router statistics).
  ForwardResult forward(Context& ctx, const Batch& batch, Pass pass = Pass::kTrain, bool return_logits = false);
  // Backward of the last kTrain forward: accumulates parameter gradients into `grads` and
  // releases the saved activations. The loss head is recomputed chunk by chunk with the batch's
  // loss_weights as they are now (DPO rewrites them between forward and backward).
  void backward(Context& ctx, ModelParams& grads);
  // Forward and backward with the loss head fused (each chunk's CE gradient is formed right after
  // its logits); one device read, after all the work is queued.
  ForwardResult forward_backward(Context& ctx, const Batch& batch, ModelParams& grads, bool return_logits = false);
  // The next training pass WRITES the matrix gradients (every tensor that zero_gradients(g, false)
  // leaves alone) instead of adding to them: no zeroing and no read of the old values. Set it after
  // zero_gradients(grads, /*matrices=*/false); the next forward(kTrain) consumes it.
  void set_overwrite_matrix_grads() { overwrite_next_ = true; }
  // The next training pass also sums the squares of the expert weight gradients as the grouped
  // GEMM writes them (on Hopper, in the kernel's epilogue: the gradient norm without a second
  // read of 97% of a MoE model's gradients). Call it before a step's last micro-batch; until the
  // next training pass, grad_sum_squares() then gives the sum ([1] f64 on the device) and the
  // gradients it covers.
  struct GradSumSquares {
    Tensor sum;
    std::vector<Tensor> grads;
  };
  void request_grad_sum_squares() { sums_next_ = true; }
  const GradSumSquares* grad_sum_squares() const { return sums_valid_ ? &sums_ : nullptr; }
  // The next training pass applies these AdamW updates to the listed expert weights (matched by
  // storage) as their gradients are formed (ops::grouped_matmul_backward_adamw;
  // optimizer.update_in_backward): their gradient tensors in `grads` are read (earlier
  // micro-batches' sum) but not written. Only expert weights may be listed (checked at the pass).
  // Call it before a step's last micro-batch; after that pass, updated_in_backward() lists the
  // weights that were updated.
  void request_in_backward_updates(std::vector<std::pair<Tensor, ops::AdamWTarget>> updates) {
    updates_next_ = std::move(updates);
  }
  const std::vector<Tensor>& updated_in_backward() const { return updated_; }
  // Forward only: log p(label_t | prefix) per token [T] f32, 0 where label_t == -100 (DPO, eval).
  // No host read.
  Tensor token_logprobs(Context& ctx, const Batch& batch);
  void release();

 private:
  struct Pending;  // device results of a forward, read once by finish_()
  ForwardResult run_forward_(Context& ctx, const Batch& batch, Pass pass, bool return_logits, ModelParams* grads);
  Tensor embed_and_layers_(Context& ctx, const Batch& batch, Pass pass);
  void head_(Context& ctx, const Batch& batch, const Tensor& hl, Pass pass, bool return_logits, ModelParams* grads,
             ForwardResult& res);
  void finish_(ForwardResult& res);
  const Tensor& lm_head_weight() const;
  int64_t chunk_rows_(int64_t T) const;

  const ModelParams& params_;
  ModelOptions opts_;
  float aux_coef_ = 0.0f;
  int64_t num_sparse_ = 0;
  std::vector<int64_t> sparse_slot_;          // layer -> index among sparse layers (-1: dense)
  // Saved state of the last kTrain forward.
  bool has_saved_ = false;
  bool overwrite_next_ = false;  // set_overwrite_matrix_grads(), consumed by the next kTrain forward
  bool overwrite_pass_ = false;  // this training pass writes the matrix gradients
  bool sums_next_ = false, sums_pass_ = false, sums_valid_ = false;  // request_grad_sum_squares()
  GradSumSquares sums_;
  std::vector<std::pair<Tensor, ops::AdamWTarget>> updates_next_, updates_pass_;  // request_in_backward_updates()
  std::vector<Tensor> updated_;
  Batch batch_;
  std::vector<LayerActs> acts_;
  Tensor final_in_, final_out_, final_rstd_;  // [T,H], [T,H], [T] (head not yet differentiated)
  Tensor dh_;                                 // [T,H] d(loss)/d(last layer output) (head fused)
  Tensor aux_counts_total_;                   // [E] f32 (global form)
  Tensor stats_;                              // packed f32 statistics (layout in qwen3_model.cpp)
  std::unique_ptr<Pending> pending_;
};

// Zeros in the model's layout, category kGradients (lm_head aliases embed when tied): f32, or
// `matrix_dtype` (optimizer.main_grads_dtype) for the 2-D/3-D weights written by matmul and
// grouped_matmul_backward; norms and the embedding table (embedding_backward) stay f32.
// expert_matrices = false: no expert gradient tensors (undefined), for expert weights that are
// only ever updated in backward (AdamWTarget; the op then takes a workspace when it needs one).
ModelParams allocate_gradients(const ModelConfig& cfg, Device device, DType matrix_dtype = DType::kF32,
                               bool expert_matrices = true);
// Zeros every (defined) gradient; with matrices = false, only those a training pass after
// Qwen3Model::set_overwrite_matrix_grads() does not write (norm weights, the embedding table).
void zero_gradients(ModelParams& grads, bool matrices = true);

// Visits tensors under transformers' in-memory parameter names (experts fused as
// mlp.experts.gate_up_proj [E,2I,H] / mlp.experts.down_proj [E,H,I]; dense MLPs split into
// mlp.gate_proj / mlp.up_proj / mlp.down_proj views; lm_head skipped when tied), the layout of
// `{n: p.grad for n, p in model.named_parameters()}` in transformers 5.
void for_each_hf_named(const ModelParams& p, const std::function<void(const std::string&, const Tensor&)>& fn);

}  // namespace moetrain
