// YAML configuration parsing (see config.h). The schema table below is the single list of keys:
// each entry binds "section.key" to a TrainConfig member with a type and one line of docs. Values
// are checked strictly (an integer key rejects 1.5 and "abc"); unknown keys get a suggestion.
#include "train/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/check.h"
#include "optim/name_pattern.h"
#include "optim/schedule.h"

namespace moetrain {

namespace {

enum class KeyType : uint8_t { kInt, kFloat, kBool, kString, kStringList };

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::kInt: return "integer";
    case KeyType::kFloat: return "number";
    case KeyType::kBool: return "boolean";
    case KeyType::kString: return "string";
    case KeyType::kStringList: return "list of strings";
  }
  return "?";
}

struct Field {
  std::string section, key, doc;
  KeyType type;
  std::function<void(TrainConfig&, const YAML::Node&, const std::string& where)> set;
  std::function<void(const TrainConfig&, YAML::Emitter&)> emit;
  std::function<std::string(const TrainConfig&)> show;  // default value, for docs
  std::string full() const { return section + "." + key; }
};

std::string where_of(const std::string& source, const YAML::Node& n) {
  if (n.Mark().line >= 0 && !source.empty() && source.rfind("<override", 0) != 0)
    return fmt::format("{} line {}", source, n.Mark().line + 1);
  return source;
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "null";
}

int64_t parse_int(const YAML::Node& n, const std::string& where, const std::string& key) {
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    size_t pos = 0;
    try {
      long long v = std::stoll(s, &pos, 10);
      if (pos == s.size()) return v;
    } catch (const std::exception&) {}
    // Accept integral floats written in exponent form (1e6) but nothing fractional.
    try {
      double d = std::stod(s, &pos);
      if (pos == s.size() && d == static_cast<double>(static_cast<int64_t>(d))) return static_cast<int64_t>(d);
    } catch (const std::exception&) {}
  }
  MT_FAIL("[config] {}: {} must be an integer, got '{}'", where, key, scalar_text(n));
}

double parse_float(const YAML::Node& n, const std::string& where, const std::string& key) {
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    size_t pos = 0;
    try {
      double v = std::stod(s, &pos);
      if (pos == s.size()) return v;
    } catch (const std::exception&) {}
  }
  MT_FAIL("[config] {}: {} must be a number, got '{}'", where, key, scalar_text(n));
}

bool parse_bool(const YAML::Node& n, const std::string& where, const std::string& key) {
  if (n.IsScalar()) {
    std::string s = n.Scalar();
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    if (s == "true" || s == "yes" || s == "on") return true;
    if (s == "false" || s == "no" || s == "off") return false;
  }
  MT_FAIL("[config] {}: {} must be true or false, got '{}'", where, key, scalar_text(n));
}

std::string parse_string(const YAML::Node& n, const std::string& where, const std::string& key) {
  if (n.IsNull()) return "";
  MT_CHECK(n.IsScalar(), "[config] {}: {} must be a string, got {}", where, key, scalar_text(n));
  return n.Scalar();
}

std::vector<std::string> parse_list(const YAML::Node& n, const std::string& where, const std::string& key) {
  std::vector<std::string> out;
  if (n.IsNull()) return out;
  if (n.IsScalar()) return {n.Scalar()};  // a single string is a one-element list
  MT_CHECK(n.IsSequence(), "[config] {}: {} must be a list of strings, got {}", where, key, scalar_text(n));
  for (const auto& e : n) {
    MT_CHECK(e.IsScalar(), "[config] {}: {} must hold strings only", where, key);
    out.push_back(e.Scalar());
  }
  return out;
}

template <typename T> KeyType key_type_of();
template <> KeyType key_type_of<int64_t>() { return KeyType::kInt; }
template <> KeyType key_type_of<double>() { return KeyType::kFloat; }
template <> KeyType key_type_of<bool>() { return KeyType::kBool; }
template <> KeyType key_type_of<std::string>() { return KeyType::kString; }
template <> KeyType key_type_of<std::vector<std::string>>() { return KeyType::kStringList; }

