// Kernel microbenchmarks of `moetrain bench --kernels` and the GEMM ceiling (bench_common.h):
// random inputs (never zeros), warm-up, median of profiler-region timings. FLOP counts: GEMMs
// 2*M*N*K; attention 4*d*heads*(visible query-key pairs) forward and 2.5x that backward; the loss
// head 6*T*V*H for logits, dlogits->dx and dW. Peak bytes are the allocator's high-water mark above
// what was held before the call (the logits the path materializes). With energy_s > 0, each case then
// runs back to back for about that long between two reads of the board's energy counter (NVML).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "cli/bench_common.h"
#include "core/check.h"
#include "core/env.h"
#include "core/energy_meter.h"
#include "core/profiler.h"
#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/loss_head.h"
#include "model/qwen3_model.h"

namespace moetrain::cli {

using ops::Trans;

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {
// One timed call: GPU time between CUDA events around fn (the profiler's region), in ms.
// MT_BENCH_BUSY_MIB=N (a diagnostic, docs/bench.md): N MiB of random fill queued on the device just before
// each sample, so that the GPU is busy when the first event is recorded: a one-call row then holds neither
// the host's time to the launch nor what an idle GPU takes to start.
double sample_ms(Context& ctx, const std::function<void()>& fn) {
  static const long busy_mib = env_int("MT_BENCH_BUSY_MIB", 0);
  if (busy_mib > 0 && ctx.device().is_cuda()) {
    static Tensor busy = Tensor::empty({busy_mib << 18}, DType::kF32, ctx.device());
    ops::fill_normal(ctx, busy, 0.0f, 1.0f, ctx.rng(0xb05f));
  }
  Profiler::enable(true);
  {
    const ProfileScope region(ctx, "bench", ProfileKind::kRegion);
    fn();
  }
  double ms = 0;
  for (const ProfileEntry& e : Profiler::report())
    if (e.kind == ProfileKind::kRegion && e.name == "bench") ms = e.total_ms;
  Profiler::enable(false);
  return ms;
}
}  // namespace

double median_ms(Context& ctx, int warmup, int reps, const std::function<void()>& fn) {
  return median_ms_interleaved(ctx, warmup, reps, {fn}).front();
}

std::vector<double> median_ms_interleaved(Context& ctx, int warmup, int reps,
                                          const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns)
    for (int i = 0; i < warmup; ++i) fn();
  std::vector<std::vector<double>> t(fns.size());
  for (int i = 0; i < std::max(reps, 1); ++i)
    for (size_t f = 0; f < fns.size(); ++f) t[f].push_back(sample_ms(ctx, fns[f]));
  std::vector<double> med;
  for (const auto& v : t) med.push_back(median_of(v));
  return med;
}

namespace {

DType compute_dtype(const Context& ctx) { return ctx.device().is_cuda() ? DType::kBF16 : DType::kF32; }

Tensor randn(Context& ctx, const Shape& shape, DType dt, float std, uint64_t purpose) {
  Tensor t = Tensor::empty(shape, dt, ctx.device());
  ops::fill_normal(ctx, t, 0.0f, std, ctx.rng(0xbe7c400 + purpose));
  return t;
}

// One case's numbers: median ms, and (when measured) board joules per call and the mean power.
struct Measure {
  double ms = 0, joules = -1, watts = -1;
  double host_us = -1;  // host time of one call issued on an idle GPU (host_us()), when measured
};

// Median host time of one call of fn issued on an idle GPU, in us: from the call to its return, the
// part of a one-call row's time that the GPU may spend waiting for the launch (the back-to-back rows
// hide it, as a training step's host running ahead does).
double host_us(Context& ctx, int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    ctx.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  ctx.synchronize();
  return median_of(t);
}

struct Rows {
  Context& ctx;
  const KernelBenchOptions& o;
  const EnergyMeter* meter = nullptr;  // null or unavailable: no energy columns
  nlohmann::json out = nlohmann::json::array();

  Measure time(const std::function<void()>& fn) { return time_interleaved({fn}).front(); }

  // Cases compared with each other: one sample of each in turn per repetition, so that the GPU's
  // clock and power state (the 700 W cap on an H100) drift alike for all of them; then each one's
  // energy, when asked for, as time() does.
  std::vector<Measure> time_interleaved(const std::vector<std::function<void()>>& fns) {
    const std::vector<double> ms = median_ms_interleaved(ctx, o.warmup, o.reps, fns);
    std::vector<Measure> out;
    for (size_t i = 0; i < fns.size(); ++i) out.push_back(energy(fns[i], ms[i]));
    return out;
  }

