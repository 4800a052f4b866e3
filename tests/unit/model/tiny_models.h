// Tiny random Qwen3-MoE models for the model tests: a 2-layer config (layer 1 optionally dense),
// parameters with decisive routing and O(1) activations, and batches of random documents.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/params.h"

namespace moetrain::test {

inline ModelConfig small_moe_config(bool tied, int64_t experts, bool dense_layer) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 12;
  c.moe_intermediate_size = 8;
  c.num_experts = experts;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  if (dense_layer) c.mlp_only_layers = {1};  // layer 0 sparse, layer 1 dense
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000.0;
  c.tie_word_embeddings = tied;
  c.router_aux_loss_coef = 0.05;
  return c;
}

// Norm weights 1 + N(0, 0.2); the router N(0, router_std) (decisive routing); the embedding
// N(0, embed_std) when embed_std > 0; every other matrix N(0, 1 / fan_in).
inline ModelParams random_test_params(const ModelConfig& c, uint32_t seed, double router_std = 1.0,
                                      double embed_std = 0.0) {
  ModelParams p = ModelParams::allocate(c, DType::kF32, Device::cpu());
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  p.for_each([&](const std::string& name, Tensor& t) {
    const bool norm = name.find("norm.weight") != std::string::npos;
    const bool router = name.find("mlp.gate.weight") != std::string::npos;
    const bool emb = embed_std > 0 && name.find("embed_tokens") != std::string::npos;
    const double std = router ? router_std : emb ? embed_std : 1.0 / std::sqrt(static_cast<double>(t.size(-1)));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, norm ? 1.0 + 0.2 * n(rng) : std * n(rng));
  });
  return p;
}

inline Batch random_batch(uint32_t seed, int64_t V, const std::vector<int>& lens) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, static_cast<int>(V) - 1);
  std::vector<std::vector<int32_t>> docs;
  for (int n : lens) {
    docs.emplace_back();
    for (int i = 0; i < n; ++i) docs.back().push_back(u(rng));
  }
  return Batch::from_documents(docs);
}

}  // namespace moetrain::test
