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
};

}  // namespace moetrain::cuda
