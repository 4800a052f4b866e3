// Qwen3Model: the Qwen3 / Qwen3-MoE causal LM forward and backward over a packed Batch, layer by
// layer with explicit saved activations (no autograd). Loss (SPEC.md sections 2-3):
//   loss = sum_t w_t * CE_t + aux_coef * aux + zloss_coef * z
// aux: HF global form by default (E * sum_e f_e P_e with statistics over the rows of all sparse
// layers together), or the Megatron per-layer form averaged over sparse layers; z: the mean over
// sparse layers of mean_t logsumexp(router logits_t)^2. Gradients accumulate (+=) in f32 into a
// ModelParams-shaped set (allocate_gradients); with tied embeddings the lm_head gradient lands in
// embed. Parameters are borrowed: the model holds a reference and must not outlive them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "model/batch.h"
#include "model/decoder_layer.h"
#include "model/params.h"

namespace moetrain {

enum class AuxLossType : uint8_t { kGlobal, kPerLayer };
// kNone saves every activation; kFull saves each layer's input only and re-runs the layer's
// forward during backward; kSelective is reserved (not implemented yet: rejected).
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
  bool router_stats = true;  // per-layer health metrics (one host read of [T,E] probs per layer)
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
  Tensor logits;      // [T,V] when requested
};

enum class Pass : uint8_t { kTrain, kEval };  // kTrain saves activations for backward

class Qwen3Model {
 public:
  Qwen3Model(const ModelParams& params, ModelOptions opts = {});

  const ModelConfig& config() const { return params_.config; }
  const ModelOptions& options() const { return opts_; }
  float aux_coef() const { return aux_coef_; }

  // One forward. kTrain keeps what backward() needs until backward() or release().
  ForwardResult forward(Context& ctx, const Batch& batch, Pass pass = Pass::kTrain, bool return_logits = false);
  // Backward of the last kTrain forward: accumulates parameter gradients into `grads` and
  // releases the saved activations.
  void backward(Context& ctx, ModelParams& grads);
  ForwardResult forward_backward(Context& ctx, const Batch& batch, ModelParams& grads, bool return_logits = false);
  // Forward only: log p(label_t | prefix) per token [T] f32, 0 where label_t == -100 (DPO, eval).
  Tensor token_logprobs(Context& ctx, const Batch& batch);
  void release();

 private:
  struct RouterTotals;
  Tensor embed_and_layers(Context& ctx, const Batch& batch, Pass pass, ForwardResult& res, RouterTotals& rt);
  const Tensor& lm_head_weight() const;
  Tensor final_logits(Context& ctx, const Tensor& hl, bool save);

  const ModelParams& params_;
  ModelOptions opts_;
  float aux_coef_ = 0.0f;
  // Saved state of the last kTrain forward.
  bool has_saved_ = false;
  Batch batch_;
  std::vector<LayerActs> acts_;
  Tensor final_in_, final_out_, final_rstd_;  // [T,H], [T,H], [T]
  Tensor logits_, ce_lse_;                    // [T,V], [T]
  Tensor aux_counts_total_;                   // [E] f32 (global form)
  std::vector<Tensor> aux_counts_layer_;      // per layer [E] f32 (per-layer form), empty if dense
  int64_t num_sparse_ = 0;
};

// f32 zeros in the model's layout, category kGradients (lm_head aliases embed when tied).
ModelParams allocate_gradients(const ModelConfig& cfg, Device device);
void zero_gradients(ModelParams& grads);

// Visits tensors under transformers' in-memory parameter names (experts fused as
// mlp.experts.gate_up_proj [E,2I,H] / mlp.experts.down_proj [E,H,I]; dense MLPs split into
// mlp.gate_proj / mlp.up_proj / mlp.down_proj views; lm_head skipped when tied), the layout of
// `{n: p.grad for n, p in model.named_parameters()}` in transformers 5.
void for_each_hf_named(const ModelParams& p, const std::function<void(const std::string&, const Tensor&)>& fn);

}  // namespace moetrain
