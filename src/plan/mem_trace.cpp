// Allocation replay of one micro-batch (see mem_trace.h). Each function below mirrors one function
// of model/decoder_layer.cpp, qwen3_model.cpp or loss_head.cpp: an act_empty() there is an alloc
// of kActivations here, a work_empty() one of kWorkspace, and a tensor going out of scope (or being
// reset) is a free at the same point; CUDA ops' device_scratch() is a kWorkspace alloc+free. Expert
// parallelism (ep > 1) is not in the model code yet: its dispatch buffers follow ARCHITECTURE.md.
#include "plan/mem_trace.h"

#include <algorithm>
#include <cmath>
#include <functional>

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
  int x = -1;               // the layer input (owned by the previous layer / the embedding)
  std::vector<int> saved;   // everything else LayerActs holds
  std::vector<int> dropped; // the [S] fields selective recompute drops (drop_recomputable)
};

int64_t chunks_of(double rows) { return static_cast<int64_t>(std::min(rows, 256.0)); }  // kMaxChunks

// CUDA rmsnorm_backward: f32 partial dw sums [chunks, D]. The bf16 vector kernel (D a power of two
// from 128 to 2048) takes rows per block = max(16, ceil(R / 512) rounded up to 8); the scalar one
// chunks of 32 rows, at most 4M / D of them (cuda/rmsnorm.cu).
// Blocks (so dw partial rows) of cuda/rmsnorm.cu's vectorised backward over R rows.
int64_t rmsnorm_vec_chunks(int64_t R) {
  const int64_t per = std::max<int64_t>(16, ((R + 511) / 512 + 7) / 8 * 8);
  return (R + per - 1) / per;
}

void rmsnorm_bwd_scratch(Trace& t, const TraceShape& s, double rows, double D, double dt, bool accumulate = false) {
  if (!s.on_cuda) return;
  const auto R = static_cast<int64_t>(rows), d = static_cast<int64_t>(D);
  const bool vec = dt == 2 && (d == 128 || d == 256 || d == 512 || d == 1024 || d == 2048);
  int64_t chunks;
  if (vec) {
    chunks = rmsnorm_vec_chunks(R);
  } else {
    chunks = std::min<int64_t>({(R + 31) / 32, std::max<int64_t>((int64_t{4} << 20) / std::max<int64_t>(d, 1), 1),
                                int64_t{65535}});
    const int64_t per = (R + chunks - 1) / std::max<int64_t>(chunks, 1);
    chunks = (R + per - 1) / std::max<int64_t>(per, 1);
  }
  // The scalar kernels add into dx through a temporary [R, D] (f32 compute dtype).
  const int part = !vec && accumulate ? t.alloc(TraceGroup::kLayerTemp, kWork, rows * D * dt, "rmsnorm dx part") : -1;
  t.free(t.alloc(TraceGroup::kLayerTemp, kWork, static_cast<double>(chunks) * D * 4, "rmsnorm dw partials"));
  if (part >= 0) t.free(part);
}

