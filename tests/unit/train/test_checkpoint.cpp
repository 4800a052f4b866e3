// Checkpoints: round trip of tensors and state, keep-last pruning, the atomic `latest` pointer,
// corrupt / truncated / incomplete checkpoints named in the error, and a save killed with SIGKILL
// in the middle (a forked child) leaving the previous checkpoint loadable. Also StopSignal.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/check.h"
#include "train/checkpoint.h"
#include "train/signals.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  Tensor a = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_floats({0.5f, -0.25f}, {2}, DType::kBF16);
  Tensor m = Tensor::from_floats({9, 8, 7, 6, 5, 4}, {2, 3});
  NamedTensors model() const { return {{"model.a", a}, {"model.b", b}}; }
  NamedTensors optim() const { return {{"exp_avg.model.a", m}}; }
};

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "/" + name;
  fs::remove_all(d);
  return d;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void set_all(const NamedTensors& ts, float v) {
  for (auto& [n, t] : ts) {
    Tensor x = t;
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, v);
  }
}

}  // namespace

TEST(Checkpoint, RoundTripAndLatest) {
  const std::string dir = fresh_dir("ckpt_roundtrip");
  Fixture f;
  CheckpointManager mgr(dir, 3);
  EXPECT_FALSE(mgr.latest().has_value());
  const std::string p = mgr.save(7, f.model(), f.optim(), {{"scheduler", {{"step", 7}}}, {"cursor", {1, 2, 3}}});
  EXPECT_EQ(p, dir + "/step_7");
  ASSERT_TRUE(mgr.latest().has_value());
  EXPECT_EQ(*mgr.latest(), dir + "/step_7");
  EXPECT_EQ(CheckpointManager::resolve(dir), dir + "/step_7");
  EXPECT_EQ(CheckpointManager::resolve(dir + "/step_7"), dir + "/step_7");

  Fixture g;
  set_all(g.model(), 0);
  set_all(g.optim(), 0);
  auto st = CheckpointManager::load(p, g.model(), g.optim());
  EXPECT_EQ(st["step"], 7);
  EXPECT_EQ(st["scheduler"]["step"], 7);
  EXPECT_EQ(g.a.to_floats(), f.a.to_floats());
  EXPECT_EQ(g.b.to_floats(), f.b.to_floats());
  EXPECT_EQ(g.b.dtype(), DType::kBF16);
  EXPECT_EQ(g.m.to_floats(), f.m.to_floats());

  // Loading into a different layout names the tensor.
  Tensor wrong = Tensor::zeros({3, 2}, DType::kF32);
  std::string e = error_of([&] { CheckpointManager::load(p, {{"model.a", wrong}, {"model.b", g.b}}, g.optim()); });
  EXPECT_NE(e.find("'model.a' has shape [2, 3], expected [3, 2]"), std::string::npos) << e;
  e = error_of([&] { CheckpointManager::load(p, {{"model.c", g.a}, {"model.b", g.b}}, g.optim()); });
  EXPECT_NE(e.find("no tensor 'model.c'"), std::string::npos) << e;
  e = error_of([&] { CheckpointManager::load(p, {{"model.a", g.a}}, g.optim()); });
  EXPECT_NE(e.find("holds 2 tensors, this run expects 1"), std::string::npos) << e;
}

TEST(Checkpoint, KeepsTheNewestK) {
  const std::string dir = fresh_dir("ckpt_keep");
  Fixture f;
  CheckpointManager mgr(dir, 2);
  for (int s : {10, 20, 30, 40}) mgr.save(s, f.model(), f.optim(), {});
  EXPECT_FALSE(fs::exists(dir + "/step_10"));
  EXPECT_FALSE(fs::exists(dir + "/step_20"));
  EXPECT_TRUE(fs::exists(dir + "/step_30"));
  EXPECT_TRUE(fs::exists(dir + "/step_40"));
  EXPECT_EQ(*mgr.latest(), dir + "/step_40");
  mgr.save(40, f.model(), f.optim(), {{"again", true}});  // re-saving a step replaces it
  EXPECT_EQ(CheckpointManager::load(dir + "/step_40", f.model(), f.optim())["again"], true);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u);
  EXPECT_EQ(checkpoint_step_of("step_123"), 123);
  EXPECT_EQ(checkpoint_step_of("step_"), -1);
  EXPECT_EQ(checkpoint_step_of("step_1x"), -1);
}

