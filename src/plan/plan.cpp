// Planner entry points: the inputs from a TrainConfig, hardware presets, the time model (SPEC.md
// section 10 FLOPs at an assumed or measured MFU, recompute work, the DPO reference pass, the
// pipeline bubble), the verdict (largest micro-batch that fits; changes that would make a run
// fit, each checked by planning it) and the layout search.
#include "plan/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "core/check.h"
#include "model/hf_checkpoint.h"
#include "optim/adamw.h"
#include "train/config.h"
#include "train/metrics.h"

namespace moetrain {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
std::string gib(double b) { return fmt::format("{:.1f} GiB", b / kGiB); }
}  // namespace

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdamW8bit: return "adamw8bit";
    case OptimizerKind::kMuon: return "muon";
    case OptimizerKind::kAdamWOffload: return "adamw_offload";
  }
  return "?";
}

OptimizerKind parse_optimizer_kind(const std::string& s) {
  if (s == "adamw") return OptimizerKind::kAdamW;
  if (s == "adamw8bit" || s == "adamw_8bit") return OptimizerKind::kAdamW8bit;
  if (s == "muon") return OptimizerKind::kMuon;
  if (s == "adamw_offload" || s == "cpu_adamw") return OptimizerKind::kAdamWOffload;
  MT_FAIL("[plan] optimizer '{}' is not one of adamw, adamw8bit, muon, adamw_offload", s);
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::kPretrain: return "pretrain";
    case Objective::kSft: return "sft";
    case Objective::kDpo: return "dpo";
    case Objective::kGrpo: return "grpo";
  }
  return "?";
}

Objective parse_objective(const std::string& s) {
  if (s == "pretrain") return Objective::kPretrain;
  if (s == "sft") return Objective::kSft;
  if (s == "dpo") return Objective::kDpo;
  if (s == "grpo") return Objective::kGrpo;
  MT_FAIL("[plan] objective '{}' is not one of pretrain, sft, dpo, grpo", s);
}

Hardware Hardware::preset(const std::string& name, int64_t num_gpus) {
  Hardware h;
  h.name = name;
  h.num_gpus = num_gpus;
  // Total memory as the devices report it (nvidia-smi / rocm-smi), dense bf16 peak from datasheets.
  if (name == "h100") {
    h.gpu_mem_bytes = 81559.0 * 1024 * 1024, h.peak_tflops = 989, h.host_mem_bytes = 2048 * kGiB;
  } else if (name == "h200") {
    h.gpu_mem_bytes = 143771.0 * 1024 * 1024, h.peak_tflops = 989, h.host_mem_bytes = 2048 * kGiB;
  } else if (name == "mi300x") {
    h.gpu_mem_bytes = 205822885888.0, h.peak_tflops = 1307, h.host_mem_bytes = 2048 * kGiB;
  } else if (name == "a100") {
    h.gpu_mem_bytes = 81920.0 * 1024 * 1024, h.peak_tflops = 312, h.host_mem_bytes = 1024 * kGiB;
  } else if (name == "cpu") {
    h.cpu = true, h.num_gpus = 1, h.gpus_per_node = 1, h.host_mem_bytes = 64 * kGiB, h.peak_tflops = 1;
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    MT_FAIL("[plan] unknown GPU '{}'; known: {} (or give --gpu-mem and --peak-tflops)", name, names);
  }
  return h;
}

std::vector<std::string> Hardware::preset_names() { return {"h100", "h200", "mi300x", "a100", "cpu"}; }

Hardware hardware_from_device(const std::string& device_name, size_t total_memory, int64_t num_gpus,
                              double peak_tflops, double mfu) {
  Hardware h;
  h.name = device_name;
  h.num_gpus = num_gpus;
  h.gpus_per_node = std::min<int64_t>(num_gpus, 8);
  h.gpu_mem_bytes = static_cast<double>(total_memory);
  h.peak_tflops = peak_tflops;
  h.mfu = mfu;
  h.cpu = device_name == "cpu" || total_memory == 0;
  return h;
}

std::string Layout::str() const {
  std::string s = fmt::format("dp{}", dp);
  if (tp > 1) s += fmt::format(" tp{}", tp);
  if (pp > 1) s += fmt::format(" pp{}", pp);
  if (cp > 1) s += fmt::format(" cp{}", cp);
  if (ep > 1) s += fmt::format(" ep{}", ep);
  if (!runnable()) s += " (planning-only)";
  return s;
}

