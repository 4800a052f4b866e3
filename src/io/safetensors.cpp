// safetensors reader (mmap + header validation), writer (space-padded 8-byte aligned header,
// __metadata__ first, data in the order given) and the sharded index of transformers.
// Writers fill one tensor at a time through TensorWriteSpec::fill, so peak extra memory is the
// largest tensor (per shard writer thread), not the model.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/env.h"

namespace moetrain {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

// Element sizes of every dtype the format defines (to validate files with dtypes moetrain does
// not compute in, e.g. F64 or BOOL, which can still be listed and skipped).
bool safetensors_dtype_size(const std::string& s, size_t* size) {
  static const std::map<std::string, size_t> table = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},
      {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = table.find(s);
  if (it == table.end()) return false;
  *size = it->second;
  return true;
}

bool checked_numel(const Shape& s, uint64_t* out) {
  uint64_t n = 1;
  for (auto d : s) {
    if (d < 0) return false;
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) return false;
    n *= static_cast<uint64_t>(d);
  }
  *out = n;
  return true;
}

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n == 0) return;
  MT_CHECK(std::fwrite(p, 1, n, f) == n, "[safetensors] write to {} failed ({}): disk full?", path,
           std::strerror(errno));
}

}  // namespace

// ---- reading -------------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->self_ = f;
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_CHECK(fd >= 0, "[safetensors] cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    MT_FAIL("[safetensors] cannot stat {}: {}", path, std::strerror(errno));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    MT_FAIL("[safetensors] {} is {} bytes, too short to hold a header (truncated or not safetensors)", path,
            file_size);
  }
  void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MT_CHECK(m != MAP_FAILED, "[safetensors] cannot mmap {}: {}", path, std::strerror(errno));
  f->map_ = m;
  f->map_bytes_ = file_size;
  const uint8_t* base = static_cast<const uint8_t*>(m);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian u64
  MT_CHECK(n <= file_size - 8, "[safetensors] {}: header length {} runs past the end of the {}-byte file "
           "(truncated or not safetensors)", path, n, file_size);
  MT_CHECK(n <= kMaxHeaderBytes, "[safetensors] {}: header length {} exceeds the 100 MB limit (corrupt file?)",
           path, n);
  f->header_size_ = n;
  f->data_ = base + 8 + n;
  const uint64_t data_size = file_size - 8 - n;

  ojson h;
  try {
    h = ojson::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + n));
  } catch (const std::exception& e) {
    MT_FAIL("[safetensors] {}: header is not valid JSON ({})", path, e.what());
  }
  MT_CHECK(h.is_object(), "[safetensors] {}: header is not a JSON object", path);
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const ojson& v = it.value();
    if (name == "__metadata__") {
      MT_CHECK(v.is_object() || v.is_null(), "[safetensors] {}: __metadata__ is not an object", path);
      if (v.is_object())
        for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
          MT_CHECK(m2.value().is_string(), "[safetensors] {}: __metadata__ value of '{}' is not a string", path,
                   m2.key());
          f->metadata_[m2.key()] = m2.value().get<std::string>();
        }
      continue;
    }
    MT_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
             "[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets, got {}", path, name, v.dump());
    SafetensorsEntry e;
    e.name = name;
    MT_CHECK(v["dtype"].is_string(), "[safetensors] {}: tensor '{}' has a non-string dtype", path, name);
    e.dtype_name = v["dtype"].get<std::string>();
    size_t esize = 0;
    MT_CHECK(safetensors_dtype_size(e.dtype_name, &esize), "[safetensors] {}: tensor '{}' has unknown dtype '{}'",
             path, name, e.dtype_name);
    e.dtype_known = dtype_from_safetensors_name(e.dtype_name, &e.dtype);
    MT_CHECK(v["shape"].is_array(), "[safetensors] {}: tensor '{}' shape is not a list", path, name);
    for (const auto& d : v["shape"]) {
      MT_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
               "[safetensors] {}: tensor '{}' has a bad shape {}", path, name, v["shape"].dump());
      e.shape.push_back(d.get<int64_t>());
    }
    const ojson& off = v["data_offsets"];
    MT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             "[safetensors] {}: tensor '{}' has bad data_offsets {}", path, name, off.dump());
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    MT_CHECK(e.begin <= e.end, "[safetensors] {}: tensor '{}' has data_offsets [{}, {}] with begin > end", path,
             name, e.begin, e.end);
    MT_CHECK(e.end <= data_size, "[safetensors] {}: tensor '{}' data [{}, {}) runs past the end of the data "
             "section ({} bytes): the file is truncated", path, name, e.begin, e.end, data_size);
    uint64_t numel = 0;
    MT_CHECK(checked_numel(e.shape, &numel) && numel <= UINT64_MAX / esize,
             "[safetensors] {}: tensor '{}' shape {} overflows", path, name, shape_str(e.shape));
    MT_CHECK(e.end - e.begin == numel * esize, "[safetensors] {}: tensor '{}' {} {} needs {} bytes but "
             "data_offsets [{}, {}] span {}", path, name, e.dtype_name, shape_str(e.shape), numel * esize, e.begin,
             e.end, e.end - e.begin);
    f->index_[name] = f->entries_.size();
    f->entries_.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const SafetensorsEntry*> by_off;
  for (const auto& e : f->entries_)
    if (e.end > e.begin) by_off.push_back(&e);
  std::sort(by_off.begin(), by_off.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_off.size(); ++i)
    MT_CHECK(by_off[i]->begin >= by_off[i - 1]->end, "[safetensors] {}: tensors '{}' and '{}' overlap (corrupt "
             "header)", path, by_off[i - 1]->name, by_off[i]->name);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  MT_CHECK(e, "[safetensors] {} has no tensor '{}'", path_, name);
  MT_CHECK(e->dtype_known, "[safetensors] {}: tensor '{}' has dtype {}, which moetrain cannot hold", path_, name,
           e->dtype_name);
  auto keep = self_.lock();
  return Tensor::from_blob(const_cast<uint8_t*>(data_ + e->begin), e->shape, e->dtype, Device::cpu(),
                           [keep]() {});
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_dir(const std::string& dir) {
  SafetensorsCheckpoint c;
  c.dir_ = dir;
  MT_CHECK(fs::is_directory(dir), "[checkpoint] {} is not a directory", dir);
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    nlohmann::json j;
    try {
      std::ifstream in(index);
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      MT_FAIL("[checkpoint] {} is not valid JSON ({})", index.string(), e.what());
    }
    MT_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
             "[checkpoint] {}: expected an object with a 'weight_map' object", index.string());
    std::map<std::string, size_t> file_idx;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      MT_CHECK(it.value().is_string(), "[checkpoint] {}: weight_map entry '{}' is not a file name", index.string(),
               it.key());
      const std::string file = it.value().get<std::string>();
      MT_CHECK(!file.empty() && file[0] != '/' && file.find("..") == std::string::npos,
               "[checkpoint] {}: weight_map entry '{}' names '{}', expected a file in the same directory",
               index.string(), it.key(), file);
      auto f = file_idx.find(file);
      if (f == file_idx.end()) {
        const std::string p = (fs::path(dir) / file).string();
        MT_CHECK(fs::exists(p), "[checkpoint] {}: shard {} (holding '{}') does not exist", index.string(), p,
                 it.key());
        c.files_.push_back(SafetensorsFile::open(p));
        f = file_idx.emplace(file, c.files_.size() - 1).first;
      }
      MT_CHECK(c.files_[f->second]->find(it.key()), "[checkpoint] {}: index says tensor '{}' is in {}, which does "
               "not hold it", index.string(), it.key(), c.files_[f->second]->path());
      c.where_[it.key()] = f->second;
    }
    return c;
  }
  std::vector<std::string> paths;
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single)) {
    paths.push_back(single.string());
  } else {
    for (const auto& de : fs::directory_iterator(dir))
      if (de.is_regular_file() && de.path().extension() == ".safetensors") paths.push_back(de.path().string());
    std::sort(paths.begin(), paths.end());
  }
  MT_CHECK(!paths.empty(), "[checkpoint] {} has no model.safetensors, model.safetensors.index.json or "
           "*.safetensors files", dir);
  for (const auto& p : paths) {
    c.files_.push_back(SafetensorsFile::open(p));
    for (const auto& e : c.files_.back()->entries()) {
      auto [it, fresh] = c.where_.emplace(e.name, c.files_.size() - 1);
      MT_CHECK(fresh, "[checkpoint] tensor '{}' appears in both {} and {}", e.name, c.files_[it->second]->path(), p);
    }
  }
  return c;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> r;
  for (const auto& [n, i] : where_) r.push_back(n);
  return r;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  MT_CHECK(it != where_.end(), "[checkpoint] {} has no tensor '{}'", dir_, name);
  return *files_[it->second];
}

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
  return *file_of(name).find(name);
}

