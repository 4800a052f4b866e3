// Profiler: scopes are free when disabled, nested ops are counted once, regions separately, and
// report() sums per name (CPU clock path; the CUDA event path runs in the GPU bench).
#include <gtest/gtest.h>

#include <thread>

#include "core/profiler.h"
#include "kernels/ops.h"

namespace moetrain {
namespace {

TEST(Profiler, DisabledRecordsNothing) {
  Profiler::enable(false);
  Context ctx;
  { ProfileScope s(ctx, "op"); }
  EXPECT_TRUE(Profiler::report().empty());
}

TEST(Profiler, NestedOpsCountOnceRegionsSeparately) {
  Context ctx;
  Profiler::enable(true);
  for (int i = 0; i < 3; ++i) {
    ProfileScope region(ctx, "step", ProfileKind::kRegion);
    ProfileScope outer(ctx, "outer");
    { ProfileScope inner(ctx, "inner"); }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  { ProfileScope after(ctx, "after"); }  // depth is back to zero: timed
  const auto rep = Profiler::report();
  Profiler::enable(false);
  ASSERT_EQ(rep.size(), 3u);
  EXPECT_EQ(rep[0].name, "outer");
  EXPECT_EQ(rep[0].calls, 3);
  EXPECT_GE(rep[0].total_ms, 5.0);
  EXPECT_EQ(rep[1].name, "after");
  EXPECT_EQ(rep[2].name, "step");
  EXPECT_EQ(rep[2].kind, ProfileKind::kRegion);
  EXPECT_GE(rep[2].total_ms, rep[0].total_ms);
}

TEST(Profiler, OpsDispatchIsTimedByName) {
  Context ctx;
  Tensor a = Tensor::zeros({64, 64}, DType::kF32, Device::cpu());
  Tensor c = Tensor::zeros({64, 64}, DType::kF32, Device::cpu());
  Profiler::enable(true);
  ops::matmul(ctx, a, ops::Trans::kNo, a, ops::Trans::kNo, c);
  ops::matmul(ctx, a, ops::Trans::kNo, a, ops::Trans::kNo, c);
  ops::add_(ctx, c, a);
  const auto rep = Profiler::report();
  Profiler::enable(false);
  ASSERT_EQ(rep.size(), 2u);
  EXPECT_EQ(rep[0].name == "matmul" ? rep[0].calls : rep[1].calls, 2);
}

}  // namespace
}  // namespace moetrain
