// CUDA rotary position embedding, rotate-half convention (HF Qwen3): dim i pairs with i + d/2,
//   y[i] = x[i] cos - x[i+d/2] sin,   y[i+d/2] = x[i+d/2] cos + x[i] sin;  backward: angle -> -angle.
// Angles follow the CPU/HF fp32 recipe exactly: inv_freq computed on the host with the same
// expression, angle = float(pos) * inv_freq (one fp32 product), cos/sin evaluated in double.
// In place (y aliasing x) is allowed: each thread reads its pair before writing it.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

constexpr int kMaxHalf = 512;  // head dim up to 1024

struct InvFreq {
  float v[kMaxHalf];
};

template <typename S, typename D>
__global__ void rope_kernel(const S* __restrict__ src, const int32_t* __restrict__ pos, const InvFreq inv,
                            float sign, D* dst, int64_t heads, int64_t d) {
  pdl_wait();
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x, half = d / 2;
  const float p = static_cast<float>(pos[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = p * inv.v[i];
    cs[i] = static_cast<float>(cos(static_cast<double>(angle)));
    sn[i] = sign * static_cast<float>(sin(static_cast<double>(angle)));
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < heads * half; e += blockDim.x) {
    const int64_t h = e / half, i = e - h * half;
    const int64_t base = (t * heads + h) * d;
    const float x0 = to_f(src[base + i]), x1 = to_f(src[base + i + half]);
    // Each product and sum rounded to nearest (no FMA contraction), as the CPU computes it and as
    // the fused q/k norm + RoPE kernel (rmsnorm.cu) does.
    dst[base + i] = from_f<D>(__fsub_rn(__fmul_rn(x0, cs[i]), __fmul_rn(x1, sn[i])));
    dst[base + i + half] = from_f<D>(__fadd_rn(__fmul_rn(x1, cs[i]), __fmul_rn(x0, sn[i])));
  }
}

void rotate(Context& ctx, const Tensor& src, const Tensor& pos, float theta, float sign, Tensor& dst,
            const char* op) {
  need_cuda(src, op, "input");
  need_cuda(pos, op, "pos");
  need_cuda(dst, op, "output");
  need_dtype(pos, DType::kI32, op, "pos");
  MT_CHECK(src.dim() == 3, "[{}] input is {}, expected [T, heads, d]", op, src.desc());
  const int64_t T = src.size(0), heads = src.size(1), d = src.size(2);
  MT_CHECK(d % 2 == 0 && d / 2 <= kMaxHalf, "[{}] head dim {} must be even and <= {}", op, d, 2 * kMaxHalf);
  need_numel(dst, src.numel(), op, "output");
  need_numel(pos, T, op, "pos");
  if (!src.numel()) return;
  InvFreq inv{};
  for (int64_t i = 0; i < d / 2; ++i)
    inv.v[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  MT_CUDA_DISPATCH(src.dtype(), S, op,
    MT_CUDA_DISPATCH(dst.dtype(), D, op,
      launch_pdl(rope_kernel<S, D>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
          static_cast<const S*>(src.data_ptr()), pos.data<int32_t>(), inv, sign,
          static_cast<D*>(dst.data_ptr()), heads, d)));
  check_launch(op);
}

}  // namespace

void rope_forward(Context& ctx, const Tensor& x, const Tensor& pos, float theta, Tensor& y) {
  rotate(ctx, x, pos, theta, 1.0f, y, "rope_forward");
}

void rope_backward(Context& ctx, const Tensor& dy, const Tensor& pos, float theta, Tensor& dx) {
  rotate(ctx, dy, pos, theta, -1.0f, dx, "rope_backward");
}

}  // namespace moetrain::cuda
