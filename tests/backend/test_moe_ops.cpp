// CUDA vs CPU: MoE router (top-k, backward, statistics, aux and z losses), route index (exact),
// permute/unpermute and grouped expert GEMM, with experts that get no tokens, all tokens on one
// expert, unused capacity rows, and Qwen3-30B-A3B widths (E = 128, k = 8, H = 2048, I = 768).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

TEST(Backend, Router) {
  MT_REQUIRE_GPU();
  // Up to E 300; ties: logits on a grid of 4 values, so most picks break ties by the lower index.
  struct Case { int64_t T, E; int k; bool ties = false; };
  for (const Case c : {Case{200, 128, 8}, Case{37, 60, 4}, Case{1, 2, 2}, Case{1000, 128, 8}, Case{4096, 64, 6},
                       Case{64, 256, 8}, Case{16, 300, 8}, Case{40, 128, 8, true}, Case{40, 300, 8, true}}) {
    for (bool normalize : {true, false}) {
      const std::string tag = "T" + std::to_string(c.T) + " E" + std::to_string(c.E) + " k" + std::to_string(c.k) +
                              (normalize ? " norm" : "") + (c.ties ? " ties" : "");
      std::vector<float> lv = randn(c.T * c.E, 91 + c.E, 2.0f);
      if (c.ties)
        for (float& x : lv) x = std::floor(std::fmod(std::fabs(x) * 4.0f, 4.0f)) * 0.5f;
      Pair logits = input(lv, {c.T, c.E}, DType::kF32);
      Pair probs = output({c.T, c.E}, DType::kF32), idx = output_ints({c.T, c.k}), w = output({c.T, c.k}, DType::kF32);
      ops::router_topk(gpu_ctx(), logits.gpu, c.k, normalize, probs.gpu, idx.gpu, w.gpu);
      cpu::router_topk(cpu_ctx(), logits.cpu, c.k, normalize, probs.cpu, idx.cpu, w.cpu);
      check("router_topk", "probs " + tag, probs, 1e-6);
      check_exact("router_topk", "topk_idx " + tag, idx);
      check("router_topk", "topk_w " + tag, w, 1e-6);

      // Backward from the CPU's forward results on both sides, with and without the aux-loss term.
      Pair p{probs.cpu, probs.cpu.to(Device::cuda(0))}, ix{idx.cpu, idx.cpu.to(Device::cuda(0))},
          tw{w.cpu, w.cpu.to(Device::cuda(0))};
      device_sync();
      Pair dw = input(randn(c.T * c.k, 92), {c.T, c.k}, DType::kF32);
      for (bool extra : {false, true}) {
        Pair dpx = extra ? input(randn(c.T * c.E, 93), {c.T, c.E}, DType::kF32) : Pair{};
        Pair dl = output({c.T, c.E}, DType::kF32);
        ops::router_topk_backward(gpu_ctx(), p.gpu, ix.gpu, tw.gpu, dw.gpu, dpx.gpu, normalize, dl.gpu);
        cpu::router_topk_backward(cpu_ctx(), p.cpu, ix.cpu, tw.cpu, dw.cpu, dpx.cpu, normalize, dl.cpu);
        check("router_topk_backward", "dlogits " + tag + (extra ? " +aux" : ""), dl, 1e-5);
      }

      // Statistics accumulate (+=) into existing values.
      const auto c0 = randu(c.E, 94, 0.0f, 5.0f);
      std::vector<float> ci(c0.size());
      std::transform(c0.begin(), c0.end(), ci.begin(), [](float x) { return std::floor(x); });
      Pair counts = output({c.E}, DType::kF32, &ci), psum = output({c.E}, DType::kF32, &c0);
      // With the health sums (from the logits) in the normalized cases, without in the others.
      Pair health = output({2}, DType::kF32);
      ops::router_stats(gpu_ctx(), p.gpu, ix.gpu, counts.gpu, psum.gpu, normalize ? logits.gpu : Tensor(),
                        normalize ? &health.gpu : nullptr);
      cpu::router_stats(cpu_ctx(), p.cpu, ix.cpu, counts.cpu, psum.cpu, normalize ? logits.cpu : Tensor(),
                        normalize ? &health.cpu : nullptr);
      check("router_stats", "counts " + tag, counts, 0.0);
      check("router_stats", "prob_sum " + tag, psum, 1e-6);
      if (normalize) check("router_stats", "health (sum of lse, sum of p * logit) " + tag, health, 1e-5);
      check_scalar("aux_loss_value", tag, ops::aux_loss_value(counts.gpu, psum.gpu, c.T),
                   cpu::aux_loss_value(counts.cpu, psum.cpu, c.T), 1e-6);
      const auto d0 = randn(c.T * c.E, 95);
      Pair dprobs = output({c.T, c.E}, DType::kF32, &d0);
      Pair cnt{counts.cpu, counts.cpu.to(Device::cuda(0))};
      device_sync();
      ops::aux_loss_backward(gpu_ctx(), cnt.gpu, c.T, 0.001f, dprobs.gpu);
      cpu::aux_loss_backward(cpu_ctx(), cnt.cpu, c.T, 0.001f, dprobs.cpu);
      check("aux_loss_backward", "dprobs " + tag, dprobs, 1e-7);
      {  // The aux-loss row inside the top-k backward: against the CPU, and bitwise against the
         // two-step form (zeros, aux_loss_backward, then the row as dprobs_extra) on the GPU.
        Pair dwp = input(randn(c.T * c.k, 96), {c.T, c.k}, DType::kF32);
        Pair dl = output({c.T, c.E}, DType::kF32), dl2 = output({c.T, c.E}, DType::kF32);
        ops::router_topk_backward(gpu_ctx(), p.gpu, ix.gpu, tw.gpu, dwp.gpu, Tensor(), normalize, dl.gpu, cnt.gpu, c.T,
                                  0.001f);
        cpu::router_topk_backward(cpu_ctx(), p.cpu, ix.cpu, tw.cpu, dwp.cpu, Tensor(), normalize, dl.cpu, cnt.cpu, c.T,
                                  0.001f);
        check("router_topk_backward", "dlogits with the aux row " + tag, dl, 1e-5);
        Tensor rows = Tensor::zeros({c.T, c.E}, DType::kF32, Device::cuda(0));
        ops::aux_loss_backward(gpu_ctx(), cnt.gpu, c.T, 0.001f, rows);
        ops::router_topk_backward(gpu_ctx(), p.gpu, ix.gpu, tw.gpu, dwp.gpu, rows, normalize, dl2.gpu);
        device_sync();
        dl2.cpu = dl.gpu.to(Device::cpu());
        check_exact("router_topk_backward", "aux row inside = two-step form " + tag, dl2);
      }

      Pair lse = output({c.T}, DType::kF32);
      const double zg = ops::router_zloss_forward(gpu_ctx(), logits.gpu, lse.gpu);
      const double zc = cpu::router_zloss_forward(cpu_ctx(), logits.cpu, lse.cpu);
      check("router_zloss_forward", "lse " + tag, lse, 1e-6);
      check_scalar("router_zloss_forward", "z " + tag, zg, zc, 1e-5);
      Pair ls{lse.cpu, lse.cpu.to(Device::cuda(0))};
      device_sync();
      Pair dz = output({c.T, c.E}, DType::kF32, &d0);
      ops::router_zloss_backward(gpu_ctx(), logits.gpu, ls.gpu, 0.25f, dz.gpu);
      cpu::router_zloss_backward(cpu_ctx(), logits.cpu, ls.cpu, 0.25f, dz.cpu);
      check("router_zloss_backward", "dlogits " + tag, dz, 1e-6);
    }
  }
}

