// ops::grouped_matmul_backward_adamw (optimizer.update_in_backward) on the GPU against the pair of
// ops it replaces, grouped_matmul_backward into a gradient tensor and then adamw_step, each of
// which has its own CPU-twin test: dx, the updated weights, moments, compute copy and the gradient's
// sum of squares must be the same bits (the sum to f64 rounding where the two tile it differently).
// Precision settings: all-bf16 (the weights are their own master, updated in place after dx has read
// them; stochastic and nearest rounding), the default (f32 gradient, master and moments, bf16 compute
// copy) and bf16 gradients with an f32 master; with and without an earlier micro-batch's gradient; the
// Qwen3-30B-A3B widths with uneven routing, experts without rows and unused capacity rows, plus a small
// odd shape. On Hopper the fused epilogue kernel must take every one of these settings when forced
// (cuda::'s entry point), and the ops:: entry (which fuses only with an f32 master) must match too.
#include <cmath>
#include <cstring>
#include <random>

#include "backend_util.h"
#include "kernels/ops.h"

#ifdef MT_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::test {
namespace {

Tensor gpu_normal(const Shape& s, DType dt, uint64_t seed, float mean, float std) {
  Tensor t = Tensor::empty(s, dt, Device::cuda(0));
  ops::fill_normal(gpu_ctx(), t, mean, std, gpu_ctx().rng(seed));
  return t;
}
Tensor gpu_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), Device::cuda(0));
  ops::cast(gpu_ctx(), t, c);
  return c;
}
bool same_bits(const Tensor& a, const Tensor& b) {
  device_sync();
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

struct Precision {
  const char* name;
  DType grad, master, moments;
  bool separate_master;  // else the bf16 weights are the master
  bool sr;
};

void run_case(const std::vector<int32_t>& counts, int64_t spare_rows, int64_t K, int64_t M, const Precision& pr,
              bool with_prior, bool expect_fused, int moments = 0, bool nonfinite = false) {
  const int64_t E = static_cast<int64_t>(counts.size());
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  const int64_t N = off.back() + spare_rows;
  const Tensor offsets = Tensor::from_ints(off, {E + 1}).to(Device::cuda(0));
  const std::string tag = std::string(pr.name) + (with_prior ? ", +prior" : ", fresh") +
                          (moments == 1   ? ", zero moments"
                           : moments == 4 ? ", huge v"
                           : moments == 5 ? ", eps 0"
                           : moments == 6 ? ", grad scale 0.5"
                           : moments      ? ", tiny m"
                                          : "") +
                          (nonfinite ? ", NaN and inf weights, a NaN gradient row" : "") +
                          ", E" + std::to_string(E) +
                          " N" + std::to_string(N) + " K" + std::to_string(K) + " M" + std::to_string(M);
  const Tensor x = gpu_normal({N, K}, DType::kBF16, 1, 0.0f, 1.0f);
  Tensor dy = gpu_normal({N, M}, DType::kBF16, 3, 0.0f, 1.0f);
  if (nonfinite) {  // a NaN in row 0 of dy: a NaN gradient row for the first expert with rows
    Tensor h = dy.to(Device::cpu());
    h.set(5, std::nan(""));
    dy = h.to(Device::cuda(0));
  }
  Tensor w0 = gpu_normal({E, M, K}, DType::kBF16, 2, 0.0f, 0.03f);
  if (nonfinite) {  // NaN, +inf and -inf weights at even and odd positions of a few vectors, every expert
    Tensor h = w0.to(Device::cpu());
    const double nan = std::nan(""), inf = HUGE_VAL;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i : {int64_t{0}, int64_t{3}, int64_t{8}, int64_t{9}, K + 5, M * K - 1, M * K / 2 + 6}) {
        const int64_t at = e * M * K + i;
        h.set(at, i % 3 == 0 ? nan : i % 3 == 1 ? inf : -inf);
      }
    w0 = h.to(Device::cuda(0));
  }
  const Tensor prior0 = gpu_normal({E, M, K}, pr.grad, 5, 0.0f, 0.5f);
  // moments 1: m = v = 0, as before a run's first step and, step after step, for an expert that has
  // not had a row yet (the fused kernel's exact-zero fast path). 2, 3: m tiny (about 1e-25, and about
  // 3e-40, subnormal), as an expert's m after hundreds of idle steps (the scaled-divide fast path).
  const float m_std = moments == 2 ? 1e-25f : moments == 3 ? 3e-40f : 0.01f;
  // moments 4: a few huge v; 5: eps = 0 and 6: grad_scale 0.5, where the fast walk does not apply
  const Tensor m0 = moments == 1 ? Tensor::zeros({E, M, K}, pr.moments, Device::cuda(0))
                                 : gpu_normal({E, M, K}, pr.moments, 6, 0.0f, m_std);
  Tensor v0 = moments == 1 ? Tensor::zeros({E, M, K}, pr.moments, Device::cuda(0))
                           : gpu_normal({E, M, K}, pr.moments, 7, 0.02f, 0.005f);  // v stays positive
  if (moments == 4) {  // second moments beyond the fast walk's narrow range [2^-101, 2^100): redone exactly
    Tensor h = v0.to(Device::cpu());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i : {int64_t{1}, int64_t{8}, K + 3, M * K - 2}) h.set(e * M * K + i, i % 2 ? 3e30 : 1.3e36);
    v0 = h.to(Device::cuda(0));
  }
  Tensor master0;
  if (pr.separate_master) {
    master0 = Tensor::empty({E, M, K}, pr.master, Device::cuda(0));
    ops::cast(gpu_ctx(), w0, master0);
  }
  ops::AdamWParams p;
  p.lr = 1e-3f;
  p.beta2 = 0.95f;
  p.weight_decay = 0.1f;
  p.step = 4;
  p.stochastic_rounding = pr.sr;
  p.rng = gpu_ctx().rng(0x520000 + 3, 4);
  if (moments == 5) p.eps = 0.0f;
  if (moments == 6) p.grad_scale = 0.5f;

  // Two copies of every state tensor: a = the fused op, b = the two ops.
  struct State { Tensor w, master, m, v, prior, dx, ss; };
  auto fresh = [&] {
    State s;
    s.w = gpu_copy(w0);
    s.master = pr.separate_master ? gpu_copy(master0) : s.w;
    s.m = gpu_copy(m0);
    s.v = gpu_copy(v0);
    if (with_prior) s.prior = gpu_copy(prior0);
    s.dx = Tensor::empty({N, K}, DType::kBF16, Device::cuda(0));
    s.ss = Tensor::zeros({1}, DType::kF64, Device::cuda(0));
    return s;
  };
  State a = fresh(), b = fresh();
  ops::AdamWTarget t;
  t.master = a.master, t.m = a.m, t.v = a.v, t.params = p;
  if (pr.separate_master) t.compute = a.w;
  if (expect_fused) {
    const bool fused =
        cuda::grouped_matmul_backward_adamw(gpu_ctx(), x, a.w, offsets, dy, a.dx, pr.grad, a.prior, t, &a.ss, true);
    EXPECT_TRUE(fused) << "the fused Hopper kernel declined " << tag;
    if (!fused) return;
  } else {
    ops::grouped_matmul_backward_adamw(gpu_ctx(), x, a.w, offsets, dy, a.dx, pr.grad, a.prior, with_prior, t, &a.ss);
  }
  Tensor g = with_prior ? b.prior : Tensor::empty({E, M, K}, pr.grad, Device::cuda(0));
  ops::grouped_matmul_backward(gpu_ctx(), x, b.w, offsets, dy, b.dx, g, with_prior, &b.ss);
  Tensor compute_b = pr.separate_master ? b.w : Tensor();
  ops::adamw_step(gpu_ctx(), b.master, g, b.m, b.v, p, compute_b);

  const bool dx = same_bits(a.dx, b.dx), w = same_bits(a.w, b.w), mst = same_bits(a.master, b.master);
  // The sums of squares: the same bits, but for an f32 gradient written (no prior), where the pair's
  // dW sums per 128 x 256 tile and the fused kernel per 128 x 128 tile: the same f32 sums of 64-column
  // spans (wg::SumSq4), added in f64 in another order, so they agree to f64 rounding.
  auto sums_agree = [&] {
    if (same_bits(a.ss, b.ss)) return true;
    if (pr.grad == DType::kBF16 || with_prior) return false;
    const double sa = a.ss.to(Device::cpu()).data<double>()[0], sb = b.ss.to(Device::cpu()).data<double>()[0];
    return std::isfinite(sa) && std::isfinite(sb) && std::fabs(sa - sb) <= 1e-12 * std::fabs(sb);
  };
  const bool m = same_bits(a.m, b.m), v = same_bits(a.v, b.v), ss = sums_agree();
  EXPECT_TRUE(dx) << "dx " << tag;
  EXPECT_TRUE(w) << "weights " << tag;
  EXPECT_TRUE(mst) << "master " << tag;
  EXPECT_TRUE(m && v) << "moments " << tag;
  EXPECT_TRUE(ss) << "sum of squares " << tag;
  EXPECT_FALSE(same_bits(a.w, w0)) << "the weights did not change " << tag;
  if (nonfinite) {  // NaN stays NaN; an infinite weight becomes NaN too (inf - lr wd inf, decoupled decay)
    const Tensor h = a.w.to(Device::cpu());
    EXPECT_TRUE(std::isnan(h.get(0)) && std::isnan(h.get(8))) << tag;
  }
  check_scalar("grouped_matmul_backward_adamw", tag + ": bits == grouped_matmul_backward + adamw_step",
               dx && w && mst && m && v && ss ? 0.0 : 1.0, 0.0, 0.0);
}

