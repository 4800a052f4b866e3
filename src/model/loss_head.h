// Loss head: logits = x W^T over the vocabulary and the per-token cross-entropy, run in token
// chunks so a micro-batch's [T,V] logits never exist at once (only one [rows,V] chunk in the
// compute dtype). Per chunk c: logits_c = x_c W^T; CE forward gives nll_c = lse_c - logit[label]
// and lse_c; with gradients asked for, dlogits_c = w_c (softmax - onehot) is written over logits_c,
// then dx_c = dlogits_c W and dW += dlogits_c^T x_c (f32, beta = 1). Same math as one big chunk.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace moetrain {

// Rows per chunk: `chunk_tokens` when > 0, else the fewest chunks of at most kCeChunkMaxRows rows
// whose logits fit `chunk_bytes` each in the compute dtype, split evenly over T (at least 1 row);
// never more than T. 1024 rows fill whole 128- and 256-row GEMM tiles, and at K = 1024 the tuned
// lm_head gradient GEMM keeps up with one over all T rows (docs/design/kernels.md, round 45): on an
// H200 the head at 1024-row chunks took 0.8-1.3 ms less per 4096 tokens than at 820 (5 chunks).
// With an f32 lm_head gradient (f32_grad) the default doubles both limits (2048 rows, 2 x chunk_bytes):
// every chunk after the first re-reads and rewrites the 4-byte [V, H] gradient, which at 1024 rows
// left that head 3-4% behind the unfused one and at 2048 rows level with it (round 52).
inline constexpr int64_t kCeChunkMaxRows = 1024;
int64_t loss_head_chunk_rows(int64_t T, int64_t V, DType dt, int64_t chunk_tokens, size_t chunk_bytes,
                             bool f32_grad = false);

struct LossHeadIO {
  Tensor nll;     // [T] f32 out: lse - logit[label] (unweighted), 0 where label == -100
  Tensor lse;     // [T] f32 out
  Tensor logits;  // [T,V] out when defined (then dlogits use a separate chunk buffer)
  Tensor dx;      // [T,H] out when defined: d(sum_t weights_t nll_t)/dx (overwritten)
  Tensor dw;      // [V,H] f32 or bf16, += when dx is defined
  bool dw_overwrite = false;  // dw = (instead of +=): the first chunk writes with beta 0
};

// x [T,H] (final-norm output), w [V,H] (lm_head or the tied embedding), labels [T] i32,
// weights [T] f32 (read only when gradients are asked for).
void loss_head(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& labels, const Tensor& weights,
               int64_t chunk_rows, LossHeadIO& io);

}  // namespace moetrain
