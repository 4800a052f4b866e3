// CPU MoE router: softmax + top-k (slots in descending probability, ties to the lower expert
// index, compared on the stored fp32 probabilities), optional renormalization of the picked
// weights, the backward through both, load-balancing statistics and the ST-MoE z-loss.
// Backward: with g = dL/dprobs, dlogits = p * (g - sum_e p_e g_e); renormalized weights
// w_j = p_j / s (s = sum of picked p) give dL/dp_j = (dw_j - sum_l dw_l w_l) / s.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
// Softmax of one row in double, returning logsumexp.
double softmax_row(const float* x, int64_t E, float* p) {
  double mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(x[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
  const double lse = mx + std::log(sum);
  if (p)
    for (int64_t e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(x[e] - lse));
  return lse;
}
}  // namespace

void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs,
                 Tensor& topk_idx, Tensor& topk_w) {
  require_f32(logits, "router_topk", "logits");
  const int64_t T = logits.size(0), E = logits.size(1);
  const float* lp = logits.data<float>();
  float* pp = probs.data<float>();
  int32_t* ip = topk_idx.data<int32_t>();
  float* wp = topk_w.data<float>();
  parallel_for(ctx, T, 32, [&](int64_t b, int64_t e) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      float* p = pp + t * E;
      const double lse = softmax_row(lp + t * E, E, p);
      MT_CHECK(std::isfinite(lse), "[router_topk] logits row {} is not finite (logsumexp = {})", t, lse);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [p](int32_t a, int32_t c) {
        return p[a] > p[c] || (p[a] == p[c] && a < c);
      });
      double s = 0.0;
      for (int j = 0; j < k; ++j) s += p[order[j]];
      for (int j = 0; j < k; ++j) {
        ip[t * k + j] = order[j];
        wp[t * k + j] = normalize ? static_cast<float>(p[order[j]] / s) : p[order[j]];
      }
    }
  });
}

namespace {
// d aux / d probs[t, e], the same for every row t: coef * E * counts[e] / rows^2, in double, stored as f32.
std::vector<float> aux_loss_row(const Tensor& counts, int64_t rows, float coef) {
  const int64_t E = counts.numel();
  const float* cp = counts.data<float>();
  const double n = static_cast<double>(rows);
  std::vector<float> row(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) row[e] = static_cast<float>(coef * static_cast<double>(E) * cp[e] / (n * n));
  return row;
}
}  // namespace

void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx,
                          const Tensor& topk_w, const Tensor& dtopk_w, const Tensor& dprobs_extra,
                          bool normalize, Tensor& dlogits, const Tensor& aux_counts, int64_t aux_rows,
                          float aux_coef) {
  require_f32(dtopk_w, "router_topk_backward", "dtopk_w");
  if (dprobs_extra.defined()) require_f32(dprobs_extra, "router_topk_backward", "dprobs_extra");
  const int64_t T = probs.size(0), E = probs.size(1), k = topk_idx.size(1);
  const float* pp = probs.data<float>();
  const int32_t* ip = topk_idx.data<int32_t>();
  const float* dwp = dtopk_w.data<float>();
  const float* xp = dprobs_extra.defined() ? dprobs_extra.data<float>() : nullptr;
  float* out = dlogits.data<float>();
  for (int64_t i = 0; i < T * k; ++i)
    MT_CHECK(ip[i] >= 0 && ip[i] < E, "[router_topk_backward] topk_idx[{}] = {} outside [0, {})", i, ip[i], E);
  // The aux-loss row, as aux_loss_backward forms it, added to dprobs_extra in f32 (its bits).
  std::vector<float> aux;
  if (aux_counts.defined()) {
    require_f32(aux_counts, "router_topk_backward", "aux_counts");
    aux = aux_loss_row(aux_counts, aux_rows, aux_coef);
  }
  parallel_for(ctx, T, 32, [&](int64_t b, int64_t e) {
    std::vector<double> g(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      const float* p = pp + t * E;
      const int32_t* idx = ip + t * k;
      const float* dw = dwp + t * k;
      for (int64_t c = 0; c < E; ++c) {
        const float x = xp ? xp[t * E + c] : 0.0f;
        g[c] = aux.empty() ? x : x + aux[c];
      }
      if (normalize) {
        double s = 0.0, dot = 0.0;
        for (int64_t j = 0; j < k; ++j) s += p[idx[j]];
        for (int64_t j = 0; j < k; ++j) dot += dw[j] * (p[idx[j]] / s);
        for (int64_t j = 0; j < k; ++j) g[idx[j]] += (dw[j] - dot) / s;
      } else {
        for (int64_t j = 0; j < k; ++j) g[idx[j]] += dw[j];
      }
      double pg = 0.0;
      for (int64_t c = 0; c < E; ++c) pg += p[c] * g[c];
      for (int64_t c = 0; c < E; ++c) out[t * E + c] = static_cast<float>(p[c] * (g[c] - pg));
    }
  });
}