const Precision kPrecisions[] = {
    {"all-bf16 (stochastic)", DType::kBF16, DType::kBF16, DType::kBF16, false, true},
    {"all-bf16 (nearest)", DType::kBF16, DType::kBF16, DType::kBF16, false, false},
    {"default (f32 grad/master/moments)", DType::kF32, DType::kF32, DType::kF32, true, false},
    {"bf16 grad, f32 master/moments", DType::kBF16, DType::kF32, DType::kF32, true, false},
};

TEST(Backend, GroupedMatmulBackwardAdamWModelWidths) {
  MT_REQUIRE_GPU();
  const bool hopper = gpu_ctx().facts().cc_major == 9;
  std::mt19937 g(17);
  std::vector<int32_t> counts(128);
  for (auto& c : counts) c = static_cast<int32_t>(g() % 7 == 0 ? 0 : g() % 500);
  counts[0] = 0, counts[1] = 1, counts[2] = 900, counts[127] = 0;
  // down (M 2048, K 768) in every setting; gate_up (2.4x the bytes; 104 s for all 8 on an H100,
  // mostly the host copies of the compare) in the two settings the trainer uses most.
  for (const Precision& pr : kPrecisions)
    for (const bool prior : {false, true}) run_case(counts, 40, 768, 2048, pr, prior, hopper);
  run_case(counts, 40, 2048, 1536, kPrecisions[0], false, hopper);
  run_case(counts, 40, 2048, 1536, kPrecisions[2], true, hopper);
  for (const Precision& pr : kPrecisions) run_case(counts, 40, 768, 2048, pr, false, hopper, 1);
  run_case(counts, 40, 768, 2048, kPrecisions[0], false, hopper, 0, true);
  for (const int moments : {4, 5, 6}) run_case(counts, 40, 768, 2048, kPrecisions[0], false, hopper, moments);
  for (const int tiny : {2, 3}) {
    run_case(counts, 40, 768, 2048, kPrecisions[0], false, hopper, tiny);
    run_case(counts, 40, 768, 2048, kPrecisions[2], false, hopper, tiny);
  }
}

TEST(Backend, GroupedMatmulBackwardAdamWSmallShapes) {
  MT_REQUIRE_GPU();
  for (const Precision& pr : kPrecisions)
    for (const bool prior : {false, true}) {
      run_case({0, 37, 0, 130, 5}, 3, 200, 136, pr, prior, false);
      run_case({64, 0, 0}, 0, 72, 24, pr, prior, false);
      for (const int moments : {1, 2, 3, 4, 5, 6}) run_case({0, 37, 0, 130, 5}, 3, 200, 136, pr, prior, false, moments);
      run_case({0, 37, 0, 130, 5}, 3, 200, 136, pr, prior, false, 0, true);
    }
}

}  // namespace
}  // namespace moetrain::test
#endif  // MT_WITH_CUDA
