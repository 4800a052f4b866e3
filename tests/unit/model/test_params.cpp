// ModelParams tests: shapes and counts of every preset (counted from tensors, compared with
// ModelConfig's closed-form counts), tying, traversal order and names, and random init
// (determinism, per-name independence, statistics, ones for norms, dtype rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/dtype.h"
#include "core/philox.h"
#include "model/params.h"

using namespace moetrain;

TEST(Params, CountsMatchConfigForEveryPreset) {
  for (const auto& name : ModelConfig::preset_names()) {
    auto cfg = ModelConfig::preset(name);
    int64_t n = 0;
    std::set<std::string> names;
    for (const auto& [pname, shape] : ModelParams::expected_shapes(cfg)) {
      n += shape_numel(shape);
      EXPECT_TRUE(names.insert(pname).second) << "duplicate " << pname;
    }
    EXPECT_EQ(n, cfg.num_parameters()) << name;
  }
  // Allocation agrees with expected_shapes (small presets only; the big ones would need GBs).
  for (const char* name : {"tiny-moe", "tiny-dense", "demo-moe"}) {
    auto cfg = ModelConfig::preset(name);
    auto p = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
    auto expect = ModelParams::expected_shapes(cfg);
    size_t i = 0;
    int64_t n = 0;
    p.for_each([&](const std::string& pname, Tensor& t) {
      ASSERT_LT(i, expect.size());
      EXPECT_EQ(pname, expect[i].first);
      EXPECT_EQ(t.shape(), expect[i].second) << pname;
      EXPECT_EQ(t.dtype(), DType::kF32);
      EXPECT_EQ(t.category(), MemCategory::kWeights);
      n += t.numel();
      ++i;
    });
    EXPECT_EQ(i, expect.size());
    EXPECT_EQ(n, cfg.num_parameters()) << name;
  }
}

TEST(Params, MixedLayersAndTying) {
  auto cfg = ModelConfig::preset("tiny-moe").with_num_layers(4);
  cfg.mlp_only_layers = {0};
  cfg.decoder_sparse_step = 1;
  cfg.tie_word_embeddings = true;
  auto p = ModelParams::allocate(cfg, DType::kBF16, Device::cpu());
  ASSERT_EQ(p.layers.size(), 4u);
  EXPECT_FALSE(p.layers[0].sparse);
  EXPECT_EQ(p.layers[0].mlp_gate_up.shape(), (Shape{2 * 128, 64}));
  EXPECT_EQ(p.layers[0].mlp_down.shape(), (Shape{64, 128}));
  EXPECT_FALSE(p.layers[0].router.defined());
  EXPECT_TRUE(p.layers[1].sparse);
  EXPECT_EQ(p.layers[1].experts_gate_up.shape(), (Shape{4, 64, 64}));
  EXPECT_EQ(p.layers[1].experts_down.shape(), (Shape{4, 64, 32}));
  EXPECT_EQ(p.layers[1].router.shape(), (Shape{4, 64}));
  EXPECT_EQ(p.lm_head.data_ptr(), p.embed.data_ptr());
  int64_t n = 0;
  bool saw_lm_head = false;
  p.for_each([&](const std::string& name, const Tensor& t) {
    n += t.numel();
    saw_lm_head |= name == "lm_head.weight";
  });
  EXPECT_FALSE(saw_lm_head);
  EXPECT_EQ(n, cfg.num_parameters());
}

TEST(Params, RandomInitDeterministicAndTransformersLike) {
  auto cfg = ModelConfig::preset("tiny-moe");
  auto a = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
  auto b = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
  auto c = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
  init_params_random(a, 7);
  init_params_random(b, 7);
  init_params_random(c, 8);
  std::map<std::string, Tensor> tb, tc;
  b.for_each([&](const std::string& n, Tensor& t) { tb[n] = t; });
  c.for_each([&](const std::string& n, Tensor& t) { tc[n] = t; });
  double sum = 0, sumsq = 0;
  int64_t count = 0;
  std::vector<float> first_values;
  a.for_each([&](const std::string& name, Tensor& t) {
    const float* x = t.data<float>();
    const float* y = tb[name].data<float>();
    const float* z = tc[name].data<float>();
    bool same_b = true, same_c = true;
    for (int64_t i = 0; i < t.numel(); ++i) {
      same_b &= x[i] == y[i];
      same_c &= x[i] == z[i];
    }
    EXPECT_TRUE(same_b) << name;
    if (name.find("norm.weight") != std::string::npos) {
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(x[i], 1.0f) << name;
      return;
    }
    EXPECT_FALSE(same_c) << name << " did not change with the seed";
    // Independent reference: Philox draw for this name's key.
    uint64_t key = param_init_key(7, name);
    for (int64_t i : {int64_t{0}, int64_t{1}, t.numel() - 1}) {
      float n0, n1;
      philox_normal2(philox4x32(key, 0, static_cast<uint64_t>(i / 2)), &n0, &n1);
      EXPECT_FLOAT_EQ(x[i], 0.02f * (i % 2 ? n1 : n0)) << name << " " << i;
    }
    first_values.push_back(x[0]);
    for (int64_t i = 0; i < t.numel(); ++i) {
      sum += x[i];
      sumsq += static_cast<double>(x[i]) * x[i];
      ++count;
    }
  });
  // Different names give different streams.
  std::set<float> distinct(first_values.begin(), first_values.end());
  EXPECT_EQ(distinct.size(), first_values.size());
  const double mean = sum / count, sd = std::sqrt(sumsq / count - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.0005);
}

TEST(Params, RandomInitBf16IsRoundedF32) {
  auto cfg = ModelConfig::preset("tiny-dense");
  auto f = ModelParams::allocate(cfg, DType::kF32, Device::cpu());
  auto h = ModelParams::allocate(cfg, DType::kBF16, Device::cpu());
  init_params_random(f, 3);
  init_params_random(h, 3);
  std::map<std::string, Tensor> th;
  h.for_each([&](const std::string& n, Tensor& t) { th[n] = t; });
  f.for_each([&](const std::string& name, Tensor& t) {
    const float* x = t.data<float>();
    const uint16_t* y = th[name].data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(float_to_bf16(x[i]), y[i]) << name << " " << i;
  });
}
