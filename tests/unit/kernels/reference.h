// Test helpers for the kernel tests: seeded random inputs, tensor <-> double vectors, an
// element-wise closeness check that reports the worst element, and central finite differences
// of a scalar function in double (used on the tests' own double-precision reference forwards).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moetrain::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<float> randu(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }
inline std::vector<double> to_d(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.get(i);
  return v;
}
inline std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

inline Tensor tensor(const std::vector<float>& v, const Shape& shape) { return Tensor::from_floats(v, shape); }
inline Tensor ints(const std::vector<int32_t>& v, const Shape& shape) { return Tensor::from_ints(v, shape); }
inline Tensor zeros(const Shape& shape, DType dt = DType::kF32) { return Tensor::zeros(shape, dt); }
// Filled with NaN so that an op that forgets to write an element fails the comparison.
inline Tensor poisoned(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  t.fill_(NAN);
  return t;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// |got - want| <= atol + rtol * |want| for every element; reports the worst one.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = -INFINITY;  // largest excess over the tolerance; NaN counts as infinite
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::fabs(got[i] - want[i]) - (atol + rtol * std::fabs(want[i]));
    if (std::isnan(excess)) excess = INFINITY;
    if (excess > worst) {
      worst = excess;
      worst_i = i;
    }
  }
  const bool ok = worst <= 0.0;
  if (got.empty()) return;
  EXPECT_TRUE(ok) << what << ": element " << worst_i << " got " << got[worst_i] << " want "
                  << want[worst_i] << " (rtol " << rtol << ", atol " << atol << ", n " << got.size() << ")";
}
inline void expect_close(const Tensor& got, const std::vector<double>& want, double rtol, double atol,
                         const std::string& what) {
  expect_close(to_d(got), want, rtol, atol, what);
}

// Central differences of f at x, in double: (f(x + eps e_i) - f(x - eps e_i)) / (2 eps).
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f,
                                   std::vector<double> x, double eps = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double fp = f(x);
    x[i] = x0 - eps;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * eps);
  }
  return g;
}

}  // namespace moetrain::test
