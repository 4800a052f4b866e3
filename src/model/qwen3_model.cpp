// Qwen3Model: embedding -> decoder layers -> final RMSNorm -> lm_head -> weighted CE, plus the
// router losses and router health statistics, and the mirrored backward (SPEC.md sections 2-3).
// Saved state lives in the model between forward(kTrain) and backward(); under Recompute::kFull
// only each layer's input is kept and the layer's forward runs again inside backward (routing is
// deterministic, so the recomputed activations equal the first ones bit for bit).
#include "model/qwen3_model.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/ops.h"

namespace moetrain {

using ops::Trans;

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::kNone;
  if (s == "selective") return Recompute::kSelective;
  if (s == "full") return Recompute::kFull;
  MT_FAIL("[model] recompute '{}' is not one of none, selective, full", s);
}

const char* aux_loss_type_name(AuxLossType t) { return t == AuxLossType::kGlobal ? "global" : "per_layer"; }

AuxLossType parse_aux_loss_type(const std::string& s) {
  if (s == "global") return AuxLossType::kGlobal;
  if (s == "per_layer") return AuxLossType::kPerLayer;
  MT_FAIL("[model] aux loss type '{}' is not one of global, per_layer", s);
}

// Router statistics of one forward: device tensors for the loss, host values for the metrics.
struct Qwen3Model::RouterTotals {
  Tensor counts_total, prob_sum_total;        // [E] f32
  std::vector<Tensor> counts, prob_sum;       // per layer (undefined for dense layers)
  std::vector<double> z_sum;                  // per layer sum_t lse^2
};

Qwen3Model::Qwen3Model(const ModelParams& params, ModelOptions opts) : params_(params), opts_(opts) {
  const ModelConfig& cfg = params.config;
  MT_CHECK(opts.recompute != Recompute::kSelective,
           "[model] recompute 'selective' is not implemented yet; use 'none' or 'full'");
  MT_CHECK(static_cast<int64_t>(params.layers.size()) == cfg.num_hidden_layers,
           "[model] parameters have {} layers but the config says {}", params.layers.size(), cfg.num_hidden_layers);
  MT_CHECK(params.embed.defined() && params.final_norm.defined(), "[model] parameters are not allocated");
  MT_CHECK(cfg.tie_word_embeddings || params.lm_head.defined(), "[model] untied model without lm_head");
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const bool sparse = cfg.is_sparse_layer(l);
    MT_CHECK(params.layers[l].sparse == sparse, "[model] layer {} is {} in the parameters but {} in the config", l,
             params.layers[l].sparse ? "sparse" : "dense", sparse ? "sparse" : "dense");
    num_sparse_ += sparse;
  }
  aux_coef_ = opts.aux_coef >= 0.0f ? opts.aux_coef : static_cast<float>(cfg.router_aux_loss_coef);
}

const Tensor& Qwen3Model::lm_head_weight() const {
  return params_.config.tie_word_embeddings ? params_.embed : params_.lm_head;
}

void Qwen3Model::release() {
  has_saved_ = false;
  batch_ = Batch();
  acts_.clear();
  final_in_ = final_out_ = final_rstd_ = logits_ = ce_lse_ = aux_counts_total_ = Tensor();
  aux_counts_layer_.clear();
}

namespace {

double host_sum(const Tensor& t) {
  double s = 0.0;
  for (float v : t.to_floats()) s += v;
  return s;
}

double mean_entropy(const Tensor& probs) {  // probs [T,E]
  const std::vector<float> p = probs.to_floats();
  const int64_t T = probs.size(0), E = probs.size(1);
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    double h = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      const double v = p[t * E + e];
      if (v > 0.0) h -= v * std::log(v);
    }
    total += h;
  }
  return T > 0 ? total / static_cast<double>(T) : 0.0;
}

}  // namespace

