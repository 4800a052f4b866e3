// Per-GPU memory of a planned run: parameter counts by role (closed forms, checked in the tests
// against the model's real tensor shapes), the persistent tensors per allocator category for the
// layout and optimizer, the activation peak from the allocation replay (mem_trace.cpp), and what
// the device holds outside moetrain's allocator; host memory per node and checkpoint sizes.
#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "core/check.h"
#include "model/loss_head.h"
#include "model/params.h"
#include "optim/name_pattern.h"
#include "plan/mem_trace.h"
#include "plan/plan.h"

namespace moetrain {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

size_t ci(MemCategory c) { return static_cast<size_t>(c); }

bool is_expert_tensor(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

}  // namespace

ParamCounts count_parameters(const ModelConfig& c, const std::vector<std::string>& freeze) {
  ParamCounts p;
  const int64_t H = c.hidden_size, V = c.vocab_size, d = c.head_dim;
  p.embed = V * H;
  p.lm_head = c.tie_word_embeddings ? 0 : V * H;
  p.final_norm = H;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    p.attention += 2 * H * c.num_attention_heads * d + 2 * H * c.num_key_value_heads * d;
    p.norms += 2 * H + 2 * d;
    if (c.is_sparse_layer(l)) {
      p.router += c.num_experts * H;
      p.experts += c.num_experts * 3 * c.moe_intermediate_size * H;
    } else {
      p.dense_mlp += 3 * c.intermediate_size * H;
    }
  }
  p.total = p.embed + p.lm_head + p.final_norm + p.attention + p.norms + p.router + p.experts + p.dense_mlp;
  p.muon = p.attention + p.router + p.experts + p.dense_mlp;
  p.active = p.total;
  if (c.is_moe() && c.num_experts > 0)
    p.active -= p.experts / c.num_experts * (c.num_experts - c.num_experts_per_tok);
  if (!freeze.empty()) {
    for (const auto& [name, shape] : ModelParams::expected_shapes(c)) {
      if (!name_matches_any(freeze, name)) continue;
      int64_t n = 1;
      for (auto s : shape) n *= s;
      p.frozen += n;
    }
  }
  return p;
}

namespace {

// Parameters held by one GPU of one pipeline stage.
struct StageParams {
  double dense = 0, expert = 0;     // local elements (dense: after tp split)
  double dense_muon = 0;            // of `dense`, the 2-D hidden matrices
  double grad_f32 = 0;              // of `dense`, gradients that stay f32: norms and the embedding table
  double largest_ns = 0;            // Muon Newton-Schulz workspace bytes for the largest batch
};

double newton_schulz_bytes(double rows, double cols) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return (3.0 * m * n + 2.0 * m * m) * 4.0;  // f32: X, g', X_next and A, A^2
}

StageParams stage_params(const ModelConfig& c, const Layout& lay, int64_t first, int64_t n, bool embed, bool head) {
  StageParams s;
  const double tp = static_cast<double>(lay.tp), H = static_cast<double>(c.hidden_size);
  const double V = static_cast<double>(c.vocab_size), d = static_cast<double>(c.head_dim);
  const double qw = static_cast<double>(c.num_attention_heads) * d, kvw = static_cast<double>(c.num_key_value_heads) * d;
  if (embed) s.dense += V * H / tp, s.grad_f32 += V * H / tp;
  if (head) {
    const double tied_copy = c.tie_word_embeddings && !embed ? V * H / tp : 0;  // the embedding's gradient (f32)
    s.dense += H + tied_copy + (c.tie_word_embeddings ? 0 : V * H / tp);
    s.grad_f32 += H + tied_copy;
  }
  for (int64_t l = first; l < first + n; ++l) {
    const double attn = (2 * H * qw + 2 * H * kvw) / tp;
    s.dense += attn + 2 * H + 2 * d;
    s.grad_f32 += 2 * H + 2 * d;
    s.dense_muon += attn;
    s.largest_ns = std::max(s.largest_ns, newton_schulz_bytes(qw / tp, H));
    if (c.is_sparse_layer(l)) {
      const double E = static_cast<double>(c.num_experts), I = static_cast<double>(c.moe_intermediate_size);
      s.dense += E * H;
      s.dense_muon += E * H;
      const double local_e = E / static_cast<double>(lay.ep);
      s.expert += local_e * 3 * I * H;
      const double batch = std::min<double>(static_cast<double>(kMuonBatch), local_e);
      s.largest_ns = std::max(s.largest_ns, batch * newton_schulz_bytes(2 * I, H));
    } else {
      const double I = static_cast<double>(c.intermediate_size);
      s.dense += 3 * I * H / tp;
      s.dense_muon += 3 * I * H / tp;
      s.largest_ns = std::max(s.largest_ns, newton_schulz_bytes(2 * I / tp, H));
    }
  }
  return s;
}

