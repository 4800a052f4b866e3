// ModelConfig tests: parsing real config.json text (Qwen3-30B-A3B, Qwen3-0.6B, transformers 5.x
// form), transformers' defaults, one clear error per bad key, presets, parameter counts against
// the published sizes and the FLOPs model against SPEC.md section 10.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/check.h"
#include "model/config.h"

using namespace moetrain;
using json = nlohmann::json;

namespace {

// The published Qwen/Qwen3-30B-A3B config.json.
const char* kQwen3_30B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// Expects from_json to throw with a message naming the source and `key`.
void expect_key_error(const json& j, const std::string& key) {
  try {
    ModelConfig::from_json(j, "cfg/config.json");
    FAIL() << "no error for bad key " << key << " in " << j.dump();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cfg/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("'" + key + "'"), std::string::npos) << m;
  }
}

}  // namespace

TEST(Config, Qwen3_30B_A3B_FromJson) {
  auto c = ModelConfig::from_json(json::parse(kQwen3_30B), "30b.json");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, 151645);
  EXPECT_FALSE(c.tie_word_embeddings);
  for (int l = 0; l < 48; ++l) EXPECT_TRUE(c.is_sparse_layer(l));
  // Published size: 30,532,122,624 parameters; ~3.35B active.
  EXPECT_EQ(c.num_parameters(), 30532122624LL);
  EXPECT_EQ(c.num_active_parameters(), 3353032704LL);
  // SPEC.md section 10: 18.25 GFLOP matmul + 4.83 GFLOP attention at S = 4096 (S_avg = 2048).
  const double attn = 6.0 * 48 * 2 * 32 * 128 * 2048.0;
  EXPECT_NEAR(attn, 4.83e9, 0.01e9);
  EXPECT_NEAR(c.flops_per_token(2048) - attn, 18.25e9, 0.01e9);
  EXPECT_NEAR(c.flops_per_token(2048), 23.08e9, 0.01e9);
  // The preset is the same model.
  auto p = ModelConfig::preset("qwen3-30b-a3b");
  EXPECT_EQ(p.to_json(), c.to_json());
}

TEST(Config, Qwen3_06B_Dense) {
  auto c = ModelConfig::from_json(json::parse(kQwen3_06B), "06b.json");
  EXPECT_FALSE(c.is_moe());
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_sparse_layer(0));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_parameters(), 596049920LL);  // published "0.6B" (0.44B non-embedding)
  EXPECT_EQ(c.num_active_parameters(), c.num_parameters());
  EXPECT_EQ(ModelConfig::preset("qwen3-0.6b").to_json(), c.to_json());
}

TEST(Config, TransformersDefaults) {
  // head_dim absent: Qwen3-MoE falls back to hidden / heads; Qwen3 (dense) defaults to 128.
  json j = {{"model_type", "qwen3_moe"}, {"hidden_size", 256}, {"num_attention_heads", 8}};
  auto c = ModelConfig::from_json(j, "x");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.bos_token_id, -1);
  json d = {{"model_type", "qwen3"}, {"hidden_size", 256}};
  auto cd = ModelConfig::from_json(d, "x");
  EXPECT_EQ(cd.head_dim, 128);
  EXPECT_EQ(cd.num_key_value_heads, 32);
  EXPECT_EQ(cd.intermediate_size, 22016);
  // num_key_value_heads null means "as many as attention heads".
  d["num_attention_heads"] = 8;
  d["num_key_value_heads"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json(d, "x").num_key_value_heads, 8);
  // head_dim != hidden / heads is kept as given.
  j["head_dim"] = 64;
  EXPECT_EQ(ModelConfig::from_json(j, "x").head_dim, 64);
}

TEST(Config, Transformers5Form) {
  json j = json::parse(kQwen3_30B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j.erase("num_experts");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  j["dtype"] = "float32";
  j["num_local_experts"] = 64;
  j["eos_token_id"] = json::array({151645, 151643});
  auto c = ModelConfig::from_json(j, "v5.json");
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.eos_token_id, 151645);
}

