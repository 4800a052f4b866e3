// ModelConfig: the architecture of a Qwen3 (dense) or Qwen3-MoE model, read from a Hugging Face
// config.json or a named preset. Field names follow config.json (SPEC.md section 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moetrain {

struct ModelConfig {
  std::string model_type = "qwen3_moe";  // "qwen3" | "qwen3_moe"
  int64_t vocab_size = 151936;
  int64_t hidden_size = 2048;
  int64_t num_hidden_layers = 48;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 128;
  int64_t intermediate_size = 6144;      // dense MLP layers
  int64_t moe_intermediate_size = 768;   // each expert
  int64_t num_experts = 128;             // 0 for dense qwen3
  int64_t num_experts_per_tok = 8;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  int64_t max_position_embeddings = 40960;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  double router_aux_loss_coef = 0.001;
  int64_t bos_token_id = 151643;
  int64_t eos_token_id = 151645;
  std::string torch_dtype = "bfloat16";

  bool is_moe() const { return model_type == "qwen3_moe" && num_experts > 0; }
  // Sparse (MoE) layer rule of transformers' Qwen3-MoE: not in mlp_only_layers, and
  // (layer + 1) % decoder_sparse_step == 0.
  bool is_sparse_layer(int64_t layer) const;
  // A depth proxy: the same model with `n` layers (mlp_only_layers entries >= n dropped).
  ModelConfig with_num_layers(int64_t n) const;

  // Parameter counts (every tensor, embedding included; active = per token with top-k experts).
  int64_t num_parameters() const;
  int64_t num_active_parameters() const;
  // Training FLOPs per token (SPEC.md section 10) for sequences of mean attended length s_avg.
  double flops_per_token(double s_avg) const;

  // Throws moetrain::Error naming `source` and the key for a missing, mistyped or out-of-range
  // field, or an unsupported model_type / hidden_act / attention_bias.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& config_json_path);
  // Presets: "qwen3-30b-a3b", "qwen3-0.6b", "demo-moe" (Qwen3 tokenizer vocab, tiny dims),
  // "tiny-moe", "tiny-dense" (vocab 256, for tests). Token ids < 0 mean "none" (null in JSON).
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  void validate(const std::string& source) const;
  nlohmann::json to_json() const;  // a config.json transformers loads (architectures, dtype...)
};

}  // namespace moetrain