  Measure energy(const std::function<void()>& fn, double ms) {
    Measure m;
    m.ms = ms;
    if (!meter || !meter->available() || o.energy_s <= 0 || m.ms <= 0) return m;
    // NVML's counter moves in steps of up to 0.1 s: a window of energy_s seconds is good to about
    // 0.2 / energy_s of its joules.
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.energy_s / (m.ms * 1e-3))));
    ctx.synchronize();
    const std::optional<double> e0 = meter->joules();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) fn();
    ctx.synchronize();
    const std::optional<double> e1 = meter->joules();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (e0 && e1 && *e1 >= *e0 && sec > 0) m.joules = (*e1 - *e0) / static_cast<double>(n), m.watts = (*e1 - *e0) / sec;
    return m;
  }

  // key: a stable id shared with bench/torch_kernels.py --json (e.g. gmm.gate_up.fwd, attn.full.bwd).
  void add(const std::string& key, const std::string& name, const Measure& m, double flops,
           double peak_extra_bytes = -1) {
    const double ms = m.ms, ceiling_tflops = o.ceiling_tflops;
    const double tflops = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
    nlohmann::json r = {{"key", key}, {"name", name}, {"ms", ms}, {"flops", flops}, {"tflops", tflops}};
    r["pct_of_gemm_ceiling"] = ceiling_tflops > 0 ? nlohmann::json(100.0 * tflops / ceiling_tflops) : nlohmann::json();
    std::string extra;
    if (peak_extra_bytes >= 0) {
      r["peak_extra_bytes"] = peak_extra_bytes;
      extra = fmt::format("  peak +{:.1f} MiB", peak_extra_bytes / 1048576.0);
    }
    if (m.host_us >= 0) {
      r["host_us"] = m.host_us;
      extra += fmt::format("  host {:.1f} us", m.host_us);
    }
    if (m.joules >= 0) {
      r["joules"] = m.joules;
      extra += fmt::format("  {:.3f} J", m.joules);
      if (m.watts >= 0) r["watts"] = m.watts, extra += fmt::format(" {:.0f} W", m.watts);
    }
    std::printf("kernel %-56s %10.3f ms %8.1f TFLOP/s %7s%s\n", name.c_str(), ms, tflops,
                ceiling_tflops > 0 ? fmt::format("{:.1f}%", 100.0 * tflops / ceiling_tflops).c_str() : "-", extra.c_str());
    std::fflush(stdout);
    out.push_back(std::move(r));
  }
};

// Routed-row offsets [E+1]: each of T tokens picks k distinct experts uniformly at random.
std::vector<int32_t> route_offsets(int64_t T, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> counts(static_cast<size_t>(E), 0), pick(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) pick[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < k; ++j) {
      std::swap(pick[j], pick[j + static_cast<int64_t>(g() % static_cast<uint64_t>(E - j))]);
      ++counts[pick[j]];
    }
  }
  std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

