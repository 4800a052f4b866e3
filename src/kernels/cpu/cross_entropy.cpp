// CPU cross-entropy over a large vocabulary, one row per thread chunk (deterministic):
// lse = logsumexp(logits[t]) in double, losses[t] = weights[t] * (lse - logits[t, label]),
// dlogits[t] = scale * weights[t] * (softmax(logits[t]) - onehot(label)); rows labelled -100 give
// zero loss and zero gradient (lse is still written).
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
constexpr int32_t kIgnoreIndex = -100;

void check_labels(const int32_t* lab, int64_t T, int64_t V, const char* op) {
  for (int64_t t = 0; t < T; ++t)
    MT_CHECK(lab[t] == kIgnoreIndex || (lab[t] >= 0 && lab[t] < V),
             "[{}] labels[{}] = {} is neither -100 nor a token id below the vocabulary size {}", op, t,
             lab[t], V);
}
}  // namespace

void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels,
                           const Tensor& weights, Tensor& losses, Tensor& lse) {
  require_f32(logits, "cross_entropy_forward", "logits");
  if (weights.defined()) require_f32(weights, "cross_entropy_forward", "weights");
  const int64_t T = logits.size(0), V = logits.size(1);
  const int32_t* lab = labels.data<int32_t>();
  check_labels(lab, T, V, "cross_entropy_forward");
  const float* lp = logits.data<float>();
  const float* wp = weights.defined() ? weights.data<float>() : nullptr;
  float* op = losses.data<float>();
  float* sp = lse.data<float>();
  parallel_for(ctx, T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* x = lp + t * V;
      double mx = -INFINITY;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(x[v]));
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
      const double l = mx + std::log(sum);
      sp[t] = static_cast<float>(l);
      if (lab[t] == kIgnoreIndex) {
        op[t] = 0.0f;
      } else {
        const double w = wp ? wp[t] : 1.0;
        op[t] = static_cast<float>(w * (l - x[lab[t]]));
      }
    }
  });
}

void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels,
                            const Tensor& weights, const Tensor& lse, float dloss_scale,
                            Tensor& dlogits) {
  require_f32(logits, "cross_entropy_backward", "logits");
  require_f32(dlogits, "cross_entropy_backward", "dlogits");
  if (weights.defined()) require_f32(weights, "cross_entropy_backward", "weights");
  const int64_t T = logits.size(0), V = logits.size(1);
  const int32_t* lab = labels.data<int32_t>();
  check_labels(lab, T, V, "cross_entropy_backward");
  const float* lp = logits.data<float>();
  const float* wp = weights.defined() ? weights.data<float>() : nullptr;
  const float* sp = lse.data<float>();
  float* dp = dlogits.data<float>();
  parallel_for(ctx, T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* d = dp + t * V;
      const double w = wp ? wp[t] : 1.0;
      if (lab[t] == kIgnoreIndex || w == 0.0) {
        std::fill(d, d + V, 0.0f);
        continue;
      }
      const float* x = lp + t * V;
      const double c = static_cast<double>(dloss_scale) * w, l = sp[t];
      const double x_label = x[lab[t]];  // read first: dlogits may alias logits (in place)
      for (int64_t v = 0; v < V; ++v) d[v] = static_cast<float>(c * std::exp(x[v] - l));
      d[lab[t]] = static_cast<float>(c * (std::exp(x_label - l) - 1.0));
    }
  });
}

double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     ops::Reduction reduction, Tensor* dlogits) {
  const int64_t T = logits.size(0);
  const int32_t* lab = labels.data<int32_t>();
  const uint8_t* mk = mask.defined() ? mask.data<uint8_t>() : nullptr;
  int64_t valid = 0;
  for (int64_t t = 0; t < T; ++t) valid += lab[t] != kIgnoreIndex && (!mk || mk[t] != 0);
  // Per-position weights carry the mask and, for a mean, the 1/valid factor.
  const float unit = reduction == ops::Reduction::kMean && valid > 0 ? static_cast<float>(1.0 / valid) : 1.0f;
  Tensor weights = Tensor::empty({T}, DType::kF32);
  float* wp = weights.data<float>();
  for (int64_t t = 0; t < T; ++t) wp[t] = (lab[t] != kIgnoreIndex && (!mk || mk[t] != 0)) ? unit : 0.0f;
  Tensor losses = Tensor::empty({T}, DType::kF32), lse = Tensor::empty({T}, DType::kF32);
  cross_entropy_forward(ctx, logits, labels, weights, losses, lse);
  double total = 0.0;
  const float* lp = losses.data<float>();
  for (int64_t t = 0; t < T; ++t) total += lp[t];
  if (dlogits && dlogits->defined()) cross_entropy_backward(ctx, logits, labels, weights, lse, 1.0f, *dlogits);
  return total;
}

}  // namespace moetrain::cpu
