// Causal GQA attention over packed documents on the CPU: forward (out and lse) against a naive
// double-precision masked softmax, backward against finite differences of it, packing invariance
// (two documents packed = each alone), one-token documents, thread-count independence, checks.
#include <cmath>
#include <cstring>

#include "core/context.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

namespace {
struct Dims {
  int64_t T, nh, nkv, d;
};

// Dense scores over all (i, j) with a mask built from document ids; out [T,nh,d], lse [nh,T].
std::vector<double> attn_ref(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const Dims& D, const std::vector<int32_t>& cu,
                             double scale, std::vector<double>* lse = nullptr) {
  std::vector<int> doc(D.T);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int32_t t = cu[s]; t < cu[s + 1]; ++t) doc[t] = static_cast<int>(s);
  std::vector<double> out(D.T * D.nh * D.d, 0.0);
  if (lse) lse->assign(D.nh * D.T, 0.0);
  for (int64_t h = 0; h < D.nh; ++h) {
    const int64_t g = h * D.nkv / D.nh;  // = h / (nh / nkv)
    for (int64_t i = 0; i < D.T; ++i) {
      std::vector<double> s(D.T, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < D.T; ++j) {
        if (doc[j] != doc[i] || j > i) continue;
        double acc = 0.0;
        for (int64_t c = 0; c < D.d; ++c) acc += q[(i * D.nh + h) * D.d + c] * k[(j * D.nkv + g) * D.d + c];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j < D.T; ++j) z += std::exp(s[j] - mx);
      for (int64_t j = 0; j < D.T; ++j) {
        const double p = std::exp(s[j] - mx) / z;
        for (int64_t c = 0; c < D.d; ++c) out[(i * D.nh + h) * D.d + c] += p * v[(j * D.nkv + g) * D.d + c];
      }
      if (lse) (*lse)[h * D.T + i] = mx + std::log(z);
    }
  }
  return out;
}

struct Case {
  Dims D;
  std::vector<int32_t> cu;
  std::vector<float> q, k, v;
  Case(Dims d, std::vector<int32_t> c, uint32_t seed) : D(d), cu(std::move(c)) {
    q = randn(D.T * D.nh * D.d, seed);
    k = randn(D.T * D.nkv * D.d, seed + 1);
    v = randn(D.T * D.nkv * D.d, seed + 2);
  }
  int max_len() const {
    int m = 0;
    for (size_t s = 0; s + 1 < cu.size(); ++s) m = std::max(m, cu[s + 1] - cu[s]);
    return m;
  }
};
}  // namespace

TEST(Attention, ForwardMatchesNaiveMaskedSoftmax) {
  Context ctx;
  ctx.set_num_threads(3);
  for (const Dims& D : {Dims{13, 4, 2, 6}, Dims{13, 3, 3, 5}, Dims{13, 4, 1, 7}}) {
    Case c(D, {0, 1, 6, 6, 9, 13}, 60);  // a one-token document first, an empty one later
    const float scale = 1.0f / std::sqrt(static_cast<float>(D.d));
    Tensor out = poisoned({D.T, D.nh, D.d}), lse = poisoned({D.nh, D.T});
    ops::attention_forward(ctx, tensor(c.q, {D.T, D.nh, D.d}), tensor(c.k, {D.T, D.nkv, D.d}),
                           tensor(c.v, {D.T, D.nkv, D.d}), ints(c.cu, {6}), c.max_len(), scale, out, lse);
    std::vector<double> lse_ref;
    auto want = attn_ref(to_d(c.q), to_d(c.k), to_d(c.v), D, c.cu, scale, &lse_ref);
    expect_close(out, want, 1e-5, 1e-6, "attention out");
    expect_close(lse, lse_ref, 1e-6, 1e-6, "attention lse");
    // The one-token document attends only itself: out = v of its kv head.
    for (int64_t h = 0; h < D.nh; ++h)
      for (int64_t cc = 0; cc < D.d; ++cc)
        EXPECT_EQ(out.get(h * D.d + cc), c.v[(h * D.nkv / D.nh) * D.d + cc]);
  }
}