void bench_grouped_gemm(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o, Rows& rows) {
  const int64_t T = o.tokens, E = mc.num_experts, k = mc.num_experts_per_tok, H = mc.hidden_size,
                I = mc.moe_intermediate_size, N = T * k;
  const DType dt = compute_dtype(ctx);
  const Tensor off = Tensor::from_ints(route_offsets(T, k, E, 42), {E + 1}).to(ctx.device());
  struct Case { const char* name; int64_t K, M; };
  for (const Case c : {Case{"gate_up", H, 2 * I}, Case{"down", I, H}}) {
    const Tensor x = randn(ctx, {N, c.K}, dt, 1.0f, 1), w = randn(ctx, {E, c.M, c.K}, dt, 0.02f, 2);
    const Tensor dy = randn(ctx, {N, c.M}, dt, 1.0f, 3);
    Tensor y = Tensor::empty({N, c.M}, dt, ctx.device()), dx = Tensor::empty({N, c.K}, dt, ctx.device());
    Tensor dw = Tensor::zeros({E, c.M, c.K}, DType::kF32, ctx.device()), none;
    const double f = 2.0 * static_cast<double>(N) * static_cast<double>(c.K) * static_cast<double>(c.M);
    const std::string tag = fmt::format("gmm {} {}->{} T{} E{} k{}", c.name, c.K, c.M, T, E, k);
    const std::string key = std::string("gmm.") + c.name + ".";
    rows.add(key + "fwd", tag + " fwd", rows.time([&] { ops::grouped_matmul(ctx, x, w, off, y); }), f);
    // dW as torch._grouped_mm forms it (bf16 out, overwritten), the same work as the torch rows of
    // the same keys; dx alone = (dx + dW) - dW (the backward op skips dx when dx is undefined).
    Tensor dwb = Tensor::empty({E, c.M, c.K}, DType::kBF16, ctx.device());
    const Measure both = rows.time([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, dx, dwb, false); });
    Measure dwo = rows.time([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dwb, false); });
    dwo.host_us = host_us(ctx, o.reps, [&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dwb, false); });
    Measure dxo{std::max(both.ms - dwo.ms, 0.0)};
    if (both.joules >= 0 && dwo.joules >= 0) dxo.joules = std::max(both.joules - dwo.joules, 0.0);
    rows.add(key + "dx", tag + " dx", dxo, f);
    rows.add(key + "dw", tag + " dW (bf16 =)", dwo, f);
    rows.add(key + "bwd", tag + " bwd (dx + bf16 dW)", both, 2 * f);
    // The same calls kB2B at a time between one pair of events, per call: the launch-to-launch time of
    // a step, where the host runs ahead of the GPU. The rows above time one call on an idle GPU, so they
    // also hold the host's time from the first event to the launch (torch_kernels.py times both ways).
    constexpr int kB2B = 10;
    auto per_call = [&](const std::function<void()>& fn) {
      Measure m = rows.time([&] {
        for (int i = 0; i < kB2B; ++i) fn();
      });
      m.ms /= kB2B;
      if (m.joules >= 0) m.joules /= kB2B;
      return m;
    };
    rows.add(key + "fwd_b2b", tag + " fwd, 10 back to back",
             per_call([&] { ops::grouped_matmul(ctx, x, w, off, y); }), f);
    rows.add(key + "dw_b2b", tag + " dW (bf16 =), 10 back to back",
             per_call([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dwb, false); }), f);
    rows.add(key + "bwd_b2b", tag + " bwd (dx + bf16 dW), 10 back to back",
             per_call([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, dx, dwb, false); }), 2 * f);
    // The gradient accumulated in f32 (default precision, a later micro-batch), and bf16 dW with the
    // sums of squares of the gradient norm, which the step's unfused update path (MT_FUSED_ADAMW=0) adds.
    rows.add(key + "dw_f32acc", tag + " dW (f32 +=)",
             rows.time([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dw); }), f);
    Tensor ss = Tensor::zeros({1}, DType::kF64, ctx.device());
    rows.add(key + "dw_ss", tag + " dW (bf16 =) + sum of squares",
             rows.time([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dwb, false, &ss); }), f);
    rows.add(key + "dw_ss_b2b", tag + " dW (bf16 =) + sum of squares, 10 back to back",
             per_call([&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dwb, false, &ss); }), f);
    // The step's expert backward with the update in its dW epilogue (all-bf16 state, stochastic
    // rounding; the weights are their own master): dx, dW and AdamW in one op. Beside it the second
    // half of the unfused pair (MT_FUSED_ADAMW=0): AdamW alone over the stored bf16 gradient, so that
    // dx + "dW + sum of squares" + "AdamW alone" can be set against the fused op.
    if (dt == DType::kBF16) {
      Tensor wm = randn(ctx, {E, c.M, c.K}, dt, 0.02f, 4), m = randn(ctx, {E, c.M, c.K}, dt, 1e-3f, 5);
      Tensor v = Tensor::empty({E, c.M, c.K}, dt, ctx.device());
      ops::fill_normal(ctx, v, 1e-3f, 0.0f, ctx.rng(0xbe7c400 + 6));  // a positive constant second moment
      ops::AdamWTarget t{wm, m, v, Tensor(), {}};
      t.params.lr = 1e-5f, t.params.weight_decay = 0.01f, t.params.stochastic_rounding = true;
      t.params.rng = ctx.rng(0xbe7c400 + 7);
      Tensor no_grad, no_compute;
      rows.add(key + "bwd_adamw", tag + " bwd + AdamW (bf16 state)", rows.time([&] {
                 ++t.params.step;
                 ops::grouped_matmul_backward_adamw(ctx, x, wm, off, dy, dx, DType::kBF16, no_grad, false, t);
               }), 3 * f);
      // The same with the gradient's sum of squares formed in the epilogue, as the step runs it (the
      // gradient norm, logged even with clip_grad 0).
      rows.add(key + "bwd_adamw_ss", tag + " bwd + AdamW (bf16 state) + sum of squares", rows.time([&] {
                 ++t.params.step;
                 ops::grouped_matmul_backward_adamw(ctx, x, wm, off, dy, dx, DType::kBF16, no_grad, false, t, &ss);
               }), 3 * f);
      // 14 bytes a weight: w, m, v read and written, g read (bf16)
      const double bytes = 14.0 * static_cast<double>(E * c.M * c.K);
      const Measure am = rows.time([&] {
        ++t.params.step;
        ops::adamw_step(ctx, wm, dwb, m, v, t.params, no_compute);
      });
      rows.add(key + "adamw", fmt::format("{} AdamW alone (bf16 state, {:.0f} GB/s)", tag,
                                          am.ms > 0 ? bytes / (am.ms * 1e-3) / 1e9 : 0.0), am, 0.0);
    }
  }
}

