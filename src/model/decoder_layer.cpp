// Decoder layer forward/backward over ops.h (SPEC.md section 2). Activations take the weights'
// dtype (f32 on the CPU reference path, bf16 on CUDA); router logits (an f32-output GEMM),
// probabilities, norms' rstd and every parameter gradient are f32; weight gradients are GEMMs
// with compute-dtype inputs and an f32 output accumulated with beta = 1. Backward mirrors forward:
//   attention: RMSNorm -> q/k/v proj -> per-head RMSNorm (q, k) -> RoPE -> attention -> o_proj
//   dense FFN: RMSNorm -> gate|up proj -> SwiGLU -> down proj
//   MoE FFN:   RMSNorm -> router -> top-k -> route index -> permute -> grouped gate|up ->
//              SwiGLU times each pick's routing weight -> grouped down -> unpermute (a plain sum)
// The routing weight scales the down projection's input rather than its output (the same
// product, rounded in another place): the backward then needs neither the expert outputs nor a
// weighted copy of dy, and the weights' gradient comes out of the SwiGLU backward.
#include "model/decoder_layer.h"

#include <cmath>

#include "core/env.h"
#include "core/profiler.h"
#include "kernels/ops.h"

namespace moetrain {

using ops::Trans;

namespace {
QkvFusion& qkv_fusion_setting();
}  // namespace
void set_qkv_fusion(QkvFusion q) { qkv_fusion_setting() = q; }

Tensor act_empty(const Shape& shape, DType dtype, Device dev) {
  return Tensor::empty(shape, dtype, dev, MemCategory::kActivations);
}
Tensor work_empty(const Shape& shape, DType dtype, Device dev) {
  return Tensor::empty(shape, dtype, dev, MemCategory::kWorkspace);
}

namespace {

// x [R, K] times W^T for W [N, K]: y [R, N].
Tensor linear(Context& ctx, const Tensor& x, const Tensor& w, DType dt, Device dev) {
  Tensor y = act_empty({x.size(0), w.size(0)}, dt, dev);
  ops::matmul(ctx, x, Trans::kNo, w, Trans::kYes, y);
  return y;
}

QkvFusion& qkv_fusion_setting() {
  static QkvFusion q = [] {
    const long v = env_int("MT_QKV_FUSED", -1);
    return v == 0 ? QkvFusion::kNever : v == 1 ? QkvFusion::kAlways : QkvFusion::kCuda;
  }();
  return q;
}

// The [q; k; v] weight (or gradient) when q_proj, k_proj and v_proj are still its row blocks (as
// ModelParams::allocate makes them) and the setting allows it, else undefined: the layer then runs
// three GEMMs each way.
Tensor fused_qkv(const LayerParams& p) {
  const Tensor& f = p.qkv_proj;
  const QkvFusion q = qkv_fusion_setting();
  if (q == QkvFusion::kNever || !f.defined() || (q == QkvFusion::kCuda && !f.device().is_cuda()) ||
      !p.q_proj.defined() || !p.k_proj.defined() || !p.v_proj.defined() || f.dim() != 2 || !f.is_contiguous())
    return {};
  const int64_t nq = p.q_proj.size(0), nk = p.k_proj.size(0), nv = p.v_proj.size(0);
  const size_t row = static_cast<size_t>(f.size(1)) * f.element_size();
  const char* base = static_cast<const char*>(f.data_ptr());
  for (const Tensor* t : {&p.q_proj, &p.k_proj, &p.v_proj})
    if (t->dtype() != f.dtype() || t->dim() != 2 || t->size(1) != f.size(1) || !t->is_contiguous()) return {};
  if (f.size(0) != nq + nk + nv || p.q_proj.data_ptr() != base || p.k_proj.data_ptr() != base + nq * row ||
      p.v_proj.data_ptr() != base + (nq + nk) * row)
    return {};
  return f;
}

}  // namespace

bool uses_fused_qkv(const LayerParams& p) { return fused_qkv(p).defined(); }

namespace {

Tensor to_dtype(Context& ctx, const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  Tensor f = work_empty(t.shape(), dt, t.device());
  ops::cast(ctx, t, f);
  return f;
}

// Per-head RMSNorm over d, then RoPE (the order transformers' Qwen3 uses): q_raw, k_raw -> q, k.
void qk_norm_rope(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch, LayerActs& s,
                  Tensor& q_rstd, Tensor& k_rstd) {
  const int64_t T = s.q_raw.size(0), d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const DType dt = s.q_raw.dtype();
  const Device dev = s.q_raw.device();
  const float eps = static_cast<float>(cfg.rms_norm_eps), theta = static_cast<float>(cfg.rope_theta);
  s.q = act_empty({T, nh, d}, dt, dev);
  s.k = act_empty({T, nkv, d}, dt, dev);
  ops::NormRopeFwdIO q{s.q_raw.view({T, nh, d}), w.q_norm, s.q, q_rstd};
  ops::NormRopeFwdIO k{s.k_raw.view({T, nkv, d}), w.k_norm, s.k, k_rstd};
  ops::norm_rope_forward_qk(ctx, q, k, eps, batch.positions, theta);
}

// softmax(q k^T / sqrt(d) + causal document mask) v -> attn, lse.
void attention_core(Context& ctx, const ModelConfig& cfg, const Batch& batch, LayerActs& s) {
  const int64_t T = s.q.size(0), d = cfg.head_dim, nh = cfg.num_attention_heads;
  s.attn = act_empty({T, nh, d}, s.q.dtype(), s.q.device());
  s.lse = act_empty({nh, T}, DType::kF32, s.q.device());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::attention_forward(ctx, s.q, s.k, s.v, batch.cu_seqlens, batch.max_seqlen, scale, s.attn, s.lse);
}

void attention_forward_part(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch,
                            const Tensor& x, LayerActs& s) {
  const int64_t T = x.size(0), H = cfg.hidden_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const DType dt = x.dtype();
  const Device dev = x.device();
  const float eps = static_cast<float>(cfg.rms_norm_eps);

  s.x = x;
  s.a = act_empty({T, H}, dt, dev);
  s.rstd_in = act_empty({T}, DType::kF32, dev);
  // h = x + attn Wo^T below: the norm's row loads also write x into h.
  s.h = act_empty({T, H}, dt, dev);
  ops::rmsnorm_forward(ctx, x, w.input_norm, eps, s.a, s.rstd_in, &s.h);

  {  // the projections' cuBLAS time, apart in `moetrain bench --profile` (regions)
    const ProfileScope region(ctx, "proj_qkv_fwd", ProfileKind::kRegion);
    const Tensor wqkv = fused_qkv(w);
    if (wqkv.defined()) {  // one GEMM; q_raw, k_raw and v are column blocks of its [T, (nh + 2 nkv) d] output
      const Tensor qkv = linear(ctx, s.a, wqkv, dt, dev);
      const int64_t nq = nh * d, nk = nkv * d;
      s.q_raw = qkv.slice(1, 0, nq).view({T, nh, d});
      s.k_raw = qkv.slice(1, nq, nq + nk).view({T, nkv, d});
      s.v = qkv.slice(1, nq + nk, nq + 2 * nk).view({T, nkv, d});
    } else {
      s.q_raw = linear(ctx, s.a, w.q_proj, dt, dev).view({T, nh, d});
      s.k_raw = linear(ctx, s.a, w.k_proj, dt, dev).view({T, nkv, d});
      s.v = linear(ctx, s.a, w.v_proj, dt, dev).view({T, nkv, d});
    }
  }
  s.q_rstd = act_empty({T * nh}, DType::kF32, dev);
  s.k_rstd = act_empty({T * nkv}, DType::kF32, dev);
  qk_norm_rope(ctx, cfg, w, batch, s, s.q_rstd, s.k_rstd);
  attention_core(ctx, cfg, batch, s);

  // h = x + attn Wo^T (h holds x's copy from the input norm)
  {
    const ProfileScope region(ctx, "proj_o_fwd", ProfileKind::kRegion);
    ops::matmul(ctx, s.attn.view({T, nh * d}), Trans::kNo, w.o_proj, Trans::kYes, s.h, 1.0f, 1.0f);
  }
}

// Dense SwiGLU MLP on b [T,H]; returns y [T,H].
Tensor dense_ffn_forward(Context& ctx, const LayerParams& w, LayerActs& s) {
  const int64_t T = s.b.size(0), I = w.mlp_down.size(1);
  const DType dt = s.b.dtype();
  const Device dev = s.b.device();
  s.gu = linear(ctx, s.b, w.mlp_gate_up, dt, dev);
  s.act = act_empty({T, I}, dt, dev);
  ops::swiglu_forward(ctx, s.gu, s.act);
  return linear(ctx, s.act, w.mlp_down, dt, dev);  // becomes the layer output
}

Tensor moe_ffn_forward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const LayerSettings& set,
                       LayerActs& s) {
  const int64_t T = s.b.size(0), H = cfg.hidden_size, E = cfg.num_experts;
  const int64_t k = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size;
  const DType dt = s.b.dtype();
  const Device dev = s.b.device();
  // Router logits straight out of the GEMM in f32 (no rounding to the compute dtype).
  s.router_logits = act_empty({T, E}, DType::kF32, dev);
  ops::matmul(ctx, s.b, Trans::kNo, w.router, Trans::kYes, s.router_logits);
  s.probs = act_empty({T, E}, DType::kF32, dev);
  s.topk_idx = act_empty({T, k}, DType::kI32, dev);
  s.topk_w = act_empty({T, k}, DType::kF32, dev);
  ops::router_topk(ctx, s.router_logits, static_cast<int>(k), cfg.norm_topk_prob, s.probs, s.topk_idx, s.topk_w);
  if (set.z_loss) {
    s.z_lse = act_empty({T}, DType::kF32, dev);
    logsumexp_rows(ctx, s.router_logits, s.z_lse);  // the model sums lse^2 on the device
  }
  s.counts = act_empty({E}, DType::kI32, dev);
  s.offsets = act_empty({E + 1}, DType::kI32, dev);
  s.row_of = act_empty({T * k}, DType::kI32, dev);
  s.token_of = act_empty({T * k}, DType::kI32, dev);
  ops::moe_route_index(ctx, s.topk_idx, static_cast<int>(E), s.counts, s.offsets, s.row_of, s.token_of);
  s.row_w = act_empty({T * k}, DType::kF32, dev);
  ops::moe_rows_from_picks(ctx, s.topk_w, s.row_of, s.row_w);
  s.xp = act_empty({T * k, H}, dt, dev);
  ops::moe_permute(ctx, s.b, s.token_of, s.xp);
  s.gu = act_empty({T * k, 2 * I}, dt, dev);
  ops::grouped_matmul(ctx, s.xp, w.experts_gate_up, s.offsets, s.gu);
  s.act = act_empty({T * k, I}, dt, dev);
  ops::swiglu_forward(ctx, s.gu, s.act, s.row_w);
  Tensor yp = work_empty({T * k, H}, dt, dev);
  ops::grouped_matmul(ctx, s.act, w.experts_down, s.offsets, yp);
  Tensor y = act_empty({T, H}, dt, dev);  // becomes the layer output: h + FFN(b)
  ops::moe_unpermute(ctx, yp, s.row_of, Tensor(), y, /*residual=*/s.h);
  return y;
}

// d(loss)/d(b) of the dense FFN into db (overwritten); accumulates parameter gradients.
void dense_ffn_backward(Context& ctx, const LayerParams& w, LayerParams& g, const LayerActs& s, const Tensor& dy,
                        Tensor& db, float gb) {
  const int64_t T = s.b.size(0), I = w.mlp_down.size(1);
  const DType dt = s.b.dtype();
  const Device dev = s.b.device();
  Tensor dact = work_empty({T, I}, dt, dev);
  ops::matmul(ctx, dy, Trans::kNo, w.mlp_down, Trans::kNo, dact);                     // [T,H] x [H,I]
  ops::matmul(ctx, dy, Trans::kYes, s.act, Trans::kNo, g.mlp_down, 1.0f, gb);       // [H,T] x [T,I]
  Tensor dgu = work_empty({T, 2 * I}, dt, dev);
  ops::swiglu_backward(ctx, s.gu, dact, dgu);
  ops::matmul(ctx, dgu, Trans::kNo, w.mlp_gate_up, Trans::kNo, db);                   // [T,2I] x [2I,H]
  ops::matmul(ctx, dgu, Trans::kYes, s.b, Trans::kNo, g.mlp_gate_up, 1.0f, gb);     // [2I,T] x [T,H]
}

void moe_ffn_backward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, LayerParams& g,
                      const LayerActs& s, const RouterLossGrad& rg, const Tensor& dy, Tensor& db, float gb,
                      Tensor* grad_sums, const ExpertUpdates& upd) {
  const int64_t T = s.b.size(0), H = cfg.hidden_size, E = cfg.num_experts;
  const int64_t k = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size;
  const DType dt = s.b.dtype();
  const Device dev = s.b.device();
  // The combine is a plain sum, so each row's gradient is its token's dy.
  Tensor dyp = work_empty({T * k, H}, dt, dev);
  ops::moe_permute(ctx, dy, s.token_of, dyp);
  Tensor dact = work_empty({T * k, I}, dt, dev);
  // Each expert matrix: its gradient into g (= or +=), or straight into its AdamW update (without
  // a buffer in g, nothing earlier to add; a pass without a target for such a matrix is refused).
  auto expert_backward = [&](const Tensor& x, const Tensor& wt, const Tensor& dout_rows, Tensor& dx, Tensor& gw,
                             ops::AdamWTarget* target) {
    if (!target) {
      MT_CHECK(gw.defined(), "[model] expert weight {} has no gradient buffer and no in-backward update", wt.desc());
      ops::grouped_matmul_backward(ctx, x, wt, s.offsets, dout_rows, dx, gw, gb != 0.0f, upd.any ? nullptr : grad_sums);
      return;
    }
    ops::grouped_matmul_backward_adamw(ctx, x, wt, s.offsets, dout_rows, dx, gw.defined() ? gw.dtype() : upd.grad_dtype,
                                       gw, gw.defined() && gb != 0.0f, *target, grad_sums);
  };
  expert_backward(s.act, w.experts_down, dyp, dact, g.experts_down, upd.down);
  dyp = Tensor();
  Tensor dgu = work_empty({T * k, 2 * I}, dt, dev);
  Tensor drow_w = work_empty({T * k}, DType::kF32, dev);
  ops::swiglu_backward_weighted(ctx, s.gu, dact, s.row_w, dgu, drow_w);
  dact = Tensor();
  Tensor dtopk_w = work_empty({T, k}, DType::kF32, dev);
  ops::moe_picks_from_rows(ctx, drow_w, s.row_of, dtopk_w);
  drow_w = Tensor();
  Tensor dxp = work_empty({T * k, H}, dt, dev);
  expert_backward(s.xp, w.experts_gate_up, dgu, dxp, g.experts_gate_up, upd.gate_up);
  dgu = Tensor();
  ops::moe_permute_backward(ctx, dxp, s.row_of, db);

  // Router: top-k weights' gradient plus the aux loss (through probs, added row by row inside the
  // op) and the z-loss (logits).
  const bool aux = rg.aux_coef != 0.0f && rg.aux_rows > 0;
  Tensor dlogits = work_empty({T, E}, DType::kF32, dev);
  ops::router_topk_backward(ctx, s.probs, s.topk_idx, s.topk_w, dtopk_w, Tensor(), cfg.norm_topk_prob, dlogits,
                            aux ? rg.aux_counts : Tensor(), rg.aux_rows, rg.aux_coef);
  if (rg.z_scale != 0.0f) ops::router_zloss_backward(ctx, s.router_logits, s.z_lse, rg.z_scale, dlogits);
  Tensor dl = to_dtype(ctx, dlogits, dt);
  ops::matmul(ctx, dl, Trans::kNo, w.router, Trans::kNo, db, 1.0f, 1.0f);          // [T,E] x [E,H]
  ops::matmul(ctx, dl, Trans::kYes, s.b, Trans::kNo, g.router, 1.0f, gb);        // [E,T] x [T,H], f32 +=
}

