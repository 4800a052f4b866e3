// LR schedules against hand-computed values, parameter-name patterns, and clipping factors.
#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "optim/adamw.h"
#include "optim/name_pattern.h"
#include "optim/schedule.h"

using namespace moetrain;

namespace {
LrSchedule make(LrDecayStyle style) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 10;
  s.decay_iters = 110;
  s.style = style;
  s.wsd_decay_iters = 20;
  return s;
}
}  // namespace

TEST(Schedule, WarmupIsLinearFromTheFirstUpdate) {
  for (auto style : {LrDecayStyle::kConstant, LrDecayStyle::kCosine, LrDecayStyle::kLinear, LrDecayStyle::kWsd}) {
    auto s = make(style);
    EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
    EXPECT_DOUBLE_EQ(s.lr_at(1), 0.1);
    EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5);
    EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  }
}

TEST(Schedule, CosineHandValues) {
  auto s = make(LrDecayStyle::kCosine);
  EXPECT_NEAR(s.lr_at(35), 0.1 + 0.45 * (1 + std::sqrt(0.5)), 1e-12);  // a quarter of the decay
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-12);                              // half
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(s.lr_at(111), 0.1);  // floor after the decay
  EXPECT_DOUBLE_EQ(s.lr_at(5000), 0.1);
}

TEST(Schedule, LinearAndConstant) {
  auto l = make(LrDecayStyle::kLinear);
  EXPECT_NEAR(l.lr_at(35), 0.775, 1e-12);
  EXPECT_NEAR(l.lr_at(60), 0.55, 1e-12);
  EXPECT_NEAR(l.lr_at(110), 0.1, 1e-12);
  auto c = make(LrDecayStyle::kConstant);
  EXPECT_DOUBLE_EQ(c.lr_at(11), 1.0);
  EXPECT_DOUBLE_EQ(c.lr_at(500), 1.0);
}

TEST(Schedule, WarmupStableDecay) {
  auto s = make(LrDecayStyle::kWsd);  // anneal from step 90 to 110
  EXPECT_DOUBLE_EQ(s.lr_at(50), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(90), 1.0);
  EXPECT_NEAR(s.lr_at(100), 0.55, 1e-12);
  EXPECT_NEAR(s.lr_at(110), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(s.lr_at(120), 0.1);
  s.wsd_style = WsdDecayStyle::kCosine;
  EXPECT_NEAR(s.lr_at(95), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  s.wsd_style = WsdDecayStyle::kExponential;
  EXPECT_NEAR(s.lr_at(100), 0.1 + 0.9 * (2 * std::sqrt(0.5) - 1), 1e-12);
  s.wsd_style = WsdDecayStyle::kMinusSqrt;
  EXPECT_NEAR(s.lr_at(100), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-12);
}

TEST(Schedule, NoWarmup) {
  auto s = make(LrDecayStyle::kLinear);
  s.warmup_iters = 0;
  s.decay_iters = 100;
  EXPECT_NEAR(s.lr_at(1), 1.0 - 0.9 * 0.01, 1e-12);
  EXPECT_NEAR(s.lr_at(100), 0.1, 1e-12);
}

TEST(Schedule, ValidateRejectsInconsistentSettings) {
  auto s = make(LrDecayStyle::kCosine);
  s.validate();
  s.min_lr = 2.0;
  EXPECT_THROW(s.validate(), Error);
  s = make(LrDecayStyle::kCosine);
  s.decay_iters = 10;  // not beyond warmup
  EXPECT_THROW(s.validate(), Error);
  s = make(LrDecayStyle::kWsd);
  s.wsd_decay_iters = 101;
  EXPECT_THROW(s.validate(), Error);
  EXPECT_THROW(parse_lr_decay_style("cosin"), Error);
  EXPECT_EQ(parse_lr_decay_style("wsd"), LrDecayStyle::kWsd);
}

TEST(NamePattern, GlobAndRegex) {
  EXPECT_TRUE(name_matches("*.mlp.gate.weight", "model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(name_matches("*.mlp.gate.weight", "model.layers.3.mlp.gate_up_proj.weight"));
  EXPECT_TRUE(name_matches("model.layers.1?.*", "model.layers.12.self_attn.q_proj.weight"));
  EXPECT_FALSE(name_matches("model.layers.1?.*", "model.layers.1.self_attn.q_proj.weight"));
  EXPECT_TRUE(name_matches("re:model\\.layers\\.[0-1]\\..*", "model.layers.1.input_layernorm.weight"));
  EXPECT_FALSE(name_matches("re:model\\.layers\\.[0-1]\\..*", "model.layers.2.input_layernorm.weight"));
  EXPECT_FALSE(name_matches("re:layers", "model.layers.2.x"));  // regex must match the whole name
  EXPECT_TRUE(name_matches_any({"a", "embed*"}, "embed_tokens"));
  EXPECT_THROW(validate_name_pattern("re:([", "model.freeze"), Error);
  EXPECT_NO_THROW(validate_name_pattern("*.weight", "model.freeze"));
}

TEST(Clip, Coefficient) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_DOUBLE_EQ(clip_coefficient(100.0, 0.0), 1.0);  // clipping off
  EXPECT_DOUBLE_EQ(clip_coefficient(NAN, 1.0), 1.0);
}