// CUDA attention_backward scratch: flash path (bf16, d 64/128) dsum [nh,T] + dK/dV partials of
// `splits` CTAs per KV head; the reference path dsum only.
void attention_bwd_scratch(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s) {
  if (!s.on_cuda) return;
  const int64_t hd = c.head_dim, nh = static_cast<int64_t>(d.nh), nkv = static_cast<int64_t>(d.nkv);
  const int64_t T = static_cast<int64_t>(d.T);
  double bytes = static_cast<double>(nh * T) * 4;
  if (s.dtype_bytes == 2 && (hd == 64 || hd == 128)) {
    // flash::backward_workspace (kernels/cuda/attention_flash_launch.cuh), each part 256-byte
    // aligned: D [nh,T] f32 and the dK/dV partials [splits,T,nkv,d] f32 twice; on Hopper also dq_acc
    // [nh,T,d] f32 and i32 counters, and never less than the sm80 layout.
    auto align = [](double b) { return std::ceil(b / 256) * 256; };
    const int64_t group = std::max<int64_t>(1, nh / std::max<int64_t>(1, nkv));
    auto layout = [&](bool sm90) {
      const int64_t keys = sm90 ? 128 : 64, kv_tiles = (T + keys - 1) / keys;
      const int64_t want = (sm90 ? 2 : 4) * std::max(1, s.sm_count);
      int64_t splits = 1;
      if (sm90) {  // the largest divisor of the group that is at most half of it
        splits = std::max<int64_t>(1, group / 2);
        while (group % splits) --splits;
      }
      while (splits < group && kv_tiles * nkv * splits < want) {
        int64_t nx = splits + 1;
        while (group % nx) ++nx;
        splits = nx;
      }
      const double part = align(static_cast<double>(splits * T * nkv * hd) * 4);
      double b = align(static_cast<double>(nh * T) * 4) + 2 * part;
      if (sm90) {
        const int64_t q_tiles = (T + 63) / 64;
        b += align(static_cast<double>(nh * T * hd) * 4) + align(static_cast<double>(nh * q_tiles + 1 + q_tiles) * 4);
      }
      return b;
    };
    bytes = s.hopper ? std::max(layout(true), layout(false)) : layout(false);
  }
  t.free(t.alloc(TraceGroup::kLayerTemp, kWork, bytes, "attention backward scratch"));
}

// logsumexp_rows: a zero label vector and discarded losses, both [T] workspace.
void logsumexp_temps(Trace& t, double T) {
  const int l0 = t.alloc(TraceGroup::kLayerTemp, kWork, T * 4, "label0 [T] i32");
  const int un = t.alloc(TraceGroup::kLayerTemp, kWork, T * 4, "unused losses [T] f32");
  t.free(l0);
  t.free(un);
}

// ops::norm_rope_forward/backward run one fused kernel without scratch on CUDA for bf16, head dim 128
// and a block's rows spanning at most 72 tokens (cuda/rmsnorm.cu); otherwise the norm and the rotation
// in sequence through a temporary of the tensor's size.
bool norm_rope_fused(const TraceShape& s, const Dims& d, double heads) {
  if (!s.on_cuda || d.dt != 2 || d.qw != 128 * d.nh) return false;
  const auto R = static_cast<int64_t>(d.T * heads), h = static_cast<int64_t>(heads);
  const int64_t per = std::max<int64_t>(16, ((R + 511) / 512 + 7) / 8 * 8);
  return (per + h - 1) / h + 1 <= 72;
}

// qk_norm_rope: q, k, then each one's normed temporary when not fused.
void qk_norm_rope(Trace& t, const Dims& d, const TraceShape& s, const std::function<int(double, const char*, bool)>& A) {
  const double T = d.T, dt = d.dt;
  A(T * d.qw * dt, "q (normed, RoPE) [T,nh*d]", true);
  A(T * d.kvw * dt, "k (normed, RoPE) [T,nkv*d]", true);
  if (!norm_rope_fused(s, d, d.nh)) t.free(t.alloc(TraceGroup::kLayerTemp, kWork, T * d.qw * dt, "qn"));
  if (!norm_rope_fused(s, d, d.nkv)) t.free(t.alloc(TraceGroup::kLayerTemp, kWork, T * d.kvw * dt, "kn"));
}

