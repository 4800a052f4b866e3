// YAML config: defaults, strict types, unknown keys with suggestions and line numbers, command-line
// overrides, the resolved YAML round trip, validation, and docs/config.md listing every key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/check.h"
#include "train/config.h"

using namespace moetrain;

namespace {
const char* kBase = R"(model:
  preset: tiny-moe
data:
  mock_data: true
training:
  train_iters: 20
  micro_batch_size: 2
  global_batch_size: 8
optimizer:
  lr: 3.0e-4
  lr_warmup_iters: 2
)";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    TrainConfig::from_yaml_string(yaml, "cfg.yaml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Config, ParsesValuesAndKeepsDefaults) {
  auto c = TrainConfig::from_yaml_string(kBase, "cfg.yaml");
  EXPECT_EQ(c.model.preset, "tiny-moe");
  EXPECT_TRUE(c.data.mock_data);
  EXPECT_EQ(c.training.train_iters, 20);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.lr_decay_style, "cosine");  // default
  EXPECT_DOUBLE_EQ(c.optimizer.adam_beta2, 0.999);
  EXPECT_EQ(c.grad_accum_steps(1), 4);
  EXPECT_EQ(c.grad_accum_steps(2), 2);
  EXPECT_THROW(c.grad_accum_steps(3), Error);  // 8 is not a multiple of 2 x 3
  EXPECT_EQ(c.decay_iters(), 20);
  EXPECT_EQ(c.checkpoint_dir(), "runs/run/checkpoints");
}

