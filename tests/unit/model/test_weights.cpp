// HF checkpoint load/export tests against files written by transformers 5.x
// (tests/reference/fixtures/model/*): element-exact load with independent index math, both
// expert layouts (and the transposed fused form) load identically, export reproduces the
// transformers file byte for byte, init -> export -> load round trips, and bad inputs fail
// with one error naming the file and tensor while leaving params and output untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kCases = {"dense", "moe_untied", "moe_tied_nonorm", "moe_sparse_step"};
std::string fixture_dir(const std::string& c) {
  return std::string(MT_SOURCE_DIR) + "/tests/reference/fixtures/model/" + c;
}

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::path(testing::TempDir()) / ("mt_w_" + std::to_string(::getpid()) + "_" +
                                            testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (fs::path(path) / f).string(); }
};

template <typename Fn>
void expect_error(Fn&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::map<std::string, Tensor> named(const ModelParams& p) {
  std::map<std::string, Tensor> m;
  p.for_each([&](const std::string& n, const Tensor& t) { m[n] = t; });
  return m;
}

// Bitwise equality of every parameter (same names, shapes, dtypes, bytes).
void expect_same_params(const ModelParams& a, const ModelParams& b) {
  auto ma = named(a), mb = named(b);
  ASSERT_EQ(ma.size(), mb.size());
  for (auto& [n, t] : ma) {
    ASSERT_TRUE(mb.count(n)) << n;
    const Tensor& u = mb[n];
    ASSERT_EQ(t.shape(), u.shape()) << n;
    ASSERT_EQ(t.dtype(), u.dtype()) << n;
    EXPECT_EQ(std::memcmp(t.contiguous().data_ptr(), u.contiguous().data_ptr(), t.nbytes()), 0) << n;
  }
}

// Writes a copy of checkpoint `src` into `dst` with tensors edited by `edit` (name -> tensors to
// write in its place; empty vector drops it). Uses only the safetensors layer.
using Edit = std::function<std::vector<std::pair<std::string, Tensor>>(const std::string&, const Tensor&)>;
void rewrite_checkpoint(const std::string& src, const std::string& dst, const Edit& edit, uint64_t shard = 0) {
  fs::create_directories(dst);
  fs::copy_file(fs::path(src) / "config.json", fs::path(dst) / "config.json", fs::copy_options::overwrite_existing);
  auto ck = SafetensorsCheckpoint::open_dir(src);
  std::vector<TensorWriteSpec> specs;
  for (const auto& n : ck.names())
    for (auto& [nn, t] : edit(n, ck.tensor(n))) specs.push_back(tensor_write_spec(nn, t));
  ShardOptions so;
  if (shard) so.max_shard_bytes = shard;
  write_safetensors_sharded(dst, specs, so);
}

}  // namespace

TEST(Weights, LoadsTransformersFilesElementExact) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c);
    auto p = load_hf_checkpoint(fixture_dir(c), DType::kF32, Device::cpu());
    auto file = SafetensorsCheckpoint::open_dir(fixture_dir(c));
    const auto& cfg = p.config;
    const int64_t H = cfg.hidden_size;
    auto at = [&](const std::string& n, int64_t i) { return file.tensor(n).get(i); };
    for (int64_t i = 0; i < p.embed.numel(); i += 7) ASSERT_EQ(p.embed.get(i), at("model.embed_tokens.weight", i));
    if (cfg.tie_word_embeddings) {
      EXPECT_EQ(p.lm_head.data_ptr(), p.embed.data_ptr());
    } else {
      for (int64_t i = 0; i < p.lm_head.numel(); i += 5) ASSERT_EQ(p.lm_head.get(i), at("lm_head.weight", i));
    }
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      const auto& L = p.layers[l];
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      for (int64_t i = 0; i < L.q_proj.numel(); ++i) ASSERT_EQ(L.q_proj.get(i), at(pre + "self_attn.q_proj.weight", i));
      for (int64_t i = 0; i < L.o_proj.numel(); ++i) ASSERT_EQ(L.o_proj.get(i), at(pre + "self_attn.o_proj.weight", i));
      for (int64_t i = 0; i < L.k_norm.numel(); ++i) ASSERT_EQ(L.k_norm.get(i), at(pre + "self_attn.k_norm.weight", i));
      if (L.sparse) {
        const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size;
        for (int64_t i = 0; i < L.router.numel(); ++i) ASSERT_EQ(L.router.get(i), at(pre + "mlp.gate.weight", i));
        for (int64_t e = 0; e < E; ++e) {
          const std::string ep = pre + "mlp.experts." + std::to_string(e) + ".";
          for (int64_t r = 0; r < I; ++r)
            for (int64_t k = 0; k < H; ++k) {
              ASSERT_EQ(L.experts_gate_up.get((e * 2 * I + r) * H + k), at(ep + "gate_proj.weight", r * H + k));
              ASSERT_EQ(L.experts_gate_up.get((e * 2 * I + I + r) * H + k), at(ep + "up_proj.weight", r * H + k));
            }
          for (int64_t i = 0; i < H * I; ++i)
            ASSERT_EQ(L.experts_down.get(e * H * I + i), at(ep + "down_proj.weight", i));
        }
      } else {
        const int64_t I = cfg.intermediate_size;
        for (int64_t i = 0; i < I * H; ++i) {
          ASSERT_EQ(L.mlp_gate_up.get(i), at(pre + "mlp.gate_proj.weight", i));
          ASSERT_EQ(L.mlp_gate_up.get(I * H + i), at(pre + "mlp.up_proj.weight", i));
        }
        for (int64_t i = 0; i < H * I; ++i) ASSERT_EQ(L.mlp_down.get(i), at(pre + "mlp.down_proj.weight", i));
      }
    }
  }
}