// decoder_layer_forward (attention_forward_part + dense/moe ffn forward); returns `out`.
int layer_forward(Trace& t, const Dims& d, const TraceShape& s, bool sparse, int x, TraceGroup g, LayerIds& ids) {
  ids.x = x;
  std::function<int(double, const char*, bool)> A = [&](double bytes, const char* name, bool dropped) {
    const int id = t.alloc(g, kAct, bytes, name);
    ids.saved.push_back(id);
    if (dropped) ids.dropped.push_back(id);
    return id;
  };
  const double T = d.T, dt = d.dt;
  A(T * d.H * dt, "a (input RMSNorm out) [T,H]", true);
  A(T * 4, "rstd_in [T] f32", false);
  A(T * d.H * dt, "h (x, then + attention out: the residual) [T,H]", false);
  if (s.on_cuda) {  // one GEMM over LayerParams::qkv_proj (decoder_layer.h, QkvFusion::kCuda)
    A(T * (d.qw + 2 * d.kvw) * dt, "q_raw | k_raw | v (the fused projection's output) [T,(nh+2nkv)*d]", false);
  } else {
    A(T * d.qw * dt, "q_raw [T,nh*d]", false);
    A(T * d.kvw * dt, "k_raw [T,nkv*d]", false);
    A(T * d.kvw * dt, "v [T,nkv*d]", false);
  }
  A(T * d.nh * 4, "q_rstd [T*nh] f32", false);
  A(T * d.nkv * 4, "k_rstd [T*nkv] f32", false);
  qk_norm_rope(t, d, s, A);
  A(T * d.qw * dt, "attn (attention out) [T,nh*d]", true);
  A(T * d.nh * 4, "lse [nh,T] f32", true);
  A(T * d.H * dt, "b (post-attention RMSNorm out) [T,H]", true);
  A(T * 4, "rstd_post [T] f32", false);
  const TraceGroup out_group = g == TraceGroup::kRecomputed ? TraceGroup::kLayerTemp : TraceGroup::kSaved;
  if (!sparse) {
    A(T * 2 * d.I_dense * dt, "gu (dense gate|up) [T,2I]", false);
    A(T * d.I_dense * dt, "act (dense SwiGLU) [T,I]", true);
    return t.alloc(out_group, kAct, T * d.H * dt, "out (down proj + h; next layer's x) [T,H]");
  }
  A(T * d.E * 4, "router_logits [T,E] f32", false);
  A(T * d.E * 4, "probs [T,E] f32", false);
  A(T * d.k * 4, "topk_idx [T,k] i32", false);
  A(T * d.k * 4, "topk_w [T,k] f32", false);
  if (s.z_loss) {
    A(T * 4, "z_lse [T] f32", false);
    logsumexp_temps(t, T);
  }
  A(d.E * 4, "counts [E] i32", false);
  A((d.E + 1) * 4, "offsets [E+1] i32", false);
  A(d.Tk * 4, "row_of [T*k] i32", false);
  A(d.Tk * 4, "token_of [T*k] i32", false);
  if (s.on_cuda) {  // moe_route_index: per-block counts [ceil(Tk / 1024)][E+1] i32 of the counting sort up to
                    // 256 experts and 2^20 picks, else CUB's 3 x Tk i32 (its sort storage, a few KiB, left out)
    const bool counting = d.E <= 256 && d.Tk <= 1048576.0;
    const double bytes = counting ? std::ceil(d.Tk / 1024) * (d.E + 1) * 4 : 3 * d.Tk * 4;
    t.free(t.alloc(TraceGroup::kLayerTemp, kWork, std::ceil(bytes / 256) * 256, "route index scratch"));
  }
  A(d.Tk * 4, "row_w (routing weight per permuted row) [T*k] f32", false);
  int combined = -1;  // the expert outputs the unpermute sums (not saved: the weights went in before)
  if (s.ep == 1) {
    A(d.Tk * d.H * dt, "xp (permuted expert inputs) [T*k,H]", true);
    A(d.Tk * 2 * d.I_moe * dt, "gu (expert gate|up) [T*k,2I]", false);
    A(d.Tk * d.I_moe * dt, "act (expert SwiGLU times routing weight) [T*k,I]", true);
    combined = t.alloc(TraceGroup::kLayerTemp, kWork, d.Tk * d.H * dt, "yp (expert outputs) [T*k,H]");
  } else {
    // EP (planning): permuted rows and their weights go out by all-to-all; this rank's experts get R rows.
    const int send = t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dispatch send [T*k,H]");
    const int xr = t.alloc(TraceGroup::kDispatch, kAct, d.R * d.H * dt, "xp received [R,H]");
    ids.saved.push_back(xr);
    ids.dropped.push_back(xr);
    t.free(send);
    A(d.R * 4, "row_w received [R] f32", false);
    A(d.R * 2 * d.I_moe * dt, "gu (expert gate|up) [R,2I]", false);
    A(d.R * d.I_moe * dt, "act (expert SwiGLU times routing weight) [R,I]", true);
    const int yp = t.alloc(TraceGroup::kDispatch, kWork, d.R * d.H * dt, "expert outputs [R,H]");
    combined = t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "yp combined back [T*k,H]");
    t.free(yp);
  }
  const int out = t.alloc(out_group, kAct, T * d.H * dt, "out (unpermuted experts + h; next layer's x) [T,H]");
  t.free(combined);
  return out;
}

