// safetensors tests: round trips of every dtype, the exact header bytes, byte-identical
// rewrites of files written by transformers/safetensors (tests/reference/fixtures), truncated
// and corrupt files (errors naming file and tensor), sharding and the index.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/safetensors.h"

using namespace moetrain;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& p, const std::string& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// A safetensors file assembled by hand (independent of the writer): u64 length + header + data.
std::string hand_file(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s + header + data;
}

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::path(testing::TempDir()) / ("mt_st_" + std::to_string(::getpid()) + "_" +
                                            testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (fs::path(path) / f).string(); }
};

// Expects `fn` to throw a moetrain::Error whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::vector<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning " << parts[0];
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

Tensor random_tensor(const Shape& s, DType dt, uint32_t seed) {
  Tensor t = Tensor::empty(s, dt);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

const std::vector<std::string> kFixtures = {"dense", "moe_untied", "moe_tied_nonorm", "moe_sparse_step"};
std::string fixture(const std::string& c) {
  return std::string(MT_SOURCE_DIR) + "/tests/reference/fixtures/model/" + c + "/model.safetensors";
}

}  // namespace

TEST(Safetensors, ExactHeaderBytes) {
  TempDir d;
  Tensor a = Tensor::from_floats({1.0f, -2.0f}, {2});
  write_safetensors(d / "a.safetensors", {tensor_write_spec("a", a)});
  // What safetensors' save_file writes for {"a": tensor([1., -2.])}: compact JSON, metadata first,
  // spaces up to a multiple of 8, then little-endian data.
  std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data(8, '\0');
  float v[2] = {1.0f, -2.0f};
  std::memcpy(data.data(), v, 8);
  EXPECT_EQ(read_bytes(d / "a.safetensors"), hand_file(header, data));
  EXPECT_FALSE(fs::exists(d / "a.safetensors.tmp"));
}

TEST(Safetensors, RoundTripEveryDtypeAndEdgeShapes) {
  TempDir d;
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"f32", random_tensor({3, 5}, DType::kF32, 1)},    {"bf16", random_tensor({7}, DType::kBF16, 2)},
      {"f16", random_tensor({2, 3, 4}, DType::kF16, 3)},  {"i32", random_tensor({4}, DType::kI32, 4)},
      {"i64", random_tensor({1, 1}, DType::kI64, 5)},     {"u8", random_tensor({9}, DType::kU8, 6)},
      {"f8", random_tensor({3}, DType::kF8E4M3, 7)},       {"empty", Tensor::empty({0, 4}, DType::kF32)},
      {"scalar", random_tensor({}, DType::kF32, 8)}};
  std::vector<TensorWriteSpec> specs;
  for (auto& [n, t] : ts) specs.push_back(tensor_write_spec(n, t));
  write_safetensors(d / "x.safetensors", specs, {{"format", "pt"}, {"step", "12"}});
  auto f = SafetensorsFile::open(d / "x.safetensors");
  EXPECT_EQ(f->header_size() % 8, 0u);
  EXPECT_EQ(f->metadata().at("step"), "12");
  ASSERT_EQ(f->entries().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& [n, t] = ts[i];
    EXPECT_EQ(f->entries()[i].name, n);  // header order = write order
    Tensor r = f->tensor(n);
    EXPECT_EQ(r.dtype(), t.dtype()) << n;
    EXPECT_EQ(r.shape(), t.shape()) << n;
    EXPECT_EQ(std::memcmp(r.data_ptr(), t.data_ptr(), t.nbytes()), 0) << n;
  }
  // Views keep the mapping alive after the file object is dropped.
  Tensor keep = f->tensor("f32");
  f.reset();
  EXPECT_EQ(std::memcmp(keep.data_ptr(), ts[0].second.data_ptr(), ts[0].second.nbytes()), 0);
  expect_error([&] { SafetensorsFile::open(d / "x.safetensors")->tensor("nope"); }, {"x.safetensors", "nope"});
}

