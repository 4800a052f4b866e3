// ModelConfig: parsing of Hugging Face config.json (qwen3 / qwen3_moe) with transformers'
// defaults for absent fields, validation with one clear error per bad key, presets, parameter
// counts and the training-FLOPs model of SPEC.md section 10.
#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/check.h"

namespace moetrain {

namespace {

using json = nlohmann::json;

const char* json_type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

// Readers: absent (or null where transformers allows None) keeps the default.
struct Reader {
  const json& j;
  const std::string& src;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }

  void int_(const char* key, int64_t* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return;
    }
    // A float with an integral value (e.g. 128.0) is accepted, as Python's int() would.
    if (v.is_number_float()) {
      double d = v.get<double>();
      MT_CHECK(d == static_cast<double>(static_cast<int64_t>(d)),
               "[config] {}: key '{}' must be an integer, got {}", src, key, v.dump());
      *out = static_cast<int64_t>(d);
      return;
    }
    MT_FAIL("[config] {}: key '{}' must be an integer, got {} ({})", src, key, json_type_name(v), v.dump());
  }
  void float_(const char* key, double* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    MT_CHECK(v.is_number(), "[config] {}: key '{}' must be a number, got {} ({})", src, key,
             json_type_name(v), v.dump());
    *out = v.get<double>();
  }
  void bool_(const char* key, bool* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    MT_CHECK(v.is_boolean(), "[config] {}: key '{}' must be true or false, got {} ({})", src, key,
             json_type_name(v), v.dump());
    *out = v.get<bool>();
  }
  void string_(const char* key, std::string* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    MT_CHECK(v.is_string(), "[config] {}: key '{}' must be a string, got {} ({})", src, key,
             json_type_name(v), v.dump());
    *out = v.get<std::string>();
  }
  void int_list_(const char* key, std::vector<int64_t>* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    MT_CHECK(v.is_array(), "[config] {}: key '{}' must be a list of integers, got {}", src, key, v.dump());
    out->clear();
    for (const auto& e : v) {
      MT_CHECK(e.is_number_integer(), "[config] {}: key '{}' must be a list of integers, got element {}",
               src, key, e.dump());
      out->push_back(e.get<int64_t>());
    }
  }
  // A token id may be an int or a list of ints (eos in some checkpoints); the first is kept.
  void token_id_(const char* key, int64_t* out) const {
    if (!has(key)) return;
    const json& v = j.at(key);
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
      *out = v[0].get<int64_t>();
      return;
    }
    int_(key, out);
  }
};

}  // namespace

bool ModelConfig::is_sparse_layer(int64_t layer) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig ModelConfig::with_num_layers(int64_t n) const {
  MT_CHECK(n >= 1, "[config] num_layers must be at least 1, got {}", n);
  ModelConfig c = *this;
  c.num_hidden_layers = n;
  c.mlp_only_layers.clear();
  for (auto l : mlp_only_layers)
    if (l < n) c.mlp_only_layers.push_back(l);
  return c;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t H = hidden_size, d = head_dim;
  const int64_t attn = H * num_attention_heads * d * 2 + H * num_key_value_heads * d * 2 + 2 * d;
  int64_t n = vocab_size * H * (tie_word_embeddings ? 1 : 2) + H;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    n += 2 * H + attn;
    if (is_sparse_layer(l))
      n += num_experts * H + num_experts * 3 * moe_intermediate_size * H;
    else
      n += 3 * intermediate_size * H;
  }
  return n;
}

int64_t ModelConfig::num_active_parameters() const {
  const int64_t H = hidden_size;
  int64_t n = num_parameters();
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (is_sparse_layer(l)) n -= (num_experts - num_experts_per_tok) * 3 * moe_intermediate_size * H;
  return n;
}

