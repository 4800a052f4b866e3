// HF <-> internal name map (see weight_map.h for the layouts). Pure bookkeeping: no I/O.
#include "model/weight_map.h"

#include "core/check.h"

namespace moetrain {

namespace {

HfPiece whole(const std::string& name, const Shape& shape) {
  HfPiece p;
  p.hf_name = name;
  p.hf_shape = shape;
  p.internal_name = name;
  return p;
}

}  // namespace

std::vector<HfPiece> hf_layer_pieces(const ModelConfig& cfg, int64_t l, ExpertLayout layout) {
  const int64_t H = cfg.hidden_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const std::string pre = "model.layers." + std::to_string(l) + ".";
  std::vector<HfPiece> out;
  out.push_back(whole(pre + "input_layernorm.weight", {H}));
  out.push_back(whole(pre + "self_attn.q_proj.weight", {nh * d, H}));
  out.push_back(whole(pre + "self_attn.k_proj.weight", {nkv * d, H}));
  out.push_back(whole(pre + "self_attn.v_proj.weight", {nkv * d, H}));
  out.push_back(whole(pre + "self_attn.o_proj.weight", {H, nh * d}));
  out.push_back(whole(pre + "self_attn.q_norm.weight", {d}));
  out.push_back(whole(pre + "self_attn.k_norm.weight", {d}));
  out.push_back(whole(pre + "post_attention_layernorm.weight", {H}));
  if (cfg.is_sparse_layer(l)) {
    const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
    out.push_back(whole(pre + "mlp.gate.weight", {E, H}));
    const std::string gu = pre + "mlp.experts.gate_up_proj", dn = pre + "mlp.experts.down_proj";
    if (layout == ExpertLayout::kFused) {
      out.push_back(whole(gu, {E, 2 * I, H}));
      out.push_back(whole(dn, {E, H, I}));
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = pre + "mlp.experts." + std::to_string(e) + ".";
        HfPiece g{ep + "gate_proj.weight", {I, H}, gu, e, 0, I, false};
        HfPiece u{ep + "up_proj.weight", {I, H}, gu, e, I, 2 * I, false};
        HfPiece w{ep + "down_proj.weight", {H, I}, dn, e, 0, -1, false};
        out.push_back(g);
        out.push_back(u);
        out.push_back(w);
      }
    }
  } else {
    const int64_t I = cfg.intermediate_size;
    const std::string gu = pre + "mlp.gate_up_proj.weight";
    out.push_back({pre + "mlp.gate_proj.weight", {I, H}, gu, -1, 0, I, false});
    out.push_back({pre + "mlp.up_proj.weight", {I, H}, gu, -1, I, 2 * I, false});
    out.push_back(whole(pre + "mlp.down_proj.weight", {H, I}));
  }
  return out;
}

std::vector<HfPiece> hf_weight_map(const ModelConfig& cfg, ExpertLayout layout) {
  std::vector<HfPiece> out;
  out.push_back(whole("model.embed_tokens.weight", {cfg.vocab_size, cfg.hidden_size}));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    auto lp = hf_layer_pieces(cfg, l, layout);
    out.insert(out.end(), lp.begin(), lp.end());
  }
  out.push_back(whole("model.norm.weight", {cfg.hidden_size}));
  if (!cfg.tie_word_embeddings) out.push_back(whole("lm_head.weight", {cfg.vocab_size, cfg.hidden_size}));
  return out;
}

Tensor piece_region(const Tensor& internal, const HfPiece& p) {
  Tensor t = p.expert >= 0 ? internal.select(0, p.expert) : internal;
  if (p.row_end >= 0) t = t.slice(0, p.row_begin, p.row_end);
  Shape want = p.hf_shape;
  if (p.transposed) std::swap(want[want.size() - 1], want[want.size() - 2]);
  MT_CHECK(t.shape() == want, "[weight_map] {} maps to a region of shape {} of {}, expected {}", p.hf_name,
           shape_str(t.shape()), p.internal_name, shape_str(want));
  return t;
}

}  // namespace moetrain