// H100 / H200 / H800 by name (presets "h100", "h200"; devices "NVIDIA H100 80GB HBM3"): compute
// capability 9.0, where the dW kernel can apply AdamW in its epilogue.
bool is_hopper(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return n.find("h100") != std::string::npos || n.find("h200") != std::string::npos || n.find("h800") != std::string::npos;
}

double frozen_fraction(const ModelConfig& c, const std::vector<std::string>& freeze, bool expert) {
  if (freeze.empty()) return 0.0;
  double frozen = 0, total = 0;
  for (const auto& [name, shape] : ModelParams::expected_shapes(c)) {
    if (is_expert_tensor(name) != expert) continue;
    double n = 1;
    for (auto s : shape) n *= static_cast<double>(s);
    total += n;
    if (name_matches_any(freeze, name)) frozen += n;
  }
  return total > 0 ? frozen / total : 0.0;
}

struct StagePlan {
  MemoryPlan mem;
  double persistent = 0;
};

StagePlan plan_stage(const PlanInput& in, const Hardware& hw, int64_t first, int64_t n, bool embed, bool head,
                     int64_t in_flight) {
  const ModelConfig& c = in.model;
  const Layout& lay = in.layout;
  StagePlan sp;
  MemoryPlan& m = sp.mem;
  const StageParams p = stage_params(c, lay, first, n, embed, head);
  const bool cpu = hw.cpu;
  const double wbytes = cpu ? 4.0 : 2.0;
  const double local = p.dense + p.expert;
  const double fd = frozen_fraction(c, in.freeze, false), fe = frozen_fraction(c, in.freeze, true);
  const double td = p.dense * (1 - fd), te = p.expert * (1 - fe);
  const double shard_d = in.distributed_optimizer ? static_cast<double>(lay.dp * lay.cp) : 1.0;
  const double shard_e = in.distributed_optimizer ? static_cast<double>(lay.expert_dp()) : 1.0;
  const double muon_frac = p.dense > 0 ? p.dense_muon / p.dense : 0.0;

  const double m_bytes = static_cast<double>(dtype_size(in.exp_avg_dtype));
  const double adam_state = m_bytes + static_cast<double>(dtype_size(in.exp_avg_sq_dtype));
  double sb_dense = adam_state, sb_expert = adam_state;
  std::string state_note = fmt::format("AdamW m {}, v {} ({} B/param)", dtype_name(in.exp_avg_dtype),
                                       dtype_name(in.exp_avg_sq_dtype), adam_state);
  switch (in.optimizer) {
    case OptimizerKind::kAdamW: break;
    case OptimizerKind::kAdamW8bit:
      sb_dense = sb_expert = 2.0 + 2.0 * 4.0 / static_cast<double>(kEightBitBlock);
      state_note = "8-bit m, v + f32 absmax per 256 (2.03 B/param)";
      break;
    case OptimizerKind::kMuon:
      sb_expert = m_bytes;
      sb_dense = muon_frac * m_bytes + (1 - muon_frac) * adam_state;
      state_note = fmt::format("Muon momentum {} for 2-D hidden matrices, AdamW m, v for the rest", dtype_name(in.exp_avg_dtype));
      break;
    case OptimizerKind::kAdamWOffload:
      sb_dense = sb_expert = 0;
      state_note = "in pinned host memory (offload)";
      break;
  }
  const bool offload = in.optimizer == OptimizerKind::kAdamWOffload;
  const double shard_params = td / shard_d + te / shard_e;  // trainable elements whose update this GPU owns

  // Gradients: f32 for norms and the embedding, main_grads_dtype for the matrices (allocate_gradients).
  const double gbytes = static_cast<double>(dtype_size(in.main_grads_dtype));
  // A master copy exists only when main_params_dtype differs from the weights' dtype (optim/adamw.h).
  const DType weight_dtype = cpu ? DType::kF32 : DType::kBF16;
  const bool has_master = !offload && in.main_params_dtype != weight_dtype;
  const double master_bytes = has_master ? static_cast<double>(dtype_size(in.main_params_dtype)) : 0.0;
  // optimizer.update_in_backward with one micro-batch and experts that need no gradient reduction
  // (expert data parallel 1): trainable expert weights have no gradient buffer (train/trainer.cpp).
  // Their backward op then needs a workspace for one matrix's gradient unless the Hopper dW kernel
  // applies AdamW in its epilogue (cc 9.0; f32 master and moments, or bf16 weights, gradients and
  // moments: gwd::dw_adamw_supported in kernels/cuda/grouped_gemm_ws_dw_adamw.cuh).
  const int64_t gbs = in.global_batch_size > 0 ? in.global_batch_size : in.micro_batch_size * lay.dp;
  const bool expert_grads_free = in.update_in_backward && in.optimizer == OptimizerKind::kAdamW &&
                                 gbs <= in.micro_batch_size * lay.dp && lay.expert_dp() == 1 && c.is_moe();
  const bool f32_state = has_master && in.main_params_dtype == DType::kF32 && in.exp_avg_dtype == DType::kF32 &&
                         in.exp_avg_sq_dtype == DType::kF32;
  const bool bf16_state = !offload && in.main_params_dtype == DType::kBF16 && in.main_grads_dtype == DType::kBF16 &&
                          in.exp_avg_dtype == DType::kBF16 && in.exp_avg_sq_dtype == DType::kBF16;
  const bool fused_update = !cpu && (f32_state || bf16_state) && is_hopper(hw.name);
  std::array<double, kNumMemCategories> pers{};
  pers[ci(MemCategory::kWeights)] = local * wbytes;
  pers[ci(MemCategory::kGradients)] =
      p.grad_f32 * 4 + (local - p.grad_f32 - (expert_grads_free ? te : 0.0)) * gbytes;
  pers[ci(MemCategory::kMaster)] = master_bytes * shard_params;
  pers[ci(MemCategory::kOptimizer)] = td / shard_d * sb_dense + te / shard_e * sb_expert;
  const bool dp_comm = lay.dp * lay.cp > 1 || lay.expert_dp() > 1;
  double other = 0;
  if (dp_comm && !cpu) other += 2 * kGradBucketBytes;
  if (offload) other += 2 * kOffloadBucketBytes;
  pers[ci(MemCategory::kOther)] = other;
  for (double b : pers) sp.persistent += b;

  auto add = [&](const std::string& name, MemCategory cat, double bytes, const std::string& note) {
    if (bytes > 0) m.items.push_back({name, cat, bytes, note});
  };
  add(fmt::format("weights ({}{})", dtype_name(weight_dtype), has_master || offload ? " compute copy" : ", also the main copy"),
      MemCategory::kWeights, pers[ci(MemCategory::kWeights)],
      fmt::format("{:.3f} B params on this GPU ({:.3f} B expert)", local / 1e9, p.expert / 1e9));
  add(in.main_grads_dtype == DType::kF32 ? std::string("gradients (f32)")
                                         : fmt::format("gradients ({} matrices, f32 norms and embedding)", dtype_name(in.main_grads_dtype)),
      MemCategory::kGradients, pers[ci(MemCategory::kGradients)],
      expert_grads_free ? "all but the trainable expert weights (updated in backward)"
                        : "every parameter, accumulated over micro-batches");
  add(fmt::format("master weights ({})", dtype_name(in.main_params_dtype)), MemCategory::kMaster, pers[ci(MemCategory::kMaster)],
      in.distributed_optimizer && shard_d * shard_e > 1
          ? fmt::format("sharded: dense over {}, experts over {}", shard_d, shard_e) : "");
  add("optimizer states", MemCategory::kOptimizer, pers[ci(MemCategory::kOptimizer)], state_note);
  add("communication / staging buckets", MemCategory::kOther, other,
      offload ? "gradient and weight staging for the host update" : "DP reduce-scatter buckets");

  // Activations: replay one micro-batch (worst-case and balanced routing).
  TraceShape ts;
  const int64_t split = lay.tp * lay.cp;
  ts.tokens = std::max<int64_t>(1, in.micro_batch_tokens() / split);
  ts.num_docs = in.micro_batch_size * (in.objective == Objective::kDpo ? 2 : 1);
  ts.first_layer = first;
  ts.num_layers = n;
  ts.vocab_local = (c.vocab_size + lay.tp - 1) / lay.tp;
  ts.width_div = lay.tp;
  ts.ep = lay.ep;
  ts.in_flight = in_flight;
  // DPO builds every pair batch of the step before its first pass (train/trainer.cpp), so their Batch
  // tensors are alive together: as many as the step's micro-batches on this rank.
  const int64_t passes = std::max<int64_t>(1, gbs / (in.micro_batch_size * lay.dp));  // micro-batches a step
  ts.batches_held = in.objective == Objective::kDpo ? passes : 1;
  ts.dtype_bytes = cpu ? 4 : 2;
  // The lm_head gradient: the tied embedding's (f32) or a matrix's (main_grads_dtype; allocate_gradients).
  const bool head_grad_f32 = c.tie_word_embeddings || in.main_grads_dtype == DType::kF32;
  ts.ce_chunk = loss_head_chunk_rows(ts.tokens, ts.vocab_local, cpu ? DType::kF32 : DType::kBF16, in.ce_chunk_tokens,
                                     kCeChunkBytes, head_grad_f32);
  ts.head = head;
  ts.fused_head = in.objective != Objective::kDpo;
  ts.batch_on_device = true;
  ts.on_cuda = !cpu;
  ts.sm_count = hw.sm_count;
  ts.hopper = !cpu && is_hopper(hw.name);
  ts.router_stats = in.router_stats;
  ts.z_loss = in.z_loss;
  ts.recompute = in.recompute;
  ts.expert_grad_scratch_bytes = expert_grads_free && !fused_update && te > 0 ? static_cast<int>(gbytes) : 0;
  if (ts.hopper && c.is_moe()) {
    // The fused gradient norm's per-tile sums of the Hopper expert dW kernels (8 bytes a tile of 128
    // rows by 256 columns for a bf16 gradient or a written f32 one, by 128 columns for an f32 +=;
    // gwd::dw_tiles). Every step's first pass writes the gradient (the first step's too), so an f32
    // gradient takes 128 only when a later pass of the step adds to it.
    const bool f32_added = in.main_grads_dtype != DType::kBF16 && ts.expert_grad_scratch_bytes == 0 && passes > 1;
    const int64_t bn = f32_added ? 128 : 256;
    const double experts = static_cast<double>(c.num_experts / lay.ep);
    auto partials = [&](int64_t K, int64_t M) {
      return 8.0 * experts * static_cast<double>((M + 127) / 128) * static_cast<double>((K + bn - 1) / bn);
    };
    ts.expert_dw_partials_gate_up = partials(c.hidden_size, 2 * c.moe_intermediate_size);
    ts.expert_dw_partials_down = partials(c.moe_intermediate_size, c.hidden_size);
  }
  const double tk = static_cast<double>(ts.tokens * c.num_experts_per_tok);
  const double cap = static_cast<double>(lay.ep) * static_cast<double>(ts.tokens) *
                     std::min<double>(static_cast<double>(c.num_experts_per_tok),
                                      static_cast<double>(c.num_experts) / static_cast<double>(lay.ep));
  ts.expert_rows = static_cast<int64_t>(std::llround(lay.ep > 1 ? std::min(tk * in.imbalance, cap) : tk));
  const TraceResult worst = trace_micro_batch(c, ts);
  ts.expert_rows = static_cast<int64_t>(std::llround(tk));
  const TraceResult expected = lay.ep > 1 ? trace_micro_batch(c, ts) : worst;

  const double ns_ws = in.optimizer == OptimizerKind::kMuon ? p.largest_ns : 0.0;
  for (size_t k = 0; k < kNumMemCategories; ++k) {
    m.category_peak[k] = pers[k] + worst.category_peak[k];
    m.at_peak[k] = pers[k] + worst.at_peak[k];
  }
  m.category_peak[ci(MemCategory::kWorkspace)] =
      std::max(m.category_peak[ci(MemCategory::kWorkspace)], pers[ci(MemCategory::kWorkspace)] + ns_ws);
  m.allocator_peak = sp.persistent + worst.total_peak;
  m.allocator_peak_expected = sp.persistent + expected.total_peak;
  m.peak_phase = worst.peak_phase;
  if (sp.persistent + ns_ws > m.allocator_peak) {
    m.allocator_peak = m.allocator_peak_expected = sp.persistent + ns_ws;
    m.at_peak = pers;
    m.at_peak[ci(MemCategory::kWorkspace)] += ns_ws;
    m.peak_phase = "optimizer step (Newton-Schulz)";
  }
  for (size_t g = 0; g < static_cast<size_t>(TraceGroup::kCount); ++g) {
    const auto group = static_cast<TraceGroup>(g);
    const MemCategory cat = group == TraceGroup::kLayerTemp || group == TraceGroup::kHeadGrad ? MemCategory::kWorkspace
                                                                                              : MemCategory::kActivations;
    std::string note;
    if (group == TraceGroup::kSaved)
      note = fmt::format("{} layers, {} tokens x {} micro-batch(es) in flight, recompute {}", n, ts.tokens,
                         in_flight, recompute_name(in.recompute));
    if (group == TraceGroup::kHead)
      note = fmt::format("logits chunk {} x {} in {}", ts.ce_chunk, ts.vocab_local, cpu ? "f32" : "bf16");
    if (group == TraceGroup::kDispatch) note = fmt::format("routing imbalance x{:.2f} at the peak", in.imbalance);
    add(std::string(trace_group_name(group)) + " (at peak)", cat, worst.groups_at_peak[g], note);
  }
  if (ns_ws > 0) add("Muon Newton-Schulz workspace (optimizer step)", MemCategory::kWorkspace, ns_ws,
                     fmt::format("{} expert matrices per batched call", kMuonBatch));

  const double dynamic = m.allocator_peak - sp.persistent;
  m.fragmentation = cpu ? 0.0 : kFragmentation * dynamic;
  m.runtime = cpu ? 0.0 : kCudaRuntimeBytes + kCublasWorkspaceBytes;
  if (!cpu && lay.world() > 1) {
    m.comm = kNcclBaseBytes;
    if (lay.ep > 1) m.comm += static_cast<double>(lay.ep - 1) * kNcclPerPeerBytes;
    m.comm += static_cast<double>((lay.tp > 1) + (lay.pp > 1) + (lay.cp > 1)) * kNcclBaseBytes;
  }
  const double extra = m.fragmentation + m.runtime + m.comm;
  m.device_total = m.allocator_peak + extra;
  m.device_total_expected = m.allocator_peak_expected + kFragmentation * (m.allocator_peak_expected - sp.persistent) * !cpu +
                            m.runtime + m.comm;

  // Host memory per node.
  const double ranks = static_cast<double>(std::min(hw.gpus_per_node, hw.num_gpus));
  if (cpu) {
    m.host_items.push_back({"training state and activations (CPU path)", MemCategory::kOther, m.allocator_peak, ""});
  } else {
    m.host_items.push_back({"per-rank runtime, data loader, pinned staging", MemCategory::kOther,
                            ranks * kHostProcessBytes, fmt::format("{} ranks x {:.0f} GiB", ranks, kHostProcessBytes / kGiB)});
    if (offload)
      m.host_items.push_back({"offloaded master + m + v + gradient shard (f32)", MemCategory::kOptimizer,
                              ranks * 16.0 * shard_params, fmt::format("{} ranks x {:.3f} B params x 16 B", ranks, shard_params / 1e9)});
  }
  for (const auto& h : m.host_items) m.host_per_node += h.bytes;
  return sp;
}

}  // namespace

