// Chunked lm_head + cross-entropy (see loss_head.h). Memory: one [rows,V] buffer in the compute
// dtype (workspace) holds a chunk's logits and then, in place, its dlogits; a second one only
// when the caller keeps the full logits. Numerics: logits and dlogits are stored in the compute
// dtype (bf16 on CUDA), CE math and the dW accumulation are f32.
#include "model/loss_head.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/ops.h"

namespace moetrain {

using ops::Trans;

int64_t loss_head_chunk_rows(int64_t T, int64_t V, DType dt, int64_t chunk_tokens, size_t chunk_bytes,
                             bool f32_grad) {
  int64_t rows = chunk_tokens;
  if (rows <= 0) {
    const size_t row_bytes = static_cast<size_t>(std::max<int64_t>(V, 1)) * dtype_size(dt);
    const int64_t scale = f32_grad ? 2 : 1;
    rows = std::clamp<int64_t>(static_cast<int64_t>(scale * chunk_bytes / row_bytes), 1, scale * kCeChunkMaxRows);
    if (T > 0) {  // the fewest chunks that fit, made equal (no short last chunk)
      const int64_t n = (T + rows - 1) / rows;
      rows = (T + n - 1) / n;
    }
  }
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(T, 1));
}

void loss_head(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& labels, const Tensor& weights,
               int64_t chunk_rows, LossHeadIO& io) {
  MT_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "[loss_head] x {} and lm_head {} do not match",
           x.desc(), w.desc());
  const int64_t T = x.size(0), V = w.size(0), H = x.size(1);
  const bool grad = io.dx.defined();
  check_shape(io.nll, {T}, "loss_head", "nll");
  check_shape(io.lse, {T}, "loss_head", "lse");
  if (io.logits.defined()) check_shape(io.logits, {T, V}, "loss_head", "logits");
  if (grad) {
    check_shape(io.dx, {T, H}, "loss_head", "dx");
    check_shape(io.dw, {V, H}, "loss_head", "dw");
    check_shape(weights, {T}, "loss_head", "weights");
  }
  MT_CHECK(chunk_rows >= 1, "[loss_head] chunk_rows = {} must be >= 1", chunk_rows);
  if (T == 0) return;
  const int64_t rows = std::min(chunk_rows, T);
  Tensor buf, dbuf;  // [rows,V] compute dtype
  if (!io.logits.defined()) buf = Tensor::empty({rows, V}, x.dtype(), x.device(), MemCategory::kWorkspace);
  if (grad && io.logits.defined()) dbuf = Tensor::empty({rows, V}, x.dtype(), x.device(), MemCategory::kWorkspace);

  for (int64_t r0 = 0; r0 < T; r0 += rows) {
    const int64_t r1 = std::min(T, r0 + rows), n = r1 - r0;
    const Tensor xc = x.slice(0, r0, r1);
    Tensor lc = io.logits.defined() ? io.logits.slice(0, r0, r1) : buf.slice(0, 0, n);
    ops::matmul(ctx, xc, Trans::kNo, w, Trans::kYes, lc);  // [n,H] x [H,V]
    const Tensor lab = labels.slice(0, r0, r1);
    Tensor nll = io.nll.slice(0, r0, r1), lse = io.lse.slice(0, r0, r1);
    ops::cross_entropy_forward(ctx, lc, lab, Tensor(), nll, lse);
    if (!grad) continue;
    // dlogits overwrite the chunk's logits (each element is read once, then written).
    Tensor dc = io.logits.defined() ? dbuf.slice(0, 0, n) : lc;
    ops::cross_entropy_backward(ctx, lc, lab, weights.slice(0, r0, r1), lse, 1.0f, dc);
    Tensor dxc = io.dx.slice(0, r0, r1);
    ops::matmul(ctx, dc, Trans::kNo, w, Trans::kNo, dxc);                 // [n,V] x [V,H]
    const float beta = io.dw_overwrite && r0 == 0 ? 0.0f : 1.0f;
    ops::matmul(ctx, dc, Trans::kYes, xc, Trans::kNo, io.dw, 1.0f, beta);  // [V,n] x [n,H], +=
  }
}

}  // namespace moetrain