// restore_recomputed (selective recompute): the [S] fields again, as activations.
std::vector<int> layer_restore(Trace& t, const Dims& d, const TraceShape& s, bool sparse) {
  const double T = d.T, dt = d.dt;
  std::vector<int> re;
  std::function<int(double, const char*, bool)> A = [&](double bytes, const char* name, bool) {
    const int id = t.alloc(TraceGroup::kRecomputed, kAct, bytes, name);
    re.push_back(id);
    return id;
  };
  auto W = [&](double bytes, const char* name) { return t.alloc(TraceGroup::kLayerTemp, kWork, bytes, name); };
  const int rstd = W(T * 4, "rstd (recomputed) [T]");
  A(T * d.H * dt, "a", true);
  const int qr = W(T * d.nh * 4, "q_rstd (recomputed)"), kr = W(T * d.nkv * 4, "k_rstd (recomputed)");
  qk_norm_rope(t, d, s, A);
  A(T * d.qw * dt, "attn", true);
  A(T * d.nh * 4, "lse", true);
  A(T * d.H * dt, "b", true);
  const double rows = sparse ? (s.ep == 1 ? d.Tk : d.R) : T;
  if (sparse) A(rows * d.H * dt, "xp", true);
  A(rows * (sparse ? d.I_moe : d.I_dense) * dt, "act", true);
  for (int id : {rstd, qr, kr}) t.free(id);
  return re;
}