MemoryPlan plan_memory(const PlanInput& in, const Hardware& hw) {
  const ModelConfig& c = in.model;
  const Layout& lay = in.layout;
  MT_CHECK(lay.dp >= 1 && lay.tp >= 1 && lay.pp >= 1 && lay.cp >= 1 && lay.ep >= 1, "[plan] layout {} has a size below 1",
           lay.str());
  MT_CHECK(!c.is_moe() || c.num_experts % lay.ep == 0, "[plan] expert parallel size {} must divide num_experts = {}",
           lay.ep, c.num_experts);
  MT_CHECK((lay.dp * lay.tp * lay.cp) % lay.ep == 0,
           "[plan] expert parallel size {} must divide dp x tp x cp = {}", lay.ep, lay.dp * lay.tp * lay.cp);
  MT_CHECK(c.num_attention_heads % lay.tp == 0, "[plan] tensor parallel size {} must divide num_attention_heads = {}",
           lay.tp, c.num_attention_heads);
  MT_CHECK(lay.pp <= c.num_hidden_layers, "[plan] pipeline parallel size {} exceeds the {} layers", lay.pp,
           c.num_hidden_layers);
  MT_CHECK(in.micro_batch_size >= 1 && in.seq_length >= 1, "[plan] micro-batch {} and sequence length {} must be >= 1",
           in.micro_batch_size, in.seq_length);
  const int64_t L = c.num_hidden_layers;
  if (lay.pp == 1) return plan_stage(in, hw, 0, L, true, true, 1).mem;
  // 1F1B: stage 0 holds the activations of up to pp micro-batches; the last stage has the head.
  const int64_t per = (L + lay.pp - 1) / lay.pp;
  const int64_t dpe = lay.dp;
  const int64_t gbs = in.global_batch_size > 0 ? in.global_batch_size : in.micro_batch_size * dpe;
  const int64_t accum = std::max<int64_t>(1, gbs / (in.micro_batch_size * dpe));
  StagePlan first = plan_stage(in, hw, 0, per, true, false, std::min(lay.pp, accum));
  StagePlan last = plan_stage(in, hw, L - per, per, false, true, 1);
  MemoryPlan out = first.mem.device_total >= last.mem.device_total ? first.mem : last.mem;
  out.peak_phase += first.mem.device_total >= last.mem.device_total ? " (first pipeline stage)" : " (last pipeline stage)";
  return out;
}

