// cuda_ops.h: the CUDA backend, one function per op in kernels/ops.h with the same name and
// parameters. ops.cpp checks shapes/dtypes and dispatches CUDA tensors here. Activations and
// weights are bf16 (f32 also accepted), accumulation is fp32. No CUDA headers here on purpose.
// All ops run on ctx.stream() and do not synchronize with the host unless they return a value.
#pragma once
#include <vector>
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace moetrain::cuda {

using ops::AdamWParams;
using ops::Reduction;
using ops::Trans;

// ---- utilities -----------------------------------------------------------------------------
void cast(Context& ctx, const Tensor& src, Tensor& dst);
void copy_rows(Context& ctx, const Tensor& src, Tensor& dst);
void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha = 1.0f);
void scale_(Context& ctx, Tensor& y, float alpha);
double sum_squares(Context& ctx, const Tensor& x);  // synchronizes (returns a host value)
void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc);  // no host synchronization
void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc);
void sum_accumulate(Context& ctx, const Tensor& x, Tensor& acc);
void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream);

// ---- embedding -----------------------------------------------------------------------------
void embedding_forward(Context& ctx, const Tensor& table, const Tensor& ids, Tensor& out);
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable);

// ---- RMSNorm -------------------------------------------------------------------------------
void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                     Tensor& rstd, Tensor* x_copy = nullptr);
void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dy, Tensor& dx, Tensor& dw, bool dx_accumulate);

// ---- GEMM ----------------------------------------------------------------------------------
void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);
// The bf16 GEMM algorithm choice (matmul.cu; MT_MATMUL_TUNE sets the start value): off runs
// cublasGemmEx's default for every shape. matmul_tuned_shapes: shapes timed so far (with_lt: how
// many took a cuBLASLt offer). matmul_check_offers (tests): C = alpha op(a) op(b) + beta c_init
// with the default and with every offer the tuner weighs, counting offers whose output checksum
// differs from the default's (the tuner never takes those).
void set_matmul_tuning(bool on);
int matmul_tuned_shapes(int* with_lt = nullptr);
struct MatmulOfferCheck {
  int offers = 0, differing = 0;
};
MatmulOfferCheck matmul_check_offers(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                                     const Tensor& c_init, float alpha, float beta);

// ---- RoPE ----------------------------------------------------------------------------------
void norm_rope_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& pos, float theta,
                       Tensor& y, Tensor& rstd);
void norm_rope_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                        float theta, const Tensor& dy, Tensor& dx, Tensor& dw);
void norm_rope_forward_qk(Context& ctx, ops::NormRopeFwdIO& q, ops::NormRopeFwdIO& k, float eps, const Tensor& pos,
                          float theta);
void norm_rope_backward_qk(Context& ctx, ops::NormRopeBwdIO& q, ops::NormRopeBwdIO& k, const Tensor& pos, float theta);
void rope_forward(Context& ctx, const Tensor& x, const Tensor& pos, float theta, Tensor& y);
void rope_backward(Context& ctx, const Tensor& dy, const Tensor& pos, float theta, Tensor& dx);

// ---- attention -----------------------------------------------------------------------------
void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& out,
                       Tensor& lse);
void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv);

// ---- SwiGLU --------------------------------------------------------------------------------
void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h, const Tensor& row_w);
void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu);
void swiglu_backward_weighted(Context& ctx, const Tensor& gu, const Tensor& dh, const Tensor& row_w, Tensor& dgu,
                              Tensor& drow_w);

// ---- MoE router ----------------------------------------------------------------------------
void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs,
                 Tensor& topk_idx, Tensor& topk_w);
void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx,
                          const Tensor& topk_w, const Tensor& dtopk_w, const Tensor& dprobs_extra,
                          bool normalize, Tensor& dlogits, const Tensor& aux_counts = Tensor(),
                          int64_t aux_rows = 0, float aux_coef = 0.0f);
void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts,
                  Tensor& prob_sum, const Tensor& logits = Tensor(), Tensor* health = nullptr);
double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows);  // copies to host
void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef, Tensor& dprobs);
double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse);  // synchronizes
void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale,
                           Tensor& dlogits);

// ---- token permutation ---------------------------------------------------------------------
void moe_route_index(Context& ctx, const Tensor& topk_idx, int num_experts, Tensor& counts,
                     Tensor& offsets, Tensor& row_of, Tensor& token_of);
void moe_permute(Context& ctx, const Tensor& x, const Tensor& token_of, Tensor& xp);
void moe_permute_backward(Context& ctx, const Tensor& dxp, const Tensor& row_of, Tensor& dx);
void moe_unpermute(Context& ctx, const Tensor& yp, const Tensor& row_of, const Tensor& topk_w,
                   Tensor& y, const Tensor& residual);
void moe_unpermute_backward(Context& ctx, const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& topk_w, Tensor& dyp, Tensor& dtopk_w);
void moe_rows_from_picks(Context& ctx, const Tensor& picks, const Tensor& row_of, Tensor& rows);
void moe_picks_from_rows(Context& ctx, const Tensor& rows, const Tensor& row_of, Tensor& picks);

// ---- grouped expert GEMM (offsets read on the device; no host sync) ------------------------
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y);
void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dw,
                             Tensor* dw_sum_squares = nullptr);

// ---- cross-entropy -------------------------------------------------------------------------
void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels,
                           const Tensor& weights, Tensor& losses, Tensor& lse);
void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels,
                            const Tensor& weights, const Tensor& lse, float dloss_scale,
                            Tensor& dlogits);
double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     Reduction reduction, Tensor* dlogits);  // synchronizes

// ---- AdamW ---------------------------------------------------------------------------------
void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute);
void adamw_step_many(Context& ctx, std::vector<ops::AdamWTarget>& targets, const std::vector<Tensor>& grads);
// The dx half of grouped_matmul_backward (the same kernels), for grouped_matmul_backward_adamw.
void grouped_matmul_dx(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy,
                       Tensor& dx);
// The fused expert dW + AdamW on Hopper (ops::grouped_matmul_backward_adamw; grad_prior: the
// gradient to add to, or undefined); false, with nothing done, when this GPU or configuration has
// no fused kernel, or when the fused kernel is the slower choice (a bf16 master: see
// docs/design/kernels.md) unless `force` (tests, benchmarks). The caller then runs the two ops.
bool grouped_matmul_backward_adamw(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dy, Tensor& dx, DType grad_dtype, const Tensor& grad_prior,
                                   ops::AdamWTarget& target, Tensor* sum_squares, bool force = false);

}  // namespace moetrain::cuda
