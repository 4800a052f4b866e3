// CPU SwiGLU on a fused gate|up row: h = silu(g) * u with g = gu[:, :I], u = gu[:, I:].
// silu(g) = g * sigmoid(g); d silu / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
// Elementwise, fp32 with the sigmoid in double. The weighted form scales each row by its routing
// weight after the rounding to the output dtype; its backward also gives the weight's gradient.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
// silu(g) * u as the forward stores it (before any row weight).
float swiglu_value(float g, float u) {
  const double sg = 1.0 / (1.0 + std::exp(-static_cast<double>(g)));
  return static_cast<float>(g * sg * u);
}
}  // namespace

void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h, const Tensor& row_w) {
  require_f32(gu, "swiglu_forward", "gu");
  require_f32(h, "swiglu_forward", "h");
  const int64_t N = h.size(0), I = h.size(1);
  const float* in = gu.data<float>();
  const float* wr = row_w.defined() ? row_w.data<float>() : nullptr;
  float* out = h.data<float>();
  parallel_for(ctx, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = in + r * 2 * I;
      const float* u = g + I;
      for (int64_t i = 0; i < I; ++i) {
        const float a = swiglu_value(g[i], u[i]);
        out[r * I + i] = wr ? wr[r] * a : a;
      }
    }
  });
}

namespace {
// dgu from wr[r] * dh[r] (wr null: dh itself), and dw[r] = sum_i dh * a when dw is given.
void backward_rows(Context& ctx, const Tensor& gu, const Tensor& dh, const float* wr, Tensor& dgu, float* dw) {
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
      double dot = 0.0;
      for (int64_t i = 0; i < I; ++i) {
        const double x = g[i];
        const double sg = 1.0 / (1.0 + std::exp(-x));
        if (dw) dot += static_cast<double>(dp[r * I + i]) * swiglu_value(g[i], u[i]);
        const double d = wr ? static_cast<double>(wr[r]) * dp[r * I + i] : dp[r * I + i];
        dg[i] = static_cast<float>(d * u[i] * sg * (1.0 + x * (1.0 - sg)));
        du[i] = static_cast<float>(d * x * sg);
      }
      if (dw) dw[r] = static_cast<float>(dot);
    }
  });
}
}  // namespace

void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu) {
  require_f32("swiglu_backward", {{gu, "gu"}, {dh, "dh"}, {dgu, "dgu"}});
  backward_rows(ctx, gu, dh, nullptr, dgu, nullptr);
}

void swiglu_backward_weighted(Context& ctx, const Tensor& gu, const Tensor& dh, const Tensor& row_w, Tensor& dgu,
                              Tensor& drow_w) {
  require_f32("swiglu_backward_weighted", {{gu, "gu"}, {dh, "dh"}, {row_w, "row_w"}, {dgu, "dgu"}, {drow_w, "drow_w"}});
  backward_rows(ctx, gu, dh, row_w.data<float>(), dgu, drow_w.data<float>());
}

}  // namespace moetrain::cpu
