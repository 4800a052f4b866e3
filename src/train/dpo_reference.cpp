// Reference log-prob store (see dpo_reference.h). Hashes are a 64-bit multiply-xorshift mix over
// 8-byte words (not cryptographic: they detect changed inputs, not adversaries). The file is a
// plain safetensors file written through path.tmp + rename, readable by `safetensors` in Python.
#include "train/dpo_reference.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/check.h"
#include "core/log.h"
#include "data/indexed_dataset.h"
#include "io/atomic_dir.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/qwen3_model.h"
#include "train/dpo_batch.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

class Hasher {
 public:
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n - i) << 56));
    mix(static_cast<uint64_t>(n));
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void u64(uint64_t v) { mix(v); }
  // Whole file, streamed.
  void file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    MT_CHECK(f.good(), "[dpo] cannot read {} to fingerprint it", path);
    std::vector<char> buf(1 << 22);
    uint64_t total = 0;
    while (f) {
      f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const size_t got = static_cast<size_t>(f.gcount());
      if (got == 0) break;
      bytes(buf.data(), got);
      total += got;
    }
    mix(total);
  }
  std::string hex() const {
    uint64_t x = h_;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
    return fmt::format("{:016x}", x);
  }

 private:
  void mix(uint64_t w) {
    w *= 0x87c37b91114253d5ull;
    w = (w << 31) | (w >> 33);
    w *= 0x4cf5ad432745937full;
    h_ ^= w;
    h_ = ((h_ << 27) | (h_ >> 37)) * 5 + 0x52dce729;
  }
  uint64_t h_ = 0x6a09e667f3bcc908ull;
};

std::string read_range(const std::string& path, uint64_t begin, uint64_t n) {
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "[dpo] cannot read {}", path);
  f.seekg(static_cast<std::streamoff>(begin));
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(f.gcount()));
  return s;
}

}  // namespace

std::string dataset_fingerprint(const std::string& prefix) {
  Hasher h;
  h.str("moetrain dpo dataset v1");
  for (const std::string& p : {prefix, mask_prefix(prefix)}) {
    h.file(idx_path(p));
    h.file(bin_path(p));
  }
  return h.hex();
}

std::string hf_checkpoint_fingerprint(const std::string& dir) {
  Hasher h;
  h.str("moetrain hf checkpoint v1");
  h.file(dir + "/config.json");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  MT_CHECK(!files.empty(), "[dpo] {} holds no *.safetensors file to fingerprint", dir);
  constexpr uint64_t kChunk = 64 << 10;
  for (const fs::path& p : files) {
    const uint64_t size = fs::file_size(p);
    h.str(p.filename().string());
    h.u64(size);
    const std::string head = read_range(p.string(), 0, 8);
    uint64_t n = 0;
    if (head.size() == 8) std::memcpy(&n, head.data(), 8);
    n = std::min<uint64_t>(n, size);
    h.str(read_range(p.string(), 0, 8 + n));  // the JSON header
    for (uint64_t at : {uint64_t{8} + n, (size > kChunk ? (size - kChunk) / 2 : 0), size > kChunk ? size - kChunk : 0})
      h.str(read_range(p.string(), at, kChunk));
  }
  return h.hex();
}

std::string params_fingerprint(const ModelParams& p) {
  Hasher h;
  h.str("moetrain params v1");
  h.str(p.config.to_json().dump());
  p.for_each([&](const std::string& name, const Tensor& t) {
    h.str(name);
    const Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
    h.u64(static_cast<uint64_t>(c.dtype()));
    h.bytes(c.data_ptr(), c.nbytes());
  });
  return h.hex();
}

std::string reference_model_fingerprint(const TrainConfig& cfg) {
  Hasher h;
  h.str("moetrain reference model v1");
  if (!cfg.model.path.empty()) {
    h.str("hf");
    h.str(hf_checkpoint_fingerprint(cfg.model.path));
  } else {
    const ModelConfig mc = !cfg.model.preset.empty() ? ModelConfig::preset(cfg.model.preset)
                                                     : ModelConfig::from_file(cfg.model.config);
    h.str("random");
    h.str(mc.to_json().dump());
    h.u64(static_cast<uint64_t>(cfg.training.seed));
    h.str(fmt::format("{:.17g}", cfg.model.init_method_std));
  }
  h.u64(static_cast<uint64_t>(cfg.model.num_layers));
  return h.hex();
}

