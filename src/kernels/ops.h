// ops.h: one backend-neutral signature per op, forward and backward. Each op checks shapes and
// dtypes, then dispatches on the tensors' device to cpu:: (the reference, fp32, trusted by the
// tests) or cuda:: (bf16 activations/weights, fp32 accumulation). Model code calls only these.
//
// Conventions
// - Row-major, contiguous inputs unless said otherwise. Shapes are written beside each argument.
// - T = tokens of one packed micro-batch, H = hidden, V = vocab, E = experts, k = top-k,
//   nh/nkv = query/kv heads, d = head dim, I = expert (or dense) intermediate width.
// - Outputs named d* that are parameter gradients ACCUMULATE (+=) in fp32; activation gradients
//   are overwritten unless the op says otherwise. Matrix-weight gradients (matmul's c with
//   beta = 1, grouped_matmul_backward's dw) may be bf16 (optimizer.main_grads_dtype): the sum is
//   formed in f32 from the old value and rounded to nearest even once per call.
// - Compute-dtype tensors ("act") are f32 on the CPU and bf16 (or f32) on CUDA; statistics that
//   feed backward (rstd, lse, probs) are always f32.
#pragma once
#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"

namespace moetrain::ops {

// ---- utilities -----------------------------------------------------------------------------
void cast(Context& ctx, const Tensor& src, Tensor& dst);       // same numel, float dtypes
// dst = src for 2-D matrices with unit-stride rows and row strides of their own (column blocks of
// wider matrices); same shape and dtype.
void copy_rows(Context& ctx, const Tensor& src, Tensor& dst);
void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha = 1.0f);  // y += alpha * x
void scale_(Context& ctx, Tensor& y, float alpha);             // y *= alpha
double sum_squares(Context& ctx, const Tensor& x);             // sum x^2 in fp64 (for norms)
// acc[0] += sum x^2 (x f32 or bf16), in fp64 on x's device with no host synchronization; a
// gradient norm over many tensors reads acc once. Deterministic (fixed-order partial sums).
void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc /*[1] f64*/);
// The same over a list (each f32 or bf16, one device): on CUDA a few launches for all of them, whose
// sum may differ from the one-by-one calls in the last bits (another order); on the CPU the calls.
void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc /*[1] f64*/);
// acc[0] += x[0] + ... + x[n-1] (x f64: sums of squares formed elsewhere), in a fixed order.
void sum_accumulate(Context& ctx, const Tensor& x /*[n] f64*/, Tensor& acc /*[1] f64*/);
// Fills with normal(mean, std): elements 2j and 2j+1 are the Box-Muller pair (cosine, sine
// value) of philox4x32(stream.key, stream.counter, j) (see philox_normal2), so the values depend
// only on the stream and the index (identical on CPU and CUDA up to libm).
void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream);

// ---- embedding -----------------------------------------------------------------------------
void embedding_forward(Context& ctx, const Tensor& table /*[V,H]*/, const Tensor& ids /*[T] i32*/,
                       Tensor& out /*[T,H]*/);
void embedding_backward(Context& ctx, const Tensor& ids /*[T] i32*/, const Tensor& dout /*[T,H]*/,
                        Tensor& dtable /*[V,H] f32, +=*/);

// ---- RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * w -------------------------
// Per-head norms (q_norm/k_norm) pass x viewed as [T*heads, d].
// x_copy (optional) receives a copy of x, made from the row loads the norm does anyway (the
// residual stream's copy that the attention output is added to).
void rmsnorm_forward(Context& ctx, const Tensor& x /*[R,D]*/, const Tensor& w /*[D]*/, float eps,
                     Tensor& y /*[R,D]*/, Tensor& rstd /*[R] f32*/, Tensor* x_copy /*[R,D]*/ = nullptr);
// dx_accumulate: dx += the norm's input gradient (the residual stream's gradient, summed in f32 and
// rounded once) instead of dx = it.
void rmsnorm_backward(Context& ctx, const Tensor& x /*[R,D]*/, const Tensor& w /*[D]*/,
                      const Tensor& rstd /*[R]*/, const Tensor& dy /*[R,D]*/, Tensor& dx /*[R,D]*/,
                      Tensor& dw /*[D] f32, +=*/, bool dx_accumulate = false);

