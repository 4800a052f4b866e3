// Backend test helpers: paired CPU/GPU tensors, guard bytes, comparisons and the results table.
#include "backend_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain::test {

namespace {

constexpr size_t kGuard = 256;  // bytes each side
constexpr uint8_t kPoison = 0xFF;

struct Row {
  std::string op, what, dtype, shape;
  double err, tol;
  bool ok;
};
std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

// GPU tensors made by output(): the whole guarded allocation, for the guard check.
struct GuardInfo {
  std::weak_ptr<Storage> big;  // alive while the view (whose keepalive holds it) is alive
  const void* base;
  size_t bytes;
};
std::vector<std::pair<const void*, GuardInfo>>& guards() {
  static std::vector<std::pair<const void*, GuardInfo>> g;
  return g;
}

class TableEnv : public ::testing::Environment {
 public:
  void TearDown() override {
    if (rows().empty()) return;
    std::printf("\n%-24s %-22s %-5s %-20s %10s %9s %s\n", "op", "output", "dtype", "shape", "rel.err", "tol", "");
    for (const Row& r : rows())
      std::printf("%-24s %-22s %-5s %-20s %10.2e %9.1e %s\n", r.op.c_str(), r.what.c_str(), r.dtype.c_str(),
                  r.shape.c_str(), r.err, r.tol, r.ok ? "ok" : "FAIL");
    int fails = 0;
    for (const Row& r : rows()) fails += !r.ok;
    std::printf("backend table: %zu comparisons, %d failed\n", rows().size(), fails);
  }
};
[[maybe_unused]] ::testing::Environment* const kTableEnv = ::testing::AddGlobalTestEnvironment(new TableEnv);

Tensor to_host_f32(const Tensor& t) {
  device_sync();
  Tensor h = t.to(Device::cpu());
  return h.dtype() == DType::kF32 || h.dtype() == DType::kI32 ? h : h.to(DType::kF32);
}

Pair guarded(const Shape& shape, DType dt, const std::vector<uint8_t>& interior) {
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dt);
  const size_t total = 2 * kGuard + nbytes;
  std::vector<uint8_t> host(total, kPoison);
  if (!interior.empty()) std::memcpy(host.data() + kGuard, interior.data(), nbytes);
  Tensor big = Tensor::empty({static_cast<int64_t>(total)}, DType::kU8, Device::cuda(0));
  copy_bytes(big.data_ptr(), big.device(), host.data(), Device::cpu(), total);
  device_sync();
  Tensor view = Tensor::from_blob(static_cast<char*>(big.data_ptr()) + kGuard, shape, dt, Device::cuda(0),
                                  [big]() {});
  auto& g = guards();
  std::erase_if(g, [](const auto& e) { return e.second.big.expired(); });
  g.push_back({view.data_ptr(), GuardInfo{big.storage(), big.data_ptr(), nbytes}});
  return {Tensor(), view};
}

bool guards_intact(const Tensor& t) {
  for (auto& [ptr, info] : guards()) {
    if (ptr != t.data_ptr() || info.big.expired()) continue;
    device_sync();
    std::vector<uint8_t> host(info.bytes + 2 * kGuard);
    copy_bytes(host.data(), Device::cpu(), info.base, Device::cuda(0), host.size());
    for (size_t i = 0; i < kGuard; ++i)
      if (host[i] != kPoison || host[kGuard + info.bytes + i] != kPoison) return false;
    return true;
  }
  return true;  // not a guarded tensor
}

void record(const std::string& op, const std::string& what, const std::string& dtype, const std::string& shape,
            double err, double tol, bool ok) {
  rows().push_back({op, what, dtype, shape, err, tol, ok});
}

}  // namespace

bool have_gpu() {
  static const bool has = cuda_device_count() > 0;
  return has;
}

Context& cpu_ctx() {
  static Context ctx(Device::cpu());
  return ctx;
}

Context& gpu_ctx() {
  static Context ctx(Device::cuda(0));
  return ctx;
}

void device_sync() {
#ifdef MT_WITH_CUDA
  if (have_gpu()) {
    gpu_ctx().synchronize();
    cudaDeviceSynchronize();
  }
#endif
}

const char* dt_name(DType dt) { return dtype_name(dt); }
double tol_for(DType dt) { return dt == DType::kBF16 ? kTolBf16 : kTolF32; }

// Random inputs in blocks of 2^20 values: block 0 is the stream of std::mt19937_64(seed), as these
// helpers drew before they had blocks (so every tensor of up to 2^20 values keeps its values), and
// block b > 0 draws from a seed mixed from (seed, b). The blocks are filled in parallel: the model-width
// tests draw tensors of 400 M values, which one thread takes about 10 s each to fill.
namespace {
constexpr int64_t kRandBlock = int64_t{1} << 20;
uint64_t block_seed(uint64_t seed, int64_t b) {
  if (b == 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(b);  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
template <class Dist>
std::vector<float> rand_blocks(int64_t n, uint64_t seed, const Dist& proto) {
  std::vector<float> v(static_cast<size_t>(n));
  const int64_t blocks = (n + kRandBlock - 1) / kRandBlock;
  auto fill = [&](int64_t b) {
    std::mt19937_64 g(block_seed(seed, b));
    Dist d = proto;
    const int64_t end = std::min(n, (b + 1) * kRandBlock);
    for (int64_t i = b * kRandBlock; i < end; ++i) v[static_cast<size_t>(i)] = d(g);
  };
  const int64_t threads = std::min<int64_t>(blocks, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t b = 0; b < blocks; ++b) fill(b);
    return v;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int64_t b = next++; b < blocks; b = next++) fill(b);
    });
  for (auto& th : pool) th.join();
  return v;
}
}  // namespace