// decoder_layer_backward; the layer's saved tensors are freed by the caller.
void layer_backward(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s, bool sparse) {
  const double T = d.T, dt = d.dt;
  auto W = [&](double bytes, const char* name) { return t.alloc(TraceGroup::kLayerTemp, kWork, bytes, name); };
  const int db = W(T * d.H * dt, "db");
  if (sparse) {
    std::vector<int> at_end;
    const double R = s.ep == 1 ? d.Tk : d.R;
    int dyp_send = -1;
    if (s.ep > 1) dyp_send = t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dyp send [T*k,H]");
    const int dyp = W(R * d.H * dt, "dyp (each row its token's dy)");
    t.free(dyp_send);
    const int dact = W(R * d.I_moe * dt, "dact");
    // The expert weights' gradient workspace of the in-backward update (down, then gate_up).
    const double expert_mats = d.E / static_cast<double>(s.ep) * d.H * d.I_moe * s.expert_grad_scratch_bytes;
    // Each expert dW: its gradient workspace (if any) and, with the fused norm, its per-tile sums.
    auto expert_dw = [&](double grad_bytes, double partial_bytes, const char* grad_name, const char* partial_name) {
      const int g = grad_bytes > 0 ? W(grad_bytes, grad_name) : -1;
      if (s.grad_sums && partial_bytes > 0) t.free(W(partial_bytes, partial_name));
      t.free(g);
    };
    expert_dw(expert_mats, s.expert_dw_partials_down, "expert down gradient (in-backward update workspace)",
              "expert down dW sum-of-squares partials");
    t.free(dyp);
    const int dgu = W(R * 2 * d.I_moe * dt, "dgu");
    const int drow_w = W(R * 4, "drow_w [R] f32");
    t.free(dact);
    at_end.push_back(W(T * d.k * 4, "dtopk_w"));
    t.free(drow_w);
    const int dxp = W(R * d.H * dt, "dxp");
    expert_dw(2 * expert_mats, s.expert_dw_partials_gate_up, "expert gate_up gradient (in-backward update workspace)",
              "expert gate_up dW sum-of-squares partials");
    t.free(dgu);
    at_end.push_back(dxp);
    if (s.ep > 1) at_end.push_back(t.alloc(TraceGroup::kDispatch, kWork, d.Tk * d.H * dt, "dxp back [T*k,H]"));
    at_end.push_back(W(T * d.E * 4, "dlogits (router)"));
    if (dt != 4) at_end.push_back(W(T * d.E * dt, "dlogits (router, compute dtype)"));
    for (int id : at_end) t.free(id);
  } else {
    const int dact = W(T * d.I_dense * dt, "dact");
    const int dgu = W(T * 2 * d.I_dense * dt, "dgu");
    t.free(dact);
    t.free(dgu);
  }
  rmsnorm_bwd_scratch(t, s, T, d.H, dt, true);  // adds into dout: no dh_part
  t.free(db);
  // attention_backward_part
  const int dattn = W(T * d.qw * dt, "dattn");
  std::vector<int> dqkv;  // one [T,(nh+2nkv)*d] gradient with the fused projection (on CUDA), else three
  if (s.on_cuda) {
    dqkv.push_back(W(T * (d.qw + 2 * d.kvw) * dt, "dq | dk | dv"));
  } else {
    dqkv = {W(T * d.qw * dt, "dq"), W(T * d.kvw * dt, "dk"), W(T * d.kvw * dt, "dv")};
  }
  attention_bwd_scratch(t, c, d, s);
  t.free(dattn);
  // norm_rope_backward_qk into dq and dk. Both fused: one grid, q's and k's dw partials alive together.
  // Otherwise q then k (a temporary for the rotated gradient of one that is not fused).
  if (norm_rope_fused(s, d, d.nh) && norm_rope_fused(s, d, d.nkv)) {
    const double hd = static_cast<double>(c.head_dim);
    const int pq = t.alloc(TraceGroup::kLayerTemp, kWork,
                           static_cast<double>(rmsnorm_vec_chunks(static_cast<int64_t>(T * d.nh))) * hd * 4,
                           "q norm dw partials");
    const int pk = t.alloc(TraceGroup::kLayerTemp, kWork,
                           static_cast<double>(rmsnorm_vec_chunks(static_cast<int64_t>(T * d.nkv))) * hd * 4,
                           "k norm dw partials");
    t.free(pq);
    t.free(pk);
  } else {
    for (const auto& [heads, width] : {std::pair{d.nh, d.qw}, std::pair{d.nkv, d.kvw}}) {
      const int tmp = norm_rope_fused(s, d, heads) ? -1 : W(T * width * dt, "d(normed) q or k");
      rmsnorm_bwd_scratch(t, s, T * heads, static_cast<double>(c.head_dim), dt);
      if (tmp >= 0) t.free(tmp);
    }
  }
  const int da = W(T * d.H * dt, "da");
  rmsnorm_bwd_scratch(t, s, T, d.H, dt, true);  // adds into dh: no dx
  t.free(da);
  for (int id : dqkv) t.free(id);
}

struct ForwardState {
  std::vector<LayerIds> layers;
  std::vector<int> batch, stats;  // stats_ and aux_counts_total_ (freed by release())
  int hl = -1, fn = -1, rstd = -1, nll = -1, dh = -1;
};