double ModelConfig::flops_per_token(double s_avg) const {
  const double H = static_cast<double>(hidden_size), d = static_cast<double>(head_dim);
  const double nh = static_cast<double>(num_attention_heads), nkv = static_cast<double>(num_key_value_heads);
  double matmul = static_cast<double>(vocab_size) * H;  // lm_head (tied or not, it is a matmul)
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    matmul += 2.0 * H * nh * d + 2.0 * H * nkv * d;
    if (is_sparse_layer(l))
      matmul += static_cast<double>(num_experts) * H +
                static_cast<double>(num_experts_per_tok) * 3.0 * static_cast<double>(moe_intermediate_size) * H;
    else
      matmul += 3.0 * static_cast<double>(intermediate_size) * H;
  }
  const double attention = 6.0 * static_cast<double>(num_hidden_layers) * 2.0 * nh * d * s_avg;
  return 6.0 * matmul + attention;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  MT_CHECK(j.is_object(), "[config] {}: expected a JSON object, got {}", source, json_type_name(j));
  Reader r{j, source};
  ModelConfig c;
  MT_CHECK(j.contains("model_type"), "[config] {}: key 'model_type' is missing (expected \"qwen3\" or \"qwen3_moe\")",
           source);
  r.string_("model_type", &c.model_type);
  MT_CHECK(c.model_type == "qwen3" || c.model_type == "qwen3_moe",
           "[config] {}: key 'model_type' is \"{}\", expected \"qwen3\" or \"qwen3_moe\"", source, c.model_type);
  const bool moe = c.model_type == "qwen3_moe";

  // transformers' defaults for the two classes (Qwen3Config / Qwen3MoeConfig).
  c.vocab_size = 151936;
  c.hidden_size = moe ? 2048 : 4096;
  c.intermediate_size = moe ? 6144 : 22016;
  c.num_hidden_layers = moe ? 24 : 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = moe ? 4 : 32;
  c.max_position_embeddings = 32768;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = false;
  c.attention_bias = false;
  c.hidden_act = "silu";
  c.moe_intermediate_size = moe ? 768 : 0;
  c.num_experts = moe ? 128 : 0;
  c.num_experts_per_tok = moe ? 8 : 0;
  c.norm_topk_prob = false;
  c.decoder_sparse_step = 1;
  c.mlp_only_layers.clear();
  c.router_aux_loss_coef = moe ? 0.001 : 0.0;
  c.bos_token_id = -1;
  c.eos_token_id = -1;
  c.torch_dtype = "bfloat16";

  r.int_("vocab_size", &c.vocab_size);
  r.int_("hidden_size", &c.hidden_size);
  r.int_("intermediate_size", &c.intermediate_size);
  r.int_("num_hidden_layers", &c.num_hidden_layers);
  r.int_("num_attention_heads", &c.num_attention_heads);
  // num_key_value_heads: null means "same as num_attention_heads" in transformers.
  if (j.contains("num_key_value_heads") && j.at("num_key_value_heads").is_null())
    c.num_key_value_heads = c.num_attention_heads;
  r.int_("num_key_value_heads", &c.num_key_value_heads);
  // head_dim: Qwen3Config defaults to 128; Qwen3-MoE's modeling falls back to hidden / heads.
  c.head_dim = moe ? (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0) : 128;
  r.int_("head_dim", &c.head_dim);
  r.string_("hidden_act", &c.hidden_act);
  r.int_("max_position_embeddings", &c.max_position_embeddings);
  r.float_("rms_norm_eps", &c.rms_norm_eps);
  r.bool_("tie_word_embeddings", &c.tie_word_embeddings);
  r.bool_("attention_bias", &c.attention_bias);
  r.int_("bos_token_id", &c.bos_token_id);
  r.token_id_("eos_token_id", &c.eos_token_id);
  r.string_("torch_dtype", &c.torch_dtype);
  r.string_("dtype", &c.torch_dtype);  // transformers 5.x name

  // RoPE: transformers 4.x writes rope_theta + rope_scaling; 5.x writes rope_parameters.
  r.float_("rope_theta", &c.rope_theta);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rp = j.at(key);
    MT_CHECK(rp.is_object(), "[config] {}: key '{}' must be an object or null, got {}", source, key, rp.dump());
    std::string type = "default";
    for (const char* tk : {"rope_type", "type"})
      if (rp.contains(tk) && rp.at(tk).is_string()) type = rp.at(tk).get<std::string>();
    MT_CHECK(type == "default", "[config] {}: key '{}' has rope_type \"{}\"; only the default RoPE is supported",
             source, key, type);
    if (rp.contains("rope_theta")) {
      Reader rr{rp, source};
      rr.float_("rope_theta", &c.rope_theta);
    }
  }
  bool sliding = false;
  r.bool_("use_sliding_window", &sliding);
  MT_CHECK(!sliding, "[config] {}: key 'use_sliding_window' is true; sliding-window attention is not supported",
           source);

  if (moe) {
    r.int_("moe_intermediate_size", &c.moe_intermediate_size);
    r.int_("num_experts", &c.num_experts);
    r.int_("num_local_experts", &c.num_experts);  // transformers 5.x attribute_map alias
    r.int_("num_experts_per_tok", &c.num_experts_per_tok);
    r.bool_("norm_topk_prob", &c.norm_topk_prob);
    r.int_("decoder_sparse_step", &c.decoder_sparse_step);
    r.int_list_("mlp_only_layers", &c.mlp_only_layers);
    r.float_("router_aux_loss_coef", &c.router_aux_loss_coef);
  }
  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& src) const {
  MT_CHECK(model_type == "qwen3" || model_type == "qwen3_moe",
           "[config] {}: key 'model_type' is \"{}\", expected \"qwen3\" or \"qwen3_moe\"", src, model_type);
  auto positive = [&](const char* key, int64_t v) {
    MT_CHECK(v > 0, "[config] {}: key '{}' must be positive, got {}", src, key, v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  MT_CHECK(num_attention_heads % num_key_value_heads == 0,
           "[config] {}: key 'num_attention_heads' ({}) must be a multiple of 'num_key_value_heads' ({})", src,
           num_attention_heads, num_key_value_heads);
  MT_CHECK(head_dim % 2 == 0, "[config] {}: key 'head_dim' must be even for RoPE, got {}", src, head_dim);
  MT_CHECK(hidden_act == "silu", "[config] {}: key 'hidden_act' is \"{}\", only \"silu\" is supported", src,
           hidden_act);
  MT_CHECK(!attention_bias, "[config] {}: key 'attention_bias' is true; Qwen3 attention without bias is the "
           "only supported form", src);
  MT_CHECK(rms_norm_eps > 0 && rms_norm_eps < 1, "[config] {}: key 'rms_norm_eps' must be in (0, 1), got {}", src,
           rms_norm_eps);
  MT_CHECK(rope_theta > 0, "[config] {}: key 'rope_theta' must be positive, got {}", src, rope_theta);
  MT_CHECK(torch_dtype == "bfloat16" || torch_dtype == "float32" || torch_dtype == "float16",
           "[config] {}: key 'torch_dtype' is \"{}\", expected bfloat16, float16 or float32", src, torch_dtype);
  for (auto [key, v] : {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id}})
    MT_CHECK(v >= -1, "[config] {}: key '{}' must be a token id, got {}", src, key, v);
  bool any_dense = false;
  for (int64_t l = 0; l < num_hidden_layers; ++l) any_dense |= !is_sparse_layer(l);
  if (any_dense) positive("intermediate_size", intermediate_size);
  if (model_type == "qwen3_moe") {
    positive("num_experts", num_experts);
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("decoder_sparse_step", decoder_sparse_step);
    MT_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= num_experts,
             "[config] {}: key 'num_experts_per_tok' must be in [1, num_experts={}], got {}", src, num_experts,
             num_experts_per_tok);
    MT_CHECK(router_aux_loss_coef >= 0, "[config] {}: key 'router_aux_loss_coef' must be >= 0, got {}", src,
             router_aux_loss_coef);
    for (auto l : mlp_only_layers)
      MT_CHECK(l >= 0 && l < num_hidden_layers,
               "[config] {}: key 'mlp_only_layers' holds layer {}, expected 0..{}", src, l, num_hidden_layers - 1);
  } else {
    MT_CHECK(num_experts == 0, "[config] {}: a qwen3 (dense) model has no experts, got num_experts={}", src,
             num_experts);
  }
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream f(path);
  MT_CHECK(f.good(), "[config] cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    MT_FAIL("[config] {} is not valid JSON: {}", path, e.what());
  }
  return from_json(j, path);
}