void bench_attention(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o, int64_t doc, const char* kind,
                     Rows& rows) {
  const int64_t T = o.tokens, nh = mc.num_attention_heads, nkv = mc.num_key_value_heads, d = mc.head_dim;
  const DType dt = compute_dtype(ctx);
  std::vector<int32_t> cu{0};
  while (cu.back() < T) cu.push_back(static_cast<int32_t>(std::min<int64_t>(cu.back() + doc, T)));
  double pairs = 0;  // visible (query, key) pairs
  int64_t maxlen = 0;
  for (size_t i = 1; i < cu.size(); ++i) {
    const double n = cu[i] - cu[i - 1];
    pairs += n * (n + 1) / 2;
    maxlen = std::max<int64_t>(maxlen, cu[i] - cu[i - 1]);
  }
  const Tensor cus = Tensor::from_ints(cu, {static_cast<int64_t>(cu.size())}).to(ctx.device());
  const Tensor q = randn(ctx, {T, nh, d}, dt, 1.0f, 11), kk = randn(ctx, {T, nkv, d}, dt, 1.0f, 12);
  const Tensor v = randn(ctx, {T, nkv, d}, dt, 1.0f, 13), g = randn(ctx, {T, nh, d}, dt, 1.0f, 14);
  Tensor out = Tensor::empty({T, nh, d}, dt, ctx.device()), lse = Tensor::empty({nh, T}, DType::kF32, ctx.device());
  Tensor dq = Tensor::empty({T, nh, d}, dt, ctx.device());
  Tensor dk = Tensor::empty({T, nkv, d}, dt, ctx.device()), dv = Tensor::empty({T, nkv, d}, dt, ctx.device());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const double f = 4.0 * pairs * static_cast<double>(d) * static_cast<double>(nh);
  const std::string tag = fmt::format("attn T{} doc{} GQA {}/{} d{}", T, maxlen, nh, nkv, d);
  const std::string key = std::string("attn.") + kind + ".";
  rows.add(key + "fwd", tag + " fwd", rows.time([&] {
             ops::attention_forward(ctx, q, kk, v, cus, static_cast<int>(maxlen), scale, out, lse);
           }), f);
  rows.add(key + "bwd", tag + " bwd", rows.time([&] {
             ops::attention_backward(ctx, q, kk, v, out, lse, g, cus, static_cast<int>(maxlen), scale, dq, dk, dv);
           }), 2.5 * f);
}

// Bytes the allocator held above `before` at its high-water mark during fn().
double peak_extra_bytes(Context& ctx, const std::function<void()>& fn) {
  Allocator& a = allocator_for(ctx.device());
  ctx.synchronize();
  a.reset_peaks();
  const size_t before = a.stats().total_current;
  fn();
  ctx.synchronize();
  return static_cast<double>(a.stats().total_peak - before);
}