// The trainer's Batch on the device: tokens, positions, cu_seqlens, labels, loss_weights.
std::vector<int> batch_tensors(Trace& t, const Dims& d, const TraceShape& s) {
  std::vector<int> ids;
  if (!s.batch_on_device) return ids;
  const MemCategory bc = s.on_cuda ? kAct : MemCategory::kOther;
  for (const char* n : {"tokens", "positions"}) ids.push_back(t.alloc(TraceGroup::kBatch, bc, d.T * 4, n));
  ids.push_back(t.alloc(TraceGroup::kBatch, bc, (static_cast<double>(s.num_docs) + 1) * 4, "cu_seqlens"));
  for (const char* n : {"labels", "loss_weights"}) ids.push_back(t.alloc(TraceGroup::kBatch, bc, d.T * 4, n));
  return ids;
}

// Qwen3Model::run_forward_ (kTrain) of one micro-batch on this stage, with the head fused
// (forward_backward: the head's backward runs here and leaves dh) or not (DPO's forward()).
ForwardState forward(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s) {
  ForwardState f;
  const double T = d.T, dt = d.dt;
  f.batch = batch_tensors(t, d, s);
  if (!s.on_cuda) {  // Batch::validate reads tokens, positions, cu_seqlens, labels through host copies
    std::vector<int> v;
    for (double b : {T * 4, T * 4, (static_cast<double>(s.num_docs) + 1) * 4, T * 4})
      v.push_back(t.alloc(TraceGroup::kBatch, MemCategory::kOther, b, "batch validation copy"));
    for (int id : v) t.free(id);
  }
  int64_t num_sparse = 0;  // the packed statistics cover every sparse layer of the model
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) num_sparse += c.is_sparse_layer(l);
  f.stats.push_back(t.alloc(TraceGroup::kRouterStats, kAct, (1 + static_cast<double>(num_sparse) * (2 * d.E + 3)) * 4,
                            "packed statistics (ce, router) f32"));
  if (num_sparse > 0) f.stats.push_back(t.alloc(TraceGroup::kRouterStats, kAct, d.E * 4, "aux counts total [E] f32"));
  int h = t.alloc(TraceGroup::kSaved, kAct, T * d.H * dt, "embedding output [T,H]");
  for (int64_t l = s.first_layer; l < s.first_layer + s.num_layers; ++l) {
    const bool sparse = c.is_sparse_layer(l);
    t.phase(sparse ? "forward (MoE layer)" : "forward (dense layer)");
    LayerIds ids;
    const int out = layer_forward(t, d, s, sparse, h, TraceGroup::kSaved, ids);
    if (sparse) {
      if (s.on_cuda)  // router_stats partial histograms (and the health sums' partials, [chunks] f32 x 2)
        t.free(t.alloc(TraceGroup::kLayerTemp, kWork, static_cast<double>(chunks_of(T)) * (d.E * 8 + (s.router_stats ? 8 : 0)),
                       "router stats scratch"));
    }
    if (s.recompute == Recompute::kFull) {  // only x stays (held as acts_[l].x)
      for (int id : ids.saved) t.free(id);
      ids.saved.clear();
    } else if (s.recompute == Recompute::kSelective) {  // drop_recomputable
      for (int id : ids.dropped) {
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
  f.nll = t.alloc(TraceGroup::kHead, kAct, T * 4, "nll [T] f32 (returned)");
  const int lse = t.alloc(TraceGroup::kHead, kWork, T * 4, "ce lse [T]");
  int dx = -1;
  if (s.fused_head) dx = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "d(final norm out) [T,H]");
  t.free(t.alloc(TraceGroup::kHead, kWork, rows * d.V * dt, "logits/dlogits chunk [rows,V]"));
  if (s.fused_head) {
    f.dh = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "dh [T,H]");
    rmsnorm_bwd_scratch(t, s, T, d.H, dt);
    for (int id : {f.fn, f.rstd, dx, f.hl}) t.free(id);
    f.fn = f.rstd = f.hl = -1;
  }
  t.free(lse);
  return f;
}