json ModelConfig::to_json() const {
  const bool moe = model_type == "qwen3_moe";
  json j;
  j["architectures"] = json::array({moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"});
  j["model_type"] = model_type;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = bos_token_id >= 0 ? json(bos_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_id >= 0 ? json(eos_token_id) : json(nullptr);
  j["head_dim"] = head_dim;
  j["hidden_act"] = hidden_act;
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["max_window_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_scaling"] = nullptr;
  j["rope_theta"] = rope_theta;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["use_sliding_window"] = false;
  j["vocab_size"] = vocab_size;
  if (moe) {
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
  }
  return j;
}

std::vector<std::string> ModelConfig::preset_names() {
  return {"qwen3-30b-a3b", "qwen3-0.6b", "demo-moe", "tiny-moe", "tiny-dense"};
}

ModelConfig ModelConfig::preset(const std::string& name) {
  ModelConfig c;  // struct defaults are Qwen3-30B-A3B (SPEC.md section 1)
  if (name == "qwen3-30b-a3b") {
    // as is
  } else if (name == "qwen3-0.6b") {
    c.model_type = "qwen3";
    c.hidden_size = 1024;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.intermediate_size = 3072;
    c.moe_intermediate_size = 0;
    c.num_experts = 0;
    c.num_experts_per_tok = 0;
    c.norm_topk_prob = false;
    c.router_aux_loss_coef = 0.0;
    c.tie_word_embeddings = true;
  } else if (name == "demo-moe") {
    // Small enough to train on a laptop, with the real Qwen3 tokenizer's vocabulary.
    c.hidden_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.intermediate_size = 256;
    c.moe_intermediate_size = 128;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.tie_word_embeddings = true;
  } else if (name == "tiny-moe" || name == "tiny-dense") {
    // Unit-test models with a byte-sized vocabulary (token ids 0..255; bos 1, eos 2).
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 128;
    c.max_position_embeddings = 4096;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    if (name == "tiny-moe") {
      c.moe_intermediate_size = 32;
      c.num_experts = 4;
      c.num_experts_per_tok = 2;
      c.tie_word_embeddings = false;
    } else {
      c.model_type = "qwen3";
      c.moe_intermediate_size = 0;
      c.num_experts = 0;
      c.num_experts_per_tok = 0;
      c.norm_topk_prob = false;
      c.router_aux_loss_coef = 0.0;
      c.tie_word_embeddings = true;
    }
  } else {
    std::string names;
    for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    MT_FAIL("[config] unknown preset '{}'; known presets: {}", name, names);
  }
  c.validate("preset " + name);
  return c;
}

}  // namespace moetrain
