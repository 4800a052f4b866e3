// CPU causal GQA attention over packed documents (cu_seqlens), the reference for flash kernels.
// Forward per (head, query): s_j = scale q.k_j over keys j of the query's document with j <= i,
// lse = logsumexp(s), out = sum_j exp(s_j - lse) v_j. Backward, with P recomputed from lse and
// D_i = dO_i . O_i:  dS_ij = P_ij (dO_i . v_j - D_i);  dq_i = scale sum_j dS_ij k_j;
// dk_j = scale sum_i dS_ij q_i;  dv_j = sum_i P_ij dO_i (sums over the query heads of a group).
// dq is computed per query and dk/dv per key in two passes, so every output is one thread's
// fixed-order sum (deterministic); dot products and accumulators are double.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {

struct Layout {
  int64_t T, nh, nkv, d, group;
  std::vector<int32_t> doc_begin, doc_end;  // per token: its document's [begin, end)
};

Layout make_layout(const Tensor& q, const Tensor& k, const Tensor& cu_seqlens, int max_seqlen,
                   const char* op) {
  Layout L;
  L.T = q.size(0);
  L.nh = q.size(1);
  L.d = q.size(2);
  L.nkv = k.size(1);
  L.group = L.nh / L.nkv;
  const int32_t* cu = cu_seqlens.data<int32_t>();
  const int64_t docs = cu_seqlens.numel() - 1;
  MT_CHECK(cu[0] == 0 && cu[docs] == L.T, "[{}] cu_seqlens must start at 0 and end at T = {}, got {} .. {}",
           op, L.T, cu[0], cu[docs]);
  L.doc_begin.resize(static_cast<size_t>(L.T));
  L.doc_end.resize(static_cast<size_t>(L.T));
  for (int64_t s = 0; s < docs; ++s) {
    MT_CHECK(cu[s + 1] >= cu[s], "[{}] cu_seqlens decreases at index {} ({} -> {})", op, s + 1, cu[s], cu[s + 1]);
    MT_CHECK(cu[s + 1] - cu[s] <= max_seqlen, "[{}] document {} has {} tokens, more than max_seqlen = {}", op,
             s, cu[s + 1] - cu[s], max_seqlen);
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) {
      L.doc_begin[t] = cu[s];
      L.doc_end[t] = cu[s + 1];
    }
  }
  return L;
}

inline double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& out,
                       Tensor& lse) {
  require_f32("attention_forward", {{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}});
  const Layout L = make_layout(q, k, cu_seqlens, max_seqlen, "attention_forward");
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* lp = lse.data<float>();
  const int64_t d = L.d;
  parallel_for(ctx, L.nh * L.T, 8, [&](int64_t b, int64_t e) {
    std::vector<double> s, acc(static_cast<size_t>(d));
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t h = idx / L.T, i = idx % L.T, g = h / L.group;
      const int64_t j0 = L.doc_begin[i];
      const float* qi = qp + (i * L.nh + h) * d;
      s.resize(static_cast<size_t>(i - j0 + 1));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = j0; j <= i; ++j) {
        s[j - j0] = scale * dot(qi, kp + (j * L.nkv + g) * d, d);
        mx = std::max(mx, s[j - j0]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = j0; j <= i; ++j) {
        const double p = std::exp(s[j - j0] - mx);
        sum += p;
        const float* vj = vp + (j * L.nkv + g) * d;
        for (int64_t c = 0; c < d; ++c) acc[c] += p * vj[c];
      }
      float* oi = op + (i * L.nh + h) * d;
      for (int64_t c = 0; c < d; ++c) oi[c] = static_cast<float>(acc[c] / sum);
      lp[h * L.T + i] = static_cast<float>(mx + std::log(sum));
    }
  });
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  require_f32("attention_backward", {{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {dout, "dout"},
                                     {dq, "dq"}, {dk, "dk"}, {dv, "dv"}});
  const Layout L = make_layout(q, k, cu_seqlens, max_seqlen, "attention_backward");
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* op = out.data<float>();
  const float* lp = lse.data<float>();
  const float* gp = dout.data<float>();
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
  const int64_t d = L.d, T = L.T;

  std::vector<double> D(static_cast<size_t>(L.nh * T));  // [nh, T] rowsum(dO * O)
  parallel_for(ctx, L.nh * T, 256, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t h = idx / T, i = idx % T;
      D[idx] = dot(gp + (i * L.nh + h) * d, op + (i * L.nh + h) * d, d);
    }
  });

  // Pass 1: dq per (head, query).
  parallel_for(ctx, L.nh * T, 8, [&](int64_t b, int64_t e) {
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t h = idx / T, i = idx % T, g = h / L.group;
      const float* qi = qp + (i * L.nh + h) * d;
      const float* gi = gp + (i * L.nh + h) * d;
      const double li = lp[h * T + i];
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = L.doc_begin[i]; j <= i; ++j) {
        const float* kj = kp + (j * L.nkv + g) * d;
        const double p = std::exp(scale * dot(qi, kj, d) - li);
        const double ds = p * (dot(gi, vp + (j * L.nkv + g) * d, d) - D[idx]);
        for (int64_t c = 0; c < d; ++c) acc[c] += ds * kj[c];
      }
      float* dqi = dqp + (i * L.nh + h) * d;
      for (int64_t c = 0; c < d; ++c) dqi[c] = static_cast<float>(scale * acc[c]);
    }
  });

  // Pass 2: dk, dv per (kv head, key), summing over the group's query heads and later queries.
  parallel_for(ctx, L.nkv * T, 8, [&](int64_t b, int64_t e) {
    std::vector<double> ak(static_cast<size_t>(d)), av(static_cast<size_t>(d));
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t g = idx / T, j = idx % T;
      const float* kj = kp + (j * L.nkv + g) * d;
      const float* vj = vp + (j * L.nkv + g) * d;
      std::fill(ak.begin(), ak.end(), 0.0);
      std::fill(av.begin(), av.end(), 0.0);
      for (int64_t h = g * L.group; h < (g + 1) * L.group; ++h) {
        for (int64_t i = j; i < L.doc_end[j]; ++i) {
          const float* qi = qp + (i * L.nh + h) * d;
          const float* gi = gp + (i * L.nh + h) * d;
          const double p = std::exp(scale * dot(qi, kj, d) - lp[h * T + i]);
          const double ds = p * (dot(gi, vj, d) - D[h * T + i]);
          for (int64_t c = 0; c < d; ++c) {
            av[c] += p * gi[c];
            ak[c] += ds * qi[c];
          }
        }
      }
      float* dkj = dkp + (j * L.nkv + g) * d;
      float* dvj = dvp + (j * L.nkv + g) * d;
      for (int64_t c = 0; c < d; ++c) {
        dkj[c] = static_cast<float>(scale * ak[c]);
        dvj[c] = static_cast<float>(av[c]);
      }
    }
  });
}

}  // namespace moetrain::cpu
