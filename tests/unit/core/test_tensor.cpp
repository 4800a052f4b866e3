// Core tensor, dtype, allocator and RNG tests.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/context.h"
#include "core/energy_meter.h"
#include "core/philox.h"
#include "core/tensor.h"

using namespace moetrain;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, F16AndF8) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(1e6f))));
  for (float v : {0.0f, 1.0f, -1.5f, 448.0f, 0.015625f, 0.001953125f})
    EXPECT_EQ(f8e4m3_to_float(float_to_f8e4m3(v)), v) << v;
  EXPECT_EQ(f8e4m3_to_float(float_to_f8e4m3(1000.0f)), 448.0f);  // saturates
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(0x7f)));
  for (float v : {0.0f, 1.0f, -1.5f, 57344.0f, 1.52587890625e-05f})
    EXPECT_EQ(f8e5m2_to_float(float_to_f8e5m2(v)), v) << v;
  // every e4m3 code decodes and re-encodes to itself (except NaNs)
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_f8e4m3(f8e4m3_to_float(static_cast<uint8_t>(c))), c == 0x80 ? 0x80 : c) << c;
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_floats({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.get(1), 3.0);  // (0,1) of the transpose is (1,0) of t
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.get(2), 4.0);
  s.set(0, 42);
  EXPECT_EQ(t.get(1), 42.0);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.get(1), 3.0);
  EXPECT_EQ(t.view({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_THROW(t.view({4, -1}), Error);
  EXPECT_THROW(tt.view({6}), Error);
}

TEST(Tensor, DtypeConversion) {
  Tensor t = Tensor::from_floats({1.0f, -2.0f, 0.3333f}, {3});
  Tensor b = t.to(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  Tensor back = b.to(DType::kF32);
  EXPECT_NEAR(back.get(2), 0.3333, 2e-3);
  EXPECT_EQ(back.get(1), -2.0);
}

TEST(Allocator, AccountsByCategory) {
  Allocator& a = allocator_for(Device::cpu());
  a.reset_peaks();
  MemStats before = a.stats();
  {
    Tensor w = Tensor::empty({1000}, DType::kF32, Device::cpu(), MemCategory::kWeights);
    Tensor g = Tensor::empty({500}, DType::kF32, Device::cpu(), MemCategory::kGradients);
    MemStats s = a.stats();
    size_t wi = static_cast<size_t>(MemCategory::kWeights), gi = static_cast<size_t>(MemCategory::kGradients);
    EXPECT_EQ(s.current[wi] - before.current[wi], 4000u);
    EXPECT_EQ(s.current[gi] - before.current[gi], 2000u);
  }
  MemStats after = a.stats();
  size_t wi = static_cast<size_t>(MemCategory::kWeights);
  EXPECT_EQ(after.current[wi], before.current[wi]);
  EXPECT_GE(after.peak[wi], before.current[wi] + 4000u);
}

// Known answers of Philox4x32-10 published with Random123 (Salmon et al.'s reference implementation,
// kat_vectors): counter words 0..3 and key words 0..1, low word first.
TEST(Rng, PhiloxMatchesRandom123KnownAnswers) {
  auto words = [](const Philox4& r) { return std::vector<uint32_t>(r.v, r.v + 4); };
  EXPECT_EQ(words(philox4x32(0, 0, 0)), (std::vector<uint32_t>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(words(philox4x32(~0ull, ~0ull, ~0ull)),
            (std::vector<uint32_t>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(words(philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull)),
            (std::vector<uint32_t>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  // the same file's 7-round answers (the rounds stochastic rounding uses)
  EXPECT_EQ(words(philox4x32_rounds<7>(0, 0, 0)),
            (std::vector<uint32_t>{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}));
  EXPECT_EQ(words(philox4x32_rounds<7>(~0ull, ~0ull, ~0ull)),
            (std::vector<uint32_t>{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}));
  EXPECT_EQ(words(philox4x32_rounds<7>(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull)),
            (std::vector<uint32_t>{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}));
}

TEST(Rng, PhiloxIsReproducibleAndSpread) {
  Context a(Device::cpu(), 7, 0), b(Device::cpu(), 7, 0), c(Device::cpu(), 7, 1);
  auto sa = a.rng(1, 5), sb = b.rng(1, 5), sc = c.rng(1, 5);
  EXPECT_EQ(sa.key, sb.key);
  EXPECT_NE(sa.key, sc.key);
  std::set<uint32_t> seen;
  double mean = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    Philox4 r = philox4x32(sa.key, sa.counter, static_cast<uint64_t>(i));
    seen.insert(r.v[0]);
    float x, y;
    philox_normal2(r, &x, &y);
    mean += x;
    sq += x * x;
  }
  EXPECT_GT(seen.size(), static_cast<size_t>(n - 5));
  mean /= n;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
}

TEST(Check, ErrorsCarryMessage) {
  try {
    MT_CHECK(1 == 2, "[test] value {} wrong", 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[test] value 3 wrong"), std::string::npos);
  }
}

// The bench's energy columns must degrade to "unavailable" (never a crash or a made-up number) where
// there is no GPU, no NVML or no such device; CI has neither, the GPU machine has both.
TEST(EnergyMeter, UnavailableWithoutADeviceSaysWhy) {
  const EnergyMeter none("");
  EXPECT_FALSE(none.available());
  EXPECT_EQ(none.why_unavailable(), "no GPU");
  EXPECT_FALSE(none.joules().has_value());
  EXPECT_FALSE(none.power_limit_w().has_value());
  const EnergyMeter bogus("0000ffff:ff:1f.0");  // no machine has this PCI address
  EXPECT_FALSE(bogus.available());
  EXPECT_FALSE(bogus.why_unavailable().empty());
  EXPECT_FALSE(bogus.joules().has_value());
}