Tensor Qwen3Model::embed_and_layers(Context& ctx, const Batch& batch, Pass pass, ForwardResult& res,
                                    RouterTotals& rt) {
  const ModelConfig& cfg = params_.config;
  const int64_t T = batch.num_tokens(), H = cfg.hidden_size, E = cfg.num_experts, L = cfg.num_hidden_layers;
  const DType dt = params_.embed.dtype();
  const Device dev = params_.embed.device();
  const bool save = pass == Pass::kTrain;
  LayerSettings set;
  set.z_loss = opts_.zloss_coef != 0.0f;

  Tensor h = act_empty({T, H}, dt, dev);
  ops::embedding_forward(ctx, params_.embed, batch.tokens, h);
  if (save) acts_.assign(static_cast<size_t>(L), LayerActs());
  rt.counts.assign(static_cast<size_t>(L), Tensor());
  rt.prob_sum.assign(static_cast<size_t>(L), Tensor());
  rt.z_sum.assign(static_cast<size_t>(L), 0.0);
  if (num_sparse_ > 0) {
    rt.counts_total = Tensor::zeros({E}, DType::kF32, dev, MemCategory::kActivations);
    rt.prob_sum_total = Tensor::zeros({E}, DType::kF32, dev, MemCategory::kActivations);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& w = params_.layers[l];
    LayerActs scratch;
    LayerActs& s = (save && opts_.recompute == Recompute::kNone) ? acts_[l] : scratch;
    Tensor out = decoder_layer_forward(ctx, cfg, w, batch, h, set, s);
    if (w.sparse) {
      rt.counts[l] = Tensor::zeros({E}, DType::kF32, dev, MemCategory::kActivations);
      rt.prob_sum[l] = Tensor::zeros({E}, DType::kF32, dev, MemCategory::kActivations);
      ops::router_stats(ctx, s.probs, s.topk_idx, rt.counts[l], rt.prob_sum[l]);
      ops::add_(ctx, rt.counts_total, rt.counts[l]);
      ops::add_(ctx, rt.prob_sum_total, rt.prob_sum[l]);
      if (set.z_loss) rt.z_sum[l] = ops::sum_squares(ctx, s.z_lse);
      if (opts_.router_stats) {
        RouterLayerStats st;
        st.layer = l;
        st.tokens_per_expert = rt.counts[l].to_floats();
        const double mean = static_cast<double>(T * cfg.num_experts_per_tok) / static_cast<double>(E);
        double mx = 0.0;
        int64_t active = 0;
        for (float c : st.tokens_per_expert) {
          mx = std::max(mx, static_cast<double>(c));
          active += c > 0.0f;
        }
        st.max_mean_load = mean > 0.0 ? mx / mean : 0.0;
        st.frac_active = static_cast<double>(active) / static_cast<double>(E);
        st.entropy = mean_entropy(s.probs);
        st.aux = ops::aux_loss_value(rt.counts[l], rt.prob_sum[l], T);
        st.z = rt.z_sum[l] / static_cast<double>(T);
        res.router.push_back(std::move(st));
      }
    }
    if (save && opts_.recompute == Recompute::kFull) acts_[l].x = h;
    h = out;
  }
  return h;
}

Tensor Qwen3Model::final_logits(Context& ctx, const Tensor& hl, bool save) {
  const ModelConfig& cfg = params_.config;
  const int64_t T = hl.size(0), H = cfg.hidden_size, V = cfg.vocab_size;
  const DType dt = hl.dtype();
  const Device dev = hl.device();
  Tensor fn = act_empty({T, H}, dt, dev);
  Tensor rstd = act_empty({T}, DType::kF32, dev);
  ops::rmsnorm_forward(ctx, hl, params_.final_norm, static_cast<float>(cfg.rms_norm_eps), fn, rstd);
  Tensor logits = act_empty({T, V}, dt, dev);
  ops::matmul(ctx, fn, Trans::kNo, lm_head_weight(), Trans::kYes, logits);
  if (save) {
    final_in_ = hl;
    final_out_ = fn;
    final_rstd_ = rstd;
  }
  return logits;
}

ForwardResult Qwen3Model::forward(Context& ctx, const Batch& batch, Pass pass, bool return_logits) {
  const ModelConfig& cfg = params_.config;
  release();
  batch.validate(cfg.vocab_size);
  MT_CHECK(batch.tokens.device() == params_.embed.device(), "[model] batch is on {} but the weights are on {}",
           batch.tokens.device().str(), params_.embed.device().str());
  const int64_t T = batch.num_tokens();
  const Device dev = params_.embed.device();
  ForwardResult res;
  RouterTotals rt;
  Tensor hl = embed_and_layers(ctx, batch, pass, res, rt);
  Tensor logits = final_logits(ctx, hl, pass == Pass::kTrain);

  Tensor losses = work_empty({T}, DType::kF32, dev);
  Tensor lse = act_empty({T}, DType::kF32, dev);
  ops::cross_entropy_forward(ctx, logits, batch.labels, batch.loss_weights, losses, lse);
  res.ce = host_sum(losses);
  res.num_labelled = batch.num_labelled();

  if (num_sparse_ > 0) {
    if (opts_.aux_type == AuxLossType::kGlobal) {
      res.aux = ops::aux_loss_value(rt.counts_total, rt.prob_sum_total, num_sparse_ * T);
    } else {
      double s = 0.0;
      for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
        if (rt.counts[l].defined()) s += ops::aux_loss_value(rt.counts[l], rt.prob_sum[l], T);
      }
      res.aux = s / static_cast<double>(num_sparse_);
    }
    double z = 0.0;
    for (double v : rt.z_sum) z += v;
    res.z = z / static_cast<double>(num_sparse_ * T);
  }
  res.loss = res.ce + static_cast<double>(aux_coef_) * res.aux + static_cast<double>(opts_.zloss_coef) * res.z;
  if (return_logits) res.logits = logits;

  if (pass == Pass::kTrain) {
    has_saved_ = true;
    batch_ = batch;
    logits_ = logits;
    ce_lse_ = lse;
    aux_counts_total_ = rt.counts_total;
    aux_counts_layer_ = rt.counts;
  }
  return res;
}