// ---- writing -------------------------------------------------------------------------------

void convert_elements(const void* src, DType sd, void* dst, DType dd, size_t n) {
  if (sd == dd) {
    std::memcpy(dst, src, n * dtype_size(sd));
    return;
  }
  if (sd == DType::kF32 && dd == DType::kBF16) {
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
  } else if (sd == DType::kBF16 && dd == DType::kF32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
  } else if (sd == DType::kF16 && dd == DType::kF32) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    float* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = f16_to_float(s[i]);
  } else {
    MT_CHECK(dtype_is_float(sd) && dtype_is_float(dd), "[convert] {} -> {} is not a float conversion",
             dtype_name(sd), dtype_name(dd));
    for (size_t i = 0; i < n; ++i) store_from_double(dst, dd, i, load_as_double(src, sd, i));
  }
}

TensorWriteSpec tensor_write_spec(const std::string& name, const Tensor& t, DType dtype) {
  MT_CHECK(t.defined(), "[safetensors] tensor '{}' to write is undefined", name);
  TensorWriteSpec s;
  s.name = name;
  s.dtype = dtype;
  s.shape = t.shape();
  s.fill = [t, dtype](void* dst) {
    Tensor h = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
    convert_elements(h.data_ptr(), h.dtype(), dst, dtype, static_cast<size_t>(h.numel()));
  };
  return s;
}

