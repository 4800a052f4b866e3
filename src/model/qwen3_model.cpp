// Qwen3Model: embedding -> decoder layers -> final RMSNorm -> chunked lm_head + weighted CE, plus
// the router losses and router health statistics, and the mirrored backward (SPEC.md sections 2-3).
// Saved state lives in the model between forward(kTrain) and backward(); Recompute::kSelective
// keeps the layer minus its cheap/attention-core tensors, kFull only each layer's input (all ops
// are deterministic, so recomputed activations equal the first ones bit for bit). Scalars and
// router statistics are device reductions into one buffer, read once per forward (finish_).
#include "model/qwen3_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.h"
#include "kernels/ops.h"
#include "model/loss_head.h"

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

// Packed f32 statistics of one forward, zeroed, written by device ops, read once by finish_():
//   [0]                     ce = sum_t w_t nll_t
//   per sparse layer j, at base = 1 + j * (2E + 3):
//     [base, base+E)        picks per expert (router_stats)
//     [base+E, base+2E)     sum over tokens of the router probabilities
//     base+2E               sum_t lse_t of the router logits        (router_stats on)
//     base+2E+1             sum_{t,e} p_te * logit_te               (router_stats on)
//     base+2E+2             sum_t lse_t^2                           (z-loss on)
// Entropy per token is lse_t - sum_e p_te logit_te, so its mean needs only the two sums.
struct Qwen3Model::Pending {
  Tensor stats;
  Batch batch;  // for num_labelled (its host copy when it has one)
  int64_t tokens = 0;
};

namespace {

int64_t stats_stride(int64_t E) { return 2 * E + 3; }

// cell (a 1-element slice) = dot(a, b) over all elements, f32, as a [1,n] x [n,1] GEMM: a device
// reduction with no host read (cuBLAS GEMMs are deterministic for a fixed shape).
void dot_into(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& cell) {
  const int64_t n = a.numel();
  MT_CHECK(b.numel() == n, "[model] dot of {} and {} elements", n, b.numel());
  Tensor c = cell.view({1, 1});
  ops::matmul(ctx, a.view({1, n}), Trans::kNo, b.view({n, 1}), Trans::kNo, c);
}

// E * sum_e (counts_e / N)(prob_sum_e / N): the load-balancing value (ops::aux_loss_value on host data).
double aux_value(const double* counts, const double* prob_sum, int64_t E, int64_t rows) {
  if (rows <= 0) return 0.0;
  const double n = static_cast<double>(rows);
  double s = 0.0;
  for (int64_t e = 0; e < E; ++e) s += (counts[e] / n) * (prob_sum[e] / n);
  return static_cast<double>(E) * s;
}

}  // namespace

Qwen3Model::Qwen3Model(const ModelParams& params, ModelOptions opts) : params_(params), opts_(opts) {
  const ModelConfig& cfg = params.config;
  MT_CHECK(static_cast<int64_t>(params.layers.size()) == cfg.num_hidden_layers,
           "[model] parameters have {} layers but the config says {}", params.layers.size(), cfg.num_hidden_layers);
  MT_CHECK(params.embed.defined() && params.final_norm.defined(), "[model] parameters are not allocated");
  MT_CHECK(cfg.tie_word_embeddings || params.lm_head.defined(), "[model] untied model without lm_head");
  MT_CHECK(opts.ce_chunk_tokens >= 0 && (opts.ce_chunk_tokens > 0 || opts.ce_chunk_bytes > 0),
           "[model] ce_chunk_tokens = {} / ce_chunk_bytes = {}: give a positive chunk size", opts.ce_chunk_tokens,
           opts.ce_chunk_bytes);
  sparse_slot_.assign(static_cast<size_t>(cfg.num_hidden_layers), -1);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const bool sparse = cfg.is_sparse_layer(l);
    MT_CHECK(params.layers[l].sparse == sparse, "[model] layer {} is {} in the parameters but {} in the config", l,
             params.layers[l].sparse ? "sparse" : "dense", sparse ? "sparse" : "dense");
    if (sparse) sparse_slot_[l] = num_sparse_++;
  }
  aux_coef_ = opts.aux_coef >= 0.0f ? opts.aux_coef : static_cast<float>(cfg.router_aux_loss_coef);
}

Qwen3Model::~Qwen3Model() = default;

const Tensor& Qwen3Model::lm_head_weight() const {
  return params_.config.tie_word_embeddings ? params_.embed : params_.lm_head;
}