// The attention projections (cuBLAS matmuls) at the layer's shapes: q, k and v as the layer runs them
// (three GEMMs per pass; dx adds into one buffer), beside one GEMM over the concatenated [q; k; v]
// weight, which is what fusing them would run; then o. Weight gradients written in the compute dtype
// (bf16 on a GPU, as all-bf16 keeps them).
void bench_projections(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o, Rows& rows) {
  const int64_t T = o.tokens, H = mc.hidden_size, Q = mc.num_attention_heads * mc.head_dim;
  const int64_t KV = mc.num_key_value_heads * mc.head_dim, F = Q + 2 * KV;
  const DType dt = compute_dtype(ctx);
  const Tensor a = randn(ctx, {T, H}, dt, 1.0f, 41), wf = randn(ctx, {F, H}, dt, 0.02f, 42);
  const Tensor dyf = randn(ctx, {T, F}, dt, 1.0f, 43);
  Tensor yf = Tensor::empty({T, F}, dt, ctx.device()), gf = Tensor::empty({F, H}, dt, ctx.device());
  Tensor da = Tensor::empty({T, H}, dt, ctx.device());
  // q, k, v: weight and gradient rows of the concatenated buffers; outputs, and dq, dk, dv as the
  // attention backward leaves them, separate contiguous tensors.
  const int64_t lo[3] = {0, Q, Q + KV}, hi[3] = {Q, Q + KV, F};
  std::vector<Tensor> w3, g3, y3, d3;
  for (int i = 0; i < 3; ++i) {
    w3.push_back(wf.slice(0, lo[i], hi[i]));
    g3.push_back(gf.slice(0, lo[i], hi[i]));
    y3.push_back(Tensor::empty({T, hi[i] - lo[i]}, dt, ctx.device()));
    d3.push_back(randn(ctx, {T, hi[i] - lo[i]}, dt, 1.0f, 44 + static_cast<uint64_t>(i)));
  }
  struct Pass {
    const char* key;
    std::function<void()> three, one;
  };
  const Pass passes[] = {
      {"fwd",
       [&] {
         for (int i = 0; i < 3; ++i) ops::matmul(ctx, a, Trans::kNo, w3[i], Trans::kYes, y3[i]);
       },
       [&] { ops::matmul(ctx, a, Trans::kNo, wf, Trans::kYes, yf); }},
      {"dx",  // the layer adds k's and v's into q's
       [&] {
         for (int i = 0; i < 3; ++i) ops::matmul(ctx, d3[i], Trans::kNo, w3[i], Trans::kNo, da, 1.0f, i ? 1.0f : 0.0f);
       },
       [&] { ops::matmul(ctx, dyf, Trans::kNo, wf, Trans::kNo, da); }},
      {"dw",
       [&] {
         for (int i = 0; i < 3; ++i) ops::matmul(ctx, d3[i], Trans::kYes, a, Trans::kNo, g3[i]);
       },
       [&] { ops::matmul(ctx, dyf, Trans::kYes, a, Trans::kNo, gf); }},
  };
  const double fq = 2.0 * T * H * F;
  const std::string tag = fmt::format("T{} H{} q{} kv{}", T, H, Q, KV);
  for (const Pass& p : passes) {
    rows.add(fmt::format("proj.qkv.{}", p.key), fmt::format("proj q,k,v {} (3 GEMMs) {}", p.key, tag),
             rows.time(p.three), fq);
    rows.add(fmt::format("proj.qkv.{}.one", p.key), fmt::format("proj [q;k;v] {} (1 GEMM) {}", p.key, tag),
             rows.time(p.one), fq);
  }
  const Tensor wo = randn(ctx, {H, Q}, dt, 0.02f, 47), attn = randn(ctx, {T, Q}, dt, 1.0f, 48);
  const Tensor dh = randn(ctx, {T, H}, dt, 1.0f, 49);
  Tensor h = Tensor::empty({T, H}, dt, ctx.device()), dattn = Tensor::empty({T, Q}, dt, ctx.device());
  Tensor go = Tensor::empty({H, Q}, dt, ctx.device());
  const double fo = 2.0 * T * H * Q;
  rows.add("proj.o.fwd", "proj o fwd (+= residual) " + tag,
           rows.time([&] { ops::matmul(ctx, attn, Trans::kNo, wo, Trans::kYes, h, 1.0f, 1.0f); }), fo);
  rows.add("proj.o.dx", "proj o dx " + tag,
           rows.time([&] { ops::matmul(ctx, dh, Trans::kNo, wo, Trans::kNo, dattn); }), fo);
  rows.add("proj.o.dw", "proj o dW " + tag,
           rows.time([&] { ops::matmul(ctx, dh, Trans::kYes, attn, Trans::kNo, go); }), fo);
}

