// CPU RMSNorm over the last dim: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Backward, with xhat = x * rstd and g = dy * w:
//   dx = rstd * (g - xhat * mean(g * xhat)),   dw += sum over rows of dy * xhat.
// Row sums use double accumulators; dw is split by columns across threads (rows summed in order).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                     Tensor& rstd, Tensor* x_copy) {
  require_f32(x, "rmsnorm_forward", "x");
  require_f32(w, "rmsnorm_forward", "w");
  require_f32(y, "rmsnorm_forward", "y");
  const int64_t R = x.size(0), D = x.size(1);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
  parallel_for(ctx, R, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = xp + r * D;
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
      rp[r] = rs;
      float* yr = yp + r * D;
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * rs * wp[i];
    }
  });
  if (x_copy) std::memcpy(x_copy->data_ptr(), xp, static_cast<size_t>(R * D) * sizeof(float));
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dy, Tensor& dx, Tensor& dw, bool dx_accumulate) {
  require_f32("rmsnorm_backward", {{x, "x"}, {w, "w"}, {dy, "dy"}, {dx, "dx"}, {dw, "dw"}});
  const int64_t R = x.size(0), D = x.size(1);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* rp = rstd.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = dx.data<float>();
  float* dwp = dw.data<float>();
  parallel_for(ctx, R, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = xp + r * D;
      const float* gr = gp + r * D;
      const double rs = rp[r];
      double dot = 0.0;  // sum_i dy_i * w_i * xhat_i
      for (int64_t i = 0; i < D; ++i) dot += static_cast<double>(gr[i]) * wp[i] * xr[i] * rs;
      const double mean_dot = dot / static_cast<double>(D);
      float* dr = dxp + r * D;
      for (int64_t i = 0; i < D; ++i) {
        const double xhat = xr[i] * rs;
        const double d = rs * (static_cast<double>(gr[i]) * wp[i] - xhat * mean_dot);
        dr[i] = static_cast<float>(dx_accumulate ? d + dr[i] : d);
      }
    }
  });
  parallel_for(ctx, D, 64, [&](int64_t b, int64_t e) {
    std::vector<double> acc(static_cast<size_t>(e - b), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = xp + r * D;
      const float* gr = gp + r * D;
      const double rs = rp[r];
      for (int64_t i = b; i < e; ++i) acc[i - b] += static_cast<double>(gr[i]) * xr[i] * rs;
    }
    for (int64_t i = b; i < e; ++i) dwp[i] += static_cast<float>(acc[i - b]);
  });
}

}  // namespace moetrain::cpu