// Qwen3Model::backward of the micro-batch `f`.
void backward(Trace& t, const ModelConfig& c, const Dims& d, const TraceShape& s, ForwardState& f) {
  const double T = d.T, dt = d.dt;
  int dh = f.dh;
  if (s.head && dh < 0) {  // the head recomputed chunk by chunk (forward() then backward())
    t.phase("loss head backward");
    const double rows = s.ce_chunk > 0 ? std::min<double>(static_cast<double>(s.ce_chunk), T) : T;
    const int nll = t.alloc(TraceGroup::kHeadGrad, kWork, T * 4, "nll (recomputed) [T]");
    const int lse = t.alloc(TraceGroup::kHeadGrad, kWork, T * 4, "lse (recomputed) [T]");
    const int dx = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "d(final norm out) [T,H]");
    t.free(t.alloc(TraceGroup::kHead, kWork, rows * d.V * dt, "logits/dlogits chunk [rows,V]"));
    t.free(f.fn);
    dh = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "dh [T,H]");
    rmsnorm_bwd_scratch(t, s, T, d.H, dt);
    for (int id : {nll, lse, dx, f.hl, f.rstd}) t.free(id);
  } else if (!s.head) {
    // A pipeline stage without the head receives d(output) and frees its output.
    dh = t.alloc(TraceGroup::kHeadGrad, kWork, T * d.H * dt, "received dh [T,H]");
    t.free(f.hl);
  }
  // Qwen3Model::backward's sums_.sum (request_grad_sum_squares), read by the optimizer after the step.
  const int sums = s.grad_sums ? t.alloc(TraceGroup::kLayerTemp, kWork, 8, "gradient sum of squares [1] f64") : -1;
  for (int64_t i = s.num_layers - 1; i >= 0; --i) {
    const int64_t l = s.first_layer + i;
    const bool sparse = c.is_sparse_layer(l);
    LayerIds& ids = f.layers[static_cast<size_t>(i)];
    std::vector<int> extra;
    if (s.recompute == Recompute::kSelective) {
      t.phase(sparse ? "backward (MoE layer, selective)" : "backward (dense layer, selective)");
      extra = layer_restore(t, d, s, sparse);
    } else if (s.recompute == Recompute::kFull) {
      t.phase(sparse ? "backward (MoE layer, recomputed)" : "backward (dense layer, recomputed)");
      LayerIds re;
      t.free(layer_forward(t, d, s, sparse, ids.x, TraceGroup::kRecomputed, re));  // the output is discarded
      extra = re.saved;
    } else {
      t.phase(sparse ? "backward (MoE layer)" : "backward (dense layer)");
    }
    layer_backward(t, c, d, s, sparse);
    for (int id : extra) t.free(id);
    for (int id : ids.saved) t.free(id);
    t.free(ids.x);
  }
  t.phase("end of backward");
  if (s.on_cuda)  // embedding_backward: 3 x T i32 sort keys/values (CUB's storage left out)
    t.free(t.alloc(TraceGroup::kLayerTemp, kWork, std::ceil(3 * T * 4 / 256) * 256, "embedding backward scratch"));
  for (int id : f.stats) t.free(id);  // release() and finish_()
  t.free(dh);
  if (sums >= 0) t.free(sums);
  t.free(f.nll);                        // the trainer's ForwardResult
  for (int id : f.batch) t.free(id);
}

}  // namespace

TraceResult trace_micro_batch(const ModelConfig& cfg, const TraceShape& s) {
  Trace t;
  const Dims d = dims_of(cfg, s);
  // The other micro-batches' Batch tensors that the trainer already holds (DPO's pair batches).
  std::vector<int> held;
  for (int64_t m = 1; m < s.batches_held; ++m)
    for (int id : batch_tensors(t, d, s)) held.push_back(id);
  std::vector<ForwardState> fs;
  const int64_t n = std::max<int64_t>(1, s.in_flight);
  for (int64_t m = 0; m < n; ++m) {
    t.phase("forward");
    fs.push_back(forward(t, cfg, d, s));
  }
  for (auto& f : fs) backward(t, cfg, d, s, f);
  for (int id : held) t.free(id);
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