void Qwen3Model::release() {
  has_saved_ = false;
  batch_ = Batch();
  acts_.clear();
  final_in_ = final_out_ = final_rstd_ = dh_ = aux_counts_total_ = stats_ = Tensor();
}

int64_t Qwen3Model::chunk_rows_(int64_t T) const {
  return loss_head_chunk_rows(T, params_.config.vocab_size, params_.embed.dtype(), opts_.ce_chunk_tokens,
                              opts_.ce_chunk_bytes, opts_.head_grad_f32 || params_.config.tie_word_embeddings);
}

Tensor Qwen3Model::embed_and_layers_(Context& ctx, const Batch& batch, Pass pass) {
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
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& w = params_.layers[l];
    LayerActs s;
    Tensor out = decoder_layer_forward(ctx, cfg, w, batch, h, set, s);
    if (w.sparse) {
      const int64_t base = 1 + sparse_slot_[l] * stats_stride(E);
      Tensor counts = stats_.slice(0, base, base + E), prob_sum = stats_.slice(0, base + E, base + 2 * E);
      if (opts_.router_stats) {  // and the health sums, from the logits, in the same two launches
        Tensor health = stats_.slice(0, base + 2 * E, base + 2 * E + 2);
        ops::router_stats(ctx, s.probs, s.topk_idx, counts, prob_sum, s.router_logits, &health);
      } else {
        ops::router_stats(ctx, s.probs, s.topk_idx, counts, prob_sum);
      }
      ops::add_(ctx, aux_counts_total_, counts);
      if (set.z_loss) dot_into(ctx, s.z_lse, s.z_lse, stats_.slice(0, base + 2 * E + 2, base + 2 * E + 3));
    }
    if (save) {
      switch (opts_.recompute) {
        case Recompute::kNone: acts_[l] = std::move(s); break;
        case Recompute::kSelective:
          drop_recomputable(s);
          acts_[l] = std::move(s);
          break;
        case Recompute::kFull: acts_[l].x = h; break;
      }
    }
    h = out;
  }
  return h;
}

void Qwen3Model::head_(Context& ctx, const Batch& batch, const Tensor& hl, Pass pass, bool return_logits,
                       ModelParams* grads, ForwardResult& res) {
  const ModelConfig& cfg = params_.config;
  const int64_t T = hl.size(0), H = cfg.hidden_size, V = cfg.vocab_size;
  const DType dt = hl.dtype();
  const Device dev = hl.device();
  Tensor fn = act_empty({T, H}, dt, dev);
  Tensor rstd = act_empty({T}, DType::kF32, dev);
  ops::rmsnorm_forward(ctx, hl, params_.final_norm, static_cast<float>(cfg.rms_norm_eps), fn, rstd);
  LossHeadIO io;
  io.nll = act_empty({T}, DType::kF32, dev);
  io.lse = work_empty({T}, DType::kF32, dev);
  if (return_logits) io.logits = act_empty({T, V}, dt, dev);
  if (grads) {
    io.dx = work_empty({T, H}, dt, dev);
    io.dw = cfg.tie_word_embeddings ? grads->embed : grads->lm_head;
    io.dw_overwrite = overwrite_pass_ && !cfg.tie_word_embeddings;  // the tied table is zeroed
  }
  loss_head(ctx, fn, lm_head_weight(), batch.labels, batch.loss_weights, chunk_rows_(T), io);
  dot_into(ctx, io.nll, batch.loss_weights, stats_.slice(0, 0, 1));
  if (grads) {
    dh_ = work_empty({T, H}, dt, dev);
    ops::rmsnorm_backward(ctx, hl, params_.final_norm, rstd, io.dx, dh_, grads->final_norm);
  } else if (pass == Pass::kTrain) {
    final_in_ = hl;
    final_out_ = fn;
    final_rstd_ = rstd;
  }
  res.nll = io.nll;
  res.logits = io.logits;
}

