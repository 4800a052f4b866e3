// need_cuda for operands whose rows (dim 0) may have a stride of their own: contiguous inside a row
// (a column block of a wider matrix, such as the fused q|k|v projection's q, k, v and gradients).
#pragma once
#include "kernels/cuda/common.cuh"

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

}  // namespace moetrain::cuda