TEST(Config, UnknownKeysSuggestTheNearestValidKey) {
  std::string e = error_of(std::string(kBase) + "  weight_decy: 0.1\n");
  EXPECT_NE(e.find("unknown key 'optimizer.weight_decy'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'optimizer.weight_decay'"), std::string::npos) << e;
  EXPECT_NE(e.find("cfg.yaml line 12"), std::string::npos) << e;
  // A key put in the wrong section points at the right one.
  e = error_of(std::string(kBase) + "checkpoint:\n  lr: 1\n");
  EXPECT_NE(e.find("did you mean 'optimizer.lr'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "optimiser:\n  lr: 1\n");
  EXPECT_NE(e.find("unknown section 'optimiser'; did you mean 'optimizer'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "seq_length: 128\n");  // top-level bare key
  EXPECT_NE(e.find("did you mean 'training.seq_length'"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  zzzzzzzzzzzz: 1\n");
  EXPECT_NE(e.find("see docs/config.md"), std::string::npos) << e;
}

TEST(Config, TypesAreStrict) {
  std::string e = error_of("model: {preset: tiny-moe}\ndata: {mock_data: true}\ntraining: {train_iters: 1.5}\n");
  EXPECT_NE(e.find("training.train_iters must be an integer, got '1.5'"), std::string::npos) << e;
  e = error_of("model: {preset: tiny-moe}\ndata: {mock_data: yes please}\n");
  EXPECT_NE(e.find("data.mock_data must be true or false"), std::string::npos) << e;
  e = error_of("model: {preset: tiny-moe}\ndata: {mock_data: true}\noptimizer: {lr: fast}\n");
  EXPECT_NE(e.find("optimizer.lr must be a number, got 'fast'"), std::string::npos) << e;
  e = error_of("model: {preset: tiny-moe}\ndata: {mock_data: true}\nmodel: [1, 2]\n");
  EXPECT_FALSE(e.empty());
  auto c = TrainConfig::from_yaml_string("model: {preset: tiny-moe}\ndata: {mock_data: true}\ntraining: {train_iters: 1e3}\n", "x");
  EXPECT_EQ(c.training.train_iters, 1000);  // integral exponent form is fine
  e = error_of("model: {preset: tiny-moe\n");
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(Config, OverridesApplyInOrder) {
  auto c = TrainConfig::from_yaml_string(
      kBase, "cfg.yaml",
      {"optimizer.lr=1e-3", "model.freeze=['*.mlp.gate.weight', 're:model\\.norm\\..*']", "training.train_iters=30",
       "optimizer.lr=2e-3", "checkpoint.save=/tmp/x"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-3);
  ASSERT_EQ(c.model.freeze.size(), 2u);
  EXPECT_EQ(c.model.freeze[0], "*.mlp.gate.weight");
  EXPECT_EQ(c.training.train_iters, 30);
  EXPECT_EQ(c.checkpoint_dir(), "/tmp/x");
  std::string e = error_of(kBase, {"optimizer.lrr=1"});
  EXPECT_NE(e.find("did you mean 'optimizer.lr'"), std::string::npos) << e;
  e = error_of(kBase, {"lr"});
  EXPECT_NE(e.find("must look like section.key=value"), std::string::npos) << e;
  e = error_of(kBase, {"training.train_iters=many"});
  EXPECT_NE(e.find("training.train_iters must be an integer"), std::string::npos) << e;
}

TEST(Config, ValidationNamesTheKey) {
  EXPECT_NE(error_of("data: {mock_data: true}\n").find("exactly one of model.path"), std::string::npos);
  EXPECT_NE(error_of("model: {preset: a, path: b}\ndata: {mock_data: true}\n").find("exactly one"), std::string::npos);
  EXPECT_NE(error_of("model: {preset: tiny-moe}\n").find("data.data_path is empty"), std::string::npos);
  std::string e = error_of(std::string(kBase) + "  lr_decay_style: cosin\n");
  EXPECT_NE(e.find("optimizer.lr_decay_style is 'cosin', expected one of constant, cosine, linear, wsd"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  lr_decay_style: wsd\n");
  EXPECT_NE(e.find("lr_wsd_decay_iters"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  min_lr: 1.0\n");
  EXPECT_NE(e.find("min_lr"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "parallel:\n  tensor_model_parallel_size: 2\n");
  EXPECT_NE(e.find("parallel.tensor_model_parallel_size = 2 is not supported"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  freeze: ['re:([']\n", {});
  EXPECT_FALSE(e.empty());
  e = error_of(kBase, {"model.freeze=['re:([']"});
  EXPECT_NE(e.find("does not compile"), std::string::npos) << e;
}

TEST(Config, ResolvedYamlRoundTrips) {
  auto c = TrainConfig::from_yaml_string(kBase, "cfg.yaml", {"model.freeze=[a, 'b c']", "optimizer.adam_eps=1e-12",
                                                             "logging.run_dir=runs/with space"});
  const std::string y = c.to_yaml();
  EXPECT_NE(y.find("lr: 0.0003"), std::string::npos) << y;
  auto c2 = TrainConfig::from_yaml_string(y, "resolved");
  EXPECT_EQ(c2.to_yaml(), y);
  EXPECT_DOUBLE_EQ(c2.optimizer.adam_eps, 1e-12);
  EXPECT_EQ(c2.model.freeze, c.model.freeze);
  EXPECT_EQ(c2.logging.run_dir, "runs/with space");
  // Every schema key appears in the resolved file.
  for (const auto& k : config_keys()) EXPECT_NE(y.find(k.substr(k.find('.') + 1) + ":"), std::string::npos) << k;
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("lr", "lr"), 0);
  EXPECT_EQ(edit_distance("weight_decy", "weight_decay"), 1);
  EXPECT_EQ(edit_distance("ab", "ba"), 1);  // transposition
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
}

TEST(Config, DocsListEveryKey) {
  std::ifstream in(std::string(MT_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in.good()) << "docs/config.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& k : config_keys()) {
    const std::string key = k.substr(k.find('.') + 1);
    EXPECT_NE(doc.find("| `" + key + "` |"), std::string::npos) << k << " is not documented in docs/config.md";
  }
}

TEST(Config, ExamplesParse) {
  for (const char* name : {"demo.yaml", "demo_dpo.yaml", "qwen3_30b_a3b_sft_8k.yaml", "qwen3_30b_a3b_dpo_4k.yaml"}) {
    const std::string path = std::string(MT_SOURCE_DIR) + "/examples/" + name;
    EXPECT_NO_THROW(TrainConfig::load(path)) << path;
  }
  auto c = TrainConfig::load(std::string(MT_SOURCE_DIR) + "/examples/qwen3_30b_a3b_sft_8k.yaml");
  EXPECT_EQ(c.training.seq_length, 8192);
  EXPECT_EQ(c.parallel.expert_model_parallel_size, 8);
  EXPECT_EQ(c.grad_accum_steps(8), 16);  // 128 / (1 x 8 ranks)
}