int64_t PlanInput::micro_batch_tokens() const {
  return micro_batch_size * seq_length * (objective == Objective::kDpo ? 2 : 1);
}

namespace {

ModelConfig model_config_of(const TrainConfig& cfg) {
  if (!cfg.model.path.empty()) {
    LoadOptions lo;
    lo.num_layers = cfg.model.num_layers;
    return load_hf_config(cfg.model.path, lo);
  }
  ModelConfig mc = !cfg.model.preset.empty() ? ModelConfig::preset(cfg.model.preset) : ModelConfig::from_file(cfg.model.config);
  if (cfg.model.num_layers > 0) mc = mc.with_num_layers(cfg.model.num_layers);
  return mc;
}

}  // namespace

PlanInput PlanInput::from_config(const TrainConfig& cfg, const Hardware& hw) {
  PlanInput in;
  in.model = model_config_of(cfg);
  in.model_name = !cfg.model.path.empty() ? cfg.model.path : !cfg.model.preset.empty() ? cfg.model.preset : cfg.model.config;
  if (cfg.model.num_layers > 0) in.model_name += fmt::format(" ({} layers)", cfg.model.num_layers);
  in.objective = parse_objective(cfg.training.objective);
  in.micro_batch_size = cfg.training.micro_batch_size;
  in.seq_length = cfg.training.seq_length;
  in.global_batch_size = cfg.training.global_batch_size;
  in.recompute = parse_recompute(cfg.training.recompute_granularity);
  in.ce_chunk_tokens = cfg.model.ce_chunk_tokens;
  in.optimizer = parse_optimizer_kind(cfg.optimizer.optimizer);
  in.layout.tp = cfg.parallel.tensor_model_parallel_size;
  in.layout.pp = cfg.parallel.pipeline_model_parallel_size;
  in.layout.cp = cfg.parallel.context_parallel_size;
  in.layout.ep = cfg.parallel.expert_model_parallel_size;
  const int64_t mp = in.layout.tp * in.layout.pp * in.layout.cp;
  MT_CHECK(hw.num_gpus % mp == 0, "[plan] {}: {} GPUs cannot hold tp x pp x cp = {}", cfg.source, hw.num_gpus, mp);
  in.layout.dp = hw.num_gpus / mp;
  in.distributed_optimizer = cfg.parallel.use_distributed_optimizer;
  in.z_loss = cfg.model.moe_z_loss_coeff > 0;
  in.router_stats = cfg.logging.log_expert_load;
  in.train_iters = cfg.training.train_iters;
  in.keep_last = cfg.checkpoint.keep_last;
  in.freeze = cfg.model.freeze;
  in.main_grads_dtype = parse_precision_dtype(cfg.optimizer.main_grads_dtype, "optimizer.main_grads_dtype");
  in.main_params_dtype = parse_precision_dtype(cfg.optimizer.main_params_dtype, "optimizer.main_params_dtype");
  in.exp_avg_dtype = parse_precision_dtype(cfg.optimizer.exp_avg_dtype, "optimizer.exp_avg_dtype");
  in.exp_avg_sq_dtype = parse_precision_dtype(cfg.optimizer.exp_avg_sq_dtype, "optimizer.exp_avg_sq_dtype");
  in.update_in_backward = cfg.optimizer.update_in_backward;
  return in;
}

