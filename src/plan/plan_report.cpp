// Text and JSON renderings of a plan. The JSON keeps every number in bytes / seconds / FLOPs and
// names the allocator categories exactly as MemStats and metrics.jsonl do ("weights", "gradients",
// "master", "optimizer", "activations", "workspace", "other"), so predicted and measured peaks can
// be compared key by key.
#include <fmt/format.h>

#include "plan/plan.h"

namespace moetrain {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
std::string gib(double b) { return fmt::format("{:8.2f} GiB", b / kGiB); }

std::string duration(double s) {
  if (s <= 0) return "-";
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  if (s < 3 * 86400) return fmt::format("{:.1f} h", s / 3600);
  return fmt::format("{:.1f} days", s / 86400);
}

}  // namespace

std::string format_plan(const PlanResult& r) {
  const PlanInput& in = r.input;
  const MemoryPlan& m = r.memory;
  std::string s;
  s += fmt::format("model      {} ({}): {:.3f} B parameters, {:.3f} B active per token\n", in.model_name,
                   in.model.model_type, r.params.total / 1e9, r.params.active / 1e9);
  s += fmt::format("           embed {:.3f} B, lm_head {:.3f} B, attention {:.3f} B, router {:.4f} B, experts {:.3f} B, "
                   "dense MLP {:.3f} B, norms {:.5f} B\n",
                   r.params.embed / 1e9, r.params.lm_head / 1e9, r.params.attention / 1e9, r.params.router / 1e9,
                   r.params.experts / 1e9, r.params.dense_mlp / 1e9, (r.params.norms + r.params.final_norm) / 1e9);
  s += fmt::format("run        {} | micro-batch {} x {} tokens{} | recompute {} | optimizer {}\n", objective_name(in.objective),
                   in.micro_batch_size, in.seq_length, in.objective == Objective::kDpo ? " x 2 (chosen, rejected)" : "",
                   recompute_name(in.recompute), optimizer_kind_name(in.optimizer));
  s += fmt::format("hardware   {} x {}{} | layout {}{}\n", r.hw.num_gpus, r.hw.name,
                   r.hw.cpu ? "" : fmt::format(" ({:.1f} GiB, {:.0f} TFLOP/s)", r.hw.gpu_mem_bytes / kGiB, r.hw.peak_tflops),
                   in.layout.str(), in.distributed_optimizer ? ", distributed optimizer" : "");
  s += fmt::format("\nmemory per {} (peak in: {})\n", r.hw.cpu ? "process (host)" : "GPU", m.peak_phase);
  for (const auto& it : m.items)
    s += fmt::format("  {:<46} {:<11} {}  {}\n", it.name, mem_category_name(it.category), gib(it.bytes), it.note);
  s += fmt::format("  {:<46} {:<11} {}\n", "= allocator peak (worst-case routing)", "", gib(m.allocator_peak));
  if (in.layout.ep > 1)
    s += fmt::format("  {:<46} {:<11} {}\n", "  (balanced routing)", "", gib(m.allocator_peak_expected));
  if (!r.hw.cpu) {
    s += fmt::format("  {:<46} {:<11} {}  {:.0f}% of the dynamic part\n", "fragmentation allowance", "", gib(m.fragmentation),
                     kFragmentation * 100);
    s += fmt::format("  {:<46} {:<11} {}\n", "CUDA context, cuBLAS workspace", "", gib(m.runtime));
    if (m.comm > 0) s += fmt::format("  {:<46} {:<11} {}\n", "NCCL buffers", "", gib(m.comm));
  }
  s += fmt::format("  {:<46} {:<11} {}\n", "= total", "", gib(m.device_total));
  s += "  per category (allocator peaks, compare with metrics.jsonl \"memory\"):";
  for (size_t c = 0; c < kNumMemCategories; ++c)
    if (m.category_peak[c] > 0)
      s += fmt::format(" {} {:.2f}", mem_category_name(static_cast<MemCategory>(c)), m.category_peak[c] / kGiB);
  s += " GiB\n";
  if (!r.hw.cpu) {
    s += fmt::format("\nhost memory per node {}", gib(m.host_per_node));
    if (r.hw.host_mem_bytes > 0) s += fmt::format(" of {}", gib(r.hw.host_mem_bytes));
    s += "\n";
    for (const auto& h : m.host_items) s += fmt::format("  {:<46} {}  {}\n", h.name, gib(h.bytes), h.note);
  }
  s += fmt::format("\ncheckpoint one resume checkpoint {} | HF export (bf16) {} | disk with keep_last={}: {}\n",
                   gib(r.checkpoint.resume_bytes), gib(r.checkpoint.export_bytes), in.keep_last, gib(r.checkpoint.disk_bytes));
  const TimePlan& t = r.time;
  s += fmt::format("\ntime       {:.2f} GFLOP per token (model, SPEC 10, S_avg = {}){}\n", t.model_flops_per_token / 1e9,
                   in.seq_length / 2,
                   t.hw_flops_per_token > t.model_flops_per_token * 1.0001
                       ? fmt::format("; {:.2f} GFLOP executed (recompute / DPO reference)", t.hw_flops_per_token / 1e9) : "");
  s += fmt::format("           {:.0f} tokens per step ({} micro-batches accumulated) | step {} | {:.0f} tokens/s/GPU at MFU {:.2f}\n",
                   t.tokens_per_step, t.grad_accum, duration(t.step_time_s), t.tokens_per_s_per_gpu, r.hw.mfu);
  if (t.pipeline_bubble > 0) s += fmt::format("           pipeline bubble {:.1f}% of the step\n", 100 * t.pipeline_bubble);
  s += fmt::format("           budget {:.3g} tokens = {:.0f} steps: {}\n", t.token_budget, t.steps, duration(t.total_time_s));
  s += fmt::format("\nverdict    {}\n", r.verdict.summary);
  for (const auto& c : r.verdict.changes) s += fmt::format("           - {}\n", c);
  for (const auto& n : r.notes) s += fmt::format("note       {}\n", n);
  return s;
}

