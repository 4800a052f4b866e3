// The board energy counter (core/energy_meter.h) on a real GPU: the path `moetrain bench` reads for its
// J/step and W columns. CI has no GPU and covers only the "unavailable" path
// (EnergyMeter.UnavailableWithoutADeviceSaysWhy); this runs on the GPU machine.
#include <chrono>

#include "backend_util.h"
#include "core/energy_meter.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

TEST(Backend, EnergyMeterReadsTheBoard) {
  MT_REQUIRE_GPU();
  const EnergyMeter m(cuda_pci_bus_id(0));
  if (!m.available()) GTEST_SKIP() << "no NVML here: " << m.why_unavailable();
  const std::optional<double> limit = m.power_limit_w();
  ASSERT_TRUE(limit.has_value());
  EXPECT_GT(*limit, 50.0);
  EXPECT_LT(*limit, 2000.0);

  // About a second of bf16 GEMMs: the counter moves in steps of up to 0.1 s, so the mean power of
  // this window is good to about 20%. A busy GPU draws more than an idle one and, averaged over a
  // second, not far above its enforced limit.
  Context& ctx = gpu_ctx();
  const int64_t n = 4096;
  Tensor a = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  Tensor b = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  Tensor c = Tensor::empty({n, n}, DType::kBF16, Device::cuda(0));
  ops::fill_normal(ctx, a, 0.0f, 1.0f, ctx.rng(71));
  ops::fill_normal(ctx, b, 0.0f, 1.0f, ctx.rng(72));
  ops::matmul(ctx, a, ops::Trans::kNo, b, ops::Trans::kNo, c);
  device_sync();
  const std::optional<double> e0 = m.joules();
  const auto t0 = std::chrono::steady_clock::now();
  double sec = 0.0;
  while (sec < 1.0) {
    for (int i = 0; i < 200; ++i) ops::matmul(ctx, a, ops::Trans::kNo, b, ops::Trans::kNo, c);
    device_sync();
    sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const std::optional<double> e1 = m.joules();
  ASSERT_TRUE(e0.has_value() && e1.has_value());
  const double watts = (*e1 - *e0) / sec;
  EXPECT_GT(*e1, *e0) << "the counter did not move in " << sec << " s";
  EXPECT_GT(watts, 60.0) << "busy for " << sec << " s";
  EXPECT_LT(watts, 1.5 * *limit) << "busy for " << sec << " s, limit " << *limit << " W";
  const bool sane = watts > 60.0 && watts < 1.5 * *limit;
  check_scalar("energy_meter", "mean W of 1 s of bf16 GEMMs, within (60, 1.5 x limit)", sane ? 0.0 : 1.0, 0.0, 0.0);
}

}  // namespace
}  // namespace moetrain::test