void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts,
                  Tensor& prob_sum, const Tensor& logits, Tensor* health) {
  require_f32(probs, "router_stats", "probs");
  require_f32(counts, "router_stats", "counts");
  require_f32(prob_sum, "router_stats", "prob_sum");
  const int64_t T = probs.size(0), E = probs.size(1), picks = topk_idx.numel();
  const float* pp = probs.data<float>();
  const int32_t* ip = topk_idx.data<int32_t>();
  float* cp = counts.data<float>();
  float* sp = prob_sum.data<float>();
  std::vector<int64_t> cnt(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < picks; ++i) {
    MT_CHECK(ip[i] >= 0 && ip[i] < E, "[router_stats] topk_idx[{}] = {} outside [0, {})", i, ip[i], E);
    ++cnt[ip[i]];
  }
  for (int64_t c = 0; c < E; ++c) cp[c] += static_cast<float>(cnt[c]);
  parallel_for(ctx, E, 16, [&](int64_t b, int64_t e) {
    std::vector<double> acc(static_cast<size_t>(e - b), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = b; c < e; ++c) acc[c - b] += pp[t * E + c];
    for (int64_t c = b; c < e; ++c) sp[c] += static_cast<float>(acc[c - b]);
  });
  if (!health) return;
  require_f32(logits, "router_stats", "logits");
  require_f32(*health, "router_stats", "health");
  const float* lp = logits.data<float>();
  double lse_sum = 0.0, pl_sum = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lp + t * E;
    double mx = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < E; ++c) mx = std::max(mx, static_cast<double>(l[c]));
    for (int64_t c = 0; c < E; ++c) s += std::exp(static_cast<double>(l[c]) - mx);
    lse_sum += mx + std::log(s);
    for (int64_t c = 0; c < E; ++c) pl_sum += static_cast<double>(pp[t * E + c]) * l[c];
  }
  health->data<float>()[0] = static_cast<float>(lse_sum);
  health->data<float>()[1] = static_cast<float>(pl_sum);
}

double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows) {
  require_f32(counts, "aux_loss_value", "counts");
  require_f32(prob_sum, "aux_loss_value", "prob_sum");
  if (rows <= 0) return 0.0;
  const int64_t E = counts.numel();
  const float* cp = counts.data<float>();
  const float* sp = prob_sum.data<float>();
  const double n = static_cast<double>(rows);
  double s = 0.0;
  for (int64_t e = 0; e < E; ++e) s += (cp[e] / n) * (sp[e] / n);
  return static_cast<double>(E) * s;
}

void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef, Tensor& dprobs) {
  require_f32(counts, "aux_loss_backward", "counts");
  require_f32(dprobs, "aux_loss_backward", "dprobs");
  const int64_t T = dprobs.size(0), E = dprobs.size(1);
  const std::vector<float> row = aux_loss_row(counts, rows, coef);
  float* dp = dprobs.data<float>();
  parallel_for(ctx, T, 256, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t c = 0; c < E; ++c) dp[t * E + c] += row[c];
  });
}

double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse) {
  require_f32(logits, "router_zloss_forward", "logits");
  const int64_t T = logits.size(0), E = logits.size(1);
  const float* lp = logits.data<float>();
  float* out = lse.data<float>();
  std::vector<double> l(static_cast<size_t>(T));
  parallel_for(ctx, T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      l[t] = softmax_row(lp + t * E, E, nullptr);
      out[t] = static_cast<float>(l[t]);
    }
  });
  double z = 0.0;
  for (double v : l) z += v * v;
  return z;
}

void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale,
                           Tensor& dlogits) {
  require_f32(logits, "router_zloss_backward", "logits");
  require_f32(dlogits, "router_zloss_backward", "dlogits");
  const int64_t T = logits.size(0), E = logits.size(1);
  const float* lp = logits.data<float>();
  const float* sp = lse.data<float>();
  float* dp = dlogits.data<float>();
  parallel_for(ctx, T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const double l = sp[t];
      for (int64_t c = 0; c < E; ++c)
        dp[t * E + c] += static_cast<float>(scale * 2.0 * l * std::exp(lp[t * E + c] - l));
    }
  });
}

}  // namespace moetrain::cpu
