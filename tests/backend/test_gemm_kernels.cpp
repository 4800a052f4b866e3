// The two Hopper kernels for the expert y, dx and dW GEMMs against each other: the warp-specialized
// TMA kernel (grouped_gemm_ws.cu, the default) and the cp.async wgmma kernel it replaced
// (grouped_gemm_wgmma.cu, MT_GEMM_KERNEL=wgmma). Both sum each output in the same wgmma order, so
// their outputs must be the same bits (y and dx also on the ws kernel's variants 2 and 6-9),
// and dW's epilogue sum of squares too except for a written f32 dW (other tiles, so other partials;
// also a bf16 dW when the process runs with MT_DW_TALL=1, the 256 x 192 tiles; the bf16 box ring, the
// default without sums and under MT_DW_TMA=1 with them too, keeps all the bits; a bf16 dW is also run
// without the sums, which is where the default takes the ring),
// at the Qwen3-30B-A3B widths with uneven routing, experts without rows and unused capacity rows. (The CPU-twin
// comparison of the default path is Backend.GroupedMatmul.)
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "backend_util.h"
#include "kernels/ops.h"

#ifdef MT_WITH_CUDA  // the kernels' own entry points exist only in a CUDA build
#include <cuda_runtime.h>

#include "kernels/cuda/grouped_gemm_wgmma.cuh"
#include "kernels/cuda/grouped_gemm_ws.cuh"

