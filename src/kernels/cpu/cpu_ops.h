// CPU reference kernels behind ops.h (namespace moetrain::cpu): fp32 math with double
// accumulators where cheap, multi-threaded only over independent outputs so results never depend
// on the thread count. Signatures mirror ops.h one for one; ops.cpp has already checked shapes,
// devices and index dtypes, and these functions check that float tensors are f32 (the CPU path
// computes in f32 only) and that index values are in range.
#pragma once
#include <vector>
#include <cstdint>
#include <initializer_list>

#include "core/context.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace moetrain::cpu {

using ops::AdamWParams;
using ops::Trans;

// "[op] name is bf16; the CPU backend computes in f32 only" unless t is f32.
void require_f32(const Tensor& t, const char* op, const char* name);
struct Named {
  const Tensor& t;
  const char* name;
};
void require_f32(const char* op, std::initializer_list<Named> tensors);

// ---- utilities (utilities.cpp) --------------------------------------------------------------
void cast(Context& ctx, const Tensor& src, Tensor& dst);
void copy_rows(Context& ctx, const Tensor& src, Tensor& dst);
void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha);
void scale_(Context& ctx, Tensor& y, float alpha);
double sum_squares(Context& ctx, const Tensor& x);
// acc[0] += the same fixed-block fp64 sum as sum_squares, for f32 or bf16 x.
void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc);
void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc);
void sum_accumulate(Context& ctx, const Tensor& x, Tensor& acc);
// Element i = mean + std * z_i, where (z_{2j}, z_{2j+1}) is the Box-Muller pair of
// philox4x32(stream.key, stream.counter, j): even i takes the cosine (first) value, odd i the
// sine (second) one. Values depend only on (stream, i).
void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream);

// ---- embedding.cpp --------------------------------------------------------------------------
void embedding_forward(Context& ctx, const Tensor& table, const Tensor& ids, Tensor& out);
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable);

// ---- rmsnorm.cpp ----------------------------------------------------------------------------
void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                     Tensor& rstd, Tensor* x_copy = nullptr);
void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dy, Tensor& dx, Tensor& dw, bool dx_accumulate);

// ---- matmul.cpp -----------------------------------------------------------------------------
void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c,
            float alpha, float beta);

void norm_rope_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& pos, float theta,
                       Tensor& y, Tensor& rstd);
void norm_rope_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                        float theta, const Tensor& dy, Tensor& dx, Tensor& dw);
void norm_rope_forward_qk(Context& ctx, ops::NormRopeFwdIO& q, ops::NormRopeFwdIO& k, float eps, const Tensor& pos,
                          float theta);
void norm_rope_backward_qk(Context& ctx, ops::NormRopeBwdIO& q, ops::NormRopeBwdIO& k, const Tensor& pos, float theta);
// ---- rope.cpp -------------------------------------------------------------------------------
// Angles follow Hugging Face's fp32 recipe: inv_freq_i = 1 / powf(theta, float(2i) / float(d)),
// angle = float(pos) * inv_freq_i (one fp32 product), cos/sin of that fp32 angle.
void rope_forward(Context& ctx, const Tensor& x, const Tensor& pos, float theta, Tensor& y);
void rope_backward(Context& ctx, const Tensor& dy, const Tensor& pos, float theta, Tensor& dx);

// ---- attention.cpp --------------------------------------------------------------------------
void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& out,
                       Tensor& lse);
void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv);

// ---- swiglu.cpp -----------------------------------------------------------------------------
void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h, const Tensor& row_w);
void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu);
void swiglu_backward_weighted(Context& ctx, const Tensor& gu, const Tensor& dh, const Tensor& row_w, Tensor& dgu,
                              Tensor& drow_w);

// ---- router.cpp -----------------------------------------------------------------------------
void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs,
                 Tensor& topk_idx, Tensor& topk_w);
void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx,
                          const Tensor& topk_w, const Tensor& dtopk_w, const Tensor& dprobs_extra,
                          bool normalize, Tensor& dlogits, const Tensor& aux_counts = Tensor(),
                          int64_t aux_rows = 0, float aux_coef = 0.0f);
void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts,
                  Tensor& prob_sum, const Tensor& logits = Tensor(), Tensor* health = nullptr);
double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows);
void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef,
                       Tensor& dprobs);
double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse);
void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale,
                           Tensor& dlogits);

// ---- moe_permute.cpp ------------------------------------------------------------------------
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

// ---- grouped_matmul.cpp ---------------------------------------------------------------------
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y);
void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dw,
                             Tensor* dw_sum_squares = nullptr);

// ---- cross_entropy.cpp ----------------------------------------------------------------------
void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels,
                           const Tensor& weights, Tensor& losses, Tensor& lse);
void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels,
                            const Tensor& weights, const Tensor& lse, float dloss_scale,
                            Tensor& dlogits);
// Mean/sum over positions with label != -100 and mask != 0, built on the two kernels above.
double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     ops::Reduction reduction, Tensor* dlogits);

// ---- adamw.cpp ------------------------------------------------------------------------------
void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute);
void adamw_step_many(Context& ctx, std::vector<ops::AdamWTarget>& targets, const std::vector<Tensor>& grads);

}  // namespace moetrain::cpu
