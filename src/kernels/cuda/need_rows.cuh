// need_cuda for operands whose rows (dim 0) may have a stride of their own: contiguous inside a row
// (a column block of a wider matrix, such as the fused q|k|v projection's q, k, v and gradients).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

inline void need_cuda_rows(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "[{}] {} is undefined", op, name);
  MT_CHECK(t.device().is_cuda(), "[{}] {} is on {}, expected a CUDA tensor", op, name, t.device().str());
  bool inner = t.dim() >= 1;
  int64_t acc = 1;
  for (int i = t.dim() - 1; inner && i >= 1; --i) {
    inner = t.size(i) == 1 || t.stride(i) == acc;
    acc *= t.size(i);
  }
  MT_CHECK(inner, "[{}] {} ({}) must be contiguous within its rows", op, name, t.desc());
}

// For kernels that read or write packed rows. packed_rows: t itself when packed, else a packed
// workspace copy of t (rows of a [T, ...] tensor whose rows have a stride of their own).
// packed_like: t itself when packed, else an uninitialized packed workspace tensor of its shape, which
// copy_back then copies into t (nothing when it is t).
inline Tensor rows_2d(const Tensor& t) { return t.view({t.size(0), t.size(0) ? t.numel() / t.size(0) : 0}); }
inline Tensor packed_like(const Tensor& t) {
  return t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device(), MemCategory::kWorkspace);
}
inline Tensor packed_rows(Context& ctx, const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor p = packed_like(t);
  Tensor dst = rows_2d(p);
  copy_rows(ctx, rows_2d(t), dst);
  return p;
}
inline void copy_back(Context& ctx, const Tensor& buf, Tensor& t) {
  if (buf.data_ptr() == t.data_ptr()) return;
  Tensor dst = rows_2d(t);
  copy_rows(ctx, rows_2d(buf), dst);
}

}  // namespace moetrain::cuda
