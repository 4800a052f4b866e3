// CUDA vs CPU: cross-entropy forward/backward over the Qwen3 vocabulary (V = 151936) on a few
// rows and over small odd vocabularies, with ignored labels (-100), weights, and the convenience
// reduction (mean/sum with a mask); the chunked loss head (model/loss_head.h) against its CPU run.
#include "backend_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "model/loss_head.h"

namespace moetrain::test {
namespace {

TEST(Backend, CrossEntropy) {
  MT_REQUIRE_GPU();
  struct Case { int64_t T, V; };
  for (const Case c : {Case{5, 151936}, Case{33, 1000}, Case{9, 1001}, Case{1, 3}}) {
    std::vector<int32_t> labels(static_cast<size_t>(c.T));
    std::mt19937 g(static_cast<uint32_t>(c.V));
    for (int64_t t = 0; t < c.T; ++t) labels[t] = t % 4 == 1 ? -100 : static_cast<int32_t>(g() % c.V);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::string tag = "T" + std::to_string(c.T) + " V" + std::to_string(c.V);
      Pair logits = input(randn(c.T * c.V, 121, 3.0f), {c.T, c.V}, dt);
      Pair lab = input_ints(labels, {c.T});
      Pair wts = input(randu(c.T, 122, 0.1f, 1.0f), {c.T}, DType::kF32);
      for (bool weighted : {false, true}) {
        const std::string tg = tag + (weighted ? " weighted" : "");
        Tensor wg = weighted ? wts.gpu : Tensor(), wc = weighted ? wts.cpu : Tensor();
        Pair losses = output({c.T}, DType::kF32), lse = output({c.T}, DType::kF32);
        ops::cross_entropy_forward(gpu_ctx(), logits.gpu, lab.gpu, wg, losses.gpu, lse.gpu);
        cpu::cross_entropy_forward(cpu_ctx(), logits.cpu, lab.cpu, wc, losses.cpu, lse.cpu);
        check("cross_entropy_forward", "losses " + tg, losses, 1e-5);
        check("cross_entropy_forward", "lse " + tg, lse, 1e-6);
        Pair ls{lse.cpu, lse.cpu.to(Device::cuda(0))};
        device_sync();
        Pair dl = output({c.T, c.V}, dt);
        ops::cross_entropy_backward(gpu_ctx(), logits.gpu, lab.gpu, wg, ls.gpu, 0.5f, dl.gpu);
        cpu::cross_entropy_backward(cpu_ctx(), logits.cpu, lab.cpu, wc, ls.cpu, 0.5f, dl.cpu);
        check("cross_entropy_backward", "dlogits " + tg, dl, dt == DType::kBF16 ? kTolBf16 : 1e-5);
      }
      // Convenience: mask some positions, mean and sum.
      std::vector<uint8_t> mask(static_cast<size_t>(c.T));
      for (int64_t t = 0; t < c.T; ++t) mask[t] = t % 3 != 2;
      Pair mk = input_u8(mask, {c.T});
      for (auto red : {ops::Reduction::kMean, ops::Reduction::kSum}) {
        const std::string tg = tag + (red == ops::Reduction::kMean ? " mean" : " sum");
        Pair dl = output({c.T, c.V}, dt);
        const double lg = ops::cross_entropy(gpu_ctx(), logits.gpu, lab.gpu, mk.gpu, red, &dl.gpu);
        const double lc = cpu::cross_entropy(cpu_ctx(), logits.cpu, lab.cpu, mk.cpu, red, &dl.cpu);
        check_scalar("cross_entropy", "loss " + tg, lg, lc, 1e-5);
        check("cross_entropy", "dlogits " + tg, dl, dt == DType::kBF16 ? kTolBf16 : 1e-5);
      }
    }
  }
}

// The loss head writes dlogits over the logits: the 16-byte vector kernel (bf16, V % 8 == 0) must
// give the same bits in place as into a separate buffer.
TEST(Backend, CrossEntropyBackwardInPlace) {
  MT_REQUIRE_GPU();
  const int64_t T = 6, V = 151936;
  std::vector<int32_t> labels = {3, -100, 151935, 0, 77777, 8};
  const std::vector<float> x = randn(T * V, 131, 3.0f);
  Pair logits = input(x, {T, V}, DType::kBF16), lab = input_ints(labels, {T});
  Pair wts = input(randu(T, 132, 0.1f, 1.0f), {T}, DType::kF32);
  Pair losses = output({T}, DType::kF32), lse = output({T}, DType::kF32);
  ops::cross_entropy_forward(gpu_ctx(), logits.gpu, lab.gpu, wts.gpu, losses.gpu, lse.gpu);
  Pair dl = output({T, V}, DType::kBF16);
  ops::cross_entropy_backward(gpu_ctx(), logits.gpu, lab.gpu, wts.gpu, lse.gpu, 0.5f, dl.gpu);
  Pair in_place = output({T, V}, DType::kBF16, &x);
  ops::cross_entropy_backward(gpu_ctx(), in_place.gpu, lab.gpu, wts.gpu, lse.gpu, 0.5f, in_place.gpu);
  device_sync();
  in_place.cpu = dl.gpu.to(Device::cpu());
  check_exact("cross_entropy_backward", "in place, T6 V151936", in_place);
}

// The chunked loss head on the GPU against the same head on the CPU: several chunks and one, the
// lm_head gradient added to a prior value and written over NaNs (the first chunk's beta 0), f32 and
// bf16; two GPU runs must give the same bits.
TEST(Backend, LossHeadChunked) {
  MT_REQUIRE_GPU();
  const int64_t T = 300, H = 256, V = 4099;
  std::vector<int32_t> labels(static_cast<size_t>(T));
  std::mt19937 g(7);
  for (int64_t t = 0; t < T; ++t) labels[t] = t % 7 == 3 ? -100 : static_cast<int32_t>(g() % V);
  const std::vector<float> prior = randn(V * H, 143, 0.1f);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Pair x = input(randn(T * H, 141, 1.0f), {T, H}, dt), w = input(randn(V * H, 142, 0.05f), {V, H}, dt);
    Pair lab = input_ints(labels, {T}), wts = input(randu(T, 144, 0.1f, 1.0f), {T}, DType::kF32);
    const double tol = dt == DType::kBF16 ? kTolBf16 : 1e-4;
    for (const int64_t rows : {int64_t{64}, T}) {
      for (const bool overwrite : {false, true}) {
        const std::string tag =
            std::string(dt_name(dt)) + " rows " + std::to_string(rows) + (overwrite ? " dw=" : " dw+=");
        Pair nll = output({T}, DType::kF32), lse = output({T}, DType::kF32), dx = output({T, H}, dt);
        Pair dw = overwrite ? output({V, H}, DType::kF32) : output({V, H}, DType::kF32, &prior);
        std::vector<float> first_dw;
        for (int run = 0; run < 2; ++run) {
          LossHeadIO io;
          io.nll = nll.gpu, io.lse = lse.gpu, io.dx = dx.gpu, io.dw = dw.gpu, io.dw_overwrite = overwrite;
          if (run == 1 && !overwrite) dw.gpu.copy_from(Tensor::from_floats(prior, {V, H}, DType::kF32));
          loss_head(gpu_ctx(), x.gpu, w.gpu, lab.gpu, wts.gpu, rows, io);
          device_sync();
          if (run == 0) first_dw = dw.gpu.to_floats();
        }
        EXPECT_TRUE(first_dw == dw.gpu.to_floats()) << "loss_head " << tag << ": two runs differ";
        LossHeadIO ic;
        ic.nll = nll.cpu, ic.lse = lse.cpu, ic.dx = dx.cpu, ic.dw = dw.cpu, ic.dw_overwrite = overwrite;
        loss_head(cpu_ctx(), x.cpu, w.cpu, lab.cpu, wts.cpu, rows, ic);
        check("loss_head", "nll " + tag, nll, tol);
        check("loss_head", "lse " + tag, lse, tol);
        check("loss_head", "dx " + tag, dx, tol);
        check("loss_head", "dw " + tag, dw, tol);
      }
    }
  }
}

}  // namespace
}  // namespace moetrain::test
