// Reduced-precision optimizer and gradient paths (optimizer.*_dtype): the generalized AdamW step
// for every storage combination against an fp64 reference of one step, stochastic rounding
// (unbiased in expectation, deterministic per (seed, step, index), independent of threads,
// addressed as word i % 4 of Philox(key, counter, i / 4)), bf16 gradient outputs of matmul and
// grouped_matmul_backward (f32 sum, one rounding), and the device-side sum-of-squares accumulator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/context.h"
#include "core/philox.h"
#include "kernels/adamw_math.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

namespace moetrain::test {
namespace {

// Storage of `v` in dtype dt (bf16: rounded to nearest even).
Tensor stored(const std::vector<float>& v, DType dt, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_floats(v, shape, dt);
}
double at(const Tensor& t, int64_t i) { return t.get(i); }
// The spacing of bf16 values around |x| (one unit in the last place).
double bf16_ulp(double x) {
  int e = 0;
  std::frexp(std::max(std::abs(x), 1e-30), &e);
  return std::ldexp(1.0, e - 8);
}

struct Combo {
  DType w, g, m, v, c;  // c: compute copy dtype, or kU8 for none
  bool sr;
};

TEST(AdamWPrecision, EveryDtypeCombinationMatchesAnFp64Step) {
  Context ctx;
  ctx.set_num_threads(2);
  const int64_t n = 4099;
  const auto w0 = randn(n, 31, 0.05f), g0 = randn(n, 32, 2.0f), m0 = randn(n, 33, 0.1f);
  auto v0 = randn(n, 34, 1.0f);
  for (auto& x : v0) x = x * x + 0.01f;
  ops::AdamWParams p;
  p.lr = 3e-3f, p.beta1 = 0.9f, p.beta2 = 0.95f, p.eps = 1e-8f, p.weight_decay = 0.1f, p.step = 7, p.grad_scale = 0.5f;
  p.rng = ctx.rng(77, 7);
  const DType F = DType::kF32, B = DType::kBF16, none = DType::kU8;
  int checked = 0;
  for (DType w : {F, B})
    for (DType g : {F, B})
      for (DType m : {F, B})
        for (DType v : {F, B})
          for (DType c : {none, F, B})
            for (bool sr : {false, true}) {
              if (sr && w == F) continue;  // stochastic rounding applies to bf16 weights only
              const Combo k{w, g, m, v, c, sr};
              Tensor W = stored(w0, k.w), G = stored(g0, k.g), M = stored(m0, k.m), V = stored(v0, k.v);
              Tensor C = k.c == none ? Tensor() : Tensor::empty({n}, k.c);
              const Tensor W_in = W.to(F), G_in = G.to(F), M_in = M.to(F), V_in = V.to(F);  // the stored inputs
              p.stochastic_rounding = k.sr;
              ops::adamw_step(ctx, W, G, M, V, p, C);
              const std::string what = fmt::format("w {} g {} m {} v {} compute {} sr {}", dtype_name(k.w), dtype_name(k.g),
                                                   dtype_name(k.m), dtype_name(k.v), k.c == none ? "none" : dtype_name(k.c), k.sr);
              const double b1 = p.beta1, b2 = p.beta2;
              const double bc1 = 1 - std::pow(b1, 7.0), bc2 = 1 - std::pow(b2, 7.0);
              int bad = 0;
              for (int64_t i = 0; i < n && bad < 3; ++i) {
                const double gi = at(G_in, i) * p.grad_scale;
                const double mi = b1 * at(M_in, i) + (1 - b1) * gi, vi = b2 * at(V_in, i) + (1 - b2) * gi * gi;
                const double wi = at(W_in, i) - p.lr * ((mi / bc1) / (std::sqrt(vi / bc2) + p.eps) + p.weight_decay * at(W_in, i));
                // f32 arithmetic noise relative to the size of the terms (m and w are differences), plus
                // for bf16 storage one nearest rounding (half an ulp) or, for stochastic weights, one of
                // the two neighbours (under one ulp). A wrong formula is off by O(lr) or O(1 - beta).
                const double ratio = std::abs((mi / bc1) / (std::sqrt(vi / bc2) + p.eps));
                const double sm = std::abs(b1 * at(M_in, i)) + std::abs((1 - b1) * gi);
                const double sv = std::abs(b2 * at(V_in, i)) + (1 - b2) * gi * gi;
                const double sw = std::abs(at(W_in, i)) + p.lr * (ratio + p.weight_decay * std::abs(at(W_in, i)));
                auto tol = [&](DType dt, double ref, double scale, double ulps) {
                  return 8 * 0x1p-24 * scale + (dt == B ? ulps * bf16_ulp(ref) : 0.0);
                };
                const double wt = k.w == B ? (k.sr ? 1.0 : 0.5) : 0.0;
                const double tw = tol(k.w, wi, sw, wt) + 1e-4 * p.lr * ratio;
                if (std::abs(at(M, i) - mi) > tol(k.m, mi, sm, 0.5)) ++bad, ADD_FAILURE() << what << " m[" << i << "] " << at(M, i) << " vs " << mi;
                if (std::abs(at(V, i) - vi) > tol(k.v, vi, sv, 0.5)) ++bad, ADD_FAILURE() << what << " v[" << i << "] " << at(V, i) << " vs " << vi;
                if (std::abs(at(W, i) - wi) > tw) ++bad, ADD_FAILURE() << what << " w[" << i << "] " << at(W, i) << " vs " << wi;
                if (C.defined()) {
                  // The compute copy holds the stored weight, rounded (RNE) to its own dtype.
                  const double want = k.c == F ? at(W, i) : static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(at(W, i)))));
                  if (at(C, i) != want) ++bad, ADD_FAILURE() << what << " compute[" << i << "] " << at(C, i) << " vs " << want;
                }
              }
              ++checked;
            }
  EXPECT_EQ(checked, 16 * 3 + 8 * 3);
}

