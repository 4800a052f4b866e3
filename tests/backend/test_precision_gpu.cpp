// CUDA vs CPU twin for the precision options (optimizer.*_dtype): the AdamW step for every storage
// combination of weights / grad / m / v / compute copy, with nearest and stochastic rounding,
// must match the CPU bit for bit (both run kernels/adamw_math.h with explicit IEEE round-to-nearest
// operations and the same Philox words), on vectorized (16-byte aligned) and scalar (misaligned
// view) paths and sizes that are not multiples of 8; sum_squares_accumulate matches the CPU to
// fp64 reordering and does not read back to the host.
#include <cmath>
#include <cstring>

#include "backend_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

// A CPU tensor of `v` stored in dt, plus the same bits on the GPU. With `offset`, both are views
// starting `offset` elements into a larger buffer (a misaligned start takes the scalar path).
struct Twin {
  Tensor cpu, gpu, gpu_base;
};
Twin twin(const std::vector<float>& v, DType dt, int64_t offset) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<float> padded(static_cast<size_t>(n + offset), 0.5f);
  std::copy(v.begin(), v.end(), padded.begin() + offset);
  Tensor host = Tensor::from_floats(padded, {n + offset}, dt);
  Twin t;
  t.gpu_base = host.to(Device::cuda(0));
  t.gpu = t.gpu_base.slice(0, offset, offset + n);
  t.cpu = host.slice(0, offset, offset + n).contiguous();
  return t;
}
bool same_bits(const Tensor& cpu, const Tensor& gpu) {
  const Tensor back = gpu.contiguous().to(Device::cpu());
  return cpu.nbytes() == back.nbytes() && std::memcmp(cpu.data_ptr(), back.data_ptr(), cpu.nbytes()) == 0;
}

TEST(BackendPrecision, AdamWEveryDtypeCombinationIsBitExact) {
  MT_REQUIRE_GPU();
  const DType F = DType::kF32, B = DType::kBF16, none = DType::kU8;
  int cases = 0, failures = 0;
  for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{4099}, int64_t{65536 * 3 + 5}})
    for (int64_t offset : {int64_t{0}, int64_t{1}})
      for (DType wd : {F, B})
        for (DType gd : {F, B})
          for (DType md : {F, B})
            for (DType vd : {F, B})
              for (DType cd : {none, F, B})
                for (bool sr : {false, true}) {
                  if (sr && wd == F) continue;
                  auto v0 = randn(n, 83, 1e-2f);
                  for (auto& x : v0) x = x * x;
                  Twin w = twin(randn(n, 80, 0.05f), wd, offset), g = twin(randn(n, 81), gd, offset),
                       m = twin(randn(n, 82, 0.1f), md, offset), v = twin(v0, vd, offset);
                  Twin c = cd == none ? Twin{} : twin(std::vector<float>(static_cast<size_t>(n), 0.0f), cd, offset);
                  ops::AdamWParams p;
                  p.lr = 3e-3f, p.weight_decay = 0.1f, p.grad_scale = 0.7f, p.stochastic_rounding = sr;
                  for (int step = 1; step <= 2; ++step) {
                    p.step = step;
                    p.rng = gpu_ctx().rng(0x520000 + 3, static_cast<uint64_t>(step));
                    ops::adamw_step(gpu_ctx(), w.gpu, g.gpu, m.gpu, v.gpu, p, c.gpu);
                    cpu::adamw_step(cpu_ctx(), w.cpu, g.cpu, m.cpu, v.cpu, p, c.cpu);
                  }
                  device_sync();
                  const std::string what = std::string("n ") + std::to_string(n) + " offset " + std::to_string(offset) +
                                           " w " + dt_name(wd) + " g " + dt_name(gd) + " m " + dt_name(md) + " v " +
                                           dt_name(vd) + " compute " + (cd == none ? "none" : dt_name(cd)) +
                                           (sr ? " stochastic" : " nearest");
                  const bool ok = same_bits(w.cpu, w.gpu) && same_bits(m.cpu, m.gpu) && same_bits(v.cpu, v.gpu) &&
                                  (cd == none || same_bits(c.cpu, c.gpu));
                  if (!ok && ++failures <= 10) ADD_FAILURE() << "adamw_step differs from the CPU twin: " << what;
                  ++cases;
                }
  check_scalar("adamw_step", "combinations bit-exact (" + std::to_string(cases) + ")", failures, 0.0, 0.0);
}