// Top-k picks for T tokens: distinct experts per token drawn from [0, range).
std::vector<int32_t> picks(int64_t T, int k, int range, uint64_t seed) {
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::vector<int32_t> v;
  std::vector<int32_t> all(static_cast<size_t>(range));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    v.insert(v.end(), all.begin(), all.begin() + k);
  }
  return v;
}

struct Routing {
  Pair idx, counts, offsets, row_of, token_of;
};

Routing route(const std::vector<int32_t>& topk, int64_t T, int k, int E, const std::string& tag) {
  Routing r;
  r.idx = input_ints(topk, {T, k});
  r.counts = output_ints({E});
  r.offsets = output_ints({E + 1});
  r.row_of = output_ints({T * k});
  r.token_of = output_ints({T * k});
  ops::moe_route_index(gpu_ctx(), r.idx.gpu, E, r.counts.gpu, r.offsets.gpu, r.row_of.gpu, r.token_of.gpu);
  cpu::moe_route_index(cpu_ctx(), r.idx.cpu, E, r.counts.cpu, r.offsets.cpu, r.row_of.cpu, r.token_of.cpu);
  check_exact("moe_route_index", "counts " + tag, r.counts);
  check_exact("moe_route_index", "offsets " + tag, r.offsets);
  check_exact("moe_route_index", "row_of " + tag, r.row_of);
  check_exact("moe_route_index", "token_of " + tag, r.token_of);
  return r;
}