TEST(AdamWPrecision, NearestEvenBf16WeightsEqualRoundingTheF32Update) {
  Context ctx;
  const int64_t n = 1000;
  const auto w0 = randn(n, 41, 0.05f), g0 = randn(n, 42);
  ops::AdamWParams p;
  p.lr = 1e-3f, p.step = 1, p.stochastic_rounding = false;
  Tensor wf = stored(w0, DType::kBF16).to(DType::kF32), mf = zeros({n}), vf = zeros({n}), none;
  Tensor wb = stored(w0, DType::kBF16), mb = zeros({n}), vb = zeros({n});
  ops::adamw_step(ctx, wf, tensor(g0, {n}), mf, vf, p, none);
  ops::adamw_step(ctx, wb, tensor(g0, {n}), mb, vb, p, none);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(wb.data<uint16_t>()[i], float_to_bf16(wf.data<float>()[i])) << i;  // torch's fused AdamW on bf16
}

// bf16_stochastic has no exponent test: infinities survive the add of the 16 random bits, NaN is
// caught by a compare. Same bits as the definition with the test (bf16_rne for Inf and NaN).
TEST(AdamWPrecision, StochasticRoundingOfNonFiniteAndLastBinadeValues) {
  namespace am = adamw_math;
  auto with_test = [](float f, uint32_t r) -> uint16_t {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return am::bf16_rne(f);
    return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
  };
  const uint32_t words[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu,
                            0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x00000000u, 0x80000000u, 0x00000001u,
                            0x3f800000u, 0x3f80ffffu};
  const uint32_t randoms[] = {0u, 1u, 0x7fffu, 0x8000u, 0xffffu, 0x12345678u, 0xffffffffu};
  for (uint32_t w : words)
    for (uint32_t r : randoms) {
      float f;
      std::memcpy(&f, &w, 4);
      EXPECT_EQ(am::bf16_stochastic(f, r), with_test(f, r)) << fmt::format("word {:#x} random {:#x}", w, r);
    }
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(am::bf16_stochastic(inf, 0xffffu), 0x7f80u);
  EXPECT_EQ(am::bf16_stochastic(-inf, 0xffffu), 0xff80u);
  EXPECT_EQ(am::bf16_stochastic(std::nanf(""), 0xffffu), 0x7fffu);
}