TEST(Safetensors, ConvertingSpec) {
  TempDir d;
  Tensor a = Tensor::from_floats({1.0f, 3.14159f, -1e-3f, 65504.0f}, {2, 2});
  // A strided (transposed) source is written in logical row-major order.
  write_safetensors(d / "c.safetensors", {tensor_write_spec("bf", a, DType::kBF16),
                                          tensor_write_spec("t", a.transpose(0, 1), DType::kF32)});
  auto f = SafetensorsFile::open(d / "c.safetensors");
  Tensor bf = f->tensor("bf");
  ASSERT_EQ(bf.dtype(), DType::kBF16);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(bf.data<uint16_t>()[i], float_to_bf16(a.data<float>()[i]));
  Tensor t = f->tensor("t");
  EXPECT_EQ(t.get(1), a.get(2));
  EXPECT_EQ(t.get(2), a.get(1));
}

TEST(Safetensors, RewriteOfTransformersFilesIsByteIdentical) {
  TempDir d;
  for (const auto& c : kFixtures) {
    auto f = SafetensorsFile::open(fixture(c));
    EXPECT_EQ(f->metadata().at("format"), "pt");
    std::vector<TensorWriteSpec> specs;
    for (const auto& e : f->entries()) specs.push_back(tensor_write_spec(e.name, f->tensor(e.name)));
    write_safetensors(d / (c + ".safetensors"), specs);
    EXPECT_TRUE(read_bytes(d / (c + ".safetensors")) == read_bytes(fixture(c))) << c;
  }
}

TEST(Safetensors, TruncatedFilesNameFileAndTensor) {
  TempDir d;
  const std::string good = read_bytes(fixture("dense"));
  auto f = SafetensorsFile::open(fixture("dense"));
  const size_t data_start = 8 + f->header_size();
  const auto& last = f->entries().back();  // model.norm.weight, the last bytes of the file
  ASSERT_EQ(data_start + last.end, good.size());
  const std::string p = d / "trunc.safetensors";
  write_bytes(p, good.substr(0, 5));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "too short"});
  write_bytes(p, good.substr(0, 8 + f->header_size() / 2));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "header length"});
  write_bytes(p, good.substr(0, good.size() - 1));
  expect_error([&] { SafetensorsFile::open(p); }, {p, last.name, "truncated"});
  write_bytes(p, good.substr(0, data_start));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "truncated"});
  expect_error([&] { SafetensorsFile::open(d / "missing.safetensors"); }, {"missing.safetensors"});
}