TEST(Weights, FusedAndTransposedExpertLayoutsLoadIdentically) {
  TempDir d;
  for (const char* c : {"moe_untied", "moe_sparse_step"}) {
    SCOPED_TRACE(c);
    auto ref = load_hf_checkpoint(fixture_dir(c), DType::kF32, Device::cpu());
    const auto& cfg = ref.config;
    const int64_t E = cfg.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
    auto src = SafetensorsCheckpoint::open_dir(fixture_dir(c));
    for (bool transposed : {false, true}) {
      // Build the fused tensors by hand from the per-expert ones.
      const std::string out = d / (std::string(c) + (transposed ? "_t" : "_f"));
      rewrite_checkpoint(fixture_dir(c), out, [&](const std::string& n, const Tensor& t)
                                                  -> std::vector<std::pair<std::string, Tensor>> {
        auto pos = n.find(".mlp.experts.");
        if (pos == std::string::npos) return {{n, t}};
        if (n.find(".mlp.experts.0.gate_proj.weight") == std::string::npos) return {};
        const std::string pre = n.substr(0, pos) + ".mlp.experts.";
        Tensor gu = transposed ? Tensor::empty({E, H, 2 * I}, DType::kF32) : Tensor::empty({E, 2 * I, H}, DType::kF32);
        Tensor dn = transposed ? Tensor::empty({E, I, H}, DType::kF32) : Tensor::empty({E, H, I}, DType::kF32);
        for (int64_t e = 0; e < E; ++e) {
          const std::string ep = pre + std::to_string(e) + ".";
          Tensor g = src.tensor(ep + "gate_proj.weight"), u = src.tensor(ep + "up_proj.weight");
          Tensor w = src.tensor(ep + "down_proj.weight");
          for (int64_t r = 0; r < I; ++r)
            for (int64_t k = 0; k < H; ++k) {
              gu.set(transposed ? (e * H + k) * 2 * I + r : (e * 2 * I + r) * H + k, g.get(r * H + k));
              gu.set(transposed ? (e * H + k) * 2 * I + I + r : (e * 2 * I + I + r) * H + k, u.get(r * H + k));
              dn.set(transposed ? (e * I + r) * H + k : (e * H + k) * I + r, w.get(k * I + r));
            }
        }
        return {{pre + "gate_up_proj", gu}, {pre + "down_proj", dn}};
      });
      auto got = load_hf_checkpoint(out, DType::kF32, Device::cpu());
      expect_same_params(ref, got);
    }
  }
}

