// Backend comparison harness: each CUDA op against its CPU twin on fresh random inputs.
// Cases live in tests/backend/*.cpp; all skip cleanly when no GPU is visible.
#include <gtest/gtest.h>

#include "core/context.h"

TEST(Backend, DeviceVisibleOrSkipped) {
  if (moetrain::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  moetrain::Context ctx(moetrain::Device::cuda(0));
  EXPECT_GE(ctx.facts().cc_major, 8);
}