// The loss head's inputs at the model's shapes: x [T,H], the lm_head [V,H], random labels, weights 1/T,
// and its outputs dx, nll, lse.
struct LossHeadInputs {
  Tensor x, w, labels, weights, dx, nll, lse;
  LossHeadInputs(Context& ctx, int64_t T, int64_t H, int64_t V, DType dt, uint64_t seed) {
    x = randn(ctx, {T, H}, dt, 1.0f, seed), w = randn(ctx, {V, H}, dt, 0.02f, seed + 1);
    std::mt19937_64 g(seed);
    std::vector<int32_t> lab(static_cast<size_t>(T));
    for (auto& l : lab) l = static_cast<int32_t>(g() % static_cast<uint64_t>(V));
    labels = Tensor::from_ints(lab, {T}).to(ctx.device());
    weights = Tensor::from_floats(std::vector<float>(static_cast<size_t>(T), 1.0f / static_cast<float>(T)), {T})
                  .to(ctx.device());
    dx = Tensor::empty({T, H}, dt, ctx.device());
    nll = Tensor::empty({T}, DType::kF32, ctx.device()), lse = Tensor::empty({T}, DType::kF32, ctx.device());
  }
};

void bench_loss_head(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o, Rows& rows) {
  const int64_t T = o.tokens, H = mc.hidden_size, V = mc.vocab_size;
  const DType dt = compute_dtype(ctx);
  LossHeadInputs in(ctx, T, H, V, dt, 21);
  const Tensor &x = in.x, &w = in.w, &labels = in.labels, &weights = in.weights;
  Tensor &dx = in.dx, &nll = in.nll, &lse = in.lse;
  const double f = 6.0 * static_cast<double>(T) * static_cast<double>(V) * static_cast<double>(H);
  // The lm_head gradient in f32 (default precision) and, on a device, bf16 (all-bf16, as torch keeps it).
  std::vector<DType> grad_dtypes = {DType::kF32};
  if (dt == DType::kBF16) grad_dtypes.push_back(DType::kBF16);
  for (const DType gdt : grad_dtypes) {
    Tensor dw = Tensor::zeros({V, H}, gdt, ctx.device());
    const std::string gkey = gdt == DType::kF32 ? "" : ".bf16grad";
    const std::string gtag = fmt::format("{} dW", dtype_name(gdt));
    // The cases of this gradient dtype, timed interleaved (Rows::time_interleaved): the chunked and
    // unfused heads run under the same clock and power drift, which moved either one by up to 2 ms
    // between back-to-back runs on an H100 (docs/performance.md, round 30).
    struct Case {
      std::string key, name;
      std::function<void()> fn;
      double peak = -1;
    };
    std::vector<Case> cases;
    // The model's path: chunks of ModelOptions' default size for this gradient dtype (or --ce-chunks),
    // dlogits in place. Each is timed adding to the lm_head gradient (a later micro-batch) and writing
    // it (a step's first).
    std::vector<int64_t> chunks = o.ce_chunks;
    if (chunks.empty())
      chunks.push_back(loss_head_chunk_rows(T, V, dt, 0, ModelOptions{}.ce_chunk_bytes, gdt == DType::kF32));
    const std::string tag = fmt::format("loss head T{} H{} V{}", T, H, V);
    for (const int64_t c : chunks) {
      const int64_t chunk = loss_head_chunk_rows(T, V, dt, c, 0);
      for (const bool first : {false, true}) {
        auto chunked = [&, chunk, first] {
          LossHeadIO io;
          io.nll = nll, io.lse = lse, io.dx = dx, io.dw = dw, io.dw_overwrite = first;
          loss_head(ctx, x, w, labels, weights, chunk, io);
        };
        const std::string rtag = chunks.size() > 1 ? fmt::format(".r{}", chunk) : "";  // keys stay unique
        cases.push_back({"loss_head.chunked" + gkey + rtag + (first ? ".write" : ""),
                         fmt::format("{} chunked ({} rows/chunk) fwd+bwd, {} {}", tag, chunk, gtag,
                                     first ? "written" : "+="),
                         chunked});
      }
    }
    // Unfused: the whole [T,V] logits, CE forward, dlogits [T,V], then the two GEMMs.
    for (const bool first : {false, true}) {
      auto unfused = [&, first] {
        Tensor logits = Tensor::empty({T, V}, dt, ctx.device(), MemCategory::kWorkspace);
        ops::matmul(ctx, x, Trans::kNo, w, Trans::kYes, logits);
        ops::cross_entropy_forward(ctx, logits, labels, Tensor(), nll, lse);
        Tensor dlogits = Tensor::empty({T, V}, dt, ctx.device(), MemCategory::kWorkspace);
        ops::cross_entropy_backward(ctx, logits, labels, weights, lse, 1.0f, dlogits);
        ops::matmul(ctx, dlogits, Trans::kNo, w, Trans::kNo, dx);
        ops::matmul(ctx, dlogits, Trans::kYes, x, Trans::kNo, dw, 1.0f, first ? 0.0f : 1.0f);
      };
      cases.push_back({std::string("loss_head.unfused") + gkey + (first ? ".write" : ""),
                       fmt::format("{} unfused GEMM+CE fwd+bwd, {} {}", tag, gtag, first ? "written" : "+="),
                       unfused});
    }
    std::vector<std::function<void()>> fns;
    for (Case& k : cases) {
      k.peak = peak_extra_bytes(ctx, k.fn);
      fns.push_back(k.fn);
    }
    const std::vector<Measure> ms = rows.time_interleaved(fns);
    for (size_t i = 0; i < cases.size(); ++i) rows.add(cases[i].key, cases[i].name, ms[i], f, cases[i].peak);
  }
}