TEST(Config, SparseLayerRule) {
  auto c = ModelConfig::preset("tiny-moe").with_num_layers(6);
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  // (l+1) % 2 == 0 -> 1, 3, 5; 3 is mlp-only.
  std::vector<bool> want = {false, true, false, false, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c.is_sparse_layer(l), want[l]) << l;
  auto proxy = c.with_num_layers(2);
  EXPECT_EQ(proxy.num_hidden_layers, 2);
  EXPECT_TRUE(proxy.mlp_only_layers.empty());
  EXPECT_THROW(c.with_num_layers(0), Error);
  // JSON round trip keeps the rule.
  auto back = ModelConfig::from_json(c.to_json(), "rt");
  for (int l = 0; l < 6; ++l) EXPECT_EQ(back.is_sparse_layer(l), want[l]) << l;
}

TEST(Config, PresetsRoundTripThroughJson) {
  for (const auto& name : ModelConfig::preset_names()) {
    auto c = ModelConfig::preset(name);
    json j = c.to_json();
    EXPECT_EQ(j["architectures"][0], c.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM") << name;
    auto back = ModelConfig::from_json(j, name);
    EXPECT_EQ(back.to_json(), j) << name;
    EXPECT_EQ(back.num_parameters(), c.num_parameters()) << name;
  }
  auto demo = ModelConfig::preset("demo-moe");
  EXPECT_EQ(demo.vocab_size, 151936);
  EXPECT_EQ(demo.num_experts, 8);
  EXPECT_TRUE(demo.tie_word_embeddings);
  auto tiny = ModelConfig::preset("tiny-dense");
  EXPECT_EQ(tiny.model_type, "qwen3");
  EXPECT_EQ(tiny.intermediate_size, 128);
  EXPECT_THROW(ModelConfig::preset("qwen9"), Error);
}

TEST(Config, ErrorsNameFileAndKey) {
  json base = json::parse(kQwen3_30B);
  auto with = [&](const std::string& k, json v) {
    json j = base;
    j[k] = std::move(v);
    return j;
  };
  expect_key_error(with("model_type", "llama"), "model_type");
  json nomt = base;
  nomt.erase("model_type");
  expect_key_error(nomt, "model_type");
  expect_key_error(with("hidden_act", "gelu"), "hidden_act");
  expect_key_error(with("attention_bias", true), "attention_bias");
  expect_key_error(with("hidden_size", "2048"), "hidden_size");
  expect_key_error(with("hidden_size", 20.5), "hidden_size");
  expect_key_error(with("hidden_size", -1), "hidden_size");
  expect_key_error(with("vocab_size", 0), "vocab_size");
  expect_key_error(with("num_key_value_heads", 5), "num_attention_heads");
  expect_key_error(with("num_experts_per_tok", 129), "num_experts_per_tok");
  expect_key_error(with("num_experts_per_tok", 0), "num_experts_per_tok");
  expect_key_error(with("mlp_only_layers", json::array({48})), "mlp_only_layers");
  expect_key_error(with("mlp_only_layers", "none"), "mlp_only_layers");
  expect_key_error(with("norm_topk_prob", 1), "norm_topk_prob");
  expect_key_error(with("rope_theta", "big"), "rope_theta");
  expect_key_error(with("head_dim", 127), "head_dim");
  expect_key_error(with("decoder_sparse_step", 0), "decoder_sparse_step");
  expect_key_error(with("rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}), "rope_scaling");
  expect_key_error(with("use_sliding_window", true), "use_sliding_window");
  expect_key_error(with("rms_norm_eps", 0), "rms_norm_eps");
  EXPECT_THROW(ModelConfig::from_json(json::array(), "x"), Error);
  // A whole-number float is accepted like Python's int().
  EXPECT_EQ(ModelConfig::from_json(with("hidden_size", 2048.0), "x").hidden_size, 2048);
}

TEST(Config, FromFile) {
  const std::string path = testing::TempDir() + "mt_config_test.json";
  {
    std::ofstream f(path);
    f << kQwen3_06B;
  }
  EXPECT_EQ(ModelConfig::from_file(path).hidden_size, 1024);
  {
    std::ofstream f(path);
    f << "{\"model_type\": \"qwen3\",";
  }
  try {
    ModelConfig::from_file(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  std::remove(path.c_str());
  EXPECT_THROW(ModelConfig::from_file(path + ".missing"), Error);
}