// ---- GEMM: C[M,N] = alpha * op(A) * op(B) + beta * C ---------------------------------------
// c may be bf16 while a and b are f32 (a bf16 gradient on the CPU path): f32 sum, one rounding.
enum class Trans : uint8_t { kNo, kYes };
void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c,
            float alpha = 1.0f, float beta = 0.0f);

// ---- RoPE, rotate-half convention: dim i pairs with i + d/2; angle = pos * theta^(-2i/d) ----
void rope_forward(Context& ctx, const Tensor& x /*[T,heads,d]*/, const Tensor& pos /*[T] i32*/,
                  float theta, Tensor& y /*[T,heads,d]*/);
void rope_backward(Context& ctx, const Tensor& dy /*[T,heads,d]*/, const Tensor& pos /*[T] i32*/,
                   float theta, Tensor& dx /*[T,heads,d]*/);

// ---- Qwen3's q/k path fused: per-head RMSNorm over d, then RoPE -----------------------------
// x (and, backward, dx) may be a column block of a wider [T, n] matrix: [T, heads, d] with a token
// stride of its own (the fused q|k|v projection's output); the other tensors are contiguous.
// y = rope(rmsnorm(x, w, eps), pos); rstd [T*heads] as rmsnorm_forward's. The normed value is
// rounded to x's dtype before the rotation, as the two ops in sequence store it, so the result
// has the bits of rmsnorm_forward then rope_forward (on the CPU it is that pair).
void norm_rope_forward(Context& ctx, const Tensor& x /*[T,heads,d]*/, const Tensor& w /*[d]*/, float eps,
                       const Tensor& pos /*[T] i32*/, float theta, Tensor& y /*[T,heads,d]*/,
                       Tensor& rstd /*[T*heads] f32*/);
// dx = rmsnorm_backward(x, w, rstd, rope_backward(dy)) (the rotated gradient rounded to dy's dtype
// in between, as stored by the pair); dw += the norm weight's gradient. dx may alias dy.
void norm_rope_backward(Context& ctx, const Tensor& x /*[T,heads,d]*/, const Tensor& w /*[d]*/,
                        const Tensor& rstd /*[T*heads]*/, const Tensor& pos /*[T] i32*/, float theta,
                        const Tensor& dy /*[T,heads,d]*/, Tensor& dx /*[T,heads,d]*/, Tensor& dw /*[d] f32, +=*/);
// A layer's q and k in one call: exactly norm_rope_forward / norm_rope_backward on q, then on k (each
// side is checked as those ops check it). On CUDA the fused kernels run both in one grid, so the
// short k rows run beside the q rows instead of after them; so what one side writes must not
// overlap what the other reads (q and k column blocks of one q|k|v matrix are fine).
struct NormRopeFwdIO {
  Tensor x, w;     // [T,heads,d], [d]
  Tensor y, rstd;  // out: [T,heads,d], [T*heads] f32
};
struct NormRopeBwdIO {
  Tensor x, w, rstd, dy;  // as norm_rope_backward's
  Tensor dx, dw;          // out: dx (may alias dy), dw [d] f32 (+=)
};
void norm_rope_forward_qk(Context& ctx, NormRopeFwdIO& q, NormRopeFwdIO& k, float eps, const Tensor& pos /*[T] i32*/,
                          float theta);
void norm_rope_backward_qk(Context& ctx, NormRopeBwdIO& q, NormRopeBwdIO& k, const Tensor& pos /*[T] i32*/,
                           float theta);

// ---- causal GQA attention over packed documents ---------------------------------------------
// cu_seqlens [docs+1] i32: document start offsets, first 0, last T. A query attends keys of its
// own document at positions <= its own. Query head j reads kv head j / (nh / nkv).
// lse [nh, T] f32 is the log-sum-exp of the scaled scores, saved for backward.
void attention_forward(Context& ctx, const Tensor& q /*[T,nh,d]*/, const Tensor& k /*[T,nkv,d]*/,
                       const Tensor& v /*[T,nkv,d]*/, const Tensor& cu_seqlens, int max_seqlen,
                       float scale, Tensor& out /*[T,nh,d]*/, Tensor& lse /*[nh,T] f32*/);