ForwardResult Qwen3Model::run_forward_(Context& ctx, const Batch& batch, Pass pass, bool return_logits,
                                       ModelParams* grads) {
  const ModelConfig& cfg = params_.config;
  release();
  pending_.reset();
  batch.validate(cfg.vocab_size);
  MT_CHECK(batch.tokens.device() == params_.embed.device(), "[model] batch is on {} but the weights are on {}",
           batch.tokens.device().str(), params_.embed.device().str());
  if (grads) {
    MT_CHECK(grads->layers.size() == params_.layers.size(), "[model] gradient set has {} layers, model {}",
             grads->layers.size(), params_.layers.size());
    MT_CHECK(grads->embed.dtype() == DType::kF32, "[model] gradients must be f32, got {}", grads->embed.desc());
  }
  const int64_t E = cfg.num_experts;
  const Device dev = params_.embed.device();
  if (pass == Pass::kTrain) {
    overwrite_pass_ = std::exchange(overwrite_next_, false);
    sums_pass_ = std::exchange(sums_next_, false);
    sums_valid_ = false;  // the gradients are about to change
    sums_ = {};           // and the last step's sum is read: its 8 bytes go before this step's peak
    updates_pass_ = std::exchange(updates_next_, {});
    updated_.clear();
  }
  stats_ = Tensor::zeros({1 + num_sparse_ * stats_stride(E)}, DType::kF32, dev, MemCategory::kActivations);
  if (num_sparse_ > 0) aux_counts_total_ = Tensor::zeros({E}, DType::kF32, dev, MemCategory::kActivations);
  ForwardResult res;
  Tensor hl = embed_and_layers_(ctx, batch, pass);
  head_(ctx, batch, hl, pass, return_logits, grads, res);
  pending_ = std::make_unique<Pending>();
  pending_->stats = stats_;
  pending_->batch = batch;
  pending_->tokens = batch.num_tokens();
  if (pass == Pass::kTrain) {
    has_saved_ = true;
    batch_ = batch;
  } else {
    release();
  }
  return res;
}

void Qwen3Model::finish_(ForwardResult& res) {
  MT_CHECK(pending_, "[model] no forward results to read");
  const ModelConfig& cfg = params_.config;
  const int64_t T = pending_->tokens, E = cfg.num_experts, k = cfg.num_experts_per_tok;
  const std::vector<float> st = pending_->stats.to_floats();  // the one device read of the step
  res.ce = st[0];
  if (num_sparse_ > 0) {
    std::vector<double> c_tot(static_cast<size_t>(E), 0.0), p_tot(static_cast<size_t>(E), 0.0);
    std::vector<double> c(static_cast<size_t>(E)), p(static_cast<size_t>(E));
    double aux_sum = 0.0, z_sum = 0.0;
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      if (sparse_slot_[l] < 0) continue;
      const int64_t base = 1 + sparse_slot_[l] * stats_stride(E);
      for (int64_t e = 0; e < E; ++e) {
        c[e] = st[base + e], p[e] = st[base + E + e];
        c_tot[e] += c[e], p_tot[e] += p[e];
      }
      const double aux_l = aux_value(c.data(), p.data(), E, T);
      const double z_l = st[base + 2 * E + 2];
      aux_sum += aux_l;
      z_sum += z_l;
      if (!opts_.router_stats) continue;
      RouterLayerStats rs;
      rs.layer = l;
      rs.tokens_per_expert.assign(st.begin() + base, st.begin() + base + E);
      const double mean = static_cast<double>(T * k) / static_cast<double>(E);
      double mx = 0.0;
      int64_t active = 0;
      for (int64_t e = 0; e < E; ++e) {
        mx = std::max(mx, c[e]);
        active += c[e] > 0.0;
      }
      rs.max_mean_load = mean > 0.0 ? mx / mean : 0.0;
      rs.frac_active = static_cast<double>(active) / static_cast<double>(E);
      rs.entropy = (static_cast<double>(st[base + 2 * E]) - st[base + 2 * E + 1]) / static_cast<double>(T);
      rs.aux = aux_l;
      rs.z = z_l / static_cast<double>(T);
      res.router.push_back(std::move(rs));
    }
    res.aux = opts_.aux_type == AuxLossType::kGlobal ? aux_value(c_tot.data(), p_tot.data(), E, num_sparse_ * T)
                                                     : aux_sum / static_cast<double>(num_sparse_);
    res.z = z_sum / static_cast<double>(num_sparse_ * T);
  }
  res.loss = res.ce + static_cast<double>(aux_coef_) * res.aux + static_cast<double>(opts_.zloss_coef) * res.z;
  res.num_labelled = pending_->batch.num_labelled();
  pending_.reset();
}

ForwardResult Qwen3Model::forward(Context& ctx, const Batch& batch, Pass pass, bool return_logits) {
  ForwardResult res = run_forward_(ctx, batch, pass, return_logits, nullptr);
  finish_(res);
  return res;
}