template <typename T> T parse_as(const YAML::Node& n, const std::string& where, const std::string& key);
template <> int64_t parse_as(const YAML::Node& n, const std::string& w, const std::string& k) { return parse_int(n, w, k); }
template <> double parse_as(const YAML::Node& n, const std::string& w, const std::string& k) { return parse_float(n, w, k); }
template <> bool parse_as(const YAML::Node& n, const std::string& w, const std::string& k) { return parse_bool(n, w, k); }
template <> std::string parse_as(const YAML::Node& n, const std::string& w, const std::string& k) { return parse_string(n, w, k); }
template <> std::vector<std::string> parse_as(const YAML::Node& n, const std::string& w, const std::string& k) {
  return parse_list(n, w, k);
}

// Shortest decimal text that reads back to the same double.
std::string double_text(double v) { return fmt::format("{}", v); }

void emit_value(YAML::Emitter& e, int64_t v) { e << v; }
void emit_value(YAML::Emitter& e, double v) { e << double_text(v); }
void emit_value(YAML::Emitter& e, bool v) { e << (v ? "true" : "false"); }
void emit_value(YAML::Emitter& e, const std::string& v) { e << YAML::DoubleQuoted << v; }
void emit_value(YAML::Emitter& e, const std::vector<std::string>& v) {
  e << YAML::Flow << YAML::BeginSeq;
  for (const auto& s : v) e << YAML::DoubleQuoted << s;
  e << YAML::EndSeq;
}
std::string show_value(int64_t v) { return std::to_string(v); }
std::string show_value(double v) { return double_text(v); }
std::string show_value(bool v) { return v ? "true" : "false"; }
std::string show_value(const std::string& v) { return v.empty() ? "\"\"" : v; }
std::string show_value(const std::vector<std::string>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + "]";
}

template <typename S, typename T>
Field make_field(const char* section, const char* key, S TrainConfig::*sp, T S::*fp, const char* doc) {
  Field f;
  f.section = section;
  f.key = key;
  f.doc = doc;
  f.type = key_type_of<T>();
  const std::string full = std::string(section) + "." + key;
  f.set = [sp, fp, full](TrainConfig& c, const YAML::Node& n, const std::string& where) {
    (c.*sp).*fp = parse_as<T>(n, where, full);
  };
  f.emit = [sp, fp](const TrainConfig& c, YAML::Emitter& e) { emit_value(e, (c.*sp).*fp); };
  f.show = [sp, fp](const TrainConfig& c) { return show_value((c.*sp).*fp); };
  return f;
}

