// One Qwen3 / Qwen3-MoE decoder layer, forward and backward, written only in ops.h terms
// (SPEC.md section 2): h = x + Attn(RMSNorm(x)); out = h + FFN(RMSNorm(h)), FFN = dense SwiGLU MLP
// or the dropless top-k MoE. Forward fills LayerActs with exactly what backward reads; backward
// turns the gradient of the layer output into the gradient of its input and accumulates (+=)
// f32 parameter gradients. No host synchronization happens inside either function.
#pragma once
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/params.h"

namespace moetrain {

// Activations of one layer (T tokens, k = top-k, Tk = T*k permuted rows). Forward fills every
// field; what stays saved until backward depends on the recompute policy:
//   kNone: all of them;  kFull: x only (the layer's forward re-runs inside backward);
//   kSelective: all but the fields marked [S], which restore_recomputed() rebuilds in backward
//   from the saved ones: the attention core (attention_forward from q, k, v), SwiGLU (from gu)
//   and the cheap elementwise outputs feeding them (RMSNorms, q/k norm + RoPE, the permutation).
//   No matmul is repeated; the rebuilt tensors are bit-identical (every op is deterministic).
struct LayerActs {
  Tensor x;                 // [T,H] layer input (the residual stream)
  Tensor a, rstd_in;        // [S] [T,H] input RMSNorm output, [T] f32
  Tensor q_raw, q_rstd;     // [T,nh,d] before q_norm, [T*nh] f32
  Tensor k_raw, k_rstd;     // [T,nkv,d] before k_norm, [T*nkv] f32
  Tensor q, k, v;           // [S] [T,nh,d], [S] [T,nkv,d] after norm + RoPE; [T,nkv,d]
  Tensor attn, lse;         // [S] [T,nh,d] attention output, [S] [nh,T] f32
  Tensor h;                 // [T,H] after the attention residual
  Tensor b, rstd_post;      // [S] [T,H] post-attention RMSNorm output, [T] f32
  Tensor gu, act;           // dense: [T,2I], [S] [T,I]; MoE: [Tk,2I], [S] [Tk,I] (expert-contiguous,
                            // each row times its routing weight)
  // MoE only
  Tensor router_logits;     // [T,E] f32
  Tensor probs;             // [T,E] f32 softmax of router_logits
  Tensor topk_idx, topk_w;  // [T,k] i32, [T,k] f32
  Tensor counts, offsets;   // [E] i32, [E+1] i32 (device-side grouping)
  Tensor row_of, token_of;  // [Tk] i32
  Tensor row_w;             // [Tk] f32 routing weight of each permuted row
  Tensor xp;                // [S] [Tk,H] permuted expert inputs
  Tensor z_lse;             // [T] f32 logsumexp of router logits (z-loss on)
  void clear() { *this = LayerActs(); }
};

// What the router losses ask of a sparse layer's backward.
struct RouterLossGrad {
  Tensor aux_counts;        // [E] f32 picks per expert over the rows the aux loss spans
  int64_t aux_rows = 0;     // N of those rows
  float aux_coef = 0.0f;    // d(loss)/d(aux term) already folded in (0: no aux gradient)
  float z_scale = 0.0f;     // d(loss)/d(sum_t lse_t^2) for this layer (0: no z-loss)
};

// When a layer runs its q, k and v projections as one GEMM each way (over LayerParams::qkv_proj,
// with q, k, v and their gradients as column blocks of one [T, (nh + 2 nkv) d] tensor): kCuda (the
// default) on CUDA tensors only, so the CPU reference keeps its three GEMMs and packed tensors;
// MT_QKV_FUSED=0 / 1 pick kNever / kAlways at start-up. The two differ only in rounding order.
enum class QkvFusion { kCuda, kAlways, kNever };
void set_qkv_fusion(QkvFusion q);
// Whether a layer with these weights (or gradients) runs the fused projection under the setting.
bool uses_fused_qkv(const LayerParams& p);

struct LayerSettings {
  bool z_loss = false;      // compute and save router logsumexp
};

// Forward of layer `w` on input x [T,H]; returns the layer output [T,H] and fills `s`.
Tensor decoder_layer_forward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch,
                             const Tensor& x, const LayerSettings& set, LayerActs& s);

// Backward: `dout` [T,H] holds d(loss)/d(layer output) on entry and d(loss)/d(layer input) on
// return. Parameter gradients accumulate into `g` (f32, same structure as `w`).
// overwrite_grads: the matrix gradients are written (beta 0) instead of accumulated; norm weight
// gradients are always accumulated. expert_grad_sums ([1] f64, MoE layers): when given, the sums of
// squares of the two expert weight gradients (as stored after this pass) are added to it.
// expert_updates (MoE layers): an expert weight with a target gets its AdamW update as its gradient
// is formed (ops::grouped_matmul_backward_adamw; its gradient in `g` is read, not written).
// With `any` (updates were requested for this pass), only the updated matrices add to
// expert_grad_sums: a matrix without a target is a frozen one, whose gradient the norm leaves out.
struct ExpertUpdates {
  ops::AdamWTarget* gate_up = nullptr;
  ops::AdamWTarget* down = nullptr;
  bool any = false;
  DType grad_dtype = DType::kF32;  // of an expert gradient without a buffer (undefined in g)
};
void decoder_layer_backward(Context& ctx, const ModelConfig& cfg, const LayerParams& w, LayerParams& g,
                            const Batch& batch, const LayerActs& s, const RouterLossGrad& rg, Tensor& dout,
                            bool overwrite_grads = false, Tensor* expert_grad_sums = nullptr,
                            const ExpertUpdates& expert_updates = {});

// Recompute::kSelective: drop the [S] fields of LayerActs after forward, and rebuild them (as
// activations) before backward.
void drop_recomputable(LayerActs& s);
void restore_recomputed(Context& ctx, const ModelConfig& cfg, const LayerParams& w, const Batch& batch, LayerActs& s);

// Row-wise logsumexp of f32 logits [R,C] into lse [R] f32 on the device without a host read
// (cross_entropy_forward against label 0; its losses are discarded).
void logsumexp_rows(Context& ctx, const Tensor& logits, Tensor& lse);

// Helpers shared with the model: uninitialized tensors of category activations / workspace.
Tensor act_empty(const Shape& shape, DType dtype, Device dev);
Tensor work_empty(const Shape& shape, DType dtype, Device dev);

}  // namespace moetrain
