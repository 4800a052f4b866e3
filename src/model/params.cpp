// ModelParams: allocation of every parameter tensor in the internal (fused) layout, name-ordered
// traversal, expected shapes for loaders, and transformers-style random initialization.
// Init is deterministic per (seed, parameter name, element index) via Philox4x32 from
// core/philox.h, independent of thread count, device and of the ops layer.
#include "model/params.h"

#include <algorithm>
#include <thread>

#include "core/env.h"
#include "core/philox.h"

namespace moetrain {

namespace {

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

// Visits (name, tensor) of every distinct parameter in a fixed order. Tensor& may be const.
template <typename P, typename Fn>
void visit(P& p, Fn&& fn) {
  fn(std::string("model.embed_tokens.weight"), p.embed);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    auto& L = p.layers[i];
    const std::string pre = layer_prefix(static_cast<int64_t>(i));
    fn(pre + "input_layernorm.weight", L.input_norm);
    fn(pre + "self_attn.q_proj.weight", L.q_proj);
    fn(pre + "self_attn.k_proj.weight", L.k_proj);
    fn(pre + "self_attn.v_proj.weight", L.v_proj);
    fn(pre + "self_attn.o_proj.weight", L.o_proj);
    fn(pre + "self_attn.q_norm.weight", L.q_norm);
    fn(pre + "self_attn.k_norm.weight", L.k_norm);
    fn(pre + "post_attention_layernorm.weight", L.post_norm);
    if (L.sparse) {
      fn(pre + "mlp.gate.weight", L.router);
      fn(pre + "mlp.experts.gate_up_proj", L.experts_gate_up);
      fn(pre + "mlp.experts.down_proj", L.experts_down);
    } else {
      fn(pre + "mlp.gate_up_proj.weight", L.mlp_gate_up);
      fn(pre + "mlp.down_proj.weight", L.mlp_down);
    }
  }
  fn(std::string("model.norm.weight"), p.final_norm);
  if (!p.config.tie_word_embeddings) fn(std::string("lm_head.weight"), p.lm_head);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

bool is_norm_name(const std::string& name) {
  return name.find("norm.weight") != std::string::npos;  // *_layernorm, q_norm, k_norm, model.norm
}

// Fills host f32 buffer `out[n]` with normal(0, std): element i is the (i % 2)-th output of
// Philox(key, 0, i / 2) under Box-Muller. Split over threads by element ranges.
void fill_normal_host(float* out, int64_t n, uint64_t key, float std) {
  const int64_t kMinPerThread = 1 << 16;
  int threads = static_cast<int>(std::min<int64_t>(env_num_threads(), std::max<int64_t>(1, n / kMinPerThread)));
  auto work = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin & ~int64_t{1}; i < end; i += 2) {
      float a, b;
      philox_normal2(philox4x32(key, 0, static_cast<uint64_t>(i / 2)), &a, &b);
      if (i >= begin) out[i] = a * std;
      if (i + 1 < end && i + 1 >= begin) out[i + 1] = b * std;
    }
  };
  if (threads <= 1) {
    work(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back(work, b, e);
  }
  for (auto& th : pool) th.join();
}

}  // namespace

ModelParams ModelParams::allocate(const ModelConfig& cfg, DType dtype, Device device, MemCategory cat) {
  return allocate(cfg, dtype, dtype, device, cat);
}