void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout /*[T,nh,d]*/,
                        const Tensor& cu_seqlens, int max_seqlen, float scale,
                        Tensor& dq /*[T,nh,d]*/, Tensor& dk /*[T,nkv,d]*/, Tensor& dv /*[T,nkv,d]*/);

// ---- SwiGLU on a fused gate|up row: h = silu(gu[:, :I]) * gu[:, I:] --------------------------
// With row_w [N] f32, h[r] = row_w[r] * a[r], where a = silu(g) * u is first rounded to h's dtype
// (the MoE layer applies each pick's routing weight here, before the down projection).
void swiglu_forward(Context& ctx, const Tensor& gu /*[N,2I]*/, Tensor& h /*[N,I]*/,
                    const Tensor& row_w = Tensor() /*[N] f32 or undefined*/);
void swiglu_backward(Context& ctx, const Tensor& gu /*[N,2I]*/, const Tensor& dh /*[N,I]*/,
                     Tensor& dgu /*[N,2I]*/);
// Backward of the weighted form: dgu from row_w[r] * dh[r] (in f32, no rounding in between), and
// drow_w[r] = sum_c dh[r,c] * a[r,c] with a recomputed exactly as the forward rounded it.
void swiglu_backward_weighted(Context& ctx, const Tensor& gu /*[N,2I]*/, const Tensor& dh /*[N,I]*/,
                              const Tensor& row_w /*[N] f32*/, Tensor& dgu /*[N,2I]*/,
                              Tensor& drow_w /*[N] f32, overwritten*/);

// ---- MoE router ----------------------------------------------------------------------------
// probs = softmax(logits) in fp32; top-k by probability, ties broken by the lower expert index;
// weights = probs at the chosen experts, divided by their sum when `normalize`.
void router_topk(Context& ctx, const Tensor& logits /*[T,E] f32*/, int k, bool normalize,
                 Tensor& probs /*[T,E] f32*/, Tensor& topk_idx /*[T,k] i32*/,
                 Tensor& topk_w /*[T,k] f32*/);
// dlogits = d/dlogits of (sum dtopk_w * topk_w + sum dprobs_extra * probs); dprobs_extra may be
// undefined. With aux_counts, every row's dprobs also gets aux_loss_backward's row (the aux-loss
// gradient, the same bits as adding it into dprobs_extra first, without a [T,E] buffer).
void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx,
                          const Tensor& topk_w, const Tensor& dtopk_w /*[T,k]*/,
                          const Tensor& dprobs_extra /*[T,E] or undefined*/, bool normalize,
                          Tensor& dlogits /*[T,E] f32*/, const Tensor& aux_counts /*[E] f32 or undefined*/ = Tensor(),
                          int64_t aux_rows = 0, float aux_coef = 0.0f);

// Load-balancing statistics of one layer, accumulated: counts[e] += number of (token, slot)
// picks of e; prob_sum[e] += sum over tokens of probs[:, e]. With the logits the probabilities
// came from, also the router's health sums, overwritten: health[0] = sum over tokens of
// logsumexp(logits[t]), health[1] = sum over tokens and experts of probs * logits (the mean
// entropy is their difference over T).
void router_stats(Context& ctx, const Tensor& probs /*[T,E]*/, const Tensor& topk_idx /*[T,k]*/,
                  Tensor& counts /*[E] f32, +=*/, Tensor& prob_sum /*[E] f32, +=*/,
                  const Tensor& logits /*[T,E] f32 or undefined*/ = Tensor(),
                  Tensor* health /*[2] f32, =; with logits*/ = nullptr);
// aux = E * sum_e (counts[e] / N) * (prob_sum[e] / N), N = rows the stats cover (HF form when
// stats span all layers; Megatron per-layer form when per layer). Host math on [E] values.
double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows);
// d aux / d probs[t,e] = coef * E * counts[e] / N^2, the same for every row: dprobs += that row.
void aux_loss_backward(Context& ctx, const Tensor& counts /*[E]*/, int64_t rows, float coef,
                       Tensor& dprobs /*[T,E] f32, +=*/);