// Non-finite values in the stored bf16 results: NaN (of either sign, any payload) is stored as the
// canonical 0x7fff on both sides (the GPU's hardware conversion), infinities as infinities; tiny and
// zero moments take the GPU's IEEE fallback for the square root and divide (adamw_math::update8).
TEST(BackendPrecision, AdamWNonFiniteValuesAreBitExact) {
  MT_REQUIRE_GPU();
  const DType F = DType::kF32, B = DType::kBF16;
  const int64_t n = 4096 + 24;
  const float inf = INFINITY;
  int failures = 0;
  for (DType gd : {F, B})
    for (bool sr : {false, true}) {
      auto gv = randn(n, 84), wv = randn(n, 85, 0.05f), mv = randn(n, 86, 0.1f), vv = randn(n, 87, 1e-2f);
      for (auto& x : vv) x = x * x;
      // and tiny finite values, where the GPU's inline square root and divide hand the element to the
      // IEEE intrinsics (v below 2^-101, quotients below 2^-63)
      const float specials[] = {NAN, -NAN, inf, -inf, 3e38f, -3e38f, 1e-40f, 1e-35f, 1e-30f, 1e-20f, 0.0f};
      for (int64_t i = 0; i < n; i += 97) {
        const float s = specials[(i / 97) % 11];
        const int64_t which = (i / 97) % 4;
        (which == 0 ? gv : which == 1 ? wv : which == 2 ? mv : vv)[static_cast<size_t>(i)] = which == 3 ? std::fabs(s) : s;
      }
      for (int64_t i = 50; i < n; i += 211) vv[static_cast<size_t>(i)] = 1e-33f * static_cast<float>(i % 7);
      uint32_t payload = 0x7fc01234u;  // a NaN with a payload, as bits
      float pnan;
      std::memcpy(&pnan, &payload, 4);
      gv[5] = pnan;
      Twin w = twin(wv, B, 0), g = twin(gv, gd, 0), m = twin(mv, B, 0), v = twin(vv, B, 0);
      ops::AdamWParams p;
      p.lr = 3e-3f, p.weight_decay = 0.1f, p.grad_scale = 0.7f, p.stochastic_rounding = sr;
      p.step = 1;
      p.rng = gpu_ctx().rng(0x520000 + 4, 1);
      Tensor no_gpu, no_cpu;
      ops::adamw_step(gpu_ctx(), w.gpu, g.gpu, m.gpu, v.gpu, p, no_gpu);
      cpu::adamw_step(cpu_ctx(), w.cpu, g.cpu, m.cpu, v.cpu, p, no_cpu);
      device_sync();
      const bool ok = same_bits(w.cpu, w.gpu) && same_bits(m.cpu, m.gpu) && same_bits(v.cpu, v.gpu);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "adamw_step with non-finite values differs from the CPU twin: g " << dt_name(gd)
                      << (sr ? " stochastic" : " nearest");
      }
      const uint16_t* wb = static_cast<const uint16_t*>(w.cpu.data_ptr());
      EXPECT_EQ(wb[5], 0x7fffu) << "a NaN gradient gives the canonical NaN weight";
    }
  check_scalar("adamw_step", "non-finite values bit-exact (4 cases)", failures, 0.0, 0.0);
}