TEST(Weights, ExportReproducesTransformersFileByteForByte) {
  TempDir d;
  for (const auto& c : kCases) {
    auto p = load_hf_checkpoint(fixture_dir(c), DType::kF32, Device::cpu());
    ExportOptions o;
    o.dtype = DType::kF32;
    o.source_dir = fixture_dir(c);
    export_hf_checkpoint(p, d / c, o);
    EXPECT_TRUE(read_bytes(d / (c + "/model.safetensors")) == read_bytes(fixture_dir(c) + "/model.safetensors")) << c;
    // config.json keeps the architecture and every field the loader reads.
    auto cj = nlohmann::json::parse(read_bytes(d / (c + "/config.json")));
    EXPECT_EQ(cj["architectures"][0], p.config.is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM");
    EXPECT_EQ(cj["torch_dtype"], "float32");
    EXPECT_EQ(ModelConfig::from_json(cj, c).to_json(), p.config.to_json());
    EXPECT_TRUE(fs::exists(d / (c + "/generation_config.json")));
  }
}

TEST(Weights, InitExportLoadRoundTrip) {
  TempDir d;
  for (const char* preset : {"tiny-moe", "tiny-dense"}) {
    SCOPED_TRACE(preset);
    auto cfg = ModelConfig::preset(preset).with_num_layers(3);
    cfg.mlp_only_layers = cfg.is_moe() ? std::vector<int64_t>{1} : std::vector<int64_t>{};
    auto p = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
    init_params_random(p, 42);
    // f32, sharded into many files, per-expert names.
    ExportOptions o;
    o.dtype = DType::kF32;
    o.max_shard_bytes = 40000;
    const std::string a = d / (std::string(preset) + "_f32");
    export_hf_checkpoint(p, a, o);
    EXPECT_TRUE(fs::exists(a + "/model.safetensors.index.json"));
    auto back = load_hf_checkpoint(a, DType::kF32, Device::cpu());
    expect_same_params(p, back);
    // fused layout on disk.
    o.expert_layout = ExpertLayout::kFused;
    const std::string f = d / (std::string(preset) + "_fused");
    export_hf_checkpoint(p, f, o);
    expect_same_params(p, load_hf_checkpoint(f, DType::kF32, Device::cpu()));
    // bf16 (the default) equals the f32 values rounded to bf16; loading into bf16 is exact.
    const std::string b = d / (std::string(preset) + "_bf16");
    export_hf_checkpoint(p, b);
    auto ck = SafetensorsCheckpoint::open_dir(b);
    EXPECT_EQ(ck.entry("model.embed_tokens.weight").dtype, DType::kBF16);
    EXPECT_EQ(nlohmann::json::parse(read_bytes(b + "/config.json"))["torch_dtype"], "bfloat16");
    auto pb = ModelParams::allocate(cfg, DType::kBF16, Device::cpu());
    init_params_random(pb, 42);
    expect_same_params(pb, load_hf_checkpoint(b, DType::kBF16, Device::cpu()));
    auto pf = load_hf_checkpoint(b, DType::kF32, Device::cpu());
    auto mp = named(p), mf = named(pf);
    for (auto& [n, t] : mp)
      for (int64_t i = 0; i < t.numel(); i += 3)
        ASSERT_EQ(mf[n].get(i), bf16_to_float(float_to_bf16(static_cast<float>(t.get(i))))) << n;
  }
}

TEST(Weights, DepthProxyLoadsFirstLayers) {
  auto full = load_hf_checkpoint(fixture_dir("moe_sparse_step"), DType::kF32, Device::cpu());
  LoadOptions o;
  o.num_layers = 2;
  auto proxy = load_hf_checkpoint(fixture_dir("moe_sparse_step"), DType::kF32, Device::cpu(), o);
  ASSERT_EQ(proxy.layers.size(), 2u);
  EXPECT_TRUE(proxy.config.mlp_only_layers.empty());
  auto mf = named(full);
  for (auto& [n, t] : named(proxy))
    EXPECT_EQ(std::memcmp(t.data_ptr(), mf[n].data_ptr(), t.nbytes()), 0) << n;
  o.num_layers = 9;
  expect_error([&] { load_hf_checkpoint(fixture_dir("moe_sparse_step"), DType::kF32, Device::cpu(), o); },
               {"9 layers"});
}

TEST(Weights, BadCheckpointsFailCleanlyWithoutWriting) {
  TempDir d;
  const std::string src = fixture_dir("moe_untied");
  auto sentinel = [&]() {
    auto p = ModelParams::allocate(load_hf_config(src), DType::kF32, Device::cpu());
    p.for_each([](const std::string&, Tensor& t) { t.fill_(7.0); });
    return p;
  };
  auto check = [&](const std::string& name, const Edit& edit, std::vector<std::string> parts) {
    SCOPED_TRACE(name);
    const std::string dir = d / name;
    rewrite_checkpoint(src, dir, edit);
    expect_error([&] { load_hf_checkpoint(dir, DType::kF32, Device::cpu()); }, parts);
    auto p = sentinel();
    expect_error([&] { load_hf_weights(dir, p); }, parts);
    p.for_each([](const std::string& n, Tensor& t) {
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.get(i), 7.0) << n << " was written";
    });
  };
  using V = std::vector<std::pair<std::string, Tensor>>;
  const std::string victim = "model.layers.1.mlp.experts.3.up_proj.weight";
  check("missing", [&](const std::string& n, const Tensor& t) { return n == victim ? V{} : V{{n, t}}; },
        {"missing tensor", victim});
  check("extra", [&](const std::string& n, const Tensor& t) {
          V v{{n, t}};
          if (n == victim) v.push_back({"model.layers.1.mlp.experts.6.up_proj.weight", t});
          return v;
        },
        {"unexpected tensor", "experts.6.up_proj.weight", "model.safetensors"});
  check("shape", [&](const std::string& n, const Tensor& t) {
          return n == victim ? V{{n, t.view({-1})}} : V{{n, t}};
        },
        {victim, "model.safetensors", "expected [24, 32]"});
  check("dtype", [&](const std::string& n, const Tensor& t) {
          return n == victim ? V{{n, Tensor::zeros(t.shape(), DType::kI32)}} : V{{n, t}};
        },
        {victim, "I32"});
  // Mixed: everything is reported in one error, with the count.
  check("many", [&](const std::string& n, const Tensor& t) {
          return n.find("layers.0.self_attn") != std::string::npos ? V{} : V{{n, t}};
        },
        {"problems", "missing tensor"});
  // Sharded checkpoints name the shard holding the bad tensor.
  const std::string sh = d / "sharded";
  rewrite_checkpoint(src, sh, [&](const std::string& n, const Tensor& t) {
    return n == victim ? V{{n, t.view({-1})}} : V{{n, t}};
  }, 20000);
  auto idx = nlohmann::json::parse(read_bytes(sh + "/model.safetensors.index.json"));
  expect_error([&] { load_hf_checkpoint(sh, DType::kF32, Device::cpu()); },
               {victim, idx["weight_map"][victim].get<std::string>()});
}