TimePlan plan_time(const PlanInput& in, const Hardware& hw) {
  TimePlan t;
  const ModelConfig& c = in.model;
  const double pairs = in.objective == Objective::kDpo ? 2.0 : 1.0;
  const int64_t gbs = in.global_batch_size > 0 ? in.global_batch_size : in.micro_batch_size * in.layout.dp;
  t.grad_accum = std::max<int64_t>(1, gbs / std::max<int64_t>(1, in.micro_batch_size * in.layout.dp));
  t.tokens_per_step = static_cast<double>(gbs) * static_cast<double>(in.seq_length) * pairs;
  // Full rows of one causal document each: a query attends S/2 keys on average.
  t.model_flops_per_token = c.flops_per_token(static_cast<double>(in.seq_length) / 2.0);
  const double head = 6.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  double hw_flops = t.model_flops_per_token;
  if (in.recompute == Recompute::kFull) hw_flops += (t.model_flops_per_token - head) / 3.0;  // one more layer forward
  if (in.recompute == Recompute::kSelective)  // the attention core's forward again (no matmul repeated)
    hw_flops += (t.model_flops_per_token - c.flops_per_token(0.0)) / 3.0;
  t.hw_flops_per_token = hw_flops;
  const double rate = static_cast<double>(hw.num_gpus) * hw.peak_tflops * 1e12 * hw.mfu;
  t.pipeline_bubble = in.layout.pp > 1 ? static_cast<double>(in.layout.pp - 1) /
                                             static_cast<double>(t.grad_accum + in.layout.pp - 1) : 0.0;
  t.step_time_s = rate > 0 ? t.tokens_per_step * hw_flops / rate / (1.0 - t.pipeline_bubble) : 0.0;
  t.tokens_per_s_per_gpu = t.step_time_s > 0 ? t.tokens_per_step / t.step_time_s / static_cast<double>(hw.num_gpus) : 0;
  t.token_budget = in.token_budget > 0 ? in.token_budget : static_cast<double>(in.train_iters) * t.tokens_per_step;
  t.steps = t.tokens_per_step > 0 ? std::ceil(t.token_budget / t.tokens_per_step) : 0;
  t.total_time_s = t.steps * t.step_time_s;
  // DPO: reference log-probs of every chosen/rejected token, one forward (1/3 of training FLOPs).
  if (in.objective == Objective::kDpo && rate > 0) {
    t.hw_flops_per_token += t.model_flops_per_token / 3.0;
    t.total_time_s += t.token_budget * t.model_flops_per_token / 3.0 / rate;
  }
  return t;
}