// The new f32 weight x of every element is the same; the rounded results must average to x.
// make_consts' zero_m, zero_v and zero_q (the GPU kernel's short path for a vector whose gradient, m
// and v are all +0) are what update() forms for such an element: the same m, v and weight bits for
// every weight, including constants that make the zero state's quotient NaN (eps 0) or its moments
// NaN (grad_scale NaN), and weights of either sign, 0 and -0.
TEST(AdamWPrecision, ZeroStateConstantsMatchUpdate) {
  namespace am = adamw_math;
  const float weights[] = {0.0f, -0.0f, 0.05f, -1.5f, 3e38f, 1e-40f, -7e-3f, INFINITY};
  struct C { float lr, b1, b2, eps, wd, gs; int64_t step; };
  const C cs[] = {{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1},   {1e-5f, 0.9f, 0.999f, 1e-6f, 0.0f, 0.7f, 500},
                  {3e-4f, 0.9f, 0.95f, 0.0f, 0.1f, 1.0f, 3},    {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, NAN, 2},
                  {2e-3f, 0.0f, 0.0f, 1e-8f, 0.01f, 1.0f, 7}};
  auto bits = [](float f) { return am::float_bits(f); };
  for (const C& c : cs) {
    const am::Consts k = am::make_consts(c.lr, c.b1, c.b2, c.eps, c.wd, c.step, c.gs);
    for (const float w0 : weights) {
      float m = 0.0f, v = 0.0f, w = w0;
      am::update(k, 0.0f, m, v, w);
      const float short_w = am::sub(w0, am::mul(k.lr, am::add(k.zero_q, am::mul(k.wd, w0))));
      EXPECT_EQ(bits(m), bits(k.zero_m)) << "m, eps " << c.eps << " grad_scale " << c.gs;
      EXPECT_EQ(bits(v), bits(k.zero_v)) << "v, eps " << c.eps << " grad_scale " << c.gs;
      EXPECT_EQ(bits(w), bits(short_w)) << "w " << w0 << ", eps " << c.eps << " grad_scale " << c.gs;
    }
  }
}

TEST(AdamWPrecision, StochasticRoundingIsUnbiasedAndIndexAddressed) {
  Context ctx(Device::cpu(), 1234);
  const int64_t n = 1 << 18;
  ops::AdamWParams p;
  p.lr = 1e-3f, p.step = 3, p.weight_decay = 0.0f, p.stochastic_rounding = true;
  p.rng = ctx.rng(5, 3);
  const float w_start = 0.0123f, g = 0.37f;
  auto run = [&](int threads, RngStream rng) {
    ctx.set_num_threads(threads);
    ops::AdamWParams q = p;
    q.rng = rng;
    Tensor w = stored(std::vector<float>(n, w_start), DType::kBF16), m = zeros({n}), v = zeros({n}), none;
    ops::adamw_step(ctx, w, tensor(std::vector<float>(n, g), {n}), m, v, q, none);
    return w;
  };
  // The exact f32 value before rounding (the f32 path of the same step).
  Tensor wf = stored({w_start}, DType::kBF16).to(DType::kF32), m1 = zeros({1}), v1 = zeros({1}), none;
  ops::AdamWParams q = p;
  q.stochastic_rounding = false;
  ops::adamw_step(ctx, wf, tensor({g}, {1}), m1, v1, q, none);
  const float x = wf.data<float>()[0];
  uint32_t xb;
  std::memcpy(&xb, &x, 4);
  const double lo = bf16_to_float(static_cast<uint16_t>(xb >> 16)), hi = bf16_to_float(static_cast<uint16_t>((xb >> 16) + 1));
  const double frac = (static_cast<double>(x) - lo) / (hi - lo);
  ASSERT_GT(frac, 0.02);
  ASSERT_LT(frac, 0.98);

  const Tensor a = run(1, p.rng), b = run(2, p.rng);
  const uint16_t* ap = a.data<uint16_t>();
  int64_t up = 0;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = bf16_to_float(ap[i]);
    ASSERT_TRUE(r == lo || r == hi) << i << ": " << r << " is not a neighbour of " << x;
    up += r == hi;
    sum += r;
    // Element i rounds up iff its 16 dropped bits plus random half-word i % 8 of the 7-round Philox
    // call i / 8 (words in order, low half first) carry into bit 16: the addressing contract the CUDA
    // kernel must follow.
    const uint32_t word =
        philox4x32_rounds<7>(p.rng.key, p.rng.counter, static_cast<uint64_t>(i) / 8).v[(i % 8) / 2];
    const uint32_t half = i % 2 == 0 ? word & 0xffffu : word >> 16;
    ASSERT_EQ(r == hi, (xb & 0xffffu) + half >= 0x10000u) << i;
  }
  const double pu = static_cast<double>(up) / n, sigma = std::sqrt(frac * (1 - frac) / n);
  EXPECT_NEAR(pu, frac, 5 * sigma);
  EXPECT_NEAR(sum / n, x, 5 * sigma * (hi - lo));  // E[round(x)] = x
  // Deterministic per (seed, step, index): thread count changes nothing; another step or seed does.
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
  const Tensor c = run(2, ctx.rng(5, 4));
  Context other(Device::cpu(), 99);
  const Tensor d = run(1, other.rng(5, 3));
  EXPECT_NE(std::memcmp(a.data_ptr(), c.data_ptr(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.data_ptr(), d.data_ptr(), a.nbytes()), 0);
}

