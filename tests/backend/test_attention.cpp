// CUDA vs CPU: causal GQA attention over packed documents, forward (out, lse) and backward
// (dq, dk, dv), with one-token documents, documents shorter and longer than a tile, head dims
// that are not multiples of 32, and the Qwen3-30B-A3B layout (32 query / 4 kv heads, d = 128).
#include <cmath>

#include "backend_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

struct Case {
  std::vector<int32_t> cu;  // document offsets, first 0, last T
  int64_t nh, nkv, d;
};

TEST(Backend, Attention) {
  MT_REQUIRE_GPU();
  const Case cases[] = {
      {{0, 1, 50, 51, 300}, 4, 2, 64},  // one-token documents, a long one spanning tiles
      {{0, 77}, 8, 1, 128},             // one document, all heads share one kv head
      {{0, 100, 256}, 32, 4, 128},      // Qwen3-30B-A3B heads
      {{0, 1}, 2, 2, 40},               // a single token; d not a multiple of 32
      {{0, 16, 33, 40, 41, 90}, 6, 3, 96},
      // Tensor-core path (bf16, d 64/128): documents crossing 64-key and 128-query tiles,
      // one-token documents mid-tile, T not a multiple of the tiles.
      {{0, 1, 130, 131, 400, 641}, 8, 2, 128},
      {{0, 513}, 4, 1, 64},
      {{0, 64, 128, 129, 257, 700}, 16, 2, 64},
  };
  for (const Case& c : cases) {
    const int64_t T = c.cu.back();
    int max_len = 0;
    for (size_t i = 1; i < c.cu.size(); ++i) max_len = std::max(max_len, c.cu[i] - c.cu[i - 1]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    const std::string tag = "T" + std::to_string(T) + " " + std::to_string(c.nh) + "/" + std::to_string(c.nkv) +
                            " d" + std::to_string(c.d);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Pair q = input(randn(T * c.nh * c.d, 81 + T), {T, c.nh, c.d}, dt);
      Pair k = input(randn(T * c.nkv * c.d, 82 + T), {T, c.nkv, c.d}, dt);
      Pair v = input(randn(T * c.nkv * c.d, 83 + T), {T, c.nkv, c.d}, dt);
      Pair cu = input_ints(c.cu, {static_cast<int64_t>(c.cu.size())});
      Pair out = output({T, c.nh, c.d}, dt);
      Pair lse = output({c.nh, T}, DType::kF32);
      ops::attention_forward(gpu_ctx(), q.gpu, k.gpu, v.gpu, cu.gpu, max_len, scale, out.gpu, lse.gpu);
      cpu::attention_forward(cpu_ctx(), q.cpu, k.cpu, v.cpu, cu.cpu, max_len, scale, out.cpu, lse.cpu);
      check("attention_forward", "out " + tag, out, tol_for(dt));
      check("attention_forward", "lse " + tag, lse, dt == DType::kBF16 ? 1e-5 : 1e-6);

      // Backward from the same saved tensors on both sides: the CPU's out (rounded to dt) and lse.
      Tensor out_typed = out.cpu.to(dt);
      Pair o{out_typed.to(DType::kF32), out_typed.to(Device::cuda(0))};
      Pair l{lse.cpu, lse.cpu.to(Device::cuda(0))};
      device_sync();
      Pair dout = input(randn(T * c.nh * c.d, 84 + T), {T, c.nh, c.d}, dt);
      Pair dq = output({T, c.nh, c.d}, dt), dk = output({T, c.nkv, c.d}, dt), dv = output({T, c.nkv, c.d}, dt);
      ops::attention_backward(gpu_ctx(), q.gpu, k.gpu, v.gpu, o.gpu, l.gpu, dout.gpu, cu.gpu, max_len, scale, dq.gpu,
                              dk.gpu, dv.gpu);
      cpu::attention_backward(cpu_ctx(), q.cpu, k.cpu, v.cpu, o.cpu, l.cpu, dout.cpu, cu.cpu, max_len, scale, dq.cpu,
                              dk.cpu, dv.cpu);
      const double tol = dt == DType::kBF16 ? kTolBf16 : 1e-5;
      check("attention_backward", "dq " + tag, dq, tol);
      check("attention_backward", "dk " + tag, dk, tol);
      check("attention_backward", "dv " + tag, dv, tol);
    }
  }
}

}  // namespace
}  // namespace moetrain::test
