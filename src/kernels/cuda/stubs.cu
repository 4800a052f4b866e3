// Temporary stubs: every CUDA op not implemented yet fails with a clear message.
// Each definition moves to its real .cu file as it lands; this file disappears at the end.
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

















void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs,
                 Tensor& topk_idx, Tensor& topk_w) {
  MT_FAIL("[router_topk] not implemented on CUDA yet");
}

void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx,
                          const Tensor& topk_w, const Tensor& dtopk_w, const Tensor& dprobs_extra,
                          bool normalize, Tensor& dlogits) {
  MT_FAIL("[router_topk_backward] not implemented on CUDA yet");
}

void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts,
                  Tensor& prob_sum) {
  MT_FAIL("[router_stats] not implemented on CUDA yet");
}

double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows) {
  MT_FAIL("[aux_loss_value] not implemented on CUDA yet");
}

void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef, Tensor& dprobs) {
  MT_FAIL("[aux_loss_backward] not implemented on CUDA yet");
}

double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse) {
  MT_FAIL("[router_zloss_forward] not implemented on CUDA yet");
}

void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale,
                           Tensor& dlogits) {
  MT_FAIL("[router_zloss_backward] not implemented on CUDA yet");
}

void moe_route_index(Context& ctx, const Tensor& topk_idx, int num_experts, Tensor& counts,
                     Tensor& offsets, Tensor& row_of, Tensor& token_of) {
  MT_FAIL("[moe_route_index] not implemented on CUDA yet");
}

void moe_permute(Context& ctx, const Tensor& x, const Tensor& token_of, Tensor& xp) {
  MT_FAIL("[moe_permute] not implemented on CUDA yet");
}

void moe_permute_backward(Context& ctx, const Tensor& dxp, const Tensor& row_of, Tensor& dx) {
  MT_FAIL("[moe_permute_backward] not implemented on CUDA yet");
}

void moe_unpermute(Context& ctx, const Tensor& yp, const Tensor& row_of, const Tensor& topk_w,
                   Tensor& y) {
  MT_FAIL("[moe_unpermute] not implemented on CUDA yet");
}

void moe_unpermute_backward(Context& ctx, const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& topk_w, Tensor& dyp, Tensor& dtopk_w) {
  MT_FAIL("[moe_unpermute_backward] not implemented on CUDA yet");
}

void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y) {
  MT_FAIL("[grouped_matmul] not implemented on CUDA yet");
}

void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw) {
  MT_FAIL("[grouped_matmul_backward] not implemented on CUDA yet");
}

void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels,
                           const Tensor& weights, Tensor& losses, Tensor& lse) {
  MT_FAIL("[cross_entropy_forward] not implemented on CUDA yet");
}

void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels,
                            const Tensor& weights, const Tensor& lse, float dloss_scale,
                            Tensor& dlogits) {
  MT_FAIL("[cross_entropy_backward] not implemented on CUDA yet");
}

double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     Reduction reduction, Tensor* dlogits) {
  MT_FAIL("[cross_entropy] not implemented on CUDA yet");
}


}  // namespace moetrain::cuda