std::vector<float> randn(int64_t n, uint64_t seed, float scale) {
  return rand_blocks(n, seed, std::normal_distribution<float>(0.0f, scale));
}

std::vector<float> randu(int64_t n, uint64_t seed, float lo, float hi) {
  return rand_blocks(n, seed, std::uniform_real_distribution<float>(lo, hi));
}

Pair input(const std::vector<float>& v, const Shape& shape, DType dt) {
  Tensor typed = Tensor::from_floats(v, shape, dt);  // rounds to dt
  Pair p;
  p.cpu = typed.to(DType::kF32);
  p.gpu = typed.to(Device::cuda(0));
  device_sync();
  return p;
}

Pair input_ints(const std::vector<int32_t>& v, const Shape& shape) {
  Pair p;
  p.cpu = Tensor::from_ints(v, shape);
  p.gpu = p.cpu.to(Device::cuda(0));
  device_sync();
  return p;
}

Pair input_u8(const std::vector<uint8_t>& v, const Shape& shape) {
  Pair p;
  p.cpu = Tensor::empty(shape, DType::kU8);
  std::memcpy(p.cpu.data_ptr(), v.data(), v.size());
  p.gpu = p.cpu.to(Device::cuda(0));
  device_sync();
  return p;
}

Pair output(const Shape& shape, DType dt, const std::vector<float>* init) {
  std::vector<uint8_t> interior;
  Tensor cpu;
  if (init) {
    Tensor typed = Tensor::from_floats(*init, shape, dt);
    interior.resize(typed.nbytes());
    std::memcpy(interior.data(), typed.data_ptr(), typed.nbytes());
    cpu = typed.to(DType::kF32);
  } else {
    cpu = Tensor::zeros(shape, DType::kF32);
  }
  Pair p = guarded(shape, dt, interior);
  p.cpu = cpu;
  return p;
}

Pair output_ints(const Shape& shape) {
  Pair p = guarded(shape, DType::kI32, {});
  p.cpu = Tensor::zeros(shape, DType::kI32);
  return p;
}

double check(const std::string& op, const std::string& what, const Pair& p, double tol) {
  const Tensor g = to_host_f32(p.gpu);
  const Tensor c = p.cpu.dtype() == DType::kF32 ? p.cpu : p.cpu.to(DType::kF32);
  const float* gp = g.data<float>();
  const float* cp = c.data<float>();
  double num = 0.0, den = 0.0;
  int64_t bad = 0, first_bad = -1;
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (std::isfinite(cp[i]) && !std::isfinite(gp[i])) {
      if (first_bad < 0) first_bad = i;
      ++bad;
      continue;
    }
    const double d = static_cast<double>(gp[i]) - cp[i];
    num += d * d;
    den += static_cast<double>(cp[i]) * cp[i];
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool guards_ok = guards_intact(p.gpu);
  const bool ok = bad == 0 && err <= tol && guards_ok;
  record(op, what, dt_name(p.gpu.dtype()), shape_str(p.gpu.shape()), bad ? INFINITY : err, tol, ok);
  EXPECT_EQ(bad, 0) << op << " " << what << ": " << bad << " non-finite GPU values where the CPU is finite (first at "
                    << first_bad << ")";
  EXPECT_LE(err, tol) << op << " " << what << " " << p.gpu.desc();
  EXPECT_TRUE(guards_ok) << op << " " << what << ": guard bytes around the output were overwritten";
  return err;
}

void check_exact(const std::string& op, const std::string& what, const Pair& p) {
  const Tensor g = to_host_f32(p.gpu);
  const Tensor c = p.cpu;
  int64_t diff = 0, first = -1;
  if (g.dtype() == DType::kF32 && c.dtype() == DType::kF32) {  // the same test as get()'s, without its dispatch
    const float* gp = g.data<float>();
    const float* cp = c.data<float>();
    for (int64_t i = 0; i < c.numel(); ++i)
      if (gp[i] != cp[i]) {
        if (first < 0) first = i;
        ++diff;
      }
  } else {
    for (int64_t i = 0; i < c.numel(); ++i)
      if (g.get(i) != c.get(i)) {
        if (first < 0) first = i;
        ++diff;
      }
  }
  const bool guards_ok = guards_intact(p.gpu);
  record(op, what, dt_name(p.gpu.dtype()), shape_str(p.gpu.shape()), static_cast<double>(diff), 0.0,
         diff == 0 && guards_ok);
  EXPECT_EQ(diff, 0) << op << " " << what << ": " << diff << " elements differ, first at " << first << " (gpu "
                     << (first >= 0 ? g.get(first) : 0) << ", cpu " << (first >= 0 ? c.get(first) : 0) << ")";
  EXPECT_TRUE(guards_ok) << op << " " << what << ": guard bytes around the output were overwritten";
}

void check_scalar(const std::string& op, const std::string& what, double gpu, double cpu, double tol) {
  const double err = std::fabs(gpu - cpu) / std::max(std::fabs(cpu), 1e-30);
  const bool ok = std::isfinite(gpu) && err <= tol;
  record(op, what, "f64", "scalar", err, tol, ok);
  EXPECT_TRUE(ok) << op << " " << what << ": gpu " << gpu << " cpu " << cpu;
}

}  // namespace moetrain::test
