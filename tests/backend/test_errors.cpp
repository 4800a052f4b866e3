// Device-side user errors: an allocation the GPU cannot hold fails with a message naming its
// size, its category and the memory moetrain holds by category, and the process can go on.
#include <gtest/gtest.h>

#include <string>

#include "backend_util.h"
#include "core/context.h"
#include "core/tensor.h"

using namespace moetrain;

TEST(BackendErrors, OutOfMemoryNamesSizeAndCategory) {
  MT_REQUIRE_GPU();
  Context ctx(Device::cuda(0));
  // 64 TiB of activations: far beyond any GPU, refused by cudaMalloc at once.
  const int64_t n = int64_t(1) << 45;
  try {
    Tensor t = Tensor::empty({n}, DType::kBF16, Device::cuda(0), MemCategory::kActivations);
    FAIL() << "a 64 TiB allocation succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of GPU memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("65536.00 GiB"), std::string::npos) << msg;
  }
  // The allocator still works afterwards.
  Tensor ok = Tensor::zeros({1024}, DType::kF32, Device::cuda(0), MemCategory::kWorkspace);
  EXPECT_EQ(ok.to(Device::cpu()).get(7), 0.0);
}