void Qwen3Model::backward(Context& ctx, ModelParams& grads) {
  const ModelConfig& cfg = params_.config;
  MT_CHECK(has_saved_, "[model] backward() needs a preceding forward(kTrain)");
  MT_CHECK(grads.layers.size() == params_.layers.size(), "[model] gradient set has {} layers, model {}",
           grads.layers.size(), params_.layers.size());
  MT_CHECK(grads.embed.dtype() == DType::kF32, "[model] gradients must be f32, got {}", grads.embed.desc());
  const int64_t T = batch_.num_tokens(), H = cfg.hidden_size;
  const DType dt = params_.embed.dtype();
  const Device dev = params_.embed.device();

  Tensor dh = dh_;
  dh_ = Tensor();
  if (!dh.defined()) {  // the head was not differentiated in forward: recompute it chunk by chunk
    LossHeadIO io;
    io.nll = work_empty({T}, DType::kF32, dev);
    io.lse = work_empty({T}, DType::kF32, dev);
    io.dx = work_empty({T, H}, dt, dev);
    io.dw = cfg.tie_word_embeddings ? grads.embed : grads.lm_head;
    io.dw_overwrite = overwrite_pass_ && !cfg.tie_word_embeddings;
    loss_head(ctx, final_out_, lm_head_weight(), batch_.labels, batch_.loss_weights, chunk_rows_(T), io);
    final_out_ = Tensor();
    dh = work_empty({T, H}, dt, dev);
    ops::rmsnorm_backward(ctx, final_in_, params_.final_norm, final_rstd_, io.dx, dh, grads.final_norm);
  }
  final_in_ = final_out_ = final_rstd_ = Tensor();

  LayerSettings set;
  set.z_loss = opts_.zloss_coef != 0.0f;
  const int64_t E = cfg.num_experts;
  sums_.grads.clear();
  if (sums_pass_) sums_.sum = Tensor::zeros({1}, DType::kF64, dev, MemCategory::kWorkspace);
  // In-backward updates: every listed weight must be an expert weight of this model.
  auto target_of = [&](const Tensor& w, std::vector<bool>& used) -> ops::AdamWTarget* {
    for (size_t i = 0; i < updates_pass_.size(); ++i)
      if (updates_pass_[i].first.data_ptr() == w.data_ptr() && updates_pass_[i].first.numel() == w.numel()) {
        used[i] = true;
        return &updates_pass_[i].second;
      }
    return nullptr;
  };
  std::vector<bool> used(updates_pass_.size(), false);
  std::vector<ExpertUpdates> layer_updates(params_.layers.size());
  for (size_t l = 0; l < params_.layers.size(); ++l) {
    if (!params_.layers[l].sparse || updates_pass_.empty()) continue;
    layer_updates[l].down = target_of(params_.layers[l].experts_down, used);
    layer_updates[l].gate_up = target_of(params_.layers[l].experts_gate_up, used);
    layer_updates[l].any = true;
    layer_updates[l].grad_dtype = grads.layers[l].router.dtype();  // the matrices' gradient dtype
  }
  for (size_t i = 0; i < used.size(); ++i)
    MT_CHECK(used[i], "[model] in-backward update {} of {} ({}) is not an expert weight of this model",
             i, used.size(), updates_pass_[i].first.desc());
  for (int64_t l = cfg.num_hidden_layers - 1; l >= 0; --l) {
    const LayerParams& w = params_.layers[l];
    const ExpertUpdates& upd = layer_updates[static_cast<size_t>(l)];
    Tensor* sums = sums_pass_ && w.sparse ? &sums_.sum : nullptr;
    if (sums) {  // with in-backward updates, only the updated matrices' sums (ExpertUpdates::any)
      // (an updated matrix without a gradient buffer: its sum is in sums_.sum, no buffer to name)
      const LayerParams& g = grads.layers[l];
      if ((!upd.any || upd.down) && g.experts_down.defined()) sums_.grads.push_back(g.experts_down);
      if ((!upd.any || upd.gate_up) && g.experts_gate_up.defined()) sums_.grads.push_back(g.experts_gate_up);
    }
    RouterLossGrad rg;
    if (w.sparse) {
      if (opts_.aux_type == AuxLossType::kGlobal) {
        rg.aux_counts = aux_counts_total_;
        rg.aux_rows = num_sparse_ * T;
        rg.aux_coef = aux_coef_;
      } else {
        const int64_t base = 1 + sparse_slot_[l] * stats_stride(E);
        rg.aux_counts = stats_.slice(0, base, base + E);
        rg.aux_rows = T;
        rg.aux_coef = aux_coef_ / static_cast<float>(num_sparse_);
      }
      rg.z_scale = opts_.zloss_coef / static_cast<float>(num_sparse_ * T);
    }
    switch (opts_.recompute) {
      case Recompute::kNone:
        decoder_layer_backward(ctx, cfg, w, grads.layers[l], batch_, acts_[l], rg, dh, overwrite_pass_, sums, upd);
        break;
      case Recompute::kSelective: {
        LayerActs s = acts_[l];
        acts_[l].clear();
        restore_recomputed(ctx, cfg, w, batch_, s);
        decoder_layer_backward(ctx, cfg, w, grads.layers[l], batch_, s, rg, dh, overwrite_pass_, sums, upd);
        break;
      }
      case Recompute::kFull: {
        LayerActs s;
        decoder_layer_forward(ctx, cfg, w, batch_, acts_[l].x, set, s);
        acts_[l].clear();
        decoder_layer_backward(ctx, cfg, w, grads.layers[l], batch_, s, rg, dh, overwrite_pass_, sums, upd);
        break;
      }
    }
    acts_[l].clear();
  }
  ops::embedding_backward(ctx, batch_.tokens, dh, grads.embed);
  overwrite_pass_ = false;
  sums_valid_ = std::exchange(sums_pass_, false);
  for (auto& [w, t] : updates_pass_) updated_.push_back(w);
  updates_pass_.clear();
  release();
}