void attention_backward_part(Context& ctx, const ModelConfig& cfg, const LayerParams& w, LayerParams& g,
                             const Batch& batch, const LayerActs& s, Tensor& dh, float gb) {
  const int64_t T = s.x.size(0), H = cfg.hidden_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const DType dt = s.x.dtype();
  const Device dev = s.x.device();
  const float theta = static_cast<float>(cfg.rope_theta);

  Tensor dattn = work_empty({T, nh * d}, dt, dev);
  {
    const ProfileScope region(ctx, "proj_o_bwd", ProfileKind::kRegion);
    ops::matmul(ctx, dh, Trans::kNo, w.o_proj, Trans::kNo, dattn);                                // [T,H] x [H,nh*d]
    ops::matmul(ctx, dh, Trans::kYes, s.attn.view({T, nh * d}), Trans::kNo, g.o_proj, 1.0f, gb);  // [H,T] x [T,nh*d]
  }

  // With the fused projection, dq, dk and dv are column blocks of one [T, (nh + 2 nkv) d] gradient.
  const Tensor wqkv = fused_qkv(w), gqkv = fused_qkv(g);
  const bool fused = wqkv.defined() && gqkv.defined();
  const int64_t nq = nh * d, nk = nkv * d;
  Tensor dqkv = fused ? work_empty({T, nq + 2 * nk}, dt, dev) : Tensor();
  Tensor dq = fused ? dqkv.slice(1, 0, nq).view({T, nh, d}) : work_empty({T, nh, d}, dt, dev);
  Tensor dk = fused ? dqkv.slice(1, nq, nq + nk).view({T, nkv, d}) : work_empty({T, nkv, d}, dt, dev);
  Tensor dv = fused ? dqkv.slice(1, nq + nk, nq + 2 * nk).view({T, nkv, d}) : work_empty({T, nkv, d}, dt, dev);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::attention_backward(ctx, s.q, s.k, s.v, s.attn, s.lse, dattn.view({T, nh, d}), batch.cu_seqlens,
                          batch.max_seqlen, scale, dq, dk, dv);
  dattn = Tensor();

  // RoPE backward, then the per-head norms (one op each), in place: dq, dk become the raw gradients.
  ops::NormRopeBwdIO gq{s.q_raw, w.q_norm, s.q_rstd, dq, dq, g.q_norm};
  ops::NormRopeBwdIO gk{s.k_raw, w.k_norm, s.k_rstd, dk, dk, g.k_norm};
  ops::norm_rope_backward_qk(ctx, gq, gk, batch.positions, theta);

  Tensor da = work_empty({T, H}, dt, dev);
  {
    const ProfileScope region(ctx, "proj_qkv_bwd", ProfileKind::kRegion);
    if (fused) {
      ops::matmul(ctx, dqkv, Trans::kNo, wqkv, Trans::kNo, da);  // [T,(nh+2nkv)d] x [(nh+2nkv)d,H]
      Tensor gw = gqkv;
      ops::matmul(ctx, dqkv, Trans::kYes, s.a, Trans::kNo, gw, 1.0f, gb);
    } else {
      Tensor dq2 = dq.view({T, nq}), dk2 = dk.view({T, nk}), dv2 = dv.view({T, nk});
      ops::matmul(ctx, dq2, Trans::kNo, w.q_proj, Trans::kNo, da);                   // [T,nh*d] x [nh*d,H]
      ops::matmul(ctx, dk2, Trans::kNo, w.k_proj, Trans::kNo, da, 1.0f, 1.0f);
      ops::matmul(ctx, dv2, Trans::kNo, w.v_proj, Trans::kNo, da, 1.0f, 1.0f);
      ops::matmul(ctx, dq2, Trans::kYes, s.a, Trans::kNo, g.q_proj, 1.0f, gb);     // [nh*d,T] x [T,H]
      ops::matmul(ctx, dk2, Trans::kYes, s.a, Trans::kNo, g.k_proj, 1.0f, gb);
      ops::matmul(ctx, dv2, Trans::kYes, s.a, Trans::kNo, g.v_proj, 1.0f, gb);
    }
  }

  // residual: d(input) = d(h) + d(norm path), added by the norm's backward
  ops::rmsnorm_backward(ctx, s.x, w.input_norm, s.rstd_in, da, dh, g.input_norm, /*dx_accumulate=*/true);
}

}  // namespace

