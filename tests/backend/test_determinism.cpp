// CUDA ops that reduce across tokens must be bitwise reproducible: run each twice on the same
// inputs and compare the bytes (embedding/RMSNorm/grouped-GEMM weight gradients, attention
// backward, router statistics, route index). None of them uses float atomics.
#include <cstring>

#include "backend_util.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

std::vector<uint8_t> bytes_of(const Tensor& t) {
  device_sync();
  Tensor h = t.to(Device::cpu());
  std::vector<uint8_t> b(h.nbytes());
  std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// Runs `fn` (which writes into `outs`, starting from zeros) twice and compares the results.
void expect_reproducible(const std::string& op, std::vector<Tensor*> outs, const std::function<void()>& fn) {
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 2; ++run) {
    for (Tensor* t : outs) t->zero_();
    device_sync();
    fn();
    for (size_t i = 0; i < outs.size(); ++i) {
      auto b = bytes_of(*outs[i]);
      if (run == 0) first.push_back(std::move(b));
      else EXPECT_TRUE(b == first[i]) << op << ": output " << i << " differs between two identical runs";
    }
  }
}

TEST(Backend, Deterministic) {
  MT_REQUIRE_GPU();
  Context& ctx = gpu_ctx();
  const DType dt = DType::kBF16;
  const Device dev = Device::cuda(0);
  {  // embedding backward with many repeated ids
    const int64_t V = 50, H = 256, T = 4096;
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 7) % V);
    Pair id = input_ints(ids, {T});
    Pair dout = input(randn(T * H, 131), {T, H}, dt);
    Tensor dtab = Tensor::zeros({V, H}, DType::kF32, dev);
    expect_reproducible("embedding_backward", {&dtab}, [&] { ops::embedding_backward(ctx, id.gpu, dout.gpu, dtab); });
  }
  {  // RMSNorm weight gradient over many rows
    const int64_t R = 8192, D = 128;
    Pair x = input(randn(R * D, 132), {R, D}, dt), w = input(randn(D, 133), {D}, dt);
    Pair dy = input(randn(R * D, 134), {R, D}, dt);
    Tensor y = Tensor::empty({R, D}, dt, dev), rstd = Tensor::empty({R}, DType::kF32, dev);
    ops::rmsnorm_forward(ctx, x.gpu, w.gpu, 1e-6f, y, rstd);
    Tensor dx = Tensor::empty({R, D}, dt, dev), dw = Tensor::zeros({D}, DType::kF32, dev);
    expect_reproducible("rmsnorm_backward", {&dx, &dw},
                        [&] { ops::rmsnorm_backward(ctx, x.gpu, w.gpu, rstd, dy.gpu, dx, dw); });
  }
  {  // grouped GEMM backward
    const int64_t E = 4, N = 1000, K = 96, M = 80;
    Pair x = input(randn(N * K, 135), {N, K}, dt), w = input(randn(E * M * K, 136), {E, M, K}, dt);
    Pair dy = input(randn(N * M, 137), {N, M}, dt);
    Pair off = input_ints({0, 400, 400, 999, 1000}, {E + 1});
    Tensor dx = Tensor::empty({N, K}, dt, dev), dw = Tensor::zeros({E, M, K}, DType::kF32, dev);
    expect_reproducible("grouped_matmul_backward", {&dx, &dw},
                        [&] { ops::grouped_matmul_backward(ctx, x.gpu, w.gpu, off.gpu, dy.gpu, dx, dw); });
  }
  {  // attention backward
    const int64_t T = 300, nh = 8, nkv = 2, d = 64;
    Pair q = input(randn(T * nh * d, 138), {T, nh, d}, dt), k = input(randn(T * nkv * d, 139), {T, nkv, d}, dt);
    Pair v = input(randn(T * nkv * d, 140), {T, nkv, d}, dt), g = input(randn(T * nh * d, 141), {T, nh, d}, dt);
    Pair cu = input_ints({0, 120, 121, 300}, {4});
    Tensor out = Tensor::empty({T, nh, d}, dt, dev), lse = Tensor::empty({nh, T}, DType::kF32, dev);
    ops::attention_forward(ctx, q.gpu, k.gpu, v.gpu, cu.gpu, 179, 0.125f, out, lse);
    Tensor dq = Tensor::empty({T, nh, d}, dt, dev), dk = Tensor::empty({T, nkv, d}, dt, dev),
           dv = Tensor::empty({T, nkv, d}, dt, dev);
    expect_reproducible("attention_backward", {&dq, &dk, &dv}, [&] {
      ops::attention_backward(ctx, q.gpu, k.gpu, v.gpu, out, lse, g.gpu, cu.gpu, 179, 0.125f, dq, dk, dv);
    });
  }
  {  // router statistics and route index
    const int64_t T = 3000, E = 128;
    const int k = 8;
    Pair logits = input(randn(T * E, 142), {T, E}, DType::kF32);
    Tensor probs = Tensor::empty({T, E}, DType::kF32, dev), idx = Tensor::empty({T, k}, DType::kI32, dev),
           w = Tensor::empty({T, k}, DType::kF32, dev);
    ops::router_topk(ctx, logits.gpu, k, true, probs, idx, w);
    Tensor counts = Tensor::zeros({E}, DType::kF32, dev), psum = Tensor::zeros({E}, DType::kF32, dev);
    Tensor health = Tensor::empty({2}, DType::kF32, dev);
    expect_reproducible("router_stats", {&counts, &psum, &health},
                        [&] { ops::router_stats(ctx, probs, idx, counts, psum, logits.gpu, &health); });
    Tensor c = Tensor::empty({E}, DType::kI32, dev), o = Tensor::empty({E + 1}, DType::kI32, dev),
           r = Tensor::empty({T * k}, DType::kI32, dev), t = Tensor::empty({T * k}, DType::kI32, dev);
    expect_reproducible("moe_route_index", {&c, &o, &r, &t},
                        [&] { ops::moe_route_index(ctx, idx, static_cast<int>(E), c, o, r, t); });
  }
}

}  // namespace
}  // namespace moetrain::test
