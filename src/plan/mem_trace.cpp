// Allocation replay of one micro-batch (see mem_trace.h). Each function below mirrors one function
// of model/decoder_layer.cpp or model/qwen3_model.cpp: an act_empty() there is an alloc of
// kActivations here, a work_empty() one of kWorkspace, and a tensor going out of scope (or being
// reset) is a free at the same point. Expert parallelism (ep > 1) is not in the model code yet:
// its dispatch buffers follow the design in ARCHITECTURE.md and are marked as such.
#include "plan/mem_trace.h"

#include <algorithm>

namespace moetrain {

const char* trace_group_name(TraceGroup g) {
  switch (g) {
    case TraceGroup::kSaved: return "saved activations";
    case TraceGroup::kRecomputed: return "recomputed layer";
    case TraceGroup::kHead: return "final norm + logits";
    case TraceGroup::kHeadGrad: return "logits gradient";
    case TraceGroup::kLayerTemp: return "layer temporaries";
    case TraceGroup::kBatch: return "batch tensors";
    case TraceGroup::kRouterStats: return "router statistics";
    case TraceGroup::kDispatch: return "expert-parallel routed rows";
    case TraceGroup::kCount: break;
  }
  return "?";
}

namespace {

constexpr MemCategory kAct = MemCategory::kActivations;
constexpr MemCategory kWork = MemCategory::kWorkspace;

struct Alloc {
  MemCategory cat;
  double bytes;
  TraceGroup group;
  const char* name;
};

struct Event {
  int id;
  bool alloc;
  int phase;
};

class Trace {
 public:
  int alloc(TraceGroup g, MemCategory c, double bytes, const char* name) {
    allocs_.push_back({c, bytes, g, name});
    const int id = static_cast<int>(allocs_.size()) - 1;
    events_.push_back({id, true, phase_});
    return id;
  }
  void free(int id) {
    if (id >= 0) events_.push_back({id, false, phase_});
  }
  void phase(const std::string& p) {
    phases_.push_back(p);
    phase_ = static_cast<int>(phases_.size()) - 1;
  }
  const std::vector<Alloc>& allocs() const { return allocs_; }

  TraceResult analyze() const {
    TraceResult r;
    std::array<double, kNumMemCategories> cur{};
    double total = 0;
    size_t peak_at = 0;
    bool any = false;
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      const Alloc& a = allocs_[e.id];
      const size_t c = static_cast<size_t>(a.cat);
      const double d = e.alloc ? a.bytes : -a.bytes;
      cur[c] += d;
      total += d;
      r.category_peak[c] = std::max(r.category_peak[c], cur[c]);
      if (e.alloc && (!any || total > r.total_peak)) {
        r.total_peak = total, peak_at = i, any = true;
        r.at_peak = cur;
      }
    }
    // Second pass up to the peak: what is live there, by group.
    std::vector<bool> live(allocs_.size(), false);
    for (size_t i = 0; any && i <= peak_at; ++i) live[events_[i].id] = events_[i].alloc;
    for (size_t id = 0; id < allocs_.size(); ++id)
      if (live[id]) r.groups_at_peak[static_cast<size_t>(allocs_[id].group)] += allocs_[id].bytes;
    if (any) r.peak_phase = phases_[static_cast<size_t>(events_[peak_at].phase)];
    r.events = events_.size();
    return r;
  }