#define MT_KEY(sec, key, doc) make_field(#sec, #key, &TrainConfig::sec, &decltype(TrainConfig::sec)::key, doc)

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = {
      MT_KEY(model, path, "Hugging Face model directory (config.json, *.safetensors, tokenizer files) to start from"),
      MT_KEY(model, preset, "random initialization from a preset: demo-moe, tiny-moe, tiny-dense, qwen3-30b-a3b, qwen3-0.6b"),
      MT_KEY(model, config, "random initialization from this config.json"),
      MT_KEY(model, num_layers, "override num_hidden_layers (> 0) for few-layer proxies"),
      MT_KEY(model, tokenizer, "tokenizer directory (tokenizer.json, tokenizer_config.json); defaults to model.path"),
      MT_KEY(model, freeze, "parameters to freeze: globs ('*.mlp.gate.weight') or 're:<regex>' matched against internal names"),
      MT_KEY(model, init_method_std, "standard deviation of the random initialization"),
      MT_KEY(model, moe_aux_loss_coeff, "load-balancing loss coefficient (HF router_aux_loss_coef)"),
      MT_KEY(model, moe_z_loss_coeff, "router z-loss coefficient (ST-MoE); 0 disables"),
      MT_KEY(model, moe_aux_loss_type, "global (HF: statistics over all sparse layers) or per_layer (Megatron: per layer, averaged)"),
      MT_KEY(model, ce_chunk_tokens, "tokens per loss-head logits chunk (0: up to 1024 that fit 512 MiB, 2048 in 1 GiB with an f32 lm_head gradient; see docs/config.md)"),
      MT_KEY(data, data_path, "training data: chat/text JSONL files or prepared dataset prefixes"),
      MT_KEY(data, valid_data_path, "held-out data; empty: take the validation split from data_path"),
      MT_KEY(data, split, "Megatron-style train,valid,test weights used when valid_data_path is empty"),
      MT_KEY(data, mock_data, "random token data instead of files (throughput tests)"),
      MT_KEY(data, format, "record format when data_path is JSONL (prepared on the fly): auto, text, chat or preference"),
      MT_KEY(training, objective, "pretrain, sft, dpo or grpo"),
      MT_KEY(training, micro_batch_size, "sequences of seq_length tokens per micro-batch"),
      MT_KEY(training, global_batch_size, "sequences per optimizer step over all ranks (0: micro_batch_size x data parallel)"),
      MT_KEY(training, seq_length, "tokens per packed sequence"),
      MT_KEY(training, train_iters, "optimizer steps to train"),
      MT_KEY(training, seed, "seed of the initialization, data order and every random stream"),
      MT_KEY(training, eval_interval, "validate every N steps (0: only at the end)"),
      MT_KEY(training, eval_iters, "validation micro-batches per evaluation"),
      MT_KEY(training, recompute_granularity, "activation recomputation: none, selective or full"),
      MT_KEY(training, device, "auto, cpu or cuda"),
      MT_KEY(training, bf16, "bf16 compute weights on the GPU (the CPU path computes in f32)"),
      MT_KEY(training, exit_signal_handler, "on SIGTERM/SIGINT save a checkpoint and exit cleanly"),
      MT_KEY(training, exit_interval, "save a checkpoint and exit after a step that is a multiple of N (0: off)"),
      MT_KEY(optimizer, optimizer, "adamw"),
      MT_KEY(optimizer, lr, "peak learning rate"),
      MT_KEY(optimizer, min_lr, "learning-rate floor reached at the end of the decay"),
      MT_KEY(optimizer, lr_warmup_iters, "linear warmup steps from 0 to lr"),
      MT_KEY(optimizer, lr_decay_style, "constant, cosine, linear or wsd (warmup-stable-decay)"),
      MT_KEY(optimizer, lr_decay_iters, "step at which the decay reaches min_lr (0: train_iters)"),
      MT_KEY(optimizer, lr_wsd_decay_iters, "wsd: length of the final decay phase"),
      MT_KEY(optimizer, lr_wsd_decay_style, "wsd: linear, cosine, exponential or minus_sqrt"),
      MT_KEY(optimizer, weight_decay, "decoupled weight decay (not applied to 1-D tensors: norms, biases)"),
      MT_KEY(optimizer, adam_beta1, "AdamW beta1"),
      MT_KEY(optimizer, adam_beta2, "AdamW beta2"),
      MT_KEY(optimizer, adam_eps, "AdamW epsilon"),
      MT_KEY(optimizer, clip_grad, "clip gradients to this global L2 norm (0: off)"),
      MT_KEY(optimizer, no_weight_decay, "extra parameter-name patterns excluded from weight decay"),
      MT_KEY(optimizer, main_grads_dtype, "fp32 or bf16: gradients of matrix weights (attention, router, experts, dense MLP, untied lm_head); norms and the embedding keep fp32"),
      MT_KEY(optimizer, main_params_dtype, "fp32 or bf16: the weights AdamW updates; bf16 with bf16 compute weights means no fp32 master copy"),
      MT_KEY(optimizer, exp_avg_dtype, "fp32 or bf16: AdamW first moment m"),
      MT_KEY(optimizer, exp_avg_sq_dtype, "fp32 or bf16: AdamW second moment v"),
      MT_KEY(optimizer, stochastic_rounding, "main_params_dtype bf16: round each update stochastically (Philox4x32, 7 rounds; reproducible per seed and step); false: round to nearest even"),
      MT_KEY(optimizer, update_in_backward, "apply AdamW to the expert weights as their gradients are formed on a step's last micro-batch (in the dW GEMM's epilogue on Hopper: the gradient is never written or read back); needs clip_grad 0, and a non-finite step then stops the run instead of being skipped"),
      MT_KEY(parallel, tensor_model_parallel_size, "tensor parallelism (1: not supported beyond 1 yet)"),
      MT_KEY(parallel, pipeline_model_parallel_size, "pipeline parallelism (1: not supported beyond 1 yet)"),
      MT_KEY(parallel, expert_model_parallel_size, "experts split over this many ranks"),
      MT_KEY(parallel, context_parallel_size, "context parallelism (1: not supported beyond 1 yet)"),
      MT_KEY(parallel, sequence_parallel, "sequence parallelism (needs tensor parallelism)"),
      MT_KEY(parallel, use_distributed_optimizer, "shard optimizer state over the data-parallel group"),
      MT_KEY(checkpoint, save, "checkpoint directory (\"\": <run_dir>/checkpoints)"),
      MT_KEY(checkpoint, load, "\"\": resume from the latest checkpoint in save if one exists; none: start fresh; or a checkpoint directory or step_N path"),
      MT_KEY(checkpoint, save_interval, "save every N steps (0: only at the end and on SIGTERM/SIGINT)"),
      MT_KEY(checkpoint, keep_last, "keep the newest K checkpoints"),
      MT_KEY(checkpoint, export_hf, "export the final model in Hugging Face format to <run_dir>/hf"),
      MT_KEY(logging, run_dir, "run directory: resolved_config.yaml, metrics.jsonl, TensorBoard events, plot, checkpoints, export"),
      MT_KEY(logging, log_interval, "print a progress line every N steps"),
      MT_KEY(logging, tensorboard, "write TensorBoard event files"),
      MT_KEY(logging, tensorboard_dir, "TensorBoard directory (\"\": <run_dir>/tensorboard)"),
      MT_KEY(logging, plot, "write <run_dir>/training.svg at each validation"),
      MT_KEY(logging, log_expert_load, "per-layer expert load statistics in metrics"),
      MT_KEY(logging, peak_tflops, "device peak TFLOP/s for MFU (0: known GPUs only: H100/H200 989, A100 312)"),
      MT_KEY(dpo, beta, "objective dpo: strength of the implicit KL penalty to the reference model (> 0)"),
      MT_KEY(dpo, loss_type, "objective dpo: sigmoid (DPO, with label_smoothing) or ipo"),
      MT_KEY(dpo, label_smoothing, "objective dpo, sigmoid loss: conservative-DPO label noise in [0, 0.5)"),
      MT_KEY(dpo, reference, "objective dpo: precomputed (one pass of the starting model, stored in <run_dir>/dpo_reference) or online (a frozen copy stays resident)"),
  };
  return fields;
}
#undef MT_KEY

