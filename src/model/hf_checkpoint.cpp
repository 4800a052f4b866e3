// HF checkpoint load (validate everything, then copy in parallel by internal tensor, converting
// bf16/f16/f32 on disk to the params' dtype, staging through host memory for device params)
// and export (per-expert names, sorted within shards, atomic directory).
#include "model/hf_checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

bool loadable_dtype(const SafetensorsEntry& e) {
  return e.dtype_known && (e.dtype == DType::kF32 || e.dtype == DType::kBF16 || e.dtype == DType::kF16);
}

// Layer index of "model.layers.<l>.*", else -1.
int64_t layer_of(const std::string& name) {
  static const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) != 0) return -1;
  size_t i = pre.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Copies one piece from file bytes into its region (contiguous CPU view), converting dtypes and
// undoing a transposed file layout.
void copy_piece(const uint8_t* src, DType sdt, const HfPiece& p, Tensor region) {
  MT_CHECK(region.is_contiguous() && region.device().is_cpu(), "[checkpoint] internal: bad region for {}", p.hf_name);
  const size_t n = static_cast<size_t>(region.numel());
  if (!p.transposed) {
    convert_elements(src, sdt, region.data_ptr(), region.dtype(), n);
    return;
  }
  // File [.., a, b] -> region [.., b, a].
  const size_t es = dtype_size(region.dtype());
  std::vector<uint8_t> tmp(n * es);
  convert_elements(src, sdt, tmp.data(), region.dtype(), n);
  const int64_t a = p.hf_shape[p.hf_shape.size() - 2], b = p.hf_shape.back();
  const int64_t batches = (a > 0 && b > 0) ? static_cast<int64_t>(n) / (a * b) : 0;
  uint8_t* dst = static_cast<uint8_t*>(region.data_ptr());
  for (int64_t k = 0; k < batches; ++k)
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < a; ++j)
        std::memcpy(dst + ((k * b + i) * a + j) * es, tmp.data() + ((k * a + j) * b + i) * es, es);
}

// Runs fn(i) for i in [0, n) on `threads` threads; rethrows the first error.
template <typename Fn>
void parallel_for(size_t n, int threads, Fn&& fn) {
  threads = static_cast<int>(std::min<size_t>(n, static_cast<size_t>(std::max(threads, 1))));
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex mu;
  auto worker = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!err) err = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (err) std::rethrow_exception(err);
}

void load_into(const std::string& dir, ModelParams& params, bool skip_deeper_layers, int threads) {
  const ModelConfig& cfg = params.config;
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open_dir(dir);

  // The pieces expected, with the expert layout detected per layer from the names present.
  std::vector<HfPiece> pieces;
  for (auto& p : hf_weight_map(cfg.with_num_layers(1), ExpertLayout::kPerExpert))
    if (layer_of(p.hf_name) < 0) pieces.push_back(p);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".mlp.experts.";
    const bool fused = ck.contains(pre + "gate_up_proj") || ck.contains(pre + "down_proj");
    for (auto p : hf_layer_pieces(cfg, l, fused ? ExpertLayout::kFused : ExpertLayout::kPerExpert)) {
      if (fused && p.hf_shape.size() == 3 && ck.contains(p.hf_name)) {
        // transformers keeps [E, 2I, H] / [E, H, I]; some tools write the last two dims swapped.
        Shape swapped = p.hf_shape;
        std::swap(swapped[1], swapped[2]);
        if (ck.entry(p.hf_name).shape == swapped && swapped != p.hf_shape) {
          p.hf_shape = swapped;
          p.transposed = true;
        }
      }
      pieces.push_back(p);
    }
  }

  // Check everything before writing anything.
  std::vector<std::string> problems;
  std::set<std::string> used;
  for (const auto& p : pieces) {
    if (!ck.contains(p.hf_name)) {
      problems.push_back(fmt::format("missing tensor '{}' (expected shape {})", p.hf_name, shape_str(p.hf_shape)));
      continue;
    }
    used.insert(p.hf_name);
    const SafetensorsEntry& e = ck.entry(p.hf_name);
    const std::string file = fs::path(ck.file_of(p.hf_name).path()).filename().string();
    if (e.shape != p.hf_shape)
      problems.push_back(fmt::format("tensor '{}' in {} has shape {}, expected {}", p.hf_name, file,
                                     shape_str(e.shape), shape_str(p.hf_shape)));
    else if (!loadable_dtype(e))
      problems.push_back(fmt::format("tensor '{}' in {} has dtype {}, expected BF16, F16 or F32", p.hf_name, file,
                                     e.dtype_name));
  }
  for (const auto& name : ck.names()) {
    if (used.count(name)) continue;
    const int64_t l = layer_of(name);
    if (skip_deeper_layers && l >= cfg.num_hidden_layers) continue;
    if (ends_with(name, "rotary_emb.inv_freq")) continue;  // a buffer old exports carried
    if (name == "lm_head.weight" && cfg.tie_word_embeddings) {
      MT_LOG_WARN("[checkpoint] {}: ignoring lm_head.weight: the config ties it to the embedding", dir);
      continue;
    }
    problems.push_back(fmt::format("unexpected tensor '{}' in {}", name,
                                   fs::path(ck.file_of(name).path()).filename().string()));
  }
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size() && i < 5; ++i) msg += (i ? "; " : "") + problems[i];
    if (problems.size() > 5) msg += fmt::format("; and {} more", problems.size() - 5);
    MT_FAIL("[checkpoint] {} does not match its config ({} problem{}): {}", dir, problems.size(),
            problems.size() == 1 ? "" : "s", msg);
  }

  // Copy, one task per internal tensor.
  std::map<std::string, Tensor> targets;
  params.for_each([&](const std::string& n, Tensor& t) { targets[n] = t; });
  std::map<std::string, std::vector<const HfPiece*>> by_target;
  for (const auto& p : pieces) by_target[p.internal_name].push_back(&p);
  std::vector<std::pair<Tensor, std::vector<const HfPiece*>>> tasks;
  for (auto& [name, ps] : by_target) {
    auto it = targets.find(name);
    MT_CHECK(it != targets.end(), "[checkpoint] internal: no parameter named {}", name);
    tasks.push_back({it->second, ps});
  }
  parallel_for(tasks.size(), threads > 0 ? threads : env_num_threads(), [&](size_t i) {
    Tensor dst = tasks[i].first;
    const bool direct = dst.device().is_cpu() && dst.is_contiguous();
    Tensor host = direct ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
    for (const HfPiece* p : tasks[i].second) {
      const SafetensorsFile& f = ck.file_of(p->hf_name);
      const SafetensorsEntry& e = *f.find(p->hf_name);
      copy_piece(f.data(e), e.dtype, *p, piece_region(host, *p));
    }
    if (!direct) dst.copy_from(host);
  });
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    default: MT_FAIL("[export] dtype {} is not an export dtype (bf16, f16 or f32)", dtype_name(t));
  }
}

}  // namespace