TEST(AdamWPrecision, RejectsBadDtypesAndAliasing) {
  Context ctx;
  const int64_t n = 8;
  ops::AdamWParams p;
  Tensor w = zeros({n}), g = zeros({n}), m = zeros({n}), v = zeros({n}), none;
  Tensor w16 = zeros({n}, DType::kF16), m_i32 = zeros({n}, DType::kI32);
  EXPECT_THROW(ops::adamw_step(ctx, w16, g, m, v, p, none), Error);
  EXPECT_THROW(ops::adamw_step(ctx, w, g, m_i32, v, p, none), Error);
  Tensor alias = w;
  EXPECT_THROW(ops::adamw_step(ctx, w, g, m, v, p, alias), Error);
}

TEST(Bf16Gradients, MatmulAccumulatesInF32AndRoundsOnce) {
  Context ctx;
  const int64_t M = 13, N = 9, K = 21;
  const auto a = randn(M * K, 51), b = randn(K * N, 52), c0 = randn(M * N, 53, 4.0f);
  Tensor c = stored(c0, DType::kBF16, {M, N});
  const Tensor c_in = c.to(DType::kF32);
  ops::matmul(ctx, tensor(a, {M, K}), ops::Trans::kNo, tensor(b, {K, N}), ops::Trans::kNo, c, 0.5f, 1.0f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(a[i * K + k]) * b[k * N + j];
      const double want = at(c_in, i * N + j) + 0.5 * s;
      EXPECT_NEAR(at(c, i * N + j), want, 0.5 * bf16_ulp(want) + 1e-5 * std::abs(want)) << i << "," << j;
    }
  // beta 0 overwrites (a NaN in C does not survive).
  Tensor cn = Tensor::empty({M, N}, DType::kBF16);
  cn.fill_(NAN);
  ops::matmul(ctx, tensor(a, {M, K}), ops::Trans::kNo, tensor(b, {K, N}), ops::Trans::kNo, cn, 1.0f, 0.0f);
  for (int64_t i = 0; i < M * N; ++i) ASSERT_TRUE(std::isfinite(at(cn, i))) << i;
}