TEST(Safetensors, CorruptHeaders) {
  TempDir d;
  const std::string p = d / "bad.safetensors";
  auto check = [&](const std::string& header, size_t data_bytes, std::vector<std::string> parts) {
    write_bytes(p, hand_file(header, std::string(data_bytes, '\0')));
    parts.insert(parts.begin(), p);
    expect_error([&] { SafetensorsFile::open(p); }, parts);
  };
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, {"not valid JSON"});
  check(R"([1,2])", 0, {"not a JSON object"});
  check(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8, {"'a'", "Q7"});
  check(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 12, {"'a'", "12 bytes"});
  check(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8, {"'a'", "shape"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"'a'", "begin > end"});
  check(R"({"a":{"dtype":"F32","shape":[2]}})", 8, {"'a'", "data_offsets"});
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        12, {"overlap"});
  check(R"({"__metadata__":{"format":5}})", 0, {"__metadata__"});
  // Header length field far beyond the file.
  std::string huge(8, '\xff');
  write_bytes(p, huge + "{}");
  expect_error([&] { SafetensorsFile::open(p); }, {p, "header length"});
  // A valid file with a dtype moetrain cannot hold lists it but refuses a view.
  write_bytes(p, hand_file(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')));
  auto f = SafetensorsFile::open(p);
  EXPECT_FALSE(f->entries()[0].dtype_known);
  expect_error([&] { f->tensor("x"); }, {"'x'", "F64"});
}

TEST(Safetensors, ShardingAndIndex) {
  TempDir d;
  std::vector<std::pair<std::string, Tensor>> ts;
  std::vector<TensorWriteSpec> specs;
  for (int i = 0; i < 7; ++i) {
    ts.push_back({"t." + std::to_string(i), random_tensor({10 + 3 * i}, DType::kF32, 100 + i)});
    specs.push_back(tensor_write_spec(ts.back().first, ts.back().second));
  }
  ts.push_back({"big", random_tensor({300}, DType::kF32, 9)});  // 1200 bytes > max: own shard
  specs.push_back(tensor_write_spec("big", ts.back().second));
  ShardOptions opt;
  opt.max_shard_bytes = 200;
  opt.threads = 2;
  auto files = write_safetensors_sharded(d.path, specs, opt);
  ASSERT_GE(files.size(), 4u);
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  const size_t nshards = files.size() - 1;
  char want_first[64];
  std::snprintf(want_first, sizeof(want_first), "model-00001-of-%05zu.safetensors", nshards);
  EXPECT_EQ(files[0], want_first);
  auto idx = nlohmann::json::parse(read_bytes(d / "model.safetensors.index.json"));
  uint64_t total = 0;
  for (auto& [n, t] : ts) total += t.nbytes();
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(idx["weight_map"].size(), ts.size());
  for (size_t s = 0; s < nshards; ++s) {
    auto f = SafetensorsFile::open(d / files[s]);
    uint64_t bytes = 0;
    for (const auto& e : f->entries()) {
      bytes += e.end - e.begin;
      EXPECT_EQ(idx["weight_map"][e.name], files[s]);
    }
    EXPECT_TRUE(bytes <= opt.max_shard_bytes || f->entries().size() == 1) << files[s];
  }
  auto ck = SafetensorsCheckpoint::open_dir(d.path);
  EXPECT_EQ(ck.num_files(), nshards);
  EXPECT_EQ(ck.names().size(), ts.size());
  for (auto& [n, t] : ts) EXPECT_EQ(std::memcmp(ck.tensor(n).data_ptr(), t.data_ptr(), t.nbytes()), 0) << n;

  // An index naming a missing shard, or a tensor its shard does not hold, is an error.
  auto bad = idx;
  bad["weight_map"]["t.0"] = "model-09999-of-09999.safetensors";
  write_bytes(d / "model.safetensors.index.json", bad.dump());
  expect_error([&] { SafetensorsCheckpoint::open_dir(d.path); }, {"model-09999-of-09999.safetensors", "t.0"});
  bad = idx;
  bad["weight_map"]["ghost"] = files[0];
  write_bytes(d / "model.safetensors.index.json", bad.dump());
  expect_error([&] { SafetensorsCheckpoint::open_dir(d.path); }, {"ghost", files[0]});
}

TEST(Safetensors, SingleShardAndDirectoryForms) {
  TempDir d;
  Tensor a = random_tensor({4}, DType::kBF16, 1);
  auto files = write_safetensors_sharded(d.path, {tensor_write_spec("a", a)});
  ASSERT_EQ(files, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  EXPECT_TRUE(SafetensorsCheckpoint::open_dir(d.path).contains("a"));
  // Without index or model.safetensors, every *.safetensors file is read; duplicates are errors.
  fs::rename(d / "model.safetensors", d / "one.safetensors");
  write_safetensors(d / "two.safetensors", {tensor_write_spec("b", a)});
  auto ck = SafetensorsCheckpoint::open_dir(d.path);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  write_safetensors(d / "three.safetensors", {tensor_write_spec("a", a)});
  expect_error([&] { SafetensorsCheckpoint::open_dir(d.path); }, {"'a'", "three.safetensors"});
  TempDir e;
  expect_error([&] { SafetensorsCheckpoint::open_dir(e.path + "/nothing"); }, {"not a directory"});
  expect_error([&] { SafetensorsCheckpoint::open_dir(e.path); }, {"no model.safetensors"});
  // Duplicate names in one write are refused before anything is written.
  expect_error([&] { write_safetensors_sharded(e.path, {tensor_write_spec("a", a), tensor_write_spec("a", a)}); },
               {"'a'", "twice"});
}
