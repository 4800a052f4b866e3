// Fast bf16 causal GQA attention over packed documents on tensor cores: the op-level entry points.
// The kernels live in attention_flash_sm90_ws.cuh (TMA + wgmma, used on compute capability 9.0) and
// attention_flash_sm80.cuh (mma.sync, elsewhere); attention_flash_launch.cuh launches them.
// MT_ATTN_ARCH=sm80 forces the mma.sync kernels (read once). Both paths are deterministic unless
// MT_ATTN_NONDETERMINISTIC=1 (read once) lets the sm90 backward add dQ partials in arrival order.
#include "kernels/cuda/attention_flash.cuh"

#include <algorithm>
#include <string>

#include "core/env.h"
#include "kernels/cuda/attention_flash_launch.cuh"
#include "kernels/cuda/common.cuh"

namespace moetrain::cuda {

namespace {

flash::Arch arch_of(const Context& ctx) {
  static const bool force_sm80 = env_string("MT_ATTN_ARCH", "") == "sm80";
  const DeviceFacts& f = ctx.facts();
  return !force_sm80 && f.cc_major == 9 && f.cc_minor == 0 ? flash::Arch::kSm90 : flash::Arch::kSm80;
}

bool deterministic() {
  static const bool det = env_int("MT_ATTN_NONDETERMINISTIC", 0) == 0;
  return det;
}

void check(cudaError_t e, const char* op) {
  MT_CHECK(e == cudaSuccess, "[{}] flash attention launch failed: {}", op, cudaGetErrorString(e));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The query-tile kernels launch one grid row per 128 queries (gridDim.y <= 65535).
void check_tokens(const FlashAttnProblem& p, const char* op) {
  constexpr int bm = std::min(flash::kFwdBM, flash::kWgBM);
  MT_CHECK(flash::query_grid_ok(p.T, bm),
           "[{}] {} tokens in one micro-batch: the flash attention kernels take at most {} (65535 tiles of {} "
           "queries); use a shorter sequence or a smaller micro-batch",
           op, p.T, int64_t{65535} * bm, bm);
}

}  // namespace

bool flash_attention_supported(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d != 64 && d != 128) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

bool flash_attention_strided_ok(const Context& ctx, std::initializer_list<int64_t> strides) {
  return flash::strided_ok(arch_of(ctx), strides);
}

void flash_attention_forward(Context& ctx, const FlashAttnProblem& p, __nv_bfloat16* out, float* lse) {
  check_tokens(p, "attention_forward");
  check(flash::forward(p, out, lse, arch_of(ctx), stream_of(ctx)), "attention_forward");
}

void flash_attention_backward(Context& ctx, const FlashAttnProblem& p, const __nv_bfloat16* out, const float* lse,
                              const __nv_bfloat16* dout, __nv_bfloat16* dq, __nv_bfloat16* dk,
                              __nv_bfloat16* dv) {
  const flash::Arch arch = arch_of(ctx);
  const int sms = ctx.facts().sm_count;
  check_tokens(p, "attention_backward");
  Tensor scratch = device_scratch(ctx, static_cast<int64_t>(flash::backward_workspace_bytes(p, arch, sms)));
  check(flash::backward(p, out, lse, dout, dq, dk, dv, scratch.data_ptr(), arch, sms, deterministic(),
                        stream_of(ctx)),
        "attention_backward");
}

}  // namespace moetrain::cuda