 private:
  std::vector<Alloc> allocs_;
  std::vector<Event> events_;
  std::vector<std::string> phases_;
  int phase_ = -1;
};

// Sizes of one layer's tensors on this GPU.
struct Dims {
  double T, R, Tk, H, qw, kvw, nh, nkv, E, k, I_moe, I_dense, V;
  double dt;
};

Dims dims_of(const ModelConfig& c, const TraceShape& s) {
  Dims d{};
  const double w = static_cast<double>(s.width_div);
  d.T = static_cast<double>(s.tokens);
  d.k = static_cast<double>(c.num_experts_per_tok);
  d.Tk = d.T * d.k;
  d.R = c.is_moe() ? static_cast<double>(s.expert_rows) : 0.0;
  d.H = static_cast<double>(c.hidden_size);
  d.nh = static_cast<double>(c.num_attention_heads) / w;
  d.nkv = std::max(1.0, static_cast<double>(c.num_key_value_heads) / w);
  d.qw = d.nh * static_cast<double>(c.head_dim);
  d.kvw = d.nkv * static_cast<double>(c.head_dim);
  d.E = static_cast<double>(c.num_experts);
  d.I_moe = static_cast<double>(c.moe_intermediate_size);
  d.I_dense = static_cast<double>(c.intermediate_size) / w;
  d.V = static_cast<double>(s.vocab_local);
  d.dt = static_cast<double>(s.dtype_bytes);
  return d;
}

struct LayerIds {
  int x = -1;               // the layer input (owned here once the layer is saved)
  std::vector<int> saved;   // everything else LayerActs holds
  std::vector<int> cheap;   // the subset selective recompute drops (outputs of elementwise ops)
};

// decoder_layer_forward (attention_forward_part + dense/moe ffn forward); returns `out`.
int layer_forward(Trace& t, const Dims& d, const TraceShape& s, bool sparse, int x, TraceGroup g, LayerIds& ids) {
  ids.x = x;
  auto A = [&](double bytes, const char* name, bool cheap = false) {
    const int id = t.alloc(g, kAct, bytes, name);
    ids.saved.push_back(id);
    if (cheap) ids.cheap.push_back(id);
    return id;
  };
  const double T = d.T, dt = d.dt;
  A(T * d.H * dt, "a (input RMSNorm out) [T,H]", true);
  A(T * 4, "rstd_in [T] f32");
  A(T * d.qw * dt, "q_raw [T,nh*d]");
  A(T * d.kvw * dt, "k_raw [T,nkv*d]");
  A(T * d.kvw * dt, "v [T,nkv*d]");
  const int qn = t.alloc(TraceGroup::kLayerTemp, kWork, T * d.qw * dt, "qn");
  const int kn = t.alloc(TraceGroup::kLayerTemp, kWork, T * d.kvw * dt, "kn");
  A(T * d.nh * 4, "q_rstd [T*nh] f32");
  A(T * d.nkv * 4, "k_rstd [T*nkv] f32");
  A(T * d.qw * dt, "q (normed, RoPE) [T,nh*d]", true);
  A(T * d.kvw * dt, "k (normed, RoPE) [T,nkv*d]", true);
  A(T * d.qw * dt, "attn (attention out) [T,nh*d]");
  A(T * d.nh * 4, "lse [nh,T] f32");
  A(T * d.H * dt, "h (after attention residual) [T,H]");
  t.free(qn);
  t.free(kn);
  A(T * d.H * dt, "b (post-attention RMSNorm out) [T,H]", true);
  A(T * 4, "rstd_post [T] f32");
  int y = -1;
  std::vector<int> transient;
  if (!sparse) {
    A(T * 2 * d.I_dense * dt, "gu (dense gate|up) [T,2I]");
    A(T * d.I_dense * dt, "act (dense SwiGLU) [T,I]", true);
    y = t.alloc(TraceGroup::kLayerTemp, kWork, T * d.H * dt, "y");
  } else {
    // linear() output in the activation dtype, then its f32 copy (the same tensor when f32).
    if (dt == 4) {
      A(T * d.E * 4, "router_logits [T,E] f32");
    } else {
      const int rl = t.alloc(TraceGroup::kLayerTemp, kAct, T * d.E * dt, "router logits (bf16)");
      A(T * d.E * 4, "router_logits [T,E] f32");
      t.free(rl);
    }
    A(T * d.E * 4, "probs [T,E] f32");
    A(T * d.k * 4, "topk_idx [T,k] i32");
    A(T * d.k * 4, "topk_w [T,k] f32");
    if (s.z_loss) A(T * 4, "z_lse [T] f32");
    A(d.E * 4, "counts [E] i32");
    A((d.E + 1) * 4, "offsets [E+1] i32");
    A(d.Tk * 4, "row_of [T*k] i32");
    A(d.Tk * 4, "token_of [T*k] i32");
    if (s.ep == 1) {
      A(d.Tk * d.H * dt, "xp (permuted expert inputs) [T*k,H]", true);
      A(d.Tk * 2 * d.I_moe * dt, "gu (expert gate|up) [T*k,2I]");
      A(d.Tk * d.I_moe * dt, "act (expert SwiGLU) [T*k,I]", true);
      A(d.Tk * d.H * dt, "yp (expert outputs) [T*k,H]");
    } else {
      // EP (planning): permuted rows go out by all-to-all; this rank's experts get R rows.
      const int send = t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dispatch send [T*k,H]");
      ids.saved.push_back(t.alloc(TraceGroup::kDispatch, kAct, d.R * d.H * dt, "xp received [R,H]"));
      t.free(send);
      A(d.R * 2 * d.I_moe * dt, "gu (expert gate|up) [R,2I]");
      A(d.R * d.I_moe * dt, "act (expert SwiGLU) [R,I]", true);
      const int yp = t.alloc(TraceGroup::kDispatch, kWork, d.R * d.H * dt, "expert outputs [R,H]");
      ids.saved.push_back(t.alloc(TraceGroup::kDispatch, kAct, d.Tk * d.H * dt, "yp combined back [T*k,H]"));
      t.free(yp);
    }
    y = t.alloc(TraceGroup::kLayerTemp, kWork, T * d.H * dt, "y");
  }
  const int out = t.alloc(g == TraceGroup::kRecomputed ? TraceGroup::kLayerTemp : TraceGroup::kSaved, kAct,
                          T * d.H * dt, "out (next layer's x) [T,H]");
  t.free(y);
  return out;
}

// decoder_layer_backward; `ids` are the layer's saved tensors (freed by the caller).
void layer_backward(Trace& t, const Dims& d, const TraceShape& s, bool sparse) {
  const double T = d.T, dt = d.dt;
  auto W = [&](double bytes, const char* name) { return t.alloc(TraceGroup::kLayerTemp, kWork, bytes, name); };
  const int db = W(T * d.H * dt, "db");
  if (sparse) {
    std::vector<int> at_end;
    const double R = s.ep == 1 ? d.Tk : d.R;
    int dyp_send = -1;
    if (s.ep > 1) dyp_send = t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dyp send [T*k,H]");
    const int dyp = W(R * d.H * dt, "dyp");
    at_end.push_back(W(T * d.k * 4, "dtopk_w"));
    t.free(dyp_send);
    const int dact = W(R * d.I_moe * dt, "dact");
    t.free(dyp);
    const int dgu = W(R * 2 * d.I_moe * dt, "dgu");
    t.free(dact);
    const int dxp = W(R * d.H * dt, "dxp");
    t.free(dgu);
    at_end.push_back(dxp);
    if (s.ep > 1) at_end.push_back(t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dxp back [T*k,H]"));
    if (s.aux_grad) at_end.push_back(W(T * d.E * 4, "dprobs"));
    at_end.push_back(W(T * d.E * 4, "dlogits (router)"));
    if (dt != 4) at_end.push_back(W(T * d.E * dt, "dlogits (router, bf16)"));
    for (int id : at_end) t.free(id);
  } else {
    const int dact = W(T * d.I_dense * dt, "dact");
    const int dgu = W(T * 2 * d.I_dense * dt, "dgu");
    t.free(dact);
    t.free(dgu);
  }
  const int dh_part = W(T * d.H * dt, "dh_part");
  t.free(db);
  t.free(dh_part);
  // attention_backward_part
  const int dattn = W(T * d.qw * dt, "dattn");
  const int dq = W(T * d.qw * dt, "dq"), dk = W(T * d.kvw * dt, "dk"), dv = W(T * d.kvw * dt, "dv");
  t.free(dattn);
  const int dqn = W(T * d.qw * dt, "dqn"), dkn = W(T * d.kvw * dt, "dkn");
  t.free(dqn);
  t.free(dkn);
  const int da = W(T * d.H * dt, "da");
  const int dx = W(T * d.H * dt, "dx");
  for (int id : {da, dx, dq, dk, dv}) t.free(id);
}

struct ForwardState {
  std::vector<LayerIds> layers;
  std::vector<int> router_keep, router_drop;
  std::vector<int> batch;
  int hl = -1, fn = -1, rstd = -1, logits = -1, lse = -1;
};

// Qwen3Model::forward (kTrain) of one micro-batch on this stage.
ForwardState forward(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s) {
  ForwardState f;
  const double T = d.T, dt = d.dt;
  if (s.batch_on_device) {  // Batch::to(device): tokens, positions, cu_seqlens, labels, weights
    for (const char* n : {"tokens", "positions"}) f.batch.push_back(t.alloc(TraceGroup::kBatch, kAct, T * 4, n));
    f.batch.push_back(t.alloc(TraceGroup::kBatch, kAct, (static_cast<double>(s.num_docs) + 1) * 4, "cu_seqlens"));
    for (const char* n : {"labels", "loss_weights"}) f.batch.push_back(t.alloc(TraceGroup::kBatch, kAct, T * 4, n));
  }
  int h = t.alloc(TraceGroup::kSaved, kAct, T * d.H * dt, "embedding output [T,H]");
  int64_t num_sparse = 0;
  for (int64_t l = s.first_layer; l < s.first_layer + s.num_layers; ++l) num_sparse += c.is_sparse_layer(l);
  if (num_sparse > 0) {
    f.router_keep.push_back(t.alloc(TraceGroup::kRouterStats, kAct, d.E * 4, "counts_total"));
    f.router_drop.push_back(t.alloc(TraceGroup::kRouterStats, kAct, d.E * 4, "prob_sum_total"));
  }
  for (int64_t l = s.first_layer; l < s.first_layer + s.num_layers; ++l) {
    const bool sparse = c.is_sparse_layer(l);
    t.phase(sparse ? "forward (MoE layer)" : "forward (dense layer)");
    LayerIds ids;
    const int out = layer_forward(t, d, s, sparse, h, TraceGroup::kSaved, ids);
    if (sparse) {
      f.router_keep.push_back(t.alloc(TraceGroup::kRouterStats, kAct, d.E * 4, "counts[l]"));
      f.router_drop.push_back(t.alloc(TraceGroup::kRouterStats, kAct, d.E * 4, "prob_sum[l]"));
    }
    if (s.recompute == Recompute::kFull) {  // scratch dies at the end of the iteration; x stays
      for (int id : ids.saved) t.free(id);
      ids.saved.clear();
    } else if (s.recompute == Recompute::kSelective) {  // planning: elementwise outputs are not kept
      for (int id : ids.cheap) {
        t.free(id);
        ids.saved.erase(std::find(ids.saved.begin(), ids.saved.end(), id));
      }
    }
    f.layers.push_back(std::move(ids));
    h = out;
  }
  f.hl = h;
  if (!s.head) return f;
  t.phase("loss head forward");
  const double rows = s.ce_chunk > 0 ? std::min<double>(static_cast<double>(s.ce_chunk), T) : T;
  f.fn = t.alloc(TraceGroup::kHead, kAct, T * d.H * dt, "final norm out [T,H]");
  f.rstd = t.alloc(TraceGroup::kHead, kAct, T * 4, "final rstd [T]");
  f.logits = t.alloc(TraceGroup::kHead, kAct, rows * d.V * dt, "logits [T,V]");
  const int losses = t.alloc(TraceGroup::kHead, kWork, T * 4, "losses [T]");
  f.lse = t.alloc(TraceGroup::kHead, kAct, T * 4, "ce lse [T]");
  if (s.ce_chunk > 0 && rows < T) {  // chunked head: the gradient is formed chunk by chunk in forward
    const int g = t.alloc(TraceGroup::kHeadGrad, kWork, rows * d.V * dt, "dlogits chunk");
    t.free(g);
    t.free(f.logits);
    f.logits = -1;
  }
  t.free(losses);
  for (int id : f.router_drop) t.free(id);  // RouterTotals go out of scope; counts stay for backward
  f.router_drop.clear();
  return f;
}

// Qwen3Model::backward of the micro-batch `f`.
void backward(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s, ForwardState& f) {
  const double T = d.T, dt = d.dt;
  int dh = -1;
  if (s.head) {
    t.phase("loss head backward");
    dh = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "dh [T,H]");
    const double rows = s.ce_chunk > 0 ? std::min<double>(static_cast<double>(s.ce_chunk), T) : T;
    int dlogits = -1;
    if (f.logits >= 0) {
      dlogits = t.alloc(TraceGroup::kHeadGrad, kWork, rows * d.V * dt, "dlogits [T,V]");
      t.free(f.logits);
    }
    const int dfn = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "dfn [T,H]");
    for (int id : {f.hl, f.fn, f.rstd}) t.free(id);
    t.free(dfn);
    t.free(dlogits);
  } else {
    // A pipeline stage without the head receives d(output) and frees its output.
    dh = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "received dh [T,H]");
    t.free(f.hl);
  }
  for (int64_t i = s.num_layers - 1; i >= 0; --i) {
    const int64_t l = s.first_layer + i;
    const bool sparse = c.is_sparse_layer(l);
    LayerIds& ids = f.layers[static_cast<size_t>(i)];
    if (s.recompute == Recompute::kSelective) {
      t.phase(sparse ? "backward (MoE layer, selective)" : "backward (dense layer, selective)");
      std::vector<int> re;
      for (int id : ids.cheap) re.push_back(t.alloc(TraceGroup::kRecomputed, kAct, t.allocs()[id].bytes, "recomputed"));
      layer_backward(t, d, s, sparse);
      for (int id : re) t.free(id);
    } else if (s.recompute == Recompute::kFull) {
      t.phase(sparse ? "backward (MoE layer, recomputed)" : "backward (dense layer, recomputed)");
      LayerIds re;
      const int out = layer_forward(t, d, s, sparse, ids.x, TraceGroup::kRecomputed, re);
      t.free(out);  // the recomputed output is discarded at once
      layer_backward(t, d, s, sparse);
      for (int id : re.saved) t.free(id);
    } else {
      t.phase(sparse ? "backward (MoE layer)" : "backward (dense layer)");
      layer_backward(t, d, s, sparse);
    }
    for (int id : ids.saved) t.free(id);  // acts_[l].clear()
    t.free(ids.x);
  }
  t.phase("end of backward");
  for (int id : f.router_keep) t.free(id);  // release()
  t.free(f.lse);
  t.free(dh);
  for (int id : f.batch) t.free(id);
}

}  // namespace