// The loss head's parts for one chunk of n rows (each chunk size timed, and n = T, the unfused
// head): the logits GEMM, cross-entropy forward + backward, the dx GEMM ([n,V] x [V,H]: an [n,H]
// output over K = V, few output tiles when n is small) and the lm_head dW GEMM (+=, f32 and bf16).
// The chunked head is about T / n of the sum; these rows say which part its extra time is in.
void bench_loss_head_parts(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o, Rows& rows) {
  const int64_t T = o.tokens, H = mc.hidden_size, V = mc.vocab_size;
  const DType dt = compute_dtype(ctx);
  std::vector<int64_t> ns = o.ce_chunks;
  if (ns.empty())  // the defaults for a bf16 and an f32 lm_head gradient
    for (const bool f32_grad : {false, true})
      ns.push_back(loss_head_chunk_rows(T, V, dt, 0, ModelOptions{}.ce_chunk_bytes, f32_grad));
  ns.push_back(T);
  for (int64_t& n : ns) n = std::clamp<int64_t>(n, 1, T);
  std::sort(ns.begin(), ns.end());
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  LossHeadInputs in(ctx, T, H, V, dt, 23);
  const Tensor &x = in.x, &w = in.w, &labels = in.labels, &weights = in.weights;
  Tensor &dx = in.dx, &nll = in.nll, &lse = in.lse;
  Tensor dw32 = Tensor::zeros({V, H}, DType::kF32, ctx.device()), dw16 = Tensor::zeros({V, H}, dt, ctx.device());
  // (on the CPU dt is f32, and dw16 is skipped below)
  for (const int64_t n : ns) {
    Tensor lc = Tensor::empty({n, V}, dt, ctx.device(), MemCategory::kWorkspace);
    const Tensor xc = x.slice(0, 0, n), lab = labels.slice(0, 0, n), wt = weights.slice(0, 0, n);
    Tensor nc = nll.slice(0, 0, n), sc = lse.slice(0, 0, n), dxc = dx.slice(0, 0, n);
    ops::matmul(ctx, xc, Trans::kNo, w, Trans::kYes, lc);
    const double f = 2.0 * static_cast<double>(n) * static_cast<double>(V) * static_cast<double>(H);
    const std::string tag = fmt::format("loss head part, {} rows of T{} H{} V{}", n, T, H, V);
    const std::string key = fmt::format("loss_head.part.r{}", n);
    rows.add(key + ".fwd", tag + ": logits GEMM",
             rows.time([&] { ops::matmul(ctx, xc, Trans::kNo, w, Trans::kYes, lc); }), f);
    // The same logits through the expert GEMM as one expert of n rows (on cc 9.0 the Hopper
    // warp-specialized kernel): whether a GEMM of ours, whose epilogue could take the cross-entropy
    // forward, runs this shape at cuBLAS's speed.
    const Tensor off = Tensor::from_ints({0, static_cast<int32_t>(n)}, {2}).to(ctx.device());
    const Tensor w3 = w.view({1, V, H});
    rows.add(key + ".fwd_gmm", tag + ": logits as a one-expert grouped GEMM",
             rows.time([&] { ops::grouped_matmul(ctx, xc, w3, off, lc); }), f);
    Tensor dc = Tensor::empty({n, V}, dt, ctx.device(), MemCategory::kWorkspace);
    rows.add(key + ".ce", tag + ": cross-entropy fwd + bwd", rows.time([&] {
      ops::cross_entropy_forward(ctx, lc, lab, Tensor(), nc, sc);
      ops::cross_entropy_backward(ctx, lc, lab, wt, sc, 1.0f, dc);
    }), 0);
    rows.add(key + ".dx", tag + ": dx GEMM [n,V] x [V,H]",
             rows.time([&] { ops::matmul(ctx, dc, Trans::kNo, w, Trans::kNo, dxc); }), f);
    // The lm_head gradient: cuBLAS, and the expert dW GEMM of one expert with n rows (on cc 9.0 the
    // Hopper kernel, whose store warps write, or load and add, each tile under the next tile's
    // mainloop; an f32 += there is a bulk reduce-add); f32 += and written, and on a bf16 device the same
    // with a bf16 gradient.
    Tensor none;
    for (Tensor* dw : {&dw32, &dw16}) {
      if (dw->dtype() == DType::kF32 && dw == &dw16) continue;  // a CPU run has no bf16 gradient
      const std::string dk = dw == &dw32 ? "" : "_bf16";
      const std::string dn = dw == &dw32 ? "f32" : "bf16";
      Tensor dw3 = dw->view({1, V, H});
      rows.add(key + ".dw" + dk, tag + ": dW GEMM " + dn + " +=",
               rows.time([&] { ops::matmul(ctx, dc, Trans::kYes, xc, Trans::kNo, *dw, 1.0f, 1.0f); }), f);
      rows.add(key + ".dw_gmm" + dk, tag + ": dW as a one-expert grouped GEMM, " + dn + " +=",
               rows.time([&] { ops::grouped_matmul_backward(ctx, xc, w3, off, dc, none, dw3, true); }), f);
      rows.add(key + ".dw" + dk + "_write", tag + ": dW GEMM " + dn + " written",
               rows.time([&] { ops::matmul(ctx, dc, Trans::kYes, xc, Trans::kNo, *dw, 1.0f, 0.0f); }), f);
      rows.add(key + ".dw_gmm" + dk + "_write", tag + ": dW as a one-expert grouped GEMM, " + dn + " written",
               rows.time([&] { ops::grouped_matmul_backward(ctx, xc, w3, off, dc, none, dw3, false); }), f);
    }
  }
}

}  // namespace