ForwardResult Qwen3Model::forward_backward(Context& ctx, const Batch& batch, ModelParams& grads,
                                           bool return_logits) {
  ForwardResult r = run_forward_(ctx, batch, Pass::kTrain, return_logits, &grads);
  backward(ctx, grads);
  finish_(r);
  return r;
}

Tensor Qwen3Model::token_logprobs(Context& ctx, const Batch& batch) {
  ForwardResult r = run_forward_(ctx, batch, Pass::kEval, /*return_logits=*/false, nullptr);
  pending_.reset();
  ops::scale_(ctx, r.nll, -1.0f);  // log p = -nll; 0 stays 0 where ignored
  return r.nll;
}

ModelParams allocate_gradients(const ModelConfig& cfg, Device device, DType matrix_dtype, bool expert_matrices) {
  MT_CHECK(matrix_dtype == DType::kF32 || matrix_dtype == DType::kBF16,
           "[model] gradient dtype {} is not supported (f32 or bf16)", dtype_name(matrix_dtype));
  ModelParams g =
      ModelParams::allocate(cfg, DType::kF32, matrix_dtype, device, MemCategory::kGradients, expert_matrices);
  zero_gradients(g);
  return g;
}

void zero_gradients(ModelParams& grads, bool matrices) {
  if (matrices) {
    grads.for_each([](const std::string&, Tensor& t) {
      if (t.defined()) t.zero_();
    });
    return;
  }
  // Written (not added) by a pass after set_overwrite_matrix_grads(): the layers' projections,
  // router, expert and dense MLP matrices and an untied lm_head.
  grads.embed.zero_();
  grads.final_norm.zero_();
  for (LayerParams& l : grads.layers) {
    l.input_norm.zero_();
    l.post_norm.zero_();
    if (l.q_norm.defined()) l.q_norm.zero_();
    if (l.k_norm.defined()) l.k_norm.zero_();
  }
}

void for_each_hf_named(const ModelParams& p, const std::function<void(const std::string&, const Tensor&)>& fn) {
  // The internal names are the HF names except for the fused dense MLP, which HF keeps as two
  // tensors: split it back into gate_proj (first I rows) and up_proj.
  static const std::string kFusedDense = "mlp.gate_up_proj.weight";
  p.for_each([&](const std::string& name, const Tensor& t) {
    if (name.size() > kFusedDense.size() && name.compare(name.size() - kFusedDense.size(), std::string::npos, kFusedDense) == 0) {
      const std::string pre = name.substr(0, name.size() - kFusedDense.size());
      const int64_t I = t.size(0) / 2;
      fn(pre + "mlp.gate_proj.weight", t.slice(0, 0, I));
      fn(pre + "mlp.up_proj.weight", t.slice(0, I, 2 * I));
    } else {
      fn(name, t);
    }
  });
}

}  // namespace moetrain