ModelConfig load_hf_config(const std::string& dir, const LoadOptions& opt) {
  ModelConfig cfg = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  if (opt.num_layers > 0) {
    MT_CHECK(opt.num_layers <= cfg.num_hidden_layers, "[checkpoint] {}: asked for {} layers but config.json has {}",
             dir, opt.num_layers, cfg.num_hidden_layers);
    cfg = cfg.with_num_layers(opt.num_layers);
  }
  return cfg;
}

ModelParams load_hf_checkpoint(const std::string& dir, DType dtype, Device device, const LoadOptions& opt) {
  ModelConfig cfg = load_hf_config(dir, opt);
  ModelParams p = ModelParams::allocate(cfg, dtype, device);
  load_into(dir, p, opt.num_layers > 0, opt.threads);
  return p;
}

void load_hf_weights(const std::string& dir, ModelParams& params, const LoadOptions& opt) {
  load_into(dir, params, true, opt.threads);
}

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> files = {
      "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
      "added_tokens.json", "chat_template.jinja", "chat_template.json"};
  return files;
}

void export_hf_checkpoint(const ModelParams& params, const std::string& out_dir, const ExportOptions& opt) {
  const ModelConfig& cfg = params.config;
  cfg.validate("params.config");
  const char* tdt = torch_dtype_name(opt.dtype);
  if (!opt.tokenizer_dir.empty())
    MT_CHECK(fs::is_regular_file(fs::path(opt.tokenizer_dir) / "tokenizer.json") ||
             fs::is_regular_file(fs::path(opt.tokenizer_dir) / "vocab.json"),
             "[export] tokenizer directory {} has no tokenizer.json (or vocab.json)", opt.tokenizer_dir);

  std::map<std::string, Tensor> internal;
  params.for_each([&](const std::string& n, const Tensor& t) { internal[n] = t; });
  std::vector<TensorWriteSpec> specs;
  for (const auto& p : hf_weight_map(cfg, opt.expert_layout)) {
    auto it = internal.find(p.internal_name);
    MT_CHECK(it != internal.end() && it->second.defined(), "[export] parameter {} is missing", p.internal_name);
    specs.push_back(tensor_write_spec(p.hf_name, piece_region(it->second, p), opt.dtype));
  }

  AtomicDir out(out_dir, opt.overwrite);
  ShardOptions so;
  so.max_shard_bytes = opt.max_shard_bytes;
  so.threads = opt.threads;
  write_safetensors_sharded(out.tmp_dir(), specs, so);

  nlohmann::json cj = cfg.to_json();
  cj["torch_dtype"] = tdt;
  cj["dtype"] = tdt;
  write_text_file(out.path("config.json"), cj.dump(2) + "\n");
  bool have_gen = false;
  if (!opt.source_dir.empty())
    have_gen = !copy_files_if_present(opt.source_dir, out.tmp_dir(), {"generation_config.json"}).empty();
  if (!have_gen) {
    nlohmann::json g = {{"_from_model_config", true}};
    if (cfg.bos_token_id >= 0) g["bos_token_id"] = cfg.bos_token_id;
    if (cfg.eos_token_id >= 0) g["eos_token_id"] = cfg.eos_token_id;
    write_text_file(out.path("generation_config.json"), g.dump(2) + "\n");
  }
  if (!opt.tokenizer_dir.empty()) copy_files_if_present(opt.tokenizer_dir, out.tmp_dir(), hf_tokenizer_files());
  out.commit();
  MT_LOG_INFO("[export] wrote {} ({} tensors, {})", out_dir, specs.size(), tdt);
}

}  // namespace moetrain