TensorWriteSpec tensor_write_spec(const std::string& name, const Tensor& t) {
  return tensor_write_spec(name, t, t.dtype());
}

void write_safetensors(const std::string& path, const std::vector<TensorWriteSpec>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  ojson h = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t off = 0;
  size_t max_bytes = 0;
  for (const auto& t : tensors) {
    MT_CHECK(!h.contains(t.name) && t.name != "__metadata__", "[safetensors] {}: tensor name '{}' written twice",
             path, t.name);
    MT_CHECK(t.fill, "[safetensors] {}: tensor '{}' has no fill function", path, t.name);
    ojson e = ojson::object();
    e["dtype"] = dtype_safetensors_name(t.dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + t.nbytes()};
    h[t.name] = e;
    off += t.nbytes();
    max_bytes = std::max(max_bytes, t.nbytes());
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  MT_CHECK(f, "[safetensors] cannot create {}: {}", tmp, std::strerror(errno));
  try {
    write_all(f, len, 8, tmp);
    write_all(f, header.data(), header.size(), tmp);
    std::vector<uint8_t> buf(max_bytes);
    for (const auto& t : tensors) {
      t.fill(buf.data());
      write_all(f, buf.data(), t.nbytes(), tmp);
    }
    MT_CHECK(std::fflush(f) == 0 && ::fsync(fileno(f)) == 0, "[safetensors] flushing {} failed: {}", tmp,
             std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  MT_CHECK(std::fclose(f) == 0, "[safetensors] closing {} failed: {}", tmp, std::strerror(errno));
  MT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "[safetensors] renaming {} to {} failed: {}", tmp, path,
           std::strerror(errno));
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir, const std::vector<TensorWriteSpec>& tensors,
                                                   const ShardOptions& opt) {
  MT_CHECK(opt.max_shard_bytes > 0, "[safetensors] max_shard_bytes must be positive");
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0, total = 0;
  std::set<std::string> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(seen.insert(tensors[i].name).second, "[safetensors] {}: tensor name '{}' written twice", dir,
             tensors[i].name);
    const uint64_t b = tensors[i].nbytes();
    if (shards.empty() || (cur > 0 && cur + b > opt.max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += b;
    total += b;
  }
  if (shards.empty()) shards.emplace_back();
  fs::create_directories(dir);
  const size_t n = shards.size();
  std::vector<std::string> names(n);
  for (size_t s = 0; s < n; ++s) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", s + 1, n);
    names[s] = n == 1 ? std::string("model.safetensors") : std::string(buf);
  }
  // Shards are independent files: write them on several threads.
  int threads = opt.threads > 0 ? opt.threads : env_num_threads();
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), n));
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto worker = [&]() {
    for (size_t s; (s = next.fetch_add(1)) < n;) {
      try {
        std::vector<TensorWriteSpec> part;
        for (size_t i : shards[s]) part.push_back(tensors[i]);
        // Within a file, names are sorted, as safetensors' save_file writes them.
        std::sort(part.begin(), part.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
        write_safetensors((fs::path(dir) / names[s]).string(), part, opt.metadata);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!err) err = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (err) std::rethrow_exception(err);
  if (n > 1) {
    nlohmann::json idx;
    idx["metadata"] = {{"total_size", total}};
    nlohmann::json wm = nlohmann::json::object();
    for (size_t s = 0; s < n; ++s)
      for (size_t i : shards[s]) wm[tensors[i].name] = names[s];
    idx["weight_map"] = wm;
    const std::string p = (fs::path(dir) / "model.safetensors.index.json").string();
    std::ofstream out(p);
    out << idx.dump(2) << "\n";
    MT_CHECK(out.good(), "[safetensors] writing {} failed", p);
    names.push_back("model.safetensors.index.json");
  }
  return names;
}

}  // namespace moetrain
