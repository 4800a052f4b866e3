// CPU SwiGLU on a fused gate|up row: h = silu(g) * u with g = gu[:, :I], u = gu[:, I:].
// silu(g) = g * sigmoid(g); d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// Elementwise, fp32 with the sigmoid in double.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h) {
  require_f32(gu, "swiglu_forward", "gu");
  require_f32(h, "swiglu_forward", "h");
  const int64_t N = h.size(0), I = h.size(1);
  const float* in = gu.data<float>();
  float* out = h.data<float>();
  parallel_for(ctx, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = in + r * 2 * I;
      const float* u = g + I;
      for (int64_t i = 0; i < I; ++i) {
        const double sg = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
        out[r * I + i] = static_cast<float>(g[i] * sg * u[i]);
      }
    }
  });
}

void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu) {
  require_f32(gu, "swiglu_backward", "gu");
  require_f32(dh, "swiglu_backward", "dh");
  require_f32(dgu, "swiglu_backward", "dgu");
  const int64_t N = dh.size(0), I = dh.size(1);
  const float* in = gu.data<float>();
  const float* dp = dh.data<float>();
  float* out = dgu.data<float>();
  parallel_for(ctx, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = in + r * 2 * I;
      const float* u = g + I;
      float* dg = out + r * 2 * I;
      float* du = dg + I;
      for (int64_t i = 0; i < I; ++i) {
        const double x = g[i];
        const double sg = 1.0 / (1.0 + std::exp(-x));
        const double d = dp[r * I + i];
        dg[i] = static_cast<float>(d * u[i] * sg * (1.0 + x * (1.0 - sg)));
        du[i] = static_cast<float>(d * x * sg);
      }
    }
  });
}

}  // namespace moetrain::cpu