CheckpointPlan plan_checkpoint(const PlanInput& in) {
  CheckpointPlan cp;
  const ParamCounts p = count_parameters(in.model, in.freeze);
  const double total = static_cast<double>(p.total), train = static_cast<double>(p.total - p.frozen);
  const double muon_frac = p.total > 0 ? static_cast<double>(p.muon) / total : 0.0;
  const double m_bytes = static_cast<double>(dtype_size(in.exp_avg_dtype));
  double states = m_bytes + static_cast<double>(dtype_size(in.exp_avg_sq_dtype));
  if (in.optimizer == OptimizerKind::kAdamW8bit) states = 2.0 + 8.0 / static_cast<double>(kEightBitBlock);
  if (in.optimizer == OptimizerKind::kMuon) states = muon_frac * m_bytes + (1 - muon_frac) * states;
  // Model tensors in the compute dtype (bf16), the master copy (none with bf16 main params, which
  // are the bf16 weights themselves), optimizer state: named globally.
  const double master = in.main_params_dtype == DType::kBF16 ? 0.0 : static_cast<double>(dtype_size(in.main_params_dtype));
  cp.resume_bytes = total * 2 + train * (master + states);
  cp.export_bytes = total * 2;
  cp.disk_bytes = static_cast<double>(std::max<int64_t>(1, in.keep_last)) * cp.resume_bytes + cp.export_bytes;
  return cp;
}

}  // namespace moetrain