ModelParams ModelParams::allocate(const ModelConfig& cfg, DType other, DType matrix, Device device, MemCategory cat,
                                  bool expert_matrices) {
  ModelParams p;
  p.config = cfg;
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  // Matrices (dim >= 2) take `matrix`; 1-D tensors and the embedding table take `other`.
  auto mk = [&](const Shape& s) { return Tensor::empty(s, s.size() >= 2 ? matrix : other, device, cat); };
  p.embed = Tensor::empty({V, H}, other, device, cat);
  p.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerParams& L = p.layers[static_cast<size_t>(l)];
    L.sparse = cfg.is_sparse_layer(l);
    L.input_norm = mk({H});
    L.qkv_proj = mk({(nh + 2 * nkv) * d, H});
    L.q_proj = L.qkv_proj.slice(0, 0, nh * d);
    L.k_proj = L.qkv_proj.slice(0, nh * d, (nh + nkv) * d);
    L.v_proj = L.qkv_proj.slice(0, (nh + nkv) * d, (nh + 2 * nkv) * d);
    L.o_proj = mk({H, nh * d});
    L.q_norm = mk({d});
    L.k_norm = mk({d});
    L.post_norm = mk({H});
    if (L.sparse) {
      const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
      L.router = mk({E, H});
      if (expert_matrices) {
        L.experts_gate_up = mk({E, 2 * I, H});
        L.experts_down = mk({E, H, I});
      }
    } else {
      const int64_t I = cfg.intermediate_size;
      L.mlp_gate_up = mk({2 * I, H});
      L.mlp_down = mk({H, I});
    }
  }
  p.final_norm = mk({H});
  p.lm_head = cfg.tie_word_embeddings ? p.embed : mk({V, H});
  return p;
}

void ModelParams::for_each(const std::function<void(const std::string&, Tensor&)>& fn) { visit(*this, fn); }

void ModelParams::for_each(const std::function<void(const std::string&, const Tensor&)>& fn) const {
  visit(*this, fn);
}

std::vector<std::pair<std::string, Shape>> ModelParams::expected_shapes(const ModelConfig& cfg) {
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  std::vector<std::pair<std::string, Shape>> out;
  out.push_back({"model.embed_tokens.weight", {V, H}});
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string pre = layer_prefix(l);
    out.push_back({pre + "input_layernorm.weight", {H}});
    out.push_back({pre + "self_attn.q_proj.weight", {nh * d, H}});
    out.push_back({pre + "self_attn.k_proj.weight", {nkv * d, H}});
    out.push_back({pre + "self_attn.v_proj.weight", {nkv * d, H}});
    out.push_back({pre + "self_attn.o_proj.weight", {H, nh * d}});
    out.push_back({pre + "self_attn.q_norm.weight", {d}});
    out.push_back({pre + "self_attn.k_norm.weight", {d}});
    out.push_back({pre + "post_attention_layernorm.weight", {H}});
    if (cfg.is_sparse_layer(l)) {
      const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
      out.push_back({pre + "mlp.gate.weight", {E, H}});
      out.push_back({pre + "mlp.experts.gate_up_proj", {E, 2 * I, H}});
      out.push_back({pre + "mlp.experts.down_proj", {E, H, I}});
    } else {
      const int64_t I = cfg.intermediate_size;
      out.push_back({pre + "mlp.gate_up_proj.weight", {2 * I, H}});
      out.push_back({pre + "mlp.down_proj.weight", {H, I}});
    }
  }
  out.push_back({"model.norm.weight", {H}});
  if (!cfg.tie_word_embeddings) out.push_back({"lm_head.weight", {V, H}});
  return out;
}

uint64_t param_init_key(uint64_t seed, const std::string& name) {
  return splitmix64(seed ^ splitmix64(fnv1a64(name)));
}

void init_params_random(ModelParams& p, uint64_t seed, float std) {
  p.for_each([&](const std::string& name, Tensor& t) {
    const int64_t n = t.numel();
    // Values are made in f32 on the host, then converted (round to nearest even) and copied.
    Tensor host = Tensor::empty(t.shape(), DType::kF32, Device::cpu());
    float* h = host.data<float>();
    if (is_norm_name(name)) {
      std::fill(h, h + n, 1.0f);
    } else {
      fill_normal_host(h, n, param_init_key(seed, name), std);
    }
    Tensor src = t.dtype() == DType::kF32 ? host : host.to(t.dtype());
    t.copy_from(src);
  });
}

}  // namespace moetrain