// Vectors of 8 whose gradient, m and v are all +0 (an embedding row no token has touched) take the
// kernel's short path (adamw_math::Consts::zero_*). Bit-exact against the CPU twin for every storage
// combination, with nearest and stochastic rounding, through adamw_step and adamw_step_many, beside
// vectors that only look like it (a -0, one non-zero value, a zero gradient with live moments), with a
// bf16 compute copy beside an f32 master, over two steps (a zero vector stays zero), and with constants
// that make the zero state's quotient 0 / 0 (eps 0: NaN weights), or its m a NaN (grad_scale NaN), the
// last two with bf16 weights and moments.
TEST(BackendPrecision, AdamWZeroStateVectorsAreBitExact) {
  MT_REQUIRE_GPU();
  const DType F = DType::kF32, B = DType::kBF16;
  const int64_t n = 8 * 61 + 5;  // a partial last vector (the scalar path)
  int cases = 0, failures = 0;
  for (DType wd : {F, B})
    for (DType gd : {F, B})
      for (DType mvd : {F, B})
        for (bool sr : {false, true})
          for (int consts = 0; consts < 3; ++consts)
            for (bool many : {false, true}) {
              if (sr && wd == F) continue;
              // NaN results are compared as stored bf16 only (both sides store the canonical 0x7fff; an
              // f32 NaN keeps the host's or the device's payload and sign), as in the non-finite test.
              if (consts && (wd == F || mvd == F)) continue;
              auto wv = randn(n, 95, 0.05f), gv = randn(n, 96), mv = randn(n, 97, 0.1f), vv = randn(n, 98, 1e-2f);
              for (auto& x : vv) x = x * x;
              for (int64_t c = 0; c < n / 8; ++c) {
                const int kind = static_cast<int>(c % 6);  // 0-2: the zero state; 3: a -0 m; 4: one live v; 5: g 0 only
                for (int64_t i = 8 * c; i < 8 * c + 8; ++i) {
                  const size_t u = static_cast<size_t>(i);
                  if (kind <= 2 || kind == 5) gv[u] = 0.0f;
                  if (kind <= 4) mv[u] = 0.0f, vv[u] = 0.0f;
                  if (kind == 3 && i == 8 * c + 3) mv[u] = -0.0f;
                  if (kind == 4 && i == 8 * c + 7) vv[u] = 1e-6f;
                }
              }
              for (int64_t i = n - 5; i < n; ++i) gv[static_cast<size_t>(i)] = mv[static_cast<size_t>(i)] = vv[static_cast<size_t>(i)] = 0.0f;
              Twin w = twin(wv, wd, 0), g = twin(gv, gd, 0), m = twin(mv, mvd, 0), v = twin(vv, mvd, 0);
              // an f32 master keeps a bf16 compute copy (the optimizer's mixed-precision layout)
              Twin c = wd == F ? twin(std::vector<float>(static_cast<size_t>(n), 0.0f), B, 0) : Twin{};
              ops::AdamWParams p;
              p.lr = 3e-3f, p.weight_decay = 0.1f, p.stochastic_rounding = sr;
              p.grad_scale = consts == 2 ? NAN : 0.7f;
              p.eps = consts == 1 ? 0.0f : 1e-8f;
              for (int step = 1; step <= 2; ++step) {
                p.step = step;
                p.rng = gpu_ctx().rng(0x520000 + 5, static_cast<uint64_t>(step));
                if (many) {
                  std::vector<ops::AdamWTarget> t{{w.gpu, m.gpu, v.gpu, c.gpu, p}};
                  ops::adamw_step_many(gpu_ctx(), t, {g.gpu});
                } else {
                  ops::adamw_step(gpu_ctx(), w.gpu, g.gpu, m.gpu, v.gpu, p, c.gpu);
                }
                cpu::adamw_step(cpu_ctx(), w.cpu, g.cpu, m.cpu, v.cpu, p, c.cpu);
              }
              device_sync();
              const bool ok = same_bits(w.cpu, w.gpu) && same_bits(m.cpu, m.gpu) && same_bits(v.cpu, v.gpu) &&
                              (wd != F || same_bits(c.cpu, c.gpu));
              if (!ok && ++failures <= 10)
                ADD_FAILURE() << "adamw_step with zero-state vectors differs from the CPU twin: w " << dt_name(wd)
                              << " g " << dt_name(gd) << " m/v " << dt_name(mvd) << (sr ? " stochastic" : " nearest")
                              << " constants " << consts << (many ? " adamw_step_many" : " adamw_step");
              ++cases;
            }
  check_scalar("adamw_step", "zero-state vectors bit-exact (" + std::to_string(cases) + ")", failures, 0.0, 0.0);
}

