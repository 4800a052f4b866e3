// An independent double-precision reference of the whole Qwen3 / Qwen3-MoE loss (SPEC.md sections
// 2-3) written as plain loops over std::vector<double>: no ops.h, no shared code with the engine.
// Used for whole-model finite differences (central, in double) and forward comparisons.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/params.h"

namespace moetrain::testref {

using Vec = std::vector<double>;

struct RefParams {
  ModelConfig cfg;
  std::map<std::string, Vec> w;  // internal names (ModelParams::for_each)
  static RefParams from(const ModelParams& p) {
    RefParams r;
    r.cfg = p.config;
    p.for_each([&](const std::string& n, const Tensor& t) {
      Vec v(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get(i);
      r.w[n] = std::move(v);
    });
    return r;
  }
  const Vec& at(const std::string& n) const { return w.at(n); }
};

struct RefOptions {
  double aux_coef = 0.0;
  bool aux_per_layer = false;
  double z_coef = 0.0;
};

struct RefResult {
  double loss = 0, ce = 0, aux = 0, z = 0;
  Vec logits;                      // [T,V]
  std::vector<int> routing;        // all top-k choices, for detecting flips under perturbation
  std::vector<Vec> counts;         // per sparse layer [E]
  std::vector<double> entropy;     // per sparse layer: mean over tokens of -sum_e p log p
};

// y[r, n] = sum_k x[r, k] * W[n, k]   (x [R,K], W [N,K] at offset)
inline Vec ref_linear(const Vec& x, int64_t R, int64_t K, const Vec& W, int64_t N, int64_t w_off = 0) {
  Vec y(static_cast<size_t>(R * N), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[r * K + k] * W[w_off + n * K + k];
      y[r * N + n] = s;
    }
  return y;
}

inline Vec ref_rmsnorm(const Vec& x, int64_t R, int64_t D, const Vec& w, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < D; ++i) ms += x[r * D + i] * x[r * D + i];
    const double rs = 1.0 / std::sqrt(ms / static_cast<double>(D) + eps);
    for (int64_t i = 0; i < D; ++i) y[r * D + i] = x[r * D + i] * rs * w[i];
  }
  return y;
}