const std::vector<std::string>& section_names() {
  static const std::vector<std::string> s = {"model", "data", "training", "optimizer", "parallel", "checkpoint", "logging", "dpo"};
  return s;
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : schema())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

// The nearest known "section.key" to an unknown one: the same key name in another section wins,
// then the smallest edit distance over keys of the same section, then over all full names.
std::string suggest_key(const std::string& section, const std::string& key) {
  for (const auto& f : schema())
    if (f.key == key) return f.full();
  std::string best;
  int best_d = std::numeric_limits<int>::max();
  const std::string full = section + "." + key;
  for (const auto& f : schema()) {
    int d = f.section == section ? edit_distance(key, f.key) : edit_distance(full, f.full());
    if (d < best_d) best_d = d, best = f.full();
  }
  const int limit = std::max<int>(2, static_cast<int>(key.size()) / 3);
  return best_d <= limit ? best : "";
}

std::string suggest_section(const std::string& s) {
  std::string best;
  int best_d = std::numeric_limits<int>::max();
  for (const auto& n : section_names()) {
    int d = edit_distance(s, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best_d <= std::max<int>(2, static_cast<int>(s.size()) / 3) ? best : "";
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& section, const std::string& key) {
  // A key written at the top level (lr: ...) or in the wrong section.
  std::string hint = suggest_key(section, key);
  MT_FAIL("[config] {}: unknown key '{}{}'{}", where, section.empty() ? "" : section + ".", key,
          hint.empty() ? std::string(" (see docs/config.md for the valid keys)") : fmt::format("; did you mean '{}'?", hint));
}

void apply_node(TrainConfig& c, const YAML::Node& root, const std::string& source) {
  if (root.IsNull()) return;
  MT_CHECK(root.IsMap(), "[config] {}: the top level must be a mapping of sections ({})", source,
           fmt::format("{}", fmt::join(section_names(), ", ")));
  for (const auto& kv : root) {
    const std::string sec = kv.first.as<std::string>();
    const std::string where = where_of(source, kv.first);
    if (std::find(section_names().begin(), section_names().end(), sec) == section_names().end()) {
      if (!kv.second.IsMap()) unknown_key(where, "", sec);  // a bare key at the top level
      std::string hint = suggest_section(sec);
      MT_FAIL("[config] {}: unknown section '{}'{}", where, sec,
              hint.empty() ? fmt::format(" (sections: {})", fmt::join(section_names(), ", "))
                           : fmt::format("; did you mean '{}'?", hint));
    }
    if (kv.second.IsNull()) continue;
    MT_CHECK(kv.second.IsMap(), "[config] {}: section '{}' must be a mapping of keys", where, sec);
    for (const auto& item : kv.second) {
      const std::string key = item.first.as<std::string>();
      const Field* f = find_field(sec, key);
      if (!f) unknown_key(where_of(source, item.first), sec, key);
      f->set(c, item.second, where_of(source, item.second));
    }
  }
}

void check_choice(const std::string& value, std::initializer_list<const char*> choices, const std::string& key,
                  const std::string& source) {
  for (const char* c : choices)
    if (value == c) return;
  std::string list;
  for (const char* c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  MT_FAIL("[config] {}: {} is '{}', expected one of {}", source, key, value, list);
}

}  // namespace

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

TrainConfig TrainConfig::from_yaml_string(const std::string& text, const std::string& source,
                                          const std::vector<std::string>& overrides) {
  TrainConfig c;
  c.source = source;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    MT_FAIL("[config] {} line {}: YAML syntax error: {}", source, e.mark.line + 1, e.msg);
  }
  apply_node(c, root, source);
  for (const auto& o : overrides) c.apply_override(o);
  c.validate();
  return c;
}

TrainConfig TrainConfig::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  MT_CHECK(in.good(), "[config] cannot open config file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_yaml_string(ss.str(), path, overrides);
}

void TrainConfig::apply_override(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  MT_CHECK(eq != std::string::npos && eq > 0, "[config] override '{}' must look like section.key=value (e.g. optimizer.lr=3e-4)",
           assignment);
  const std::string lhs = assignment.substr(0, eq), rhs = assignment.substr(eq + 1);
  const size_t dot = lhs.find('.');
  const std::string where = fmt::format("<override {}>", assignment);
  if (dot == std::string::npos) unknown_key(where, "", lhs);
  const std::string sec = lhs.substr(0, dot), key = lhs.substr(dot + 1);
  const Field* f = find_field(sec, key);
  if (!f) unknown_key(where, sec, key);
  YAML::Node value;
  try {
    value = rhs.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(rhs);
  } catch (const YAML::Exception& e) {
    MT_FAIL("[config] override '{}': cannot parse value '{}': {}", assignment, rhs, e.msg);
  }
  f->set(*this, value, where);
}

void TrainConfig::validate() const {
  const std::string& s = source;
  int sources = !model.path.empty() + !model.preset.empty() + !model.config.empty();
  MT_CHECK(sources == 1, "[config] {}: give exactly one of model.path (HF directory), model.preset or model.config, got {}",
           s, sources);
  MT_CHECK(model.num_layers >= 0, "[config] {}: model.num_layers must be >= 0, got {}", s, model.num_layers);
  MT_CHECK(model.init_method_std > 0, "[config] {}: model.init_method_std must be > 0", s);
  MT_CHECK(model.ce_chunk_tokens >= 0, "[config] {}: model.ce_chunk_tokens is {}, expected >= 0 (0: the default budget)", s,
           model.ce_chunk_tokens);
  MT_CHECK(model.moe_aux_loss_coeff >= 0 && model.moe_z_loss_coeff >= 0,
           "[config] {}: model.moe_aux_loss_coeff and moe_z_loss_coeff must be >= 0", s);
  for (const auto& p : model.freeze) validate_name_pattern(p, "model.freeze");
  for (const auto& p : optimizer.no_weight_decay) validate_name_pattern(p, "optimizer.no_weight_decay");
  MT_CHECK(data.mock_data || !data.data_path.empty(), "[config] {}: data.data_path is empty and data.mock_data is false", s);
  check_choice(model.moe_aux_loss_type, {"global", "per_layer"}, "model.moe_aux_loss_type", s);
  MT_CHECK(training.exit_interval >= 0, "[config] {}: training.exit_interval must be >= 0", s);
  MT_CHECK(logging.peak_tflops >= 0, "[config] {}: logging.peak_tflops must be >= 0", s);
  check_choice(data.format, {"auto", "text", "chat", "preference"}, "data.format", s);
  check_choice(training.objective, {"pretrain", "sft", "dpo", "grpo"}, "training.objective", s);
  check_choice(training.recompute_granularity, {"none", "selective", "full"}, "training.recompute_granularity", s);
  check_choice(training.device, {"auto", "cpu", "cuda"}, "training.device", s);
  MT_CHECK(training.micro_batch_size > 0, "[config] {}: training.micro_batch_size must be > 0, got {}", s, training.micro_batch_size);
  MT_CHECK(training.global_batch_size >= 0, "[config] {}: training.global_batch_size must be >= 0", s);
  MT_CHECK(training.seq_length > 1, "[config] {}: training.seq_length must be > 1, got {}", s, training.seq_length);
  MT_CHECK(training.train_iters > 0, "[config] {}: training.train_iters must be > 0, got {}", s, training.train_iters);
  MT_CHECK(training.eval_interval >= 0 && training.eval_iters >= 0, "[config] {}: training.eval_interval and eval_iters must be >= 0", s);
  check_choice(optimizer.optimizer, {"adamw"}, "optimizer.optimizer", s);
  check_choice(optimizer.lr_decay_style, {"constant", "cosine", "linear", "wsd"}, "optimizer.lr_decay_style", s);
  check_choice(optimizer.lr_wsd_decay_style, {"linear", "cosine", "exponential", "minus_sqrt"}, "optimizer.lr_wsd_decay_style", s);
  MT_CHECK(optimizer.adam_beta1 >= 0 && optimizer.adam_beta1 < 1 && optimizer.adam_beta2 >= 0 && optimizer.adam_beta2 < 1,
           "[config] {}: optimizer.adam_beta1/adam_beta2 must be in [0, 1)", s);
  MT_CHECK(optimizer.adam_eps > 0, "[config] {}: optimizer.adam_eps must be > 0", s);
  check_choice(optimizer.main_grads_dtype, {"fp32", "bf16"}, "optimizer.main_grads_dtype", s);
  check_choice(optimizer.main_params_dtype, {"fp32", "bf16"}, "optimizer.main_params_dtype", s);
  check_choice(optimizer.exp_avg_dtype, {"fp32", "bf16"}, "optimizer.exp_avg_dtype", s);
  check_choice(optimizer.exp_avg_sq_dtype, {"fp32", "bf16"}, "optimizer.exp_avg_sq_dtype", s);
  MT_CHECK(optimizer.weight_decay >= 0 && optimizer.clip_grad >= 0, "[config] {}: optimizer.weight_decay and clip_grad must be >= 0", s);
  MT_CHECK(!optimizer.update_in_backward || optimizer.clip_grad == 0,
           "[config] {}: optimizer.update_in_backward needs optimizer.clip_grad 0 (clipping scales every gradient by a "
           "factor known only after the last one; got clip_grad {})", s, optimizer.clip_grad);
  LrSchedule sched;
  sched.max_lr = optimizer.lr;
  sched.min_lr = optimizer.min_lr;
  sched.warmup_iters = optimizer.lr_warmup_iters;
  sched.decay_iters = decay_iters();
  sched.style = parse_lr_decay_style(optimizer.lr_decay_style);
  sched.wsd_decay_iters = optimizer.lr_wsd_decay_iters;
  sched.wsd_style = parse_wsd_decay_style(optimizer.lr_wsd_decay_style);
  try {
    sched.validate();
  } catch (const Error& e) {
    MT_FAIL("{} (in {})", e.what(), s);
  }
  for (auto [k, v] : {std::pair{"tensor_model_parallel_size", parallel.tensor_model_parallel_size},
                      std::pair{"pipeline_model_parallel_size", parallel.pipeline_model_parallel_size},
                      std::pair{"context_parallel_size", parallel.context_parallel_size}})
    MT_CHECK(v == 1, "[config] {}: parallel.{} = {} is not supported (moetrain uses expert + data parallelism; set 1)", s, k, v);
  MT_CHECK(!parallel.sequence_parallel, "[config] {}: parallel.sequence_parallel needs tensor parallelism, which is not supported", s);
  MT_CHECK(parallel.expert_model_parallel_size >= 1, "[config] {}: parallel.expert_model_parallel_size must be >= 1", s);
  MT_CHECK(checkpoint.save_interval >= 0, "[config] {}: checkpoint.save_interval must be >= 0", s);
  MT_CHECK(checkpoint.keep_last >= 1, "[config] {}: checkpoint.keep_last must be >= 1, got {}", s, checkpoint.keep_last);
  MT_CHECK(!logging.run_dir.empty(), "[config] {}: logging.run_dir must not be empty", s);
  check_choice(dpo.loss_type, {"sigmoid", "ipo"}, "dpo.loss_type", s);
  check_choice(dpo.reference, {"precomputed", "online"}, "dpo.reference", s);
  MT_CHECK(std::isfinite(dpo.beta) && dpo.beta > 0, "[config] {}: dpo.beta must be > 0, got {}", s, dpo.beta);
  MT_CHECK(dpo.label_smoothing >= 0 && dpo.label_smoothing < 0.5, "[config] {}: dpo.label_smoothing must be in [0, 0.5), got {}",
           s, dpo.label_smoothing);
  MT_CHECK(dpo.loss_type == "sigmoid" || dpo.label_smoothing == 0,
           "[config] {}: dpo.label_smoothing applies to loss_type sigmoid only (loss_type is {})", s, dpo.loss_type);
  MT_CHECK(logging.log_interval >= 1, "[config] {}: logging.log_interval must be >= 1", s);
}

int64_t TrainConfig::data_parallel_size(int64_t world_size) const {
  MT_CHECK(world_size >= 1, "[config] world size {} < 1", world_size);
  return world_size;  // EP ranks also take distinct data (experts sharded, dense replicated)
}

int64_t TrainConfig::grad_accum_steps(int64_t world_size) const {
  const int64_t dp = data_parallel_size(world_size);
  const int64_t per_step = training.micro_batch_size * dp;
  const int64_t gbs = training.global_batch_size > 0 ? training.global_batch_size : per_step;
  MT_CHECK(gbs % per_step == 0,
           "[config] {}: training.global_batch_size ({}) must be a multiple of micro_batch_size ({}) x data parallel size ({})",
           source, gbs, training.micro_batch_size, dp);
  return gbs / per_step;
}

std::string TrainConfig::checkpoint_dir() const { return checkpoint.save.empty() ? logging.run_dir + "/checkpoints" : checkpoint.save; }
std::string TrainConfig::tensorboard_dir() const {
  return logging.tensorboard_dir.empty() ? logging.run_dir + "/tensorboard" : logging.tensorboard_dir;
}

std::string TrainConfig::to_yaml() const {
  YAML::Emitter e;
  e << YAML::BeginMap;
  for (const auto& sec : section_names()) {
    e << YAML::Key << sec << YAML::Value << YAML::BeginMap;
    for (const auto& f : schema()) {
      if (f.section != sec) continue;
      e << YAML::Key << f.key << YAML::Value;
      f.emit(*this, e);
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& f : schema()) out.push_back(f.full());
  return out;
}

std::string config_reference_markdown() {
  const TrainConfig defaults;
  std::string md;
  for (const auto& sec : section_names()) {
    md += fmt::format("\n### {}\n\n| key | type | default | meaning |\n|---|---|---|---|\n", sec);
    for (const auto& f : schema())
      if (f.section == sec)
        md += fmt::format("| `{}` | {} | `{}` | {} |\n", f.key, key_type_name(f.type), f.show(defaults), f.doc);
  }
  return md;
}

}  // namespace moetrain