namespace moetrain::test {
namespace {

Tensor gpu_randn(const Shape& s, uint64_t seed, float std) {
  Tensor t = Tensor::empty(s, DType::kBF16, Device::cuda(0));
  ops::fill_normal(gpu_ctx(), t, 0.0f, std, gpu_ctx().rng(seed));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  device_sync();
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

struct Widths { int64_t K, M; };

// Every ws path against the wgmma kernel over the same routing (counts[e] rows for expert e, then
// 77 unused capacity rows): y and dx for each of `variants` over outputs poisoned with NaN first,
// and dW f32 / bf16, = / +=, with the epilogue's sum of squares (bf16 also without it).
void check_ws_against_wgmma(const std::vector<int32_t>& counts, const std::vector<Widths>& widths,
                            const std::vector<int>& variants) {
  const int E = static_cast<int>(counts.size());
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  const int64_t N = off.back() + 77;  // unused capacity rows at the end
  const Tensor offsets = Tensor::from_ints(off, {E + 1}).to(Device::cuda(0));
  for (const Widths s : widths) {
    const std::string tag = "E" + std::to_string(E) + " N" + std::to_string(N) + " K" + std::to_string(s.K) + " M" +
                            std::to_string(s.M);
    const Tensor x = gpu_randn({N, s.K}, 1, 1.0f), w = gpu_randn({E, s.M, s.K}, 2, 0.03f), dy = gpu_randn({N, s.M}, 3, 1.0f);
    ASSERT_TRUE(cuda::grouped_gemm_ws_supported(gpu_ctx(), N, s.K, s.M, E, x.data_ptr(), w.data_ptr(), x.data_ptr()));
    auto bf = [](const Tensor& t) { return static_cast<const __nv_bfloat16*>(t.data_ptr()); };
    auto bfm = [](Tensor& t) { return static_cast<__nv_bfloat16*>(t.data_ptr()); };
    Tensor y1 = Tensor::empty({N, s.M}, DType::kBF16, Device::cuda(0)), y2 = Tensor::empty({N, s.M}, DType::kBF16, Device::cuda(0));
    Tensor d1 = Tensor::empty({N, s.K}, DType::kBF16, Device::cuda(0)), d2 = Tensor::empty({N, s.K}, DType::kBF16, Device::cuda(0));
    cuda::grouped_gemm_wgmma_forward(gpu_ctx(), bf(x), bf(w), offsets.data<int32_t>(), E, N, s.K, s.M, bfm(y2));
    cuda::grouped_gemm_wgmma_dx(gpu_ctx(), bf(dy), bf(w), offsets.data<int32_t>(), E, N, s.K, s.M, bfm(d2));
    for (const int variant : variants) {
      const std::string vtag = tag + (variant ? " variant " + std::to_string(variant) : "");
      ASSERT_EQ(cudaMemset(y1.data_ptr(), 0xFF, y1.nbytes()), cudaSuccess);  // bf16 NaNs
      ASSERT_EQ(cudaMemset(d1.data_ptr(), 0xFF, d1.nbytes()), cudaSuccess);
      cuda::grouped_gemm_ws_forward(gpu_ctx(), bf(x), bf(w), offsets.data<int32_t>(), E, N, s.K, s.M, bfm(y1), variant);
      const bool y_same = same_bits(y1, y2);
      EXPECT_TRUE(y_same) << "y " << vtag;
      check_scalar("grouped_gemm_ws", "y bits == wgmma kernel's, " + vtag, y_same ? 0.0 : 1.0, 0.0, 0.0);
      cuda::grouped_gemm_ws_dx(gpu_ctx(), bf(dy), bf(w), offsets.data<int32_t>(), E, N, s.K, s.M, bfm(d1), variant);
      const bool dx_same = same_bits(d1, d2);
      EXPECT_TRUE(dx_same) << "dx " << vtag;
      check_scalar("grouped_gemm_ws", "dx bits == wgmma kernel's, " + vtag, dx_same ? 0.0 : 1.0, 0.0, 0.0);
    }
    // dW, f32 and bf16, = and += (from the same start), with the epilogue's sum of squares.
    const char* tall_env = std::getenv("MT_DW_TALL");  // the process's dW variant (read once by the op)
    const bool dw_tall = tall_env && std::string(tall_env) == "1";
    for (const bool bf16 : {false, true}) {
      for (const bool acc : {false, true}) {
        const DType dt = bf16 ? DType::kBF16 : DType::kF32;
        Tensor w1 = Tensor::empty({E, s.M, s.K}, dt, Device::cuda(0));
        ops::fill_normal(gpu_ctx(), w1, 0.0f, 0.1f, gpu_ctx().rng(4));
        Tensor w2 = Tensor::empty({E, s.M, s.K}, dt, Device::cuda(0)), w3 = Tensor::empty({E, s.M, s.K}, dt, Device::cuda(0));
        ops::cast(gpu_ctx(), w1, w2);
        ops::cast(gpu_ctx(), w1, w3);
        Tensor ss1 = Tensor::zeros({1}, DType::kF64, Device::cuda(0)), ss2 = Tensor::zeros({1}, DType::kF64, Device::cuda(0));
        cuda::grouped_gemm_ws_dw(gpu_ctx(), bf(x), bf(dy), offsets.data<int32_t>(), E, N, s.K, s.M, w1.data_ptr(), bf16,
                                 acc, static_cast<double*>(ss1.data_ptr()));
        cuda::grouped_gemm_wgmma_dw(gpu_ctx(), bf(x), bf(dy), offsets.data<int32_t>(), E, N, s.K, s.M, w2.data_ptr(), bf16,
                                    acc, 0, 0, static_cast<double*>(ss2.data_ptr()));
        const std::string what = std::string("dW ") + (bf16 ? "bf16 " : "f32 ") + (acc ? "+= " : "= ") + tag;
        const bool dw_same = same_bits(w1, w2);
        EXPECT_TRUE(dw_same) << what;
        check_scalar("grouped_gemm_ws", what + ": bits == wgmma kernel's", dw_same ? 0.0 : 1.0, 0.0, 0.0);
        if (bf16) {  // without the sums (the box ring's default case where the shape allows it)
          cuda::grouped_gemm_ws_dw(gpu_ctx(), bf(x), bf(dy), offsets.data<int32_t>(), E, N, s.K, s.M, w3.data_ptr(),
                                   true, acc, nullptr);
          const bool plain_same = same_bits(w3, w2);
          EXPECT_TRUE(plain_same) << what << ", no sums";
          check_scalar("grouped_gemm_ws", what + ", no sums: bits == wgmma kernel's", plain_same ? 0.0 : 1.0, 0.0, 0.0);
        }
        // The sum of squares: the same bits where both kernels form per-tile partials over 128-wide
        // tiles; a written f32 gradient takes 256-wide tiles in the ws kernel since round 40, and a bf16
        // one 256 x 192 tiles under MT_DW_TALL=1, so their partials group the same squares differently
        // and only f64 rounding may differ.
        const double a = ss1.to(Device::cpu()).data<double>()[0], b = ss2.to(Device::cpu()).data<double>()[0];
        if ((!bf16 && !acc) || (bf16 && dw_tall)) {
          check_scalar("grouped_gemm_ws", what + ": sum of squares, relative to the wgmma kernel's", a, b, 1e-12);
        } else {
          const bool ss_same = same_bits(ss1, ss2);
          EXPECT_TRUE(ss_same) << what << ": sum of squares " << a << " vs " << b;
          check_scalar("grouped_gemm_ws", what + ": sum of squares bits == wgmma kernel's", ss_same ? 0.0 : 1.0, 0.0,
                       0.0);
        }
      }
    }
  }
}

TEST(Backend, GroupedGemmWsMatchesWgmmaBitForBit) {
  MT_REQUIRE_GPU();
  if (gpu_ctx().facts().cc_major != 9) GTEST_SKIP() << "Hopper kernels (cc 9.0)";
  std::mt19937 g(11);
  std::vector<int32_t> counts(128);
  for (auto& c : counts) c = static_cast<int32_t>(g() % 6 == 0 ? 0 : g() % 520);
  counts[0] = 1, counts[1] = 0, counts[2] = 1000, counts[3] = 128, counts[4] = 129;
  // The default (8 for dx, 7 for y since round 48), variant 1 (the static stride, y's default before),
  // 2 (2-CTA clusters, the down dx default before round
  // 42), 6 (256 x 192 tiles: other column tiles, two accumulators per warpgroup, A in two boxes),
  // 7 / 8 (1 / 6 with units from an atomic counter; each launch leaves the counter zero for the
  // next) and 9 (8 or 1 by shape). K 200, M 136: tiles cut at both edges, where the dW's sums of squares
  // must leave out the fragment values past them.
  check_ws_against_wgmma(counts, {{2048, 1536}, {768, 2048}, {200, 136}}, {0, 1, 2, 6, 7, 8, 7, 9});
}

// More experts than the tall tiles' shared offsets hold (512): variants 6, 8 and the dx default run
// as 1 and 7 there (the dispatch's fallback), up to the kernels' limit of 1024 experts. A few rows
// an expert, some experts without rows, one with several row blocks.
TEST(Backend, GroupedGemmWsManyExperts) {
  MT_REQUIRE_GPU();
  if (gpu_ctx().facts().cc_major != 9) GTEST_SKIP() << "Hopper kernels (cc 9.0)";
  for (const int E : {512, 513, 1024}) {
    std::mt19937 g(static_cast<uint32_t>(E));
    std::vector<int32_t> counts(static_cast<size_t>(E));
    for (auto& c : counts) c = static_cast<int32_t>(g() % 4 == 0 ? 0 : g() % 40);
    counts[1] = 600, counts[static_cast<size_t>(E) - 1] = 257;
    check_ws_against_wgmma(counts, {{256, 384}}, {0, 6, 8, 9});
  }
}

}  // namespace
}  // namespace moetrain::test
#endif  // MT_WITH_CUDA