// Rotate-half RoPE in place on x [T, heads, d].
inline void ref_rope(Vec& x, int64_t T, int64_t heads, int64_t d, const std::vector<int32_t>& pos, double theta) {
  const int64_t half = d / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      double* v = &x[(t * heads + h) * d];
      for (int64_t i = 0; i < half; ++i) {
        const double ang = pos[t] * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double c = std::cos(ang), s = std::sin(ang);
        const double a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
}

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

inline std::vector<int32_t> host_ints(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<int32_t>(t.get(i));
  return v;
}

inline RefResult ref_forward(const RefParams& P, const Batch& batch, const RefOptions& o) {
  const ModelConfig& c = P.cfg;
  const int64_t T = batch.num_tokens(), H = c.hidden_size, V = c.vocab_size, d = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, E = c.num_experts;
  const int64_t k = c.num_experts_per_tok;
  const double eps = c.rms_norm_eps;
  const auto tok = host_ints(batch.tokens), pos = host_ints(batch.positions), cu = host_ints(batch.cu_seqlens);
  const auto lab = host_ints(batch.labels);
  std::vector<int64_t> doc_start(static_cast<size_t>(T));
  for (size_t dd = 0; dd + 1 < cu.size(); ++dd)
    for (int32_t t = cu[dd]; t < cu[dd + 1]; ++t) doc_start[t] = cu[dd];

  RefResult res;
  const Vec& emb = P.at("model.embed_tokens.weight");
  Vec h(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) h[t * H + i] = emb[tok[t] * H + i];

  Vec cnt_total(static_cast<size_t>(E), 0.0), psum_total(static_cast<size_t>(E), 0.0);
  double aux_layers = 0, z_total = 0;
  int64_t n_sparse = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Vec a = ref_rmsnorm(h, T, H, P.at(pre + "input_layernorm.weight"), eps);
    Vec q = ref_linear(a, T, H, P.at(pre + "self_attn.q_proj.weight"), nh * d);
    Vec kk = ref_linear(a, T, H, P.at(pre + "self_attn.k_proj.weight"), nkv * d);
    Vec v = ref_linear(a, T, H, P.at(pre + "self_attn.v_proj.weight"), nkv * d);
    q = ref_rmsnorm(q, T * nh, d, P.at(pre + "self_attn.q_norm.weight"), eps);
    kk = ref_rmsnorm(kk, T * nkv, d, P.at(pre + "self_attn.k_norm.weight"), eps);
    ref_rope(q, T, nh, d, pos, c.rope_theta);
    ref_rope(kk, T, nkv, d, pos, c.rope_theta);
    Vec att(static_cast<size_t>(T * nh * d), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hh = 0; hh < nh; ++hh) {
        const int64_t kvh = hh / (nh / nkv);
        Vec s;
        double mx = -1e300;
        for (int64_t j = doc_start[t]; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[(t * nh + hh) * d + i] * kk[(j * nkv + kvh) * d + i];
          s.push_back(dot * scale);
          mx = std::max(mx, dot * scale);
        }
        double den = 0;
        for (double& x : s) den += (x = std::exp(x - mx));
        for (int64_t j = doc_start[t]; j <= t; ++j) {
          const double p = s[j - doc_start[t]] / den;
          for (int64_t i = 0; i < d; ++i) att[(t * nh + hh) * d + i] += p * v[(j * nkv + kvh) * d + i];
        }
      }
    Vec o = ref_linear(att, T, nh * d, P.at(pre + "self_attn.o_proj.weight"), H);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
    Vec b = ref_rmsnorm(h, T, H, P.at(pre + "post_attention_layernorm.weight"), eps);
    Vec y(static_cast<size_t>(T * H), 0.0);
    if (c.is_sparse_layer(l)) {
      ++n_sparse;
      const int64_t I = c.moe_intermediate_size;
      const Vec& gu = P.at(pre + "mlp.experts.gate_up_proj");  // [E,2I,H]
      const Vec& dn = P.at(pre + "mlp.experts.down_proj");     // [E,H,I]
      Vec r = ref_linear(b, T, H, P.at(pre + "mlp.gate.weight"), E);
      Vec cnt(static_cast<size_t>(E), 0.0), psum(static_cast<size_t>(E), 0.0);
      double zl = 0, ent = 0;
      for (int64_t t = 0; t < T; ++t) {
        double mx = -1e300;
        for (int64_t e = 0; e < E; ++e) mx = std::max(mx, r[t * E + e]);
        double den = 0;
        for (int64_t e = 0; e < E; ++e) den += std::exp(r[t * E + e] - mx);
        const double lse = mx + std::log(den);
        zl += lse * lse;
        Vec p(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) psum[e] += (p[e] = std::exp(r[t * E + e] - lse));
        for (int64_t e = 0; e < E; ++e) ent -= p[e] > 0 ? p[e] * std::log(p[e]) : 0.0;
        std::vector<int> idx(static_cast<size_t>(E));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int x, int z) { return p[x] > p[z]; });
        double wsum = 0;
        for (int64_t j = 0; j < k; ++j) wsum += p[idx[j]];
        for (int64_t j = 0; j < k; ++j) {
          const int e = idx[j];
          res.routing.push_back(e);
          cnt[e] += 1;
          const double wt = c.norm_topk_prob ? p[e] / wsum : p[e];
          Vec x(b.begin() + t * H, b.begin() + (t + 1) * H);
          Vec g = ref_linear(x, 1, H, gu, 2 * I, e * 2 * I * H);
          Vec act(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) act[i] = silu(g[i]) * g[I + i];
          Vec out = ref_linear(act, 1, I, dn, H, e * H * I);
          for (int64_t i = 0; i < H; ++i) y[t * H + i] += wt * out[i];
        }
      }
      double al = 0;
      for (int64_t e = 0; e < E; ++e) {
        al += (cnt[e] / static_cast<double>(T)) * (psum[e] / static_cast<double>(T));
        cnt_total[e] += cnt[e];
        psum_total[e] += psum[e];
      }
      aux_layers += static_cast<double>(E) * al;
      z_total += zl / static_cast<double>(T);
      res.counts.push_back(cnt);
      res.entropy.push_back(ent / static_cast<double>(T));
    } else {
      const int64_t I = c.intermediate_size;
      const Vec& gu = P.at(pre + "mlp.gate_up_proj.weight");  // [2I,H]
      Vec g = ref_linear(b, T, H, gu, 2 * I);
      Vec act(static_cast<size_t>(T * I));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < I; ++i) act[t * I + i] = silu(g[t * 2 * I + i]) * g[t * 2 * I + I + i];
      y = ref_linear(act, T, I, P.at(pre + "mlp.down_proj.weight"), H);
    }
    for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
  }
  Vec fn = ref_rmsnorm(h, T, H, P.at("model.norm.weight"), eps);
  const Vec& lm = c.tie_word_embeddings ? emb : P.at("lm_head.weight");
  res.logits = ref_linear(fn, T, H, lm, V);
  const Tensor wts = batch.loss_weights;
  for (int64_t t = 0; t < T; ++t) {
    if (lab[t] == kIgnoreLabel) continue;
    double mx = -1e300;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, res.logits[t * V + j]);
    double den = 0;
    for (int64_t j = 0; j < V; ++j) den += std::exp(res.logits[t * V + j] - mx);
    res.ce += wts.get(t) * (mx + std::log(den) - res.logits[t * V + lab[t]]);
  }
  if (n_sparse > 0) {
    if (o.aux_per_layer) {
      res.aux = aux_layers / static_cast<double>(n_sparse);
    } else {
      const double N = static_cast<double>(n_sparse * T);
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += (cnt_total[e] / N) * (psum_total[e] / N);
      res.aux = static_cast<double>(E) * s;
    }
    res.z = z_total / static_cast<double>(n_sparse);
  }
  res.loss = res.ce + o.aux_coef * res.aux + o.z_coef * res.z;
  return res;
}

}  // namespace moetrain::testref