// route_index alone at the model's sizes: one block below 257 experts (several rounds per warp,
// skewed and uniform picks), the radix sort above; all bit-equal to the CPU's stable order.
TEST(Backend, MoeRouteIndex) {
  MT_REQUIRE_GPU();
  struct Case { int64_t T; int k, E, range; };
  for (const Case c : {Case{4096, 8, 128, 128}, Case{4096, 8, 128, 8}, Case{1000, 8, 256, 256}, Case{3, 2, 256, 2},
                       Case{300, 4, 512, 512}, Case{1, 1, 1, 1}}) {
    const std::string tag = "T" + std::to_string(c.T) + " k" + std::to_string(c.k) + " E" + std::to_string(c.E) +
                            " range " + std::to_string(c.range);
    route(picks(c.T, c.k, c.range, 301 + c.T), c.T, c.k, c.E, tag);
  }
}

TEST(Backend, MoePermute) {
  MT_REQUIRE_GPU();
  struct Case { int64_t T; int k, E, range; int64_t H; };
  // random over all experts; only 16 of 128 experts used (zero-token experts); all on expert 0
  // (k = 1); one token; Qwen widths.
  for (const Case c : {Case{100, 8, 128, 128, 64}, Case{50, 4, 128, 16, 33}, Case{70, 1, 8, 1, 16},
                       Case{1, 2, 4, 4, 5}, Case{64, 8, 128, 128, 2048}}) {
    const std::string tag = "T" + std::to_string(c.T) + " k" + std::to_string(c.k) + " E" + std::to_string(c.E) +
                            " H" + std::to_string(c.H);
    const auto topk = picks(c.T, c.k, c.range, 101 + c.T);
    Routing r = route(topk, c.T, c.k, c.E, tag);
    const int64_t N = c.T * c.k;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::string tg = tag + " " + dt_name(dt);
      Pair x = input(randn(c.T * c.H, 102), {c.T, c.H}, dt);
      Pair xp = output({N, c.H}, dt);
      ops::moe_permute(gpu_ctx(), x.gpu, r.token_of.gpu, xp.gpu);
      cpu::moe_permute(cpu_ctx(), x.cpu, r.token_of.cpu, xp.cpu);
      check("moe_permute", "xp " + tg, xp, 0.0);

      Pair dxp = input(randn(N * c.H, 103), {N, c.H}, dt);
      Pair dx = output({c.T, c.H}, dt);
      ops::moe_permute_backward(gpu_ctx(), dxp.gpu, r.row_of.gpu, dx.gpu);
      cpu::moe_permute_backward(cpu_ctx(), dxp.cpu, r.row_of.cpu, dx.cpu);
      check("moe_permute_backward", "dx " + tg, dx, tol_for(dt));

      Pair yp = input(randn(N * c.H, 104), {N, c.H}, dt);
      Pair w = input(randu(c.T * c.k, 105, 0.0f, 1.0f), {c.T, c.k}, DType::kF32);
      Pair y = output({c.T, c.H}, dt);
      ops::moe_unpermute(gpu_ctx(), yp.gpu, r.row_of.gpu, w.gpu, y.gpu);
      cpu::moe_unpermute(cpu_ctx(), yp.cpu, r.row_of.cpu, w.cpu, y.cpu, Tensor());
      check("moe_unpermute", "y " + tg, y, tol_for(dt));
      // With the residual (the decoder's h + FFN(b)), added after the sum.
      Pair res = input(randn(c.T * c.H, 107), {c.T, c.H}, dt);
      Pair yr = output({c.T, c.H}, dt);
      ops::moe_unpermute(gpu_ctx(), yp.gpu, r.row_of.gpu, w.gpu, yr.gpu, res.gpu);
      cpu::moe_unpermute(cpu_ctx(), yp.cpu, r.row_of.cpu, w.cpu, yr.cpu, res.cpu);
      check("moe_unpermute", "y + residual " + tg, yr, tol_for(dt));
      // Without weights (the MoE layer's form: the weights went in before the experts).
      Pair yu = output({c.T, c.H}, dt);
      ops::moe_unpermute(gpu_ctx(), yp.gpu, r.row_of.gpu, Tensor(), yu.gpu, res.gpu);
      cpu::moe_unpermute(cpu_ctx(), yp.cpu, r.row_of.cpu, Tensor(), yu.cpu, res.cpu);
      check("moe_unpermute", "y unweighted + residual " + tg, yu, tol_for(dt));

      Pair dy = input(randn(c.T * c.H, 106), {c.T, c.H}, dt);
      Pair dyp = output({N, c.H}, dt), dw = output({c.T, c.k}, DType::kF32);
      ops::moe_unpermute_backward(gpu_ctx(), dy.gpu, yp.gpu, r.row_of.gpu, w.gpu, dyp.gpu, dw.gpu);
      cpu::moe_unpermute_backward(cpu_ctx(), dy.cpu, yp.cpu, r.row_of.cpu, w.cpu, dyp.cpu, dw.cpu);
      check("moe_unpermute_backward", "dyp " + tg, dyp, tol_for(dt));
      check("moe_unpermute_backward", "dtopk_w " + tg, dw, 1e-5);
    }
    // Per-pick values into row order and back: exact.
    Pair pv = input(randn(N, 108), {c.T, c.k}, DType::kF32);
    Pair rows = output({N}, DType::kF32);
    ops::moe_rows_from_picks(gpu_ctx(), pv.gpu, r.row_of.gpu, rows.gpu);
    cpu::moe_rows_from_picks(cpu_ctx(), pv.cpu, r.row_of.cpu, rows.cpu);
    check_exact("moe_rows_from_picks", "rows " + tag, rows);
    Pair back = output({c.T, c.k}, DType::kF32);
    ops::moe_picks_from_rows(gpu_ctx(), rows.gpu, r.row_of.gpu, back.gpu);
    cpu::moe_picks_from_rows(cpu_ctx(), rows.cpu, r.row_of.cpu, back.cpu);
    check_exact("moe_picks_from_rows", "picks " + tag, back);
  }
}

