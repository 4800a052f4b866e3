// Atomic, verified resume checkpoints (see checkpoint.h). Durability order: every file is fsynced
// (safetensors writers fsync their own files), then the directories, then the rename, then the
// parent directory, then the pointer. MT_TEST_SAVE_PAUSE_MS (env.h) holds a save before its
// rename so tests can kill the process mid-save.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace moetrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kState = "trainer_state.json";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr int kFormatVersion = 1;

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  MT_CHECK(fd >= 0, "[checkpoint] cannot open {} to sync it", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  MT_CHECK(rc == 0, "[checkpoint] fsync of {} failed", path);
}

void write_text_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    MT_CHECK(out.good(), "[checkpoint] cannot write {}", path);
  }
  fsync_path(path, false);
}

std::vector<std::string> files_under(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(fs::relative(e.path(), root).string());
  std::sort(out.begin(), out.end());
  return out;
}

void write_tensors(const std::string& dir, const NamedTensors& tensors) {
  fs::create_directories(dir);
  std::vector<TensorWriteSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) specs.push_back(tensor_write_spec(name, t));
  if (specs.empty()) return;  // e.g. no optimizer state when everything is frozen
  ShardOptions opt;
  opt.metadata = {{"format", "moetrain"}};
  write_safetensors_sharded(dir, specs, opt);
}

// Optimizer state in another dtype (e.g. fp32 moments loaded by an optimizer.exp_avg_dtype bf16
// run) is converted (round to nearest even, with a warning); a master copy that exists on one
// side only (optimizer.main_params_dtype changed) is an error, since neither side can be rebuilt
// exactly from the other.
void load_tensors(const std::string& step_dir, const std::string& sub, const NamedTensors& into) {
  const std::string dir = step_dir + "/" + sub;
  if (into.empty()) return;
  MT_CHECK(fs::is_directory(dir), "[checkpoint] {} has no {}/ directory", step_dir, sub);
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open_dir(dir);
  const char* kMasterHint = "optimizer.main_params_dtype differs from the run that wrote it (bf16 main params with bf16 "
                            "weights keep no master copy); resume with the same optimizer.main_params_dtype, or set "
                            "checkpoint.load=none to start fresh";
  bool warned = false;
  for (const auto& [name, t] : into) {
    if (!ck.contains(name) && name.rfind("master.", 0) == 0)
      MT_FAIL("[checkpoint] {}/{} has no master copy '{}' but this run keeps one: {}", step_dir, sub, name, kMasterHint);
    MT_CHECK(ck.contains(name), "[checkpoint] {}/{} has no tensor '{}' (was it saved with another model or frozen set?)",
             step_dir, sub, name);
    Tensor src = ck.tensor(name);
    MT_CHECK(src.shape() == t.shape(), "[checkpoint] {}/{}: tensor '{}' has shape {}, expected {}", step_dir, sub, name,
             shape_str(src.shape()), shape_str(t.shape()));
    Tensor dst = t;
    if (src.dtype() != t.dtype()) {
      if (!warned && sub == "optimizer")
        MT_LOG_WARN("[checkpoint] {}/{}: converting optimizer state from {} to {} (round to nearest even), e.g. '{}'; "
                    "the resumed run is not bit-identical to an uninterrupted one", step_dir, sub,
                    dtype_name(src.dtype()), dtype_name(t.dtype()), name);
      warned = warned || sub == "optimizer";
      src = src.to(t.dtype());
    }
    dst.copy_from(src);
  }
  const size_t stored = ck.names().size();
  if (stored != into.size()) {
    for (const auto& n : ck.names()) {
      const bool expected = std::any_of(into.begin(), into.end(), [&](const auto& e) { return e.first == n; });
      if (!expected && n.rfind("master.", 0) == 0)
        MT_FAIL("[checkpoint] {}/{} holds a master copy '{}' but this run keeps none: {}", step_dir, sub, n, kMasterHint);
    }
  }
  MT_CHECK(stored == into.size(), "[checkpoint] {}/{} holds {} tensors, this run expects {}", step_dir, sub, stored,
           into.size());
}

}  // namespace

int64_t checkpoint_step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

uint32_t file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), "[checkpoint] cannot read {}", path);
  std::vector<char> buf(1 << 22);
  uLong crc = crc32(0L, Z_NULL, 0);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}

CheckpointManager::CheckpointManager(std::string dir, int64_t keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {
  MT_CHECK(keep_last_ >= 1, "[checkpoint] keep_last must be >= 1, got {}", keep_last_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MT_CHECK(!ec, "[checkpoint] cannot create checkpoint directory {}: {}", dir_, ec.message());
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kTmpPrefix, 0) == 0) {
      MT_LOG_WARN("[checkpoint] removing {} left by an interrupted save", e.path().string());
      fs::remove_all(e.path(), ec);
    }
  }
}