namespace {

bool fits_on(const MemoryPlan& m, const Hardware& hw) {
  if (hw.cpu) return hw.host_mem_bytes <= 0 || m.device_total <= hw.host_mem_bytes;
  const bool host = hw.host_mem_bytes <= 0 || m.host_per_node <= hw.host_mem_bytes;
  return m.device_total <= hw.gpu_mem_bytes && host;
}

bool fits_with(PlanInput in, const Hardware& hw, int64_t mbs) {
  in.micro_batch_size = mbs;
  return fits_on(plan_memory(in, hw), hw);
}

// Largest micro-batch in [1, cap] that fits (memory grows with it); 0 when none does.
int64_t max_micro_batch(const PlanInput& in, const Hardware& hw, int64_t cap) {
  if (!fits_with(in, hw, 1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= cap && fits_with(in, hw, hi)) lo = hi, hi *= 2;
  if (hi > cap) {
    if (fits_with(in, hw, cap)) return cap;
    hi = cap;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits_with(in, hw, mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

std::string fit_line(const PlanInput& in, const Hardware& hw) {
  const MemoryPlan m = plan_memory(in, hw);
  return fmt::format("{} per {}", gib(m.device_total), hw.cpu ? "host" : "GPU");
}

// Changes that make a non-fitting run fit, each planned to check it.
std::vector<std::string> suggest_changes(const PlanInput& in, const Hardware& hw) {
  std::vector<std::string> out;
  auto try_it = [&](PlanInput v, const std::string& what) {
    if (fits_with(v, hw, v.micro_batch_size)) {
      out.push_back(fmt::format("{}: {}", what, fit_line(v, hw)));
      return true;
    }
    return false;
  };
  const int64_t mb = max_micro_batch(in, hw, in.micro_batch_size);
  if (mb > 0 && mb < in.micro_batch_size) {
    PlanInput v = in;
    v.micro_batch_size = mb;
    try_it(v, fmt::format("training.micro_batch_size={} (raise gradient accumulation to keep the global batch)", mb));
  }
  std::vector<std::pair<PlanInput, std::string>> bases = {{in, ""}};
  if (in.recompute != Recompute::kFull) {
    PlanInput v = in;
    v.recompute = Recompute::kFull;
    if (!try_it(v, "training.recompute_granularity=full")) bases.push_back({v, "training.recompute_granularity=full and "});
  }
  for (const auto& [base, prefix] : bases) {
    for (OptimizerKind k : {OptimizerKind::kAdamW8bit, OptimizerKind::kMuon, OptimizerKind::kAdamWOffload}) {
      if (in.optimizer == k || (in.optimizer != OptimizerKind::kAdamW && k != OptimizerKind::kAdamWOffload)) continue;
      PlanInput v = base;
      v.optimizer = k;
      try_it(v, prefix + fmt::format("--optimizer {}", optimizer_kind_name(k)));
    }
    if (base.model.is_moe()) {  // a larger expert-parallel group on the same GPUs
      const int64_t room = base.layout.dp * base.layout.tp * base.layout.cp;
      for (int64_t ep = base.layout.ep * 2; ep <= room && base.model.num_experts % ep == 0; ep *= 2) {
        if (room % ep != 0) break;
        PlanInput v = base;
        v.layout.ep = ep;
        if (try_it(v, prefix + fmt::format("parallel.expert_model_parallel_size={}", ep))) break;
      }
    }
    if (!hw.cpu) {  // more GPUs of the same kind (dp grows; ep follows for MoE)
      for (int64_t n = hw.num_gpus * 2; n <= 4096; n *= 2) {
        PlanInput v = base;
        Hardware h = hw;
        h.num_gpus = n;
        v.layout.dp = n / (v.layout.tp * v.layout.pp * v.layout.cp);
        if (v.layout.dp < 1) continue;
        if (v.model.is_moe()) {
          int64_t ep = v.layout.ep;
          while (ep * 2 <= v.layout.dp * v.layout.tp * v.layout.cp && v.model.num_experts % (ep * 2) == 0) ep *= 2;
          v.layout.ep = ep;
        }
        if (fits_with(v, h, v.micro_batch_size)) {
          out.push_back(prefix + fmt::format("{} GPUs ({}): {}", n, v.layout.str(), fit_line(v, h)));
          break;
        }
      }
    }
    if (!out.empty()) break;
  }
  return out;
}

}  // namespace

PlanResult plan(const PlanInput& in, const Hardware& hw) {
  MT_CHECK(in.layout.world() == hw.num_gpus || hw.cpu,
           "[plan] layout {} uses {} GPUs but the hardware has {}", in.layout.str(), in.layout.world(), hw.num_gpus);
  MT_CHECK(hw.cpu || hw.gpu_mem_bytes > 0, "[plan] GPU memory is unknown: give --gpu NAME or --gpu-mem GB");
  PlanResult r;
  r.input = in;
  r.hw = hw;
  r.params = count_parameters(in.model, in.freeze);
  r.memory = plan_memory(in, hw);
  r.checkpoint = plan_checkpoint(in);
  r.time = plan_time(in, hw);
  Verdict& v = r.verdict;
  v.fits = fits_on(r.memory, hw);
  v.host_fits = hw.host_mem_bytes <= 0 || r.memory.host_per_node <= hw.host_mem_bytes;
  v.max_micro_batch = max_micro_batch(in, hw, 1024);
  const double cap = hw.cpu ? hw.host_mem_bytes : hw.gpu_mem_bytes;
  if (v.fits) {
    v.summary = fmt::format("fits: {} of {} per {} ({:.0f}%); largest micro-batch that fits: {}", gib(r.memory.device_total),
                            gib(cap), hw.cpu ? "host" : "GPU", 100.0 * r.memory.device_total / cap, v.max_micro_batch);
  } else {
    v.summary = !v.host_fits && r.memory.device_total <= cap
                    ? fmt::format("does not fit: host memory {} per node exceeds {}", gib(r.memory.host_per_node),
                                  gib(hw.host_mem_bytes))
                    : fmt::format("does not fit: {} needed per {}, {} available (peak in {})", gib(r.memory.device_total),
                                  hw.cpu ? "host" : "GPU", gib(cap), r.memory.peak_phase);
    v.changes = suggest_changes(in, hw);
    if (v.changes.empty()) v.changes.push_back("no single change tried (recompute, micro-batch, optimizer, expert parallel, more GPUs) fits");
  }
  if (!in.layout.runnable())
    r.notes.push_back("tensor, pipeline and context parallelism are planning-only: moetrain runs data and expert parallelism");
  if (in.layout.ep > 1) r.notes.push_back("expert-parallel dispatch buffers follow the design (all-to-all), not yet the model code");
  if (in.optimizer != OptimizerKind::kAdamW)
    r.notes.push_back(fmt::format("optimizer {} is planning-only until src/optim implements it", optimizer_kind_name(in.optimizer)));
  if (in.objective == Objective::kDpo)
    r.notes.push_back("DPO: a micro-batch holds chosen + rejected of each pair; reference log-probs are precomputed once");
  if (in.objective == Objective::kGrpo) r.notes.push_back("GRPO: rollout generation time and KV cache are not modeled");
  r.notes.push_back(fmt::format("time assumes MFU {:.2f} of {:.0f} TFLOP/s per GPU (an assumption until measured)", hw.mfu,
                                hw.peak_tflops));
  // What one H200 measured for Qwen3-30B-A3B layers (docs/plan.md), so a user sees how far the
  // assumption may be from this run's precision; --mfu / --mfu-from replace it.
  if (!hw.cpu) {
    const bool bf16_state = in.main_params_dtype == DType::kBF16 && in.exp_avg_dtype == DType::kBF16;
    r.notes.push_back(bf16_state ? "Qwen3-30B-A3B layers measured on one H200 with bf16 weights, gradients and moments: "
                                   "MFU 0.31-0.33 (give --mfu or --mfu-from run/metrics.jsonl for this run's)"
                                 : "Qwen3-30B-A3B layers measured on one H200 with f32 master weights or moments: MFU "
                                   "about 0.21 with one micro-batch a step, 0.27 with four (give --mfu or --mfu-from "
                                   "run/metrics.jsonl for this run's)");
  }
  return r;
}

PlanResult plan_run(const TrainConfig& cfg, const Hardware& hw) { return plan(PlanInput::from_config(cfg, hw), hw); }

std::vector<PlanResult> search_layouts(const PlanInput& base, const Hardware& hw, int64_t max_mbs) {
  std::vector<PlanResult> out;
  const ModelConfig& c = base.model;
  const int64_t N = hw.num_gpus;
  for (int64_t tp = 1; tp <= std::min<int64_t>(N, 8); tp *= 2) {
    if (N % tp || c.num_attention_heads % tp) continue;
    for (int64_t pp = 1; pp <= N / tp && pp <= c.num_hidden_layers; pp *= 2) {
      if ((N / tp) % pp) continue;
      for (int64_t cp = 1; cp <= N / (tp * pp) && cp <= 8; cp *= 2) {
        if ((N / (tp * pp)) % cp) continue;
        const int64_t dp = N / (tp * pp * cp);
        for (int64_t ep = 1; ep <= dp * tp * cp; ep *= 2) {
          if ((dp * tp * cp) % ep || (c.is_moe() ? c.num_experts % ep != 0 : ep > 1)) continue;
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            PlanInput in = base;
            in.layout = {dp, tp, pp, cp, ep};
            in.recompute = rc;
            const int64_t mb = max_micro_batch(in, hw, max_mbs);
            if (mb == 0) continue;
            in.micro_batch_size = mb;
            PlanResult r;
            r.input = in;
            r.hw = hw;
            r.params = count_parameters(in.model, in.freeze);
            r.memory = plan_memory(in, hw);
            r.time = plan_time(in, hw);
            r.checkpoint = plan_checkpoint(in);
            r.verdict.fits = true;
            r.verdict.max_micro_batch = mb;
            out.push_back(std::move(r));
          }
        }
      }
    }
  }
  auto key = [](const PlanResult& r) {
    const double per_token = r.time.tokens_per_step > 0 ? r.time.step_time_s / r.time.tokens_per_step : 0;
    const Layout& l = r.input.layout;
    return std::make_tuple(!l.runnable(), r.input.recompute == Recompute::kSelective, std::round(per_token * 1e12),
                           -r.input.micro_batch_size, l.tp * l.pp * l.cp, r.memory.device_total);
  };
  std::stable_sort(out.begin(), out.end(), [&](const PlanResult& a, const PlanResult& b) { return key(a) < key(b); });
  return out;
}

double parse_memory_size(const std::string& s, const std::string& what) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    MT_FAIL("[plan] {} '{}' is not a size (examples: 80, 80GB, 141GiB, 512MiB)", what, s);
  }
  std::string unit = s.substr(pos);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mul = 0;
  if (unit.empty() || unit == "gib" || unit == "g") mul = kGiB;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "mib") mul = 1024.0 * 1024.0;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "tib") mul = kGiB * 1024.0;
  else if (unit == "tb") mul = 1e12;
  MT_CHECK(mul > 0 && v > 0, "[plan] {} '{}' is not a positive size (examples: 80, 80GB, 141GiB, 512MiB)", what, s);
  return v * mul;
}

double measured_mfu(const std::string& path, double peak_tflops) {
  std::vector<double> v;
  for (const auto& rec : read_metrics_file(path)) {
    if (rec.value("type", "") != "train") continue;
    if (rec.contains("mfu")) v.push_back(rec["mfu"].get<double>());
    else if (rec.contains("tflops") && peak_tflops > 0) v.push_back(rec["tflops"].get<double>() / peak_tflops);
  }
  MT_CHECK(!v.empty(), "[plan] {} has no train records with mfu or tflops (give --peak-tflops for tflops-only records)", path);
  if (v.size() > 1) v.erase(v.begin());  // the first step includes warm-up
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace moetrain