// grouped_matmul and its backward against the CPU op. The cases (built in one order, so that the random
// expert counts stay the same): [0, 7) small and Qwen-width ones with 8 experts or fewer and E = 128 at
// small widths; 7 and 8 the Qwen3-30B-A3B widths with E = 128 (gate_up, down), each its own test because
// the CPU reference at 400 M weights takes minutes (tests/gpu/run.sh PARALLEL=1 runs them side by side).
struct GmmCase {
  std::vector<int32_t> counts;
  int64_t N, K, M;
};
std::vector<GmmCase> grouped_matmul_cases() {
  std::vector<int32_t> qwen(8);
  const int32_t qc[] = {100, 0, 37, 64, 1, 0, 200, 110};  // 512 rows over 8 experts
  std::copy(std::begin(qc), std::end(qc), qwen.begin());
  std::vector<int32_t> many(128);
  std::mt19937 g(7);
  for (auto& x : many) x = static_cast<int32_t>(g() % 9 == 0 ? 0 : g() % 11);  // some zero-token experts
  const int32_t many_rows = std::accumulate(many.begin(), many.end(), 0);
  // Qwen3-30B-A3B widths with E = 128 and uneven routing (tensor-core path, tiles of 128 rows):
  // experts with 0, 1, 128, 129 and 300 rows, then random counts; 64 unused rows at the end.
  std::vector<int32_t> real(128);
  for (size_t e = 0; e < real.size(); ++e) real[e] = static_cast<int32_t>(g() % 7 == 0 ? 0 : g() % 40);
  real[0] = 300, real[1] = 0, real[2] = 1, real[3] = 128, real[4] = 129;
  const int32_t real_rows = std::accumulate(real.begin(), real.end(), 0);
  return {
      {{5, 0, 70, 1, 0, 64, 3, 100}, 300, 100, 70},  // 243 used rows of 300: unused capacity tail
      {{0, 0, 257, 0}, 257, 48, 33},                  // all rows on one expert
      {{1}, 1, 1, 1},
      {many, many_rows, 64, 48},                      // E = 128
      {qwen, 512, 2048, 1536},                        // Qwen widths: H = 2048 -> 2 x 768 (gate|up)
      {qwen, 512, 768, 2048},                         // and the down projection 768 -> 2048
      {{130, 0, 1, 257, 60}, 500, 200, 72},           // partial k and column tiles, 52 unused rows
      {real, real_rows + 64, 2048, 1536},             // E = 128 at Qwen widths
      {real, real_rows + 64, 768, 2048},
  };
}