TraceResult trace_micro_batch(const ModelConfig& cfg, const TraceShape& s) {
  Trace t;
  const Dims d = dims_of(cfg, s);
  // Selective recompute (planning-only; the model rejects it today) keeps the matmul and
  // attention outputs and recomputes norms, RoPE, SwiGLU and the permutation in backward.
  std::vector<ForwardState> fs;
  const int64_t n = std::max<int64_t>(1, s.in_flight);
  for (int64_t m = 0; m < n; ++m) {
    t.phase("forward");
    fs.push_back(forward(t, cfg, d, s));
  }
  for (auto& f : fs) backward(t, cfg, d, s, f);
  return t.analyze();
}

std::vector<std::pair<std::string, double>> saved_tensors_per_token(const ModelConfig& cfg, bool sparse,
                                                                    int dtype_bytes, bool z_loss) {
  // Bytes of each saved tensor at T = 2 minus at T = 1: per-token cost, constants cancel.
  auto run = [&](int64_t T) {
    Trace t;
    TraceShape s;
    s.tokens = T;
    s.expert_rows = T * cfg.num_experts_per_tok;
    s.dtype_bytes = dtype_bytes;
    s.z_loss = z_loss;
    s.vocab_local = cfg.vocab_size;
    LayerIds ids;
    t.phase("layer");
    const int out = layer_forward(t, dims_of(cfg, s), s, sparse, -1, TraceGroup::kSaved, ids);
    std::vector<std::pair<std::string, double>> v;
    v.emplace_back("x (layer input) [T,H]", static_cast<double>(T * cfg.hidden_size * dtype_bytes));
    for (int id : ids.saved) v.emplace_back(t.allocs()[id].name, t.allocs()[id].bytes);
    (void)out;
    return v;
  };
  auto one = run(1), two = run(2);
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < one.size(); ++i) {
    const double per = two[i].second - one[i].second;
    if (per > 0) out.emplace_back(one[i].first, per);
  }
  return out;
}

}  // namespace moetrain
