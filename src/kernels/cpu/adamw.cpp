// CPU AdamW (Loshchilov & Hutter, decoupled weight decay), elementwise, the twin of the CUDA
// kernel bit for bit (kernels/adamw_math.h holds the shared per-element math):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   w -= lr * ( (m / (1-b1^t)) / (sqrt(v) / sqrt(1-b2^t) + eps) + wd * w ),
// the bias corrections applied as host-computed reciprocals (adamw_math::update).
// Storage dtypes: weights, grad, m, v each f32 or bf16 (math in f32). bf16 m/v round to nearest
// even; bf16 weights round to nearest even or stochastically (16 Philox bits per element index).
#include <cmath>
#include <type_traits>

#include "kernels/adamw_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {

namespace am = adamw_math;

// Storage tags: f32 as float, bf16 as raw uint16_t bits.
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return am::bf16_to_f32(p[i]); }
inline void store_rne(float* p, int64_t i, float x) { p[i] = x; }
inline void store_rne(uint16_t* p, int64_t i, float x) { p[i] = am::bf16_rne(x); }

template <typename W, typename G, typename M, typename V, typename C>
void adamw_loop(Context& ctx, W* w, const G* g, M* m, V* v, C* comp, int64_t n, const am::Consts& k,
                bool stochastic, RngStream rng) {
  parallel_for(ctx, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float mi = load(m, i), vi = load(v, i), wi = load(w, i);
      am::update(k, load(g, i), mi, vi, wi);
      store_rne(m, i, mi);
      store_rne(v, i, vi);
      if constexpr (std::is_same_v<W, uint16_t>) {
        w[i] = stochastic ? am::bf16_stochastic(wi, am::random_word(rng.key, rng.counter, static_cast<uint64_t>(i)))
                          : am::bf16_rne(wi);
      } else {
        w[i] = wi;
      }
      if (comp) store_rne(comp, i, load(w, i));  // the stored (possibly rounded) weight
    }
  });
}

// Turns one runtime dtype into a storage pointer type and calls fn with it.
template <typename Fn>
void with_ptr(const Tensor& t, const char* op, const char* name, Fn&& fn) {
  switch (t.dtype()) {
    case DType::kF32: fn(static_cast<float*>(t.data_ptr())); break;
    case DType::kBF16: fn(static_cast<uint16_t*>(t.data_ptr())); break;
    default: MT_FAIL("[{}] {} is {}, expected f32 or bf16", op, name, dtype_name(t.dtype()));
  }
}

}  // namespace

void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute) {
  const char* op = "adamw_step";
  const am::Consts k = am::make_consts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale);
  const int64_t n = master.numel();
  with_ptr(master, op, "master", [&](auto* wp) {
    with_ptr(grad, op, "grad", [&](auto* gp) {
      with_ptr(m, op, "m", [&](auto* mp) {
        with_ptr(v, op, "v", [&](auto* vp) {
          if (!compute.defined()) {
            adamw_loop(ctx, wp, gp, mp, vp, static_cast<float*>(nullptr), n, k, p.stochastic_rounding, p.rng);
          } else {
            with_ptr(compute, op, "compute", [&](auto* cp) {
              adamw_loop(ctx, wp, gp, mp, vp, cp, n, k, p.stochastic_rounding, p.rng);
            });
          }
        });
      });
    });
  });
}

void adamw_step_many(Context& ctx, std::vector<ops::AdamWTarget>& targets, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < targets.size(); ++i) {
    ops::AdamWTarget& t = targets[i];
    cpu::adamw_step(ctx, t.master, grads[i], t.m, t.v, t.params, t.compute);
  }
}

}  // namespace moetrain::cpu