Tensor decoder_layer_forward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch,
                             const Tensor& x, const LayerSettings& set, LayerActs& s) {
  const int64_t T = x.size(0), H = cfg.hidden_size;
  MT_CHECK(x.dim() == 2 && x.size(1) == H, "[decoder_layer] input {} must be [T, {}]", x.desc(), H);
  attention_forward_part(ctx, cfg, w, batch, x, s);
  const DType dt = x.dtype();
  const Device dev = x.device();
  s.b = act_empty({T, H}, dt, dev);
  s.rstd_post = act_empty({T}, DType::kF32, dev);
  ops::rmsnorm_forward(ctx, s.h, w.post_norm, static_cast<float>(cfg.rms_norm_eps), s.b, s.rstd_post);
  if (w.sparse) return moe_ffn_forward(ctx, cfg, w, set, s);  // adds the residual h itself
  Tensor out = dense_ffn_forward(ctx, w, s);
  ops::add_(ctx, out, s.h);  // out = h + FFN(b)
  return out;
}

void decoder_layer_backward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, LayerParams& g,
                            const Batch& batch, const LayerActs& s, const RouterLossGrad& rg, Tensor& dout,
                            bool overwrite_grads, Tensor* expert_grad_sums, const ExpertUpdates& expert_updates) {
  const float gb = overwrite_grads ? 0.0f : 1.0f;  // beta of the matrix-gradient GEMMs
  const int64_t T = s.x.size(0), H = cfg.hidden_size;
  MT_CHECK(s.x.defined() && s.b.defined(), "[decoder_layer] backward without saved activations");
  check_shape(dout, {T, H}, "decoder_layer", "dout");
  Tensor db = work_empty({T, H}, s.b.dtype(), s.b.device());
  if (w.sparse) {
    moe_ffn_backward(ctx, cfg, w, g, s, rg, dout, db, gb, expert_grad_sums, expert_updates);
  } else {
    dense_ffn_backward(ctx, w, g, s, dout, db, gb);
  }
  // dout += the post-norm path's gradient: dout now holds d(loss)/d(h)
  ops::rmsnorm_backward(ctx, s.h, w.post_norm, s.rstd_post, db, dout, g.post_norm, /*dx_accumulate=*/true);
  db = Tensor();
  attention_backward_part(ctx, cfg, w, g, batch, s, dout, gb);
}