TEST(BackendPrecision, SumSquaresAccumulateMatchesCpu) {
  MT_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{65536 * 5 + 3}})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      Pair x = input(randn(n, 90 + n), {n}, dt);
      Pair y = input(randn(n / 2 + 1, 91 + n, 3.0f), {n / 2 + 1}, dt);
      Tensor acc_gpu = Tensor::zeros({1}, DType::kF64, Device::cuda(0)), acc_cpu = Tensor::zeros({1}, DType::kF64);
      ops::sum_squares_accumulate(gpu_ctx(), x.gpu, acc_gpu);
      ops::sum_squares_accumulate(gpu_ctx(), y.gpu, acc_gpu);
      ops::sum_squares_accumulate(cpu_ctx(), x.cpu, acc_cpu);  // the CPU side holds the same (rounded) values
      ops::sum_squares_accumulate(cpu_ctx(), y.cpu, acc_cpu);
      device_sync();
      const double got = acc_gpu.to(Device::cpu()).data<double>()[0], want = acc_cpu.data<double>()[0];
      check_scalar("sum_squares_accumulate", std::string(dt_name(dt)) + " n=" + std::to_string(n), got, want, 1e-12);
    }
}

// The list form (the gradient norm's small tensors): 60 tensors of mixed dtypes and sizes, an empty
// one and an unaligned view, so two launches of up to 48 tensors; against the CPU's one-by-one sum.
TEST(BackendPrecision, SumSquaresAccumulateManyMatchesCpu) {
  MT_REQUIRE_GPU();
  std::vector<Tensor> gpu, cpu;
  std::vector<Pair> keep;
  for (int i = 0; i < 60; ++i) {
    const int64_t n = i == 7 ? 0 : (i * 7919) % 70000 + 1;
    const DType dt = i % 3 == 0 ? DType::kF32 : DType::kBF16;
    keep.push_back(input(randn(std::max<int64_t>(n, 1) + 3, 200 + i, 1.0f + 0.1f * static_cast<float>(i)),
                         {std::max<int64_t>(n, 1) + 3}, dt));
    const int64_t off = i == 11 ? 3 : 0;  // a view that starts 3 elements in: not 16-byte aligned
    gpu.push_back(keep.back().gpu.slice(0, off, off + n));
    cpu.push_back(keep.back().cpu.slice(0, off, off + n));
  }
  Tensor acc_gpu = Tensor::zeros({1}, DType::kF64, Device::cuda(0)), acc_cpu = Tensor::zeros({1}, DType::kF64);
  ops::sum_squares_accumulate_many(gpu_ctx(), gpu, acc_gpu);
  ops::sum_squares_accumulate_many(cpu_ctx(), cpu, acc_cpu);
  device_sync();
  const double got = acc_gpu.to(Device::cpu()).data<double>()[0], want = acc_cpu.data<double>()[0];
  check_scalar("sum_squares_accumulate_many", "60 tensors, f32 and bf16", got, want, 1e-12);
}

TEST(BackendPrecision, SumAccumulateMatchesCpu) {
  MT_REQUIRE_GPU();
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{5000}}) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 1e3 * std::sin(0.7 * static_cast<double>(i)) + 2.0;
    Tensor x = Tensor::zeros({n}, DType::kF64);
    std::copy(v.begin(), v.end(), x.data<double>());
    Tensor acc_cpu = Tensor::zeros({1}, DType::kF64);
    acc_cpu.data<double>()[0] = 0.25;  // added to, not overwritten
    Tensor acc_gpu = acc_cpu.to(Device::cuda(0));
    ops::sum_accumulate(gpu_ctx(), x.to(Device::cuda(0)), acc_gpu);
    ops::sum_accumulate(cpu_ctx(), x, acc_cpu);
    device_sync();
    check_scalar("sum_accumulate", "n=" + std::to_string(n), acc_gpu.to(Device::cpu()).data<double>()[0],
                 acc_cpu.data<double>()[0], 1e-12);
  }
}

}  // namespace
}  // namespace moetrain::test
