// ModelParams: every parameter tensor of a Qwen3 / Qwen3-MoE model in moetrain's internal
// layout, which fuses what transformers 5.x fuses in memory:
// - experts: gate_up [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up) and down [E, H, I];
// - dense MLP: gate_up [2I, H] (gate rows first) and down [H, I].
// Internal names (used for checkpoints and gradient dumps) are the HF names, with the fused
// tensors named as transformers 5.x names them in memory:
//   model.embed_tokens.weight, model.layers.{l}.input_layernorm.weight,
//   model.layers.{l}.self_attn.{q,k,v,o}_proj.weight, model.layers.{l}.self_attn.{q,k}_norm.weight,
//   model.layers.{l}.post_attention_layernorm.weight, model.layers.{l}.mlp.gate.weight,
//   model.layers.{l}.mlp.experts.gate_up_proj, model.layers.{l}.mlp.experts.down_proj,
//   model.layers.{l}.mlp.gate_up_proj.weight (dense), model.layers.{l}.mlp.down_proj.weight (dense),
//   model.norm.weight, lm_head.weight (absent when tied).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace moetrain {

struct LayerParams {
  bool sparse = false;
  Tensor input_norm;   // [H]
  Tensor q_proj;       // [nh*d, H]
  Tensor k_proj;       // [nkv*d, H]
  Tensor v_proj;       // [nkv*d, H]
  // [(nh + 2 nkv) d, H]: ModelParams::allocate makes q_proj, k_proj and v_proj its row blocks, so a
  // layer runs the three projections (and their gradients) as one GEMM each way. Not a parameter
  // of its own (for_each does not visit it); the layer checks that the blocks are still its rows.
  Tensor qkv_proj;
  Tensor o_proj;       // [H, nh*d]
  Tensor q_norm;       // [d]
  Tensor k_norm;       // [d]
  Tensor post_norm;    // [H]
  // sparse layers
  Tensor router;          // [E, H]
  Tensor experts_gate_up; // [E, 2I, H]
  Tensor experts_down;    // [E, H, I]
  // dense layers
  Tensor mlp_gate_up;  // [2I_dense, H]
  Tensor mlp_down;     // [H, I_dense]
};

struct ModelParams {
  ModelConfig config;
  Tensor embed;       // [V, H]
  std::vector<LayerParams> layers;
  Tensor final_norm;  // [H]
  Tensor lm_head;     // [V, H]; shares storage with embed when tie_word_embeddings

  // Allocates every tensor (uninitialized) with `dtype` on `device`, category kWeights.
  static ModelParams allocate(const ModelConfig& cfg, DType dtype, Device device,
                              MemCategory cat = MemCategory::kWeights);
  // The same with two dtypes: `matrix` for the 2-D/3-D weights that GEMMs write gradients into
  // (attention projections, router, experts, dense MLP, an untied lm_head), `other` for the 1-D
  // norm weights and the embedding table (gradient sets: optimizer.main_grads_dtype).
  // expert_matrices = false leaves the MoE layers' expert tensors undefined (gradient sets whose
  // expert weights are updated in backward: optimizer.update_in_backward with one micro-batch).
  static ModelParams allocate(const ModelConfig& cfg, DType other, DType matrix, Device device, MemCategory cat,
                              bool expert_matrices = true);
  // Visits each distinct parameter once (lm_head skipped when tied) with its internal name.
  void for_each(const std::function<void(const std::string& name, Tensor& t)>& fn);
  void for_each(const std::function<void(const std::string& name, const Tensor& t)>& fn) const;
  // Expected shape of each internal name (for loaders' error messages).
  static std::vector<std::pair<std::string, Shape>> expected_shapes(const ModelConfig& cfg);
};

// transformers' initializer: normal(0, initializer_range=0.02) for matrices and embeddings,
// ones for norm weights. Deterministic for (seed, name).
// Element i of a matrix named `name` is normal draw (i % 2) of Philox4x32(key, 0, i / 2) under
// Box-Muller (core/philox.h), key = param_init_key(seed, name), times std; values are made in f32
// and rounded to the tensor's dtype.
void init_params_random(ModelParams& p, uint64_t seed, float std = 0.02f);
uint64_t param_init_key(uint64_t seed, const std::string& name);

}  // namespace moetrain
