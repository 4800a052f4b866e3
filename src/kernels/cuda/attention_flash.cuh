// Fast bf16 tensor-core causal GQA attention (attention_flash.cu), called by attention.cu when
// flash_attention_supported(); the simple fp32 kernels remain the fallback. Raw device pointers;
// cu_seqlens [ndocs+1] i32 is read on the device only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

#include "core/context.h"
#include "kernels/cuda/attention_flash_problem.cuh"

namespace moetrain::cuda {

// Head dim 64 or 128 and every pointer 16-byte aligned.
bool flash_attention_supported(int64_t d, std::initializer_list<const void*> ptrs);
// Whether this device's kernels take token strides other than packed (FlashAttnProblem::v_row etc.).
bool flash_attention_strided_ok(const Context& ctx, std::initializer_list<int64_t> strides);
// out [T, nh, d] bf16, lse [nh, T] f32 (natural log of the scaled scores' sum of exponentials).
void flash_attention_forward(Context& ctx, const FlashAttnProblem& p, __nv_bfloat16* out, float* lse);
// dq [T, nh, d], dk/dv [T, nkv, d] bf16; bitwise deterministic unless MT_ATTN_NONDETERMINISTIC=1
// (sm90 only); uses device workspace.
void flash_attention_backward(Context& ctx, const FlashAttnProblem& p, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* dout, __nv_bfloat16* dq,
                              __nv_bfloat16* dk, __nv_bfloat16* dv);

}  // namespace moetrain::cuda