GemmCeiling measure_gemm_ceiling(Context& ctx, int64_t n, int reps) {
  const DType dt = compute_dtype(ctx);
  const Tensor a = randn(ctx, {n, n}, dt, 1.0f, 31), b = randn(ctx, {n, n}, dt, 1.0f, 32);
  Tensor c = Tensor::empty({n, n}, dt, ctx.device());
  GemmCeiling g;
  g.n = n;
  g.dtype = dtype_name(dt);
  g.ms = median_ms(ctx, 3, reps, [&] { ops::matmul(ctx, a, Trans::kNo, b, Trans::kNo, c); });
  g.tflops = g.ms > 0 ? 2.0 * std::pow(static_cast<double>(n), 3) / (g.ms * 1e-3) / 1e12 : 0.0;
  return g;
}

void check_kernel_groups(const std::vector<std::string>& groups) {
  for (const std::string& g : groups)
    MT_CHECK(g == "gmm" || g == "attn" || g == "proj" || g == "head",
             "[bench] --kernel-groups: unknown group '{}', expected gmm, attn, proj or head", g);
}

nlohmann::json run_kernel_benchmarks(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o) {
  MT_CHECK(o.tokens >= 1, "[bench] --kernel-tokens = {} must be >= 1", o.tokens);
  const EnergyMeter meter(o.energy_s > 0 && ctx.device().is_cuda() ? cuda_pci_bus_id(ctx.device().index) : "");
  if (o.energy_s > 0 && !meter.available())
    std::printf("kernel energy: unavailable (%s)\n", meter.why_unavailable().c_str());
  check_kernel_groups(o.groups);
  auto want = [&](const char* g) {
    return o.groups.empty() || std::find(o.groups.begin(), o.groups.end(), g) != o.groups.end();
  };
  Rows rows{ctx, o, &meter};
  if (want("gmm")) {
    if (mc.is_moe()) bench_grouped_gemm(ctx, mc, o, rows);
    else std::printf("kernel (dense model: no grouped GEMM cases)\n");
  }
  if (want("attn")) {
    bench_attention(ctx, mc, o, o.tokens, "full", rows);
    // Packed documents; when the micro-batch is not longer than `doc`, quarters of it instead.
    bench_attention(ctx, mc, o, o.doc < o.tokens ? o.doc : std::max<int64_t>(1, o.tokens / 4), "packed", rows);
  }
  if (want("proj")) bench_projections(ctx, mc, o, rows);
  if (want("head")) {
    bench_loss_head(ctx, mc, o, rows);
    bench_loss_head_parts(ctx, mc, o, rows);
  }
  return rows.out;
}

}  // namespace moetrain::cli