TEST(Checkpoint, CorruptionIsDetectedAndNamed) {
  const std::string dir = fresh_dir("ckpt_corrupt");
  Fixture f;
  CheckpointManager mgr(dir, 5);
  const std::string p = mgr.save(1, f.model(), f.optim(), {});
  const std::string file = p + "/model/model.safetensors";
  ASSERT_TRUE(fs::exists(file));
  EXPECT_NO_THROW(CheckpointManager::verify(p));
  {  // flip one byte in the data section
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-3, std::ios::end);
    char c;
    io.get(c);
    io.seekp(-3, std::ios::end);
    io.put(static_cast<char>(c ^ 0x40));
  }
  std::string e = error_of([&] { CheckpointManager::load(p, f.model(), f.optim()); });
  EXPECT_NE(e.find(p + " is corrupt: model/model.safetensors has CRC32"), std::string::npos) << e;
  fs::resize_file(file, fs::file_size(file) - 10);
  e = error_of([&] { CheckpointManager::verify(p); });
  EXPECT_NE(e.find("model/model.safetensors has"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  fs::remove(p + "/optimizer/model.safetensors");
  fs::remove(file);
  e = error_of([&] { CheckpointManager::verify(p); });
  EXPECT_NE(e.find("is missing"), std::string::npos) << e;
  fs::remove(p + "/manifest.json");
  e = error_of([&] { CheckpointManager::verify(p); });
  EXPECT_NE(e.find("manifest.json is missing"), std::string::npos) << e;
  {
    std::ofstream(dir + "/latest") << "step_99\n";
  }
  e = error_of([&] { mgr.latest(); });
  EXPECT_NE(e.find("points at"), std::string::npos) << e;
}

TEST(Checkpoint, SigkillDuringSaveKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("ckpt_kill");
  Fixture f;
  {
    CheckpointManager mgr(dir, 3);
    mgr.save(1, f.model(), f.optim(), {{"marker", 1}});
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("MT_TEST_SAVE_PAUSE_MS", "20000", 1);
    try {
      CheckpointManager mgr(dir, 3);
      Fixture h;
      set_all(h.model(), 42);
      mgr.save(2, h.model(), h.optim(), {{"marker", 2}});
    } catch (...) {
    }
    _exit(0);
  }
  // Wait for the child's temporary directory to hold its manifest (everything written, not yet
  // renamed), then kill it.
  bool seen = false;
  for (int i = 0; i < 400 && !seen; ++i) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind(".tmp-step_2", 0) == 0 && fs::exists(e.path() / "manifest.json")) seen = true;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(seen) << "the child never reached the pause";
  EXPECT_TRUE(WIFSIGNALED(status));
  CheckpointManager mgr(dir, 3);  // cleans the leftover
  ASSERT_TRUE(mgr.latest().has_value());
  EXPECT_EQ(*mgr.latest(), dir + "/step_1");
  Fixture g;
  EXPECT_EQ(CheckpointManager::load(*mgr.latest(), g.model(), g.optim())["marker"], 1);
  EXPECT_EQ(g.a.to_floats(), f.a.to_floats());
  EXPECT_FALSE(fs::exists(dir + "/step_2"));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u);
}

TEST(Signals, FirstSignalSetsTheFlagAndHandlersAreRestored) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    StopSignal stop;
    EXPECT_FALSE(stop.requested());
    raise(SIGTERM);
    EXPECT_TRUE(stop.requested());
    EXPECT_EQ(stop.signal_number(), SIGTERM);
    EXPECT_THROW(StopSignal(), Error);  // only one at a time
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  StopSignal again;  // a fresh one starts cleared
  EXPECT_FALSE(again.requested());
}
