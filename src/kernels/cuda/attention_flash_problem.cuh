// The shape and inputs of one fast-attention call (attention_flash.cu), shared by the op, the
// launchers (attention_flash_launch.cuh) and the standalone GPU harness. Raw device pointers.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace moetrain::cuda {

struct FlashAttnProblem {
  const __nv_bfloat16* q;  // [T, nh, d]
  const __nv_bfloat16* k;  // [T, nkv, d]
  const __nv_bfloat16* v;  // [T, nkv, d]
  const int32_t* cu;       // [ndocs + 1], read on the device only
  int64_t T, nh, nkv, d;
  int ndocs;
  float scale;
  // Token strides in elements; 0: packed ([T, heads, d]). Only the sm90 kernels take others (v read
  // through its TMA map, dq / dk / dv written by the backward's finish kernel): the fused q|k|v
  // projection's column blocks. flash::strided_ok says when.
  int64_t v_row = 0, dq_row = 0, dk_row = 0, dv_row = 0;
};

}  // namespace moetrain::cuda