void run_grouped_matmul_case(const GmmCase& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size());
  std::vector<int32_t> off(c.counts.size() + 1, 0);
  for (size_t e = 0; e < c.counts.size(); ++e) off[e + 1] = off[e] + c.counts[e];
  const std::string tag = "E" + std::to_string(E) + " N" + std::to_string(c.N) + " K" + std::to_string(c.K) + " M" +
                          std::to_string(c.M);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    if ((c.K == 2048 || (c.counts.size() == 128 && c.K >= 768)) && dt == DType::kF32) continue;  // CPU time
    const std::string tg = tag + " " + dt_name(dt);
    Pair x = input(randn(c.N * c.K, 111), {c.N, c.K}, dt);
    Pair w = input(randn(E * c.M * c.K, 112, 0.05f), {E, c.M, c.K}, dt);
    Pair o = input_ints(off, {E + 1});
    Pair y = output({c.N, c.M}, dt);
    ops::grouped_matmul(gpu_ctx(), x.gpu, w.gpu, o.gpu, y.gpu);
    cpu::grouped_matmul(cpu_ctx(), x.cpu, w.cpu, o.cpu, y.cpu);
    check("grouped_matmul", "y " + tg, y, dt == DType::kBF16 ? kTolBf16 : 1e-5);

    Pair dy = input(randn(c.N * c.M, 113), {c.N, c.M}, dt);
    Pair dx = output({c.N, c.K}, dt);
    const auto init = randn(E * c.M * c.K, 114, 0.1f);
    Pair dw = output({E, c.M, c.K}, DType::kF32, &init);
    ops::grouped_matmul_backward(gpu_ctx(), x.gpu, w.gpu, o.gpu, dy.gpu, dx.gpu, dw.gpu);
    cpu::grouped_matmul_backward(cpu_ctx(), x.cpu, w.cpu, o.cpu, dy.cpu, dx.cpu, dw.cpu, true);
    check("grouped_matmul_backward", "dx " + tg, dx, dt == DType::kBF16 ? kTolBf16 : 1e-5);
    check("grouped_matmul_backward", "dw " + tg, dw, 1e-5);
    // dx undefined: only dw accumulates (again).
    Tensor none;
    ops::grouped_matmul_backward(gpu_ctx(), x.gpu, w.gpu, o.gpu, dy.gpu, none, dw.gpu);
    cpu::grouped_matmul_backward(cpu_ctx(), x.cpu, w.cpu, o.cpu, dy.cpu, none, dw.cpu, true);
    check("grouped_matmul_backward", "dw twice " + tg, dw, 1e-5);
    // Overwrite mode (the first micro-batch of a step): dw starts as NaN and must be fully written,
    // zeros for experts without rows; f32 and bf16 gradients. Each mode also sums the squares of
    // the final dw (on Hopper in the dW epilogue): against sum_squares of the GPU's own dw (the
    // same values: the summation order differs, and the Hopper epilogue adds 64-column spans of a row's
    // squares in f32, a relative error below 9e-7 for bf16 values, 1.2e-6 at worst for f32 ones, far less
    // in a sum of many spans) and against the CPU op's sum.
    if (dt == DType::kBF16) {
      // The f32 gradient written with sums of squares (on Hopper: 128 x 256 tiles staged in halves), and
      // added with them (the one f32 case still on 128 x 128 tiles, whose store warps load the old rows).
      Tensor f32_written, f32_added_narrow;
      for (DType gdt : {DType::kF32, DType::kBF16}) {
        for (bool acc : {false, true}) {
          const std::string what = std::string(acc ? "dw += " : "dw overwrite ") + dt_name(gdt) + " " + tg;
          Pair dwo = acc ? output({E, c.M, c.K}, gdt, &init) : output({E, c.M, c.K}, gdt);
          Tensor ssc = Tensor::zeros({1}, DType::kF64, Device::cpu());
          ssc.data<double>()[0] = 0.5;  // the op adds to what is there
          Tensor ssg = ssc.to(gpu_ctx().device());
          ops::grouped_matmul_backward(gpu_ctx(), x.gpu, w.gpu, o.gpu, dy.gpu, none, dwo.gpu, acc, &ssg);
          cpu::grouped_matmul_backward(cpu_ctx(), x.cpu, w.cpu, o.cpu, dy.cpu, none, dwo.cpu, acc, &ssc);
          check("grouped_matmul_backward", what, dwo, gdt == DType::kBF16 ? kTolBf16 : 1e-5);
          device_sync();
          const double fused = ssg.to(Device::cpu()).data<double>()[0] - 0.5;
          const double reread = ops::sum_squares(gpu_ctx(), dwo.gpu);
          check_scalar("grouped_matmul_backward", "sum of squares, fused vs sum_squares, " + what, fused, reread, 1e-6);
          check_scalar("grouped_matmul_backward", "sum of squares vs CPU, " + what, fused,
                       ssc.data<double>()[0] - 0.5, gdt == DType::kBF16 ? 2 * kTolBf16 : 1e-4);
          if (gdt == DType::kF32) (acc ? f32_added_narrow : f32_written) = dwo.gpu.to(Device::cpu());
        }
      }
      // An f32 gradient without sums of squares (on Hopper: the same 128 x 256 tiles, the += a bulk
      // reduce-add done in L2). Written, it must equal the one written with sums above bit for bit. +=,
      // it must equal bit for bit both the f32 sum of the old values and the written ones (one rounding
      // an element) and the += with sums above, which loads and adds the old rows on the other tiles:
      // the two tilings and the two ways of adding agree (the random values here have no subnormal
      // sums, which the reduce-add may flush to zero).
      {
        Pair dwo = output({E, c.M, c.K}, DType::kF32);
        ops::grouped_matmul_backward(gpu_ctx(), x.gpu, w.gpu, o.gpu, dy.gpu, none, dwo.gpu, false);
        check_exact("grouped_matmul_backward", "dw overwrite f32, no sums of squares, = with them " + tg,
                    Pair{f32_written, dwo.gpu});
        Pair dwa = output({E, c.M, c.K}, DType::kF32, &init);
        ops::grouped_matmul_backward(gpu_ctx(), x.gpu, w.gpu, o.gpu, dy.gpu, none, dwa.gpu, true);
        device_sync();
        Tensor sum = Tensor::empty({E, c.M, c.K}, DType::kF32, Device::cpu());
        for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] = init[i] + f32_written.data<float>()[i];
        check_exact("grouped_matmul_backward", "dw += f32, no sums of squares, = old + written " + tg,
                    Pair{sum, dwa.gpu});
        check_exact("grouped_matmul_backward", "dw += f32, no sums of squares, = += with them " + tg,
                    Pair{f32_added_narrow, dwa.gpu});
      }
    }
  }
}

TEST(Backend, GroupedMatmul) {
  MT_REQUIRE_GPU();
  const auto cases = grouped_matmul_cases();
  for (size_t i = 0; i < 7; ++i) run_grouped_matmul_case(cases[i]);
}
TEST(Backend, GroupedMatmulModelWidthsGateUp) {
  MT_REQUIRE_GPU();
  run_grouped_matmul_case(grouped_matmul_cases()[7]);
}
TEST(Backend, GroupedMatmulModelWidthsDown) {
  MT_REQUIRE_GPU();
  run_grouped_matmul_case(grouped_matmul_cases()[8]);
}

}  // namespace
}  // namespace moetrain::test
