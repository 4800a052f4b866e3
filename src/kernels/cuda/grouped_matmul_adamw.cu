// cuda::grouped_matmul_backward_adamw: the expert backward whose weight gradient goes straight into
// AdamW (optimizer.update_in_backward). On cc 9.0 the TMA dW kernel applies the update in its
// epilogue (grouped_gemm_ws_dw_adamw.cuh): the gradient never reaches memory. Elsewhere, or for
// precision mixes that kernel does not take, it returns false and ops:: runs the two ops.
#include "core/env.h"
#include "kernels/adamw_math.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/grouped_gemm_ws.cuh"
#include "kernels/cuda/grouped_gemm_ws_dw_adamw.cuh"

namespace moetrain::cuda {

bool grouped_matmul_backward_adamw(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dy, Tensor& dx, DType grad_dtype, const Tensor& grad_prior,
                                   ops::AdamWTarget& t, Tensor* sum_squares, bool force) {
  // MT_FUSED_ADAMW (read once): 0 keeps the two-op path; 1 (default) fuses whenever the kernel
  // supports the settings (f32 master and moments, or all-bf16: both measured faster inside the step
  // on the H100 since round 6; the planner assumes the same, plan/plan_memory.cpp). 2 is the same as 1
  // (kept for scripts). MT_GEMM_KERNEL=wgmma: off.
  static const int mode = env_string("MT_GEMM_KERNEL", "ws") == "wgmma" ? 0 : static_cast<int>(env_int("MT_FUSED_ADAMW", 1));
  if (!force && mode == 0) return false;
  if (x.dtype() != DType::kBF16 || w.dtype() != DType::kBF16 || dy.dtype() != DType::kBF16) return false;
  if (w.dim() != 3 || x.dim() != 2 || offsets.numel() != w.size(0) + 1) return false;
  const int64_t E = w.size(0), M = w.size(1), K = w.size(2), N = x.size(0);
  if (N == 0 || E > INT32_MAX) return false;
  if (!grouped_gemm_ws_supported(ctx, N, K, M, E, x.data_ptr(), dy.data_ptr(), x.data_ptr())) return false;
  if (dx.defined() && (dx.dtype() != DType::kBF16 || !grouped_gemm_ws_supported(ctx, N, K, M, E, dy.data_ptr(),
                                                                                 w.data_ptr(), dx.data_ptr())))
    return false;
  const ops::AdamWParams& p = t.params;
  gwd::DwAdamWArgs a;
  a.master = t.master.data_ptr();
  a.master_bf16 = t.master.dtype() == DType::kBF16;
  a.m = t.m.data_ptr();
  a.m_bf16 = t.m.dtype() == DType::kBF16;
  a.v = t.v.data_ptr();
  a.v_bf16 = t.v.dtype() == DType::kBF16;
  if (t.compute.defined()) {
    a.compute = t.compute.data_ptr();
    a.compute_bf16 = t.compute.dtype() == DType::kBF16;
  }
  a.grad_bf16 = grad_dtype == DType::kBF16;
  a.prior = grad_prior.defined() ? grad_prior.data_ptr() : nullptr;
  a.k = adamw_math::make_consts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale);
  a.sr = p.stochastic_rounding && a.master_bf16;
  a.key = p.rng.key;
  a.counter = p.rng.counter;
  if (!gwd::dw_adamw_supported(ctx, static_cast<int>(E), N, K, M, a)) return false;
  if (dx.defined()) grouped_matmul_dx(ctx, x, w, offsets, dy, dx);  // before the update may overwrite w
  const int64_t tiles = gwd::dw_adamw_tiles(static_cast<int>(E), K, M, a.grad_bf16);
  Tensor partial;
  double* part = nullptr;
  if (sum_squares) {
    partial = device_scratch(ctx, tiles * 8);
    part = static_cast<double*>(partial.data_ptr());
  }
  // MT_DW_ADAMW_VARIANT (read once; benchmarks): dispatch_dw_adamw's variant bits, same results.
  static const int variant = [] {
    const long v = env_int("MT_DW_ADAMW_VARIANT", 0);
    MT_CHECK(v >= 0 && v < 32 && v % 4 == 0, "[grouped_matmul_backward_adamw] MT_DW_ADAMW_VARIANT={}: "
             "expected a sum of 4, 8 and 16 (or 0)", v);
    return static_cast<int>(v);
  }();
  gwd::dispatch_dw_adamw(ctx, static_cast<const __nv_bfloat16*>(x.data_ptr()),
                         static_cast<const __nv_bfloat16*>(dy.data_ptr()), offsets.data<int32_t>(),
                         static_cast<int>(E), N, K, M, a, part, variant);
  check_launch("grouped_matmul_backward_adamw");
  if (sum_squares) add_partials_into(ctx, part, tiles, static_cast<double*>(sum_squares->data_ptr()));
  return true;
}

}  // namespace moetrain::cuda