std::string CheckpointManager::save(int64_t step, const NamedTensors& model, const NamedTensors& optimizer,
                                    const nlohmann::json& state) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string name = fmt::format("step_{}", step);
  const std::string tmp = fmt::format("{}/{}{}-{}", dir_, kTmpPrefix, name, getpid());
  const std::string final_dir = dir_ + "/" + name;
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_tensors(tmp + "/model", model);
  write_tensors(tmp + "/optimizer", optimizer);
  nlohmann::json st = state;
  st["step"] = step;
  write_text_synced(tmp + "/" + kState, st.dump(2) + "\n");

  nlohmann::json manifest;
  manifest["format"] = "moetrain-checkpoint";
  manifest["version"] = kFormatVersion;
  manifest["step"] = step;
  manifest["files"] = nlohmann::json::object();
  for (const auto& rel : files_under(tmp)) {
    const std::string p = tmp + "/" + rel;
    fsync_path(p, false);
    manifest["files"][rel] = {{"bytes", fs::file_size(p)}, {"crc32", fmt::format("{:08x}", file_crc32(p))}};
  }
  write_text_synced(tmp + "/" + kManifest, manifest.dump(2) + "\n");
  fsync_path(tmp + "/model", true);
  fsync_path(tmp + "/optimizer", true);
  fsync_path(tmp, true);

  if (long pause = env_int("MT_TEST_SAVE_PAUSE_MS", 0); pause > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(pause));

  if (fs::exists(final_dir)) {  // re-saving a step (e.g. after a resume): move the old one aside
    const std::string old = fmt::format("{}/{}old-{}-{}", dir_, kTmpPrefix, name, getpid());
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_dir);
  }
  fsync_path(dir_, true);
  const std::string ptr_tmp = dir_ + "/" + kTmpPrefix + "latest";
  write_text_synced(ptr_tmp, name + "\n");
  fs::rename(ptr_tmp, dir_ + "/latest");
  fsync_path(dir_, true);
  prune_(name);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MT_LOG_INFO("[checkpoint] saved {} in {:.2f} s", final_dir, secs);
  return final_dir;
}

void CheckpointManager::prune_(const std::string& keep) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const int64_t s = checkpoint_step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory()) steps.emplace_back(s, e.path());
  }
  std::sort(steps.begin(), steps.end());
  const int64_t excess = static_cast<int64_t>(steps.size()) - keep_last_;
  for (int64_t i = 0; i < excess; ++i) {
    if (steps[i].second.filename() == keep) continue;
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
    if (ec) MT_LOG_WARN("[checkpoint] could not remove old checkpoint {}: {}", steps[i].second.string(), ec.message());
  }
}

std::optional<std::string> CheckpointManager::latest() const {
  const std::string ptr = dir_ + "/latest";
  if (!fs::exists(ptr)) return std::nullopt;
  std::ifstream in(ptr);
  std::string name;
  std::getline(in, name);
  MT_CHECK(checkpoint_step_of(name) >= 0, "[checkpoint] {} holds '{}', expected a step_<N> name", ptr, name);
  const std::string step_dir = dir_ + "/" + name;
  MT_CHECK(fs::is_directory(step_dir), "[checkpoint] {} points at {}, which does not exist", ptr, step_dir);
  return step_dir;
}

std::string CheckpointManager::resolve(const std::string& path) {
  MT_CHECK(fs::exists(path), "[checkpoint] checkpoint path {} does not exist", path);
  if (fs::exists(path + "/" + kManifest)) return path;
  if (fs::exists(path + "/latest")) {
    std::ifstream in(path + "/latest");
    std::string name;
    std::getline(in, name);
    MT_CHECK(checkpoint_step_of(name) >= 0, "[checkpoint] {}/latest holds '{}', expected a step_<N> name", path, name);
    return path + "/" + name;
  }
  MT_FAIL("[checkpoint] {} is neither a checkpoint (no {}) nor a checkpoint directory (no latest)", path, kManifest);
}

void CheckpointManager::verify(const std::string& step_dir) {
  const std::string mpath = step_dir + "/" + kManifest;
  MT_CHECK(fs::exists(mpath), "[checkpoint] {} is incomplete: {} is missing", step_dir, kManifest);
  std::ifstream in(mpath);
  nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  MT_CHECK(!m.is_discarded() && m.contains("files") && m["files"].is_object(), "[checkpoint] {} is corrupt (not valid JSON)", mpath);
  MT_CHECK(m.value("version", 0) == kFormatVersion, "[checkpoint] {}: format version {}, this build reads {}", mpath,
           m.value("version", 0), kFormatVersion);
  for (const auto& [rel, info] : m["files"].items()) {
    const std::string p = step_dir + "/" + rel;
    MT_CHECK(fs::exists(p), "[checkpoint] {} is incomplete: {} is missing", step_dir, rel);
    const uint64_t want = info.at("bytes").get<uint64_t>(), have = fs::file_size(p);
    MT_CHECK(have == want, "[checkpoint] {} is corrupt: {} has {} bytes, the manifest says {} (truncated?)", step_dir, rel,
             have, want);
    const std::string crc = fmt::format("{:08x}", file_crc32(p));
    MT_CHECK(crc == info.at("crc32").get<std::string>(), "[checkpoint] {} is corrupt: {} has CRC32 {}, the manifest says {}",
             step_dir, rel, crc, info.at("crc32").get<std::string>());
  }
}

nlohmann::json CheckpointManager::load(const std::string& step_dir, const NamedTensors& model, const NamedTensors& optimizer) {
  verify(step_dir);
  load_tensors(step_dir, "model", model);
  load_tensors(step_dir, "optimizer", optimizer);
  std::ifstream in(step_dir + "/" + kState);
  nlohmann::json st = nlohmann::json::parse(in, nullptr, false);
  MT_CHECK(!st.is_discarded() && st.contains("step"), "[checkpoint] {}/{} is not valid trainer state", step_dir, kState);
  return st;
}

}  // namespace moetrain
