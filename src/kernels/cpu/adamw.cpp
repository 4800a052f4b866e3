// CPU AdamW (Loshchilov & Hutter, decoupled weight decay), elementwise on fp32 master/states:
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   w -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * w ).
// Bias corrections in double; per-element math in fp32 (like a fused GPU kernel). The optional
// compute copy (f32 or bf16, round to nearest even) receives the new weights.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute) {
  require_f32("adamw_step", {{master, "master"}, {grad, "grad"}, {m, "m"}, {v, "v"}});
  const DType cd = compute.defined() ? compute.dtype() : DType::kF32;
  MT_CHECK(!compute.defined() || cd == DType::kF32 || cd == DType::kBF16,
           "[adamw_step] compute is {}, expected f32 or bf16", dtype_name(cd));
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step)));
  const float b1 = p.beta1, b2 = p.beta2, lr = p.lr, eps = p.eps, wd = p.weight_decay, gs = p.grad_scale;
  float* wp = master.data<float>();
  const float* gp = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  void* cp = compute.defined() ? compute.data_ptr() : nullptr;
  parallel_for(ctx, master.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = gp[i] * gs;
      const float mi = b1 * mp[i] + (1.0f - b1) * g;
      const float vi = b2 * vp[i] + (1.0f - b2) * g * g;
      mp[i] = mi;
      vp[i] = vi;
      const float w = wp[i];
      const float upd = (mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * w;
      const float nw = w - lr * upd;
      wp[i] = nw;
      if (cp) {
        if (cd == DType::kF32)
          static_cast<float*>(cp)[i] = nw;
        else
          static_cast<uint16_t*>(cp)[i] = float_to_bf16(nw);
      }
    }
  });
}

}  // namespace moetrain::cpu