// Router z-loss (ST-MoE): z = sum over tokens of logsumexp(logits)^2 (caller divides by the
// token count); backward adds scale * 2 * lse[t] * softmax(logits)[t] to dlogits.
double router_zloss_forward(Context& ctx, const Tensor& logits /*[T,E] f32*/, Tensor& lse /*[T] f32*/);
void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale,
                           Tensor& dlogits /*[T,E] f32, +=*/);

// ---- token permutation into expert-contiguous order -----------------------------------------
// counts [E] i32, offsets [E+1] i32 (exclusive prefix sums), row_of [T*k] i32: the permuted row of
// pick (t, j) (flat t*k+j); token_of [T*k] i32: the token of each permuted row. Within an expert,
// rows are in ascending flat pick order (stable, deterministic).
void moe_route_index(Context& ctx, const Tensor& topk_idx /*[T,k] i32*/, int num_experts,
                     Tensor& counts, Tensor& offsets, Tensor& row_of, Tensor& token_of);
void moe_permute(Context& ctx, const Tensor& x /*[T,H]*/, const Tensor& token_of /*[T*k]*/,
                 Tensor& xp /*[T*k,H]*/);
void moe_permute_backward(Context& ctx, const Tensor& dxp /*[T*k,H]*/, const Tensor& row_of /*[T*k]*/,
                          Tensor& dx /*[T,H], overwritten*/);
// y[t] = sum_j topk_w[t,j] * yp[row_of[t*k+j]] (+ residual[t] when given, added in f32 after the sum,
// with one rounding: the layer output h + FFN(b) without a separate add). An undefined topk_w
// weighs every row 1 (k = rows / T): the MoE layer, whose weights went in before the experts.
void moe_unpermute(Context& ctx, const Tensor& yp /*[T*k,H]*/, const Tensor& row_of,
                   const Tensor& topk_w /*[T,k] f32 or undefined*/, Tensor& y /*[T,H]*/,
                   const Tensor& residual = Tensor() /*[T,H], y's dtype*/);
void moe_unpermute_backward(Context& ctx, const Tensor& dy /*[T,H]*/, const Tensor& yp,
                            const Tensor& row_of, const Tensor& topk_w, Tensor& dyp /*[T*k,H]*/,
                            Tensor& dtopk_w /*[T,k] f32*/);
// A per-pick f32 value into permuted-row order and back: rows[row_of[p]] = picks[p] and
// picks[p] = rows[row_of[p]] (the routing weights for swiglu_forward, their gradient back).
void moe_rows_from_picks(Context& ctx, const Tensor& picks /*[T,k] f32*/, const Tensor& row_of /*[T*k]*/,
                         Tensor& rows /*[T*k] f32*/);
void moe_picks_from_rows(Context& ctx, const Tensor& rows /*[T*k] f32*/, const Tensor& row_of /*[T*k]*/,
                         Tensor& picks /*[T,k] f32*/);

// ---- grouped expert GEMM: y[r] = x[r] W[e]^T for rows r in [offsets[e], offsets[e+1]) ----------
// offsets live on the tensors' device (no host synchronization needed by the caller).
void grouped_matmul(Context& ctx, const Tensor& x /*[N,K]*/, const Tensor& w /*[E,M,K]*/,
                    const Tensor& offsets /*[E+1] i32*/, Tensor& y /*[N,M]*/);
// dx = dy W[e] (skipped when dx is undefined); dw[e] += dy_e^T x_e. dw is f32 or bf16; a bf16
// dw[e] is widened, the product added in f32, and rounded to nearest even once per call
// (experts with no rows are left untouched).
void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy /*[N,M]*/, Tensor& dx /*[N,K]*/,
                             Tensor& dw /*[E,M,K] f32|bf16, +=*/, bool accumulate_dw = true,
                             Tensor* dw_sum_squares = nullptr /*[1] f64, +=*/);