TEST(Bf16Gradients, GroupedBackwardDwAccumulatesPerExpert) {
  Context ctx;
  const int64_t E = 4, Mo = 6, K = 10;
  const std::vector<int32_t> off = {0, 5, 5, 12, 13};  // expert 1 has no rows
  const int64_t Nr = 15;                                 // rows past offsets[E] are unused
  const auto x = randn(Nr * K, 61), w = randn(E * Mo * K, 62), dy = randn(Nr * Mo, 63), dw0 = randn(E * Mo * K, 64);
  Tensor dw = stored(dw0, DType::kBF16, {E, Mo, K}), none;
  const Tensor dw_in = dw.to(DType::kF32);
  Tensor dw_before = dw.to(DType::kBF16);
  ops::grouped_matmul_backward(ctx, tensor(x, {Nr, K}), tensor(w, {E, Mo, K}), ints(off, {E + 1}), tensor(dy, {Nr, Mo}),
                               none, dw);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t mo = 0; mo < Mo; ++mo)
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t r = off[e]; r < off[e + 1]; ++r) s += static_cast<double>(dy[r * Mo + mo]) * x[r * K + k];
        const int64_t i = (e * Mo + mo) * K + k;
        const double want = at(dw_in, i) + s;
        EXPECT_NEAR(at(dw, i), want, 0.5 * bf16_ulp(want) + 1e-5 * std::abs(want)) << e << "," << mo << "," << k;
      }
  // The expert with no rows is untouched bit for bit.
  EXPECT_EQ(std::memcmp(dw.data<uint16_t>() + Mo * K, dw_before.data<uint16_t>() + Mo * K, Mo * K * 2), 0);
  Tensor dw16 = zeros({E, Mo, K}, DType::kF16);
  EXPECT_THROW(ops::grouped_matmul_backward(ctx, tensor(x, {Nr, K}), tensor(w, {E, Mo, K}), ints(off, {E + 1}),
                                            tensor(dy, {Nr, Mo}), none, dw16), Error);
}

TEST(SumAccumulate, AddsF64ValuesInOrderAndChecksDtypes) {
  Context ctx;
  Tensor x = Tensor::zeros({3}, DType::kF64);
  x.data<double>()[0] = 1e16, x.data<double>()[1] = 1.0, x.data<double>()[2] = -1e16;
  Tensor acc = Tensor::zeros({1}, DType::kF64);
  acc.data<double>()[0] = 0.5;
  ops::sum_accumulate(ctx, x, acc);
  EXPECT_EQ(acc.data<double>()[0], 0.5 + ((1e16 + 1.0) - 1e16));  // element order, added to acc
  Tensor f32 = Tensor::zeros({3}, DType::kF32);
  EXPECT_THROW(ops::sum_accumulate(ctx, f32, acc), Error);
  Tensor two = Tensor::zeros({2}, DType::kF64);
  EXPECT_THROW(ops::sum_accumulate(ctx, x, two), Error);
}

TEST(SumSquaresAccumulate, F32AndBf16IntoOneF64Accumulator) {
  Context ctx;
  ctx.set_num_threads(2);
  const auto a = randn(70001, 71), b = randn(333, 72, 3.0f);
  const Tensor ta = tensor(a, {70001}), tb = stored(b, DType::kBF16);
  Tensor acc = Tensor::zeros({1}, DType::kF64);
  ops::sum_squares_accumulate(ctx, ta, acc);
  ops::sum_squares_accumulate(ctx, tb, acc);
  double want = 0;
  for (float x : a) want += static_cast<double>(x) * x;
  for (int64_t i = 0; i < tb.numel(); ++i) want += at(tb, i) * at(tb, i);
  EXPECT_NEAR(acc.data<double>()[0], want, 1e-12 * want);
  // Same value as the host-returning op, bit for bit, for f32 input.
  Tensor acc2 = Tensor::zeros({1}, DType::kF64);
  ops::sum_squares_accumulate(ctx, ta, acc2);
  EXPECT_EQ(acc2.data<double>()[0], ops::sum_squares(ctx, ta));
  Tensor bad_acc = zeros({1});
  EXPECT_THROW(ops::sum_squares_accumulate(ctx, ta, bad_acc), Error);
  Tensor two = Tensor::zeros({2}, DType::kF64);
  EXPECT_THROW(ops::sum_squares_accumulate(ctx, ta, two), Error);
}

}  // namespace
}  // namespace moetrain::test