void save_reference_logps(const std::string& path, const ReferenceLogps& r) {
  MT_CHECK(r.chosen.size() == r.rejected.size(), "[dpo] {} chosen and {} rejected reference log-probs",
           r.chosen.size(), r.rejected.size());
  const uint64_t n = r.chosen.size(), bytes = 8 * n;
  nlohmann::json hdr;
  hdr["__metadata__"] = {{"format", "moetrain-dpo-reference"}, {"version", "1"}, {"pairs", std::to_string(n)},
                         {"data_fingerprint", r.data_fingerprint}, {"model_fingerprint", r.model_fingerprint}};
  hdr["chosen"] = {{"dtype", "F64"}, {"shape", {n}}, {"data_offsets", {0, bytes}}};
  hdr["rejected"] = {{"dtype", "F64"}, {"shape", {n}}, {"data_offsets", {bytes, 2 * bytes}}};
  std::string js = hdr.dump();
  js.resize((js.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  const uint64_t hn = js.size();
  std::memcpy(out.data(), &hn, 8);  // little-endian hosts only (x86-64, aarch64)
  out += js;
  out.append(reinterpret_cast<const char*>(r.chosen.data()), bytes);
  out.append(reinterpret_cast<const char*>(r.rejected.data()), bytes);
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  write_text_file(path, out);
}

std::optional<ReferenceLogps> load_reference_logps(const std::string& path, const std::string& data_fingerprint,
                                                   const std::string& model_fingerprint) {
  if (!fs::exists(path)) return std::nullopt;
  auto f = SafetensorsFile::open(path);
  const auto& md = f->metadata();
  auto meta = [&](const char* k) {
    auto it = md.find(k);
    return it == md.end() ? std::string() : it->second;
  };
  MT_CHECK(meta("format") == "moetrain-dpo-reference", "[dpo] {} is not a DPO reference log-prob file", path);
  if (meta("data_fingerprint") != data_fingerprint) {
    MT_LOG_INFO("[dpo] {} was computed for other data (fingerprint {} != {}); recomputing", path,
                meta("data_fingerprint"), data_fingerprint);
    return std::nullopt;
  }
  if (meta("model_fingerprint") != model_fingerprint) {
    MT_LOG_INFO("[dpo] {} was computed with another reference model (fingerprint {} != {}); recomputing", path,
                meta("model_fingerprint"), model_fingerprint);
    return std::nullopt;
  }
  ReferenceLogps r;
  r.data_fingerprint = data_fingerprint;
  r.model_fingerprint = model_fingerprint;
  for (const char* name : {"chosen", "rejected"}) {
    const SafetensorsEntry* e = f->find(name);
    MT_CHECK(e && e->dtype_name == "F64" && e->shape.size() == 1, "[dpo] {}: tensor '{}' missing or not F64 [pairs]",
             path, name);
    std::vector<double>& v = std::string(name) == "chosen" ? r.chosen : r.rejected;
    v.resize(static_cast<size_t>(e->shape[0]));
    std::memcpy(v.data(), f->data(*e), v.size() * 8);
  }
  MT_CHECK(r.chosen.size() == r.rejected.size(), "[dpo] {}: chosen and rejected differ in length", path);
  return r;
}

ReferenceLogps compute_reference_logps(Context& ctx, Qwen3Model& model, const PreferenceDataset& data,
                                       int64_t max_tokens, Device device) {
  ReferenceLogps r;
  const int64_t n = data.size();
  r.chosen.resize(static_cast<size_t>(n));
  r.rejected.resize(static_cast<size_t>(n));
  std::vector<PreferencePair> pairs;
  std::vector<int64_t> ids;
  int64_t tokens = 0;
  auto flush = [&]() {
    if (pairs.empty()) return;
    PairBatch pb = make_pair_batch(pairs, ids, device);
    const std::vector<double> lp = sequence_logps(model.token_logprobs(ctx, pb.batch), pb.cu_seqlens);
    for (size_t i = 0; i < ids.size(); ++i) {
      r.chosen[ids[i]] = lp[2 * i];
      r.rejected[ids[i]] = lp[2 * i + 1];
    }
    pairs.clear(), ids.clear(), tokens = 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    PreferencePair p = data.get(i);
    const int64_t len = static_cast<int64_t>(p.chosen.size() + p.rejected.size());
    if (!pairs.empty() && tokens + len > max_tokens) flush();
    tokens += len;
    pairs.push_back(std::move(p));
    ids.push_back(i);
  }
  flush();
  return r;
}

ReferenceLogps ensure_reference_logps(Context& ctx, Qwen3Model& model, const std::string& prefix,
                                      const std::string& model_fingerprint, const std::string& path,
                                      int64_t max_tokens, Device device, std::string data_fingerprint) {
  if (data_fingerprint.empty()) data_fingerprint = dataset_fingerprint(prefix);
  if (auto r = load_reference_logps(path, data_fingerprint, model_fingerprint)) {
    MT_LOG_INFO("[dpo] reusing reference log-probs of {} pairs from {}", r->size(), path);
    return *r;
  }
  PreferenceDataset data(prefix);
  MT_LOG_INFO("[dpo] computing reference log-probs of {} pairs ({}) with the starting model", data.size(), prefix);
  ReferenceLogps r = compute_reference_logps(ctx, model, data, max_tokens, device);
  r.data_fingerprint = data_fingerprint;
  r.model_fingerprint = model_fingerprint;
  save_reference_logps(path, r);
  MT_LOG_INFO("[dpo] reference log-probs saved to {}", path);
  return r;
}

}  // namespace moetrain
