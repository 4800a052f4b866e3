// Utility ops on the CPU: cast, add_, scale_, sum_squares and the Philox normal fill, each against
// a plain loop, plus thread-count independence and argument checks.
#include <cstring>

#include "core/context.h"
#include "core/philox.h"
#include "kernels/ops.h"
#include "unit/kernels/reference.h"

using namespace moetrain;
using namespace moetrain::test;

TEST(Utilities, CastF32Bf16F16) {
  Context ctx;
  auto v = randn(1001, 1, 3.0f);
  v[0] = 1.0f + std::ldexp(1.0f, -8);  // a tie: rounds to even
  Tensor src = tensor(v, {1001});
  Tensor b = Tensor::empty({7, 143}, DType::kBF16);  // same numel, other shape
  ops::cast(ctx, src, b);
  const uint16_t* bp = b.data<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bp[i], float_to_bf16(v[i])) << i;
  EXPECT_EQ(bp[0], float_to_bf16(1.0f));
  Tensor back = Tensor::empty({1001}, DType::kF32);
  ops::cast(ctx, b, back);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(back.data<float>()[i], bf16_to_float(bp[i]));
  Tensor h = Tensor::empty({1001}, DType::kF16);
  ops::cast(ctx, src, h);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(h.data<uint16_t>()[i], float_to_f16(v[i])) << i;
  Tensor wrong = Tensor::empty({1000}, DType::kBF16);
  EXPECT_THROW(ops::cast(ctx, src, wrong), Error);
  Tensor ids = Tensor::empty({1001}, DType::kI32);
  EXPECT_THROW(ops::cast(ctx, src, ids), Error);
}

TEST(Utilities, AddScaleSumSquares) {
  Context ctx;
  const int64_t n = 70001;  // several sum blocks, not a multiple of anything
  auto y0 = randn(n, 2), x = randn(n, 3);
  Tensor y = tensor(y0, {n}), xt = tensor(x, {n});
  ops::add_(ctx, y, xt, -0.5f);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = static_cast<double>(y0[i] + -0.5f * x[i]);
  expect_close(y, want, 0, 0, "add_");
  ops::scale_(ctx, y, 3.0f);
  for (auto& w : want) w = static_cast<float>(static_cast<float>(w) * 3.0f);
  expect_close(y, want, 0, 0, "scale_");
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  EXPECT_NEAR(ops::sum_squares(ctx, xt), ss, 1e-9 * ss);
  Tensor ints_t = Tensor::zeros({n}, DType::kI32);
  EXPECT_THROW(ops::add_(ctx, ints_t, xt), Error);
  Tensor short_t = tensor({1, 2}, {2});
  EXPECT_THROW(ops::add_(ctx, y, short_t), Error);
  Tensor bf = Tensor::zeros({n}, DType::kBF16);
  EXPECT_THROW(ops::scale_(ctx, bf, 2.0f), Error);  // CPU computes in f32 only
}

TEST(Utilities, SumSquaresIndependentOfThreads) {
  Context ctx;
  auto x = randn(200003, 4);
  Tensor t = tensor(x, {200003});
  ctx.set_num_threads(1);
  const double a = ops::sum_squares(ctx, t);
  ctx.set_num_threads(5);
  const double b = ops::sum_squares(ctx, t);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
}

TEST(Utilities, FillNormalIsIndexAddressedPhilox) {
  Context ctx;
  RngStream s{0x1234567890ULL, 77};
  const int64_t n = 40001;  // odd: the last pair is half used
  Tensor t = Tensor::empty({n}, DType::kF32);
  ctx.set_num_threads(3);
  ops::fill_normal(ctx, t, 0.5f, 2.0f, s);
  const float* p = t.data<float>();
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{12345}, n - 2, n - 1}) {
    float z0, z1;
    philox_normal2(philox4x32(s.key, s.counter, static_cast<uint64_t>(i / 2)), &z0, &z1);
    EXPECT_EQ(p[i], 0.5f + 2.0f * (i % 2 == 0 ? z0 : z1)) << i;
  }
  double mean = 0.0, var = 0.0;
  for (int64_t i = 0; i < n; ++i) mean += p[i];
  mean /= n;
  for (int64_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
  var /= n;
  EXPECT_NEAR(mean, 0.5, 0.05);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.05);
  // Same stream, one thread, a prefix-shaped tensor: identical values.
  ctx.set_num_threads(1);
  Tensor u = Tensor::empty({1001}, DType::kF32);
  ops::fill_normal(ctx, u, 0.5f, 2.0f, s);
  EXPECT_EQ(std::memcmp(u.data_ptr(), t.data_ptr(), 1001 * 4), 0);
  // Another counter gives other values; bf16 gets the rounded f32 values.
  Tensor w = Tensor::empty({16}, DType::kF32);
  ops::fill_normal(ctx, w, 0.5f, 2.0f, RngStream{s.key, 78});
  EXPECT_NE(w.data<float>()[0], p[0]);
  Tensor b = Tensor::empty({16}, DType::kBF16);
  ops::fill_normal(ctx, b, 0.5f, 2.0f, s);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.data<uint16_t>()[i], float_to_bf16(p[i]));
}

TEST(Dispatch, DevicesAndLayoutsAreChecked) {
  Context ctx;
  // A "CUDA" tensor that is really host memory: enough to exercise the dispatch checks.
  std::vector<float> host(6, 1.0f);
  Tensor fake = Tensor::from_blob(host.data(), {6}, DType::kF32, Device::cuda(0));
  Tensor cpu_t = tensor({1, 2, 3, 4, 5, 6}, {6});
  try {
    ops::add_(ctx, cpu_t, fake);
    FAIL() << "mixed devices accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos) << e.what();
  }
  try {
    ops::scale_(ctx, fake, 2.0f);
    FAIL() << "CUDA tensors with a CPU context accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[scale_]"), std::string::npos) << e.what();
  }
  Tensor m = tensor(randn(12, 5), {3, 4});
  Tensor mt = m.transpose(0, 1);
  EXPECT_THROW(ops::scale_(ctx, mt, 2.0f), Error);  // non-contiguous
}