void drop_recomputable(LayerActs& s) {
  s.a = s.q = s.k = s.attn = s.lse = s.b = s.act = s.xp = Tensor();
}

void restore_recomputed(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch, LayerActs& s) {
  MT_CHECK(s.x.defined() && s.h.defined() && s.gu.defined(), "[decoder_layer] selective recompute without the saved "
           "layer input, residual and gate|up activations");
  const int64_t T = s.x.size(0), H = cfg.hidden_size;
  const DType dt = s.x.dtype();
  const Device dev = s.x.device();
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  // rstd outputs are recomputed too (equal to the saved ones) into scratch.
  Tensor rstd = work_empty({T}, DType::kF32, dev);
  s.a = act_empty({T, H}, dt, dev);
  ops::rmsnorm_forward(ctx, s.x, w.input_norm, eps, s.a, rstd);
  Tensor q_rstd = work_empty(s.q_rstd.shape(), DType::kF32, dev), k_rstd = work_empty(s.k_rstd.shape(), DType::kF32, dev);
  qk_norm_rope(ctx, cfg, w, batch, s, q_rstd, k_rstd);
  attention_core(ctx, cfg, batch, s);
  s.b = act_empty({T, H}, dt, dev);
  ops::rmsnorm_forward(ctx, s.h, w.post_norm, eps, s.b, rstd);
  if (w.sparse) {
    s.xp = act_empty({s.token_of.size(0), H}, dt, dev);
    ops::moe_permute(ctx, s.b, s.token_of, s.xp);
  }
  s.act = act_empty({s.gu.size(0), s.gu.size(1) / 2}, dt, dev);
  ops::swiglu_forward(ctx, s.gu, s.act, s.row_w);  // row_w is undefined in a dense layer
}

void logsumexp_rows(Context& ctx, const Tensor& logits, Tensor& lse) {
  const int64_t R = logits.size(0);
  Tensor label0 = Tensor::zeros({R}, DType::kI32, logits.device(), MemCategory::kWorkspace);
  Tensor unused = work_empty({R}, DType::kF32, logits.device());
  ops::cross_entropy_forward(ctx, logits, label0, Tensor(), unused, lse);
}

}  // namespace moetrain
