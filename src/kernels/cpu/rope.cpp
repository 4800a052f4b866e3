// CPU rotary position embedding, rotate-half convention (HF Qwen3): dim i pairs with i + d/2,
//   y[i]     = x[i] cos - x[i+d/2] sin,   y[i+d/2] = x[i+d/2] cos + x[i] sin.
// The backward is the inverse rotation (the transpose of an orthogonal map): angle -> -angle.
// Angles use HF's fp32 recipe (see cpu_ops.h) so positions near 40k match the reference.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
// sign = +1 forward, -1 backward.
void rotate(Context& ctx, const Tensor& src, const Tensor& pos, float theta, float sign,
            Tensor& dst, const char* op) {
  require_f32(src, op, "input");
  require_f32(dst, op, "output");
  const int64_t T = src.size(0), heads = src.size(1), d = src.size(2), half = d / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  const int32_t* pp = pos.data<int32_t>();
  const float* s = src.data<float>();
  float* o = dst.data<float>();
  parallel_for(ctx, T, 16, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pp[t]) * inv_freq[i];  // one fp32 product, as HF
        cs[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sn[i] = sign * static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* x = s + (t * heads + h) * d;
        float* y = o + (t * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = x[i], x1 = x[i + half];
          y[i] = x0 * cs[i] - x1 * sn[i];
          y[i + half] = x1 * cs[i] + x0 * sn[i];
        }
      }
    }
  });
}
}  // namespace

void rope_forward(Context& ctx, const Tensor& x, const Tensor& pos, float theta, Tensor& y) {
  rotate(ctx, x, pos, theta, 1.0f, y, "rope_forward");
}

void rope_backward(Context& ctx, const Tensor& dy, const Tensor& pos, float theta, Tensor& dx) {
  rotate(ctx, dy, pos, theta, -1.0f, dx, "rope_backward");
}

// The q/k path: the two ops in sequence through a temporary (the CUDA backend fuses them).
namespace {
// x itself, or a packed workspace copy when its tokens have a stride of their own.
Tensor packed(const Tensor& x) { return x.is_contiguous() ? x : x.clone(MemCategory::kWorkspace); }
}  // namespace

void norm_rope_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& pos, float theta,
                       Tensor& y, Tensor& rstd) {
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2);
  Tensor xn = Tensor::empty({T * heads, d}, x.dtype(), x.device(), MemCategory::kWorkspace);
  rmsnorm_forward(ctx, packed(x).view({T * heads, d}), w, eps, xn, rstd);  // x may have a token stride
  rope_forward(ctx, xn.view({T, heads, d}), pos, theta, y);
}

void norm_rope_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                        float theta, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2);
  Tensor dxn = Tensor::empty({T, heads, d}, dy.dtype(), dy.device(), MemCategory::kWorkspace);
  rope_backward(ctx, packed(dy), pos, theta, dxn);
  // x, dy and dx may have a token stride of their own (column blocks of a wider matrix).
  Tensor out = dx.is_contiguous() ? dx : Tensor::empty({T, heads, d}, dx.dtype(), dx.device(), MemCategory::kWorkspace);
  Tensor dxv = out.view({T * heads, d});
  rmsnorm_backward(ctx, packed(x).view({T * heads, d}), w, rstd, dxn.view({T * heads, d}), dxv, dw, false);
  if (!dx.is_contiguous()) {
    Tensor dst = dx.view({T, heads * d});
    copy_rows(ctx, out.view({T, heads * d}), dst);
  }
}

void norm_rope_forward_qk(Context& ctx, ops::NormRopeFwdIO& q, ops::NormRopeFwdIO& k, float eps, const Tensor& pos,
                          float theta) {
  norm_rope_forward(ctx, q.x, q.w, eps, pos, theta, q.y, q.rstd);
  norm_rope_forward(ctx, k.x, k.w, eps, pos, theta, k.y, k.rstd);
}

void norm_rope_backward_qk(Context& ctx, ops::NormRopeBwdIO& q, ops::NormRopeBwdIO& k, const Tensor& pos, float theta) {
  norm_rope_backward(ctx, q.x, q.w, q.rstd, pos, theta, q.dy, q.dx, q.dw);
  norm_rope_backward(ctx, k.x, k.w, k.rstd, pos, theta, k.dy, k.dx, k.dw);
}

}  // namespace moetrain::cpu