std::string format_search(const std::vector<PlanResult>& rs, size_t max_rows) {
  if (rs.empty()) return "no layout fits these GPUs (try more GPUs, full recompute or a lighter optimizer)\n";
  std::string s = fmt::format("{:>3}  {:<40} {:<10} {:>5} {:>12} {:>12} {:>14} {:>10}\n", "#", "layout", "recompute",
                              "mbs", "GPU mem", "step", "tok/s/GPU", "total");
  for (size_t i = 0; i < rs.size() && i < max_rows; ++i) {
    const PlanResult& r = rs[i];
    s += fmt::format("{:>3}  {:<40} {:<10} {:>5} {:>12} {:>10.1f} s {:>14.0f} {:>10.1f} h\n", i + 1, r.input.layout.str(),
                     recompute_name(r.input.recompute), r.input.micro_batch_size,
                     fmt::format("{:.1f} GiB", r.memory.device_total / kGiB), r.time.step_time_s,
                     r.time.tokens_per_s_per_gpu, r.time.total_time_s / 3600);
  }
  if (rs.size() > max_rows) s += fmt::format("... {} more\n", rs.size() - max_rows);
  s += "times use one MFU for every layout: communication of tp/pp/cp/ep is not modeled beyond the pipeline bubble\n";
  return s;
}

nlohmann::json plan_to_json(const PlanResult& r) {
  using json = nlohmann::json;
  const PlanInput& in = r.input;
  const MemoryPlan& m = r.memory;
  json j;
  j["model"] = {{"name", in.model_name}, {"config", in.model.to_json()}};
  j["parameters"] = {{"total", r.params.total}, {"active", r.params.active}, {"embed", r.params.embed},
                     {"lm_head", r.params.lm_head}, {"final_norm", r.params.final_norm}, {"attention", r.params.attention},
                     {"norms", r.params.norms}, {"router", r.params.router}, {"experts", r.params.experts},
                     {"dense_mlp", r.params.dense_mlp}, {"muon", r.params.muon}, {"frozen", r.params.frozen}};
  j["run"] = {{"objective", objective_name(in.objective)}, {"micro_batch_size", in.micro_batch_size},
              {"seq_length", in.seq_length}, {"micro_batch_tokens", in.micro_batch_tokens()},
              {"recompute", recompute_name(in.recompute)}, {"optimizer", optimizer_kind_name(in.optimizer)},
              {"distributed_optimizer", in.distributed_optimizer}, {"imbalance", in.imbalance},
              {"ce_chunk_tokens", in.ce_chunk_tokens}};
  j["layout"] = {{"dp", in.layout.dp}, {"tp", in.layout.tp}, {"pp", in.layout.pp}, {"cp", in.layout.cp},
                 {"ep", in.layout.ep}, {"runnable", in.layout.runnable()}};
  j["hardware"] = {{"name", r.hw.name}, {"num_gpus", r.hw.num_gpus}, {"gpu_mem_bytes", r.hw.gpu_mem_bytes},
                   {"host_mem_bytes", r.hw.host_mem_bytes}, {"peak_tflops", r.hw.peak_tflops}, {"mfu", r.hw.mfu},
                   {"cpu", r.hw.cpu}};
  json cat = json::object(), at = json::object();
  for (size_t c = 0; c < kNumMemCategories; ++c) {
    cat[mem_category_name(static_cast<MemCategory>(c))] = m.category_peak[c];
    at[mem_category_name(static_cast<MemCategory>(c))] = m.at_peak[c];
  }
  json items = json::array();
  for (const auto& it : m.items)
    items.push_back({{"name", it.name}, {"category", mem_category_name(it.category)}, {"bytes", it.bytes}, {"note", it.note}});
  json host = json::array();
  for (const auto& it : m.host_items) host.push_back({{"name", it.name}, {"bytes", it.bytes}, {"note", it.note}});
  j["memory"] = {{"category_peak", cat}, {"at_peak", at}, {"allocator_peak", m.allocator_peak},
                 {"allocator_peak_expected", m.allocator_peak_expected}, {"peak_phase", m.peak_phase},
                 {"fragmentation", m.fragmentation}, {"runtime", m.runtime}, {"comm", m.comm},
                 {"device_total", m.device_total}, {"device_total_expected", m.device_total_expected},
                 {"items", items}, {"host_per_node", m.host_per_node}, {"host_items", host}};
  j["checkpoint"] = {{"resume_bytes", r.checkpoint.resume_bytes}, {"export_bytes", r.checkpoint.export_bytes},
                     {"disk_bytes", r.checkpoint.disk_bytes}};
  const TimePlan& t = r.time;
  j["time"] = {{"model_flops_per_token", t.model_flops_per_token}, {"hw_flops_per_token", t.hw_flops_per_token},
               {"tokens_per_step", t.tokens_per_step}, {"grad_accum", t.grad_accum}, {"step_time_s", t.step_time_s},
               {"tokens_per_s_per_gpu", t.tokens_per_s_per_gpu}, {"token_budget", t.token_budget}, {"steps", t.steps},
               {"total_time_s", t.total_time_s}, {"pipeline_bubble", t.pipeline_bubble}};
  j["verdict"] = {{"fits", r.verdict.fits}, {"host_fits", r.verdict.host_fits},
                  {"max_micro_batch", r.verdict.max_micro_batch}, {"summary", r.verdict.summary},
                  {"changes", r.verdict.changes}};
  j["notes"] = r.notes;
  return j;
}

}  // namespace moetrain