TEST(Weights, ExportIsAtomicAndCopiesTokenizer) {
  TempDir d;
  auto p = ModelParams::allocate(ModelConfig::preset("tiny-moe"), DType::kF32, Device::cpu());
  init_params_random(p, 1);
  // Tokenizer files are copied when a tokenizer dir is given.
  const std::string tok = d / "tok";
  fs::create_directories(tok);
  std::ofstream(tok + "/tokenizer.json") << "{}";
  std::ofstream(tok + "/tokenizer_config.json") << "{\"chat_template\": \"x\"}";
  ExportOptions o;
  o.tokenizer_dir = tok;
  export_hf_checkpoint(p, d / "out", o);
  EXPECT_TRUE(fs::exists(d / "out/tokenizer.json"));
  EXPECT_TRUE(fs::exists(d / "out/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(d / "out/vocab.json"));
  auto gen = nlohmann::json::parse(read_bytes(d / "out/generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], 2);
  // An existing non-empty output is refused and left as it was; nothing temporary remains.
  const std::string before = read_bytes(d / "out/model.safetensors");
  init_params_random(p, 2);
  expect_error([&] { export_hf_checkpoint(p, d / "out", o); }, {"out", "not empty"});
  EXPECT_EQ(read_bytes(d / "out/model.safetensors"), before);
  o.overwrite = Overwrite::kReplace;
  export_hf_checkpoint(p, d / "out", o);
  EXPECT_NE(read_bytes(d / "out/model.safetensors"), before);
  // A tokenizer dir without tokenizer files fails before anything is created.
  o.tokenizer_dir = d / "nothing";
  expect_error([&] { export_hf_checkpoint(p, d / "out2", o); }, {"nothing", "tokenizer.json"});
  EXPECT_FALSE(fs::exists(d / "out2"));
  for (const auto& de : fs::directory_iterator(d.path))
    EXPECT_EQ(de.path().filename().string().find(".tmp"), std::string::npos) << de.path();
}
