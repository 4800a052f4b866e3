// TrainConfig: the YAML run configuration (sections model, data, training, optimizer, parallel,
// checkpoint, logging, dpo) with Megatron/Primus key names where one exists. Every key is declared
// once in a schema table (config.cpp) that drives parsing, type checks, nearest-key suggestions
// for unknown keys, command-line overrides (section.key=value), the resolved YAML and the docs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moetrain {

struct ModelSection {
  std::string path;       // HF directory: config.json, *.safetensors, tokenizer files
  std::string preset;     // random init from a preset (tiny-moe, qwen3-30b-a3b, ...)
  std::string config;     // random init from a config.json
  int64_t num_layers = 0; // overrides num_hidden_layers when > 0 (proxies)
  std::string tokenizer;  // tokenizer directory; defaults to path
  std::vector<std::string> freeze;  // parameter-name patterns (glob, or re:regex)
  double init_method_std = 0.02;
  double moe_aux_loss_coeff = 0.001;
  double moe_z_loss_coeff = 0.0;
  std::string moe_aux_loss_type = "global";  // global (HF) | per_layer (Megatron)
  // loss-head tokens per logits chunk; 0: up to 1024 that fit 512 MiB (2048 in 1 GiB with an f32 lm_head gradient)
  int64_t ce_chunk_tokens = 0;
};

struct DataSection {
  std::vector<std::string> data_path;        // JSONL files or prepared dataset prefixes
  std::vector<std::string> valid_data_path;  // held-out data; empty: split from data_path
  std::string split = "98,2,0";              // Megatron train,valid,test weights
  bool mock_data = false;                    // random tokens, no files
  std::string format = "auto";               // auto|text|chat|preference (JSONL inputs)
};

struct TrainingSection {
  std::string objective = "sft";  // pretrain|sft|dpo|grpo
  int64_t micro_batch_size = 1;   // sequences (packed rows of seq_length tokens) per micro-batch
  int64_t global_batch_size = 0;  // sequences per optimizer step (0: micro_batch_size * dp)
  int64_t seq_length = 4096;
  int64_t train_iters = 100;
  int64_t seed = 1234;
  int64_t eval_interval = 100;    // 0: only at the end
  int64_t eval_iters = 10;
  std::string recompute_granularity = "none";  // none|selective|full
  std::string device = "auto";    // auto|cpu|cuda
  bool bf16 = true;               // bf16 compute weights on GPU (the CPU path is f32)
  bool exit_signal_handler = true;
  int64_t exit_interval = 0;      // > 0: save and exit after a step that is a multiple of it
};

struct OptimizerSection {
  std::string optimizer = "adamw";
  double lr = 1e-5;
  double min_lr = 0.0;
  int64_t lr_warmup_iters = 0;
  std::string lr_decay_style = "cosine";  // constant|cosine|linear|wsd
  int64_t lr_decay_iters = 0;             // 0: train_iters
  int64_t lr_wsd_decay_iters = 0;
  std::string lr_wsd_decay_style = "linear";
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;                 // 0: off
  std::vector<std::string> no_weight_decay;  // patterns, besides 1-D tensors
  // Precision (Megatron's precision-aware optimizer names; docs/design/precision.md): fp32|bf16.
  std::string main_grads_dtype = "fp32";   // gradients of matrix weights
  std::string main_params_dtype = "fp32";  // the weights AdamW updates (bf16: no fp32 master)
  std::string exp_avg_dtype = "fp32";
  std::string exp_avg_sq_dtype = "fp32";
  bool stochastic_rounding = true;         // bf16 main params: stochastic vs nearest-even rounding
  // Expert weights updated as their gradients are formed on a step's last micro-batch (needs
  // clip_grad 0; docs/design/kernels.md "AdamW in the dW epilogue").
  bool update_in_backward = false;
};

struct ParallelSection {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = true;
};

struct CheckpointSection {
  std::string save;        // checkpoint directory ("" : <run_dir>/checkpoints)
  std::string load;        // "" : resume from save's latest if any; "none"; or a path
  int64_t save_interval = 0;  // 0: only at the end (and on SIGTERM/SIGINT)
  int64_t keep_last = 3;
  bool export_hf = true;   // HF export of the final model into <run_dir>/hf
};

struct LoggingSection {
  std::string run_dir = "runs/run";
  int64_t log_interval = 1;
  bool tensorboard = true;
  std::string tensorboard_dir;  // "" : <run_dir>/tensorboard
  bool plot = true;             // <run_dir>/training.svg, refreshed at each validation
  bool log_expert_load = true;
  double peak_tflops = 0.0;     // device peak for MFU; 0: known GPUs only (H100/H200 989, A100 312)
};

struct DpoSection {  // objective dpo only (docs/dpo.md)
  double beta = 0.1;                   // strength of the implicit KL to the reference
  std::string loss_type = "sigmoid";   // sigmoid|ipo
  double label_smoothing = 0.0;        // sigmoid only, [0, 0.5)
  std::string reference = "precomputed";  // precomputed|online
};

struct TrainConfig {
  ModelSection model;
  DataSection data;
  TrainingSection training;
  OptimizerSection optimizer;
  ParallelSection parallel;
  CheckpointSection checkpoint;
  LoggingSection logging;
  DpoSection dpo;
  std::string source;  // the YAML file it came from (for messages)

  // Parses `path`, then applies overrides "section.key=value" (value in YAML syntax: 3e-4, true,
  // [a, b]) in order, then validates. Unknown keys, wrong types and bad values throw an Error
  // naming the file, line and key, with the nearest valid key when one is close.
  static TrainConfig load(const std::string& path, const std::vector<std::string>& overrides = {});
  static TrainConfig from_yaml_string(const std::string& text, const std::string& source,
                                      const std::vector<std::string>& overrides = {});
  void apply_override(const std::string& assignment);
  void validate() const;

  std::string to_yaml() const;  // every key, resolved (defaults filled in)

  // Derived values.
  int64_t data_parallel_size(int64_t world_size) const;
  int64_t grad_accum_steps(int64_t world_size) const;
  int64_t decay_iters() const { return optimizer.lr_decay_iters > 0 ? optimizer.lr_decay_iters : training.train_iters; }
  std::string checkpoint_dir() const;
  std::string tensorboard_dir() const;
};

// All keys as "section.key" (for docs and tests) and a Markdown reference table.
std::vector<std::string> config_keys();
std::string config_reference_markdown();

// Damerau-Levenshtein (optimal string alignment) distance, used for "did you mean" suggestions.
int edit_distance(const std::string& a, const std::string& b);

}  // namespace moetrain