void Qwen3Model::backward(Context& ctx, ModelParams& grads) {
  const ModelConfig& cfg = params_.config;
  MT_CHECK(has_saved_, "[model] backward() needs a preceding forward(kTrain)");
  MT_CHECK(grads.layers.size() == params_.layers.size(), "[model] gradient set has {} layers, model {}",
           grads.layers.size(), params_.layers.size());
  MT_CHECK(grads.embed.dtype() == DType::kF32, "[model] gradients must be f32, got {}", grads.embed.desc());
  const int64_t T = batch_.num_tokens(), H = cfg.hidden_size, V = cfg.vocab_size;
  const DType dt = params_.embed.dtype();
  const Device dev = params_.embed.device();

  // lm_head and final norm.
  Tensor dh = work_empty({T, H}, dt, dev);
  {
    Tensor dlogits = work_empty({T, V}, dt, dev);
    ops::cross_entropy_backward(ctx, logits_, batch_.labels, batch_.loss_weights, ce_lse_, 1.0f, dlogits);
    logits_ = Tensor();
    Tensor& g_lm = cfg.tie_word_embeddings ? grads.embed : grads.lm_head;
    Tensor dfn = work_empty({T, H}, dt, dev);
    ops::matmul(ctx, dlogits, Trans::kNo, lm_head_weight(), Trans::kNo, dfn);           // [T,V] x [V,H]
    ops::matmul(ctx, dlogits, Trans::kYes, final_out_, Trans::kNo, g_lm, 1.0f, 1.0f);  // [V,T] x [T,H]
    ops::rmsnorm_backward(ctx, final_in_, params_.final_norm, final_rstd_, dfn, dh, grads.final_norm);
    final_in_ = final_out_ = final_rstd_ = Tensor();
  }

  LayerSettings set;
  set.z_loss = opts_.zloss_coef != 0.0f;
  for (int64_t l = cfg.num_hidden_layers - 1; l >= 0; --l) {
    const LayerParams& w = params_.layers[l];
    RouterLossGrad rg;
    if (w.sparse) {
      if (opts_.aux_type == AuxLossType::kGlobal) {
        rg.aux_counts = aux_counts_total_;
        rg.aux_rows = num_sparse_ * T;
        rg.aux_coef = aux_coef_;
      } else {
        rg.aux_counts = aux_counts_layer_[l];
        rg.aux_rows = T;
        rg.aux_coef = aux_coef_ / static_cast<float>(num_sparse_);
      }
      rg.z_scale = opts_.zloss_coef / static_cast<float>(num_sparse_ * T);
    }
    if (opts_.recompute == Recompute::kFull) {
      LayerActs s;
      decoder_layer_forward(ctx, cfg, w, batch_, acts_[l].x, set, s);
      decoder_layer_backward(ctx, cfg, w, grads.layers[l], batch_, s, rg, dh);
    } else {
      decoder_layer_backward(ctx, cfg, w, grads.layers[l], batch_, acts_[l], rg, dh);
    }
    acts_[l].clear();
  }
  ops::embedding_backward(ctx, batch_.tokens, dh, grads.embed);
  release();
}

ForwardResult Qwen3Model::forward_backward(Context& ctx, const Batch& batch, ModelParams& grads,
                                           bool return_logits) {
  ForwardResult r = forward(ctx, batch, Pass::kTrain, return_logits);
  backward(ctx, grads);
  return r;
}

Tensor Qwen3Model::token_logprobs(Context& ctx, const Batch& batch) {
  ForwardResult r = forward(ctx, batch, Pass::kEval, /*return_logits=*/true);
  const int64_t T = batch.num_tokens();
  const Device dev = params_.embed.device();
  Tensor lp = Tensor::empty({T}, DType::kF32, dev, MemCategory::kActivations);
  Tensor lse = work_empty({T}, DType::kF32, dev);
  ops::cross_entropy_forward(ctx, r.logits, batch.labels, Tensor(), lp, lse);  // lse - logit[label]
  ops::scale_(ctx, lp, -1.0f);
  return lp;
}

ModelParams allocate_gradients(const ModelConfig& cfg, Device device) {
  ModelParams g = ModelParams::allocate(cfg, DType::kF32, device, MemCategory::kGradients);
  zero_gradients(g);
  return g;
}

void zero_gradients(ModelParams& grads) {
  grads.for_each([](const std::string&, Tensor& t) { t.zero_(); });
}

void for_each_hf_named(const ModelParams& p, const std::function<void(const std::string&, const Tensor&)>& fn) {
  const ModelConfig& cfg = p.config;
  fn("model.embed_tokens.weight", p.embed);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerParams& L = p.layers[i];
    const std::string pre = "model.layers." + std::to_string(i) + ".";
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
      const int64_t I = L.mlp_down.size(1);
      fn(pre + "mlp.gate_proj.weight", L.mlp_gate_up.slice(0, 0, I));
      fn(pre + "mlp.up_proj.weight", L.mlp_gate_up.slice(0, I, 2 * I));
      fn(pre + "mlp.down_proj.weight", L.mlp_down);
    }
  }
  fn("model.norm.weight", p.final_norm);
  if (!cfg.tie_word_embeddings) fn("lm_head.weight", p.lm_head);
}

}  // namespace moetrain