// accumulate_dw = false overwrites instead: dw[e] = dy_e^T x_e, and zeros for experts without rows
// (the first micro-batch of a step, so the gradient needs no zeroing and no read).
// dw_sum_squares: when given, the sum of squares of dw's final values (as stored) is added to it,
// as sum_squares_accumulate(dw) would (the gradient norm, without a second read of dw on Hopper).

// ---- cross-entropy over a large vocabulary ------------------------------------------------
// losses[t] = weights[t] * (lse[t] - logits[t, labels[t]]), 0 where labels[t] == -100.
// weights may be undefined (all ones); they carry loss masks and the 1/N of a mean.
void cross_entropy_forward(Context& ctx, const Tensor& logits /*[T,V]*/, const Tensor& labels /*[T] i32*/,
                           const Tensor& weights /*[T] f32 or undefined*/, Tensor& losses /*[T] f32*/,
                           Tensor& lse /*[T] f32*/);
// dlogits[t] = dloss_scale * weights[t] * (softmax(logits[t]) - onehot(labels[t])); 0 if ignored.
void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels,
                            const Tensor& weights, const Tensor& lse, float dloss_scale,
                            Tensor& dlogits /*[T,V]*/);
enum class Reduction : uint8_t { kMean, kSum };
// Convenience: loss over positions with label != -100 and mask != 0 (mask [T] u8 or undefined),
// reduced by mean (over those positions) or sum; writes dlogits when defined.
double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     Reduction reduction, Tensor* dlogits);

// ---- AdamW (decoupled weight decay) ----------------------------------------------------------
struct AdamWParams {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1-based, for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient first (clipping)
  // bf16 master only: round the new weight stochastically with the 16-bit half i % 8 of the 7-round
  // Philox call (rng.key, rng.counter, i / 8) for element i (adamw_math::random_word; else round to
  // nearest even).
  bool stochastic_rounding = false;
  RngStream rng;
};
// master: the main weights, updated in place, f32 or bf16 (bf16 = no fp32 master copy). grad,
// m, v: same element count, each f32 or bf16; math in f32 (kernels/adamw_math.h), bf16 m/v
// stored rounded to nearest even. When `compute` is defined (f32 or bf16, a separate tensor), it
// receives the stored new weights in its dtype. CPU and CUDA give identical bits.
void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute);

// ---- expert backward with the AdamW update (optimizer.update_in_backward) --------------------
// One parameter's AdamW state and settings for a step (adamw_step's arguments, grad aside).
struct AdamWTarget {
  Tensor master, m, v, compute;  // compute: undefined when the weights are their own master
  AdamWParams params;
};
// adamw_step for many parameters at once: targets[i] with grads[i], in any order (the updates are
// independent: no two masters may share memory), the same bits as one adamw_step call each. On CUDA the tensors of one storage-type
// combination share launches (up to 24 per launch), so a small tensor (a norm's weight) does not
// pay a kernel launch of its own.
void adamw_step_many(Context& ctx, std::vector<AdamWTarget>& targets, const std::vector<Tensor>& grads);
// grouped_matmul_backward whose weight gradient goes straight into AdamW: dx as there, then
// g = dy_e^T x_e (+ grad when accumulate, summed in f32), rounded to grad_dtype (f32 or bf16) as
// if stored, and adamw_step(target.master, g, target.m, target.v, target.params, target.compute)
// with it. The bits equal that pair of calls. grad: the gradient buffer (grad_dtype, w's shape),
// read when accumulate (earlier micro-batches' sum); afterwards it holds this step's gradient (two-op
// path) or is left as it was (fused path), so treat it as scratch. It may be undefined when not
// accumulating (a workspace tensor is taken if the two-op path needs one). On Hopper with an f32
// master the dW kernel's epilogue applies the update and the gradient never reaches memory
// (docs/design/kernels.md, "AdamW in the dW epilogue"). target.master may be w itself (bf16
// weights without a master copy): dx is formed first. sum_squares: += the sum of squares of g as
// stored (the gradient norm). Experts without rows still get their update (g = prior or 0).
void grouped_matmul_backward_adamw(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dy, Tensor& dx, DType grad_dtype, Tensor& grad, bool accumulate,
                                   AdamWTarget& target, Tensor* sum_squares = nullptr);

}  // namespace moetrain::ops