TEST(Attention, PackedEqualsSeparate) {
  Context ctx;
  const Dims D{11, 2, 1, 4};
  Case c(D, {0, 7, 11}, 70);
  Tensor q = tensor(c.q, {D.T, D.nh, D.d}), k = tensor(c.k, {D.T, D.nkv, D.d}), v = tensor(c.v, {D.T, D.nkv, D.d});
  Tensor out = poisoned({D.T, D.nh, D.d}), lse = poisoned({D.nh, D.T});
  ops::attention_forward(ctx, q, k, v, ints(c.cu, {3}), 7, 0.5f, out, lse);
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 7}, {7, 11}}) {
    const int64_t n = e - b;
    Tensor o1 = poisoned({n, D.nh, D.d}), l1 = poisoned({D.nh, n});
    ops::attention_forward(ctx, q.slice(0, b, e), k.slice(0, b, e), v.slice(0, b, e),
                           ints({0, static_cast<int32_t>(n)}, {2}), static_cast<int>(n), 0.5f, o1, l1);
    expect_close(out.slice(0, b, e).contiguous(), to_d(o1), 0, 0, "packed vs alone: out");
    for (int64_t h = 0; h < D.nh; ++h)
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(lse.get(h * D.T + b + i), l1.get(h * n + i));
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  Context ctx;
  const Dims D{9, 4, 2, 5};
  Case c(D, {0, 4, 5, 9}, 80);  // includes a one-token document
  const float scale = 0.4f;
  Tensor q = tensor(c.q, {D.T, D.nh, D.d}), k = tensor(c.k, {D.T, D.nkv, D.d}), v = tensor(c.v, {D.T, D.nkv, D.d});
  Tensor cu = ints(c.cu, {4}), out = poisoned({D.T, D.nh, D.d}), lse = poisoned({D.nh, D.T});
  ops::attention_forward(ctx, q, k, v, cu, 4, scale, out, lse);
  auto rw = randn(D.T * D.nh * D.d, 83);
  Tensor dout = tensor(rw, {D.T, D.nh, D.d});
  Tensor dq = poisoned(q.shape()), dk = poisoned(k.shape()), dv = poisoned(v.shape());
  ctx.set_num_threads(1);
  ops::attention_backward(ctx, q, k, v, out, lse, dout, cu, 4, scale, dq, dk, dv);
  const auto R = to_d(rw);
  const auto qd = to_d(c.q), kd = to_d(c.k), vd = to_d(c.v);
  auto gq = fd_grad([&](const std::vector<double>& x) { return dot(attn_ref(x, kd, vd, D, c.cu, scale), R); }, qd);
  auto gk = fd_grad([&](const std::vector<double>& x) { return dot(attn_ref(qd, x, vd, D, c.cu, scale), R); }, kd);
  auto gv = fd_grad([&](const std::vector<double>& x) { return dot(attn_ref(qd, kd, x, D, c.cu, scale), R); }, vd);
  expect_close(dq, gq, 1e-4, 1e-5, "attention dq");
  expect_close(dk, gk, 1e-4, 1e-5, "attention dk");
  expect_close(dv, gv, 1e-4, 1e-5, "attention dv");

  // Bitwise identical with another thread count.
  ctx.set_num_threads(5);
  Tensor dq2 = poisoned(q.shape()), dk2 = poisoned(k.shape()), dv2 = poisoned(v.shape());
  ops::attention_backward(ctx, q, k, v, out, lse, dout, cu, 4, scale, dq2, dk2, dv2);
  EXPECT_EQ(std::memcmp(dq.data_ptr(), dq2.data_ptr(), dq.nbytes()), 0);
  EXPECT_EQ(std::memcmp(dk.data_ptr(), dk2.data_ptr(), dk.nbytes()), 0);
  EXPECT_EQ(std::memcmp(dv.data_ptr(), dv2.data_ptr(), dv.nbytes()), 0);
}

TEST(Attention, ArgumentChecks) {
  Context ctx;
  const Dims D{6, 3, 2, 4};  // 3 heads over 2 kv heads: invalid
  Case c(D, {0, 6}, 90);
  Tensor out = poisoned({6, 3, 4}), lse = poisoned({3, 6});
  EXPECT_THROW(ops::attention_forward(ctx, tensor(c.q, {6, 3, 4}), tensor(c.k, {6, 2, 4}), tensor(c.v, {6, 2, 4}),
                                      ints({0, 6}, {2}), 6, 1.0f, out, lse),
               Error);
  Tensor q = tensor(randn(6 * 2 * 4, 91), {6, 2, 4}), k = tensor(c.k, {6, 2, 4}), v = tensor(c.v, {6, 2, 4});
  Tensor o2 = poisoned({6, 2, 4}), l2 = poisoned({2, 6});
  EXPECT_THROW(ops::attention_forward(ctx, q, k, v, ints({0, 5}, {2}), 6, 1.0f, o2, l2), Error);     // ends != T
  EXPECT_THROW(ops::attention_forward(ctx, q, k, v, ints({0, 6}, {2}), 4, 1.0f, o2, l2), Error);     // > max_seqlen
  EXPECT_THROW(ops::attention_forward(ctx, q, k, v, ints({0, 4, 2, 6}, {4}), 6, 1.0f, o2, l2), Error);  // decreasing
  Tensor lse_t = poisoned({6, 2});  // transposed lse shape
  EXPECT_THROW(ops::attention_forward(ctx, q, k, v, ints({0, 6}, {2}), 6, 1.0f, o2, lse_t), Error);
}
