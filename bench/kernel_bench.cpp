// Kernel microbenchmarks on the GPU for the two ops that dominate a Qwen3-30B-A3B layer step:
// the expert grouped GEMM (forward, dX, dW; offsets on the device) and causal GQA attention
// (forward, backward). Random inputs, warm-up, median of CUDA-event timings; prints one line per
// case: name, ms, TFLOP/s. bench/torch_kernels.py times PyTorch on the same shapes.
// Usage: kernel_bench [--tokens 4096] [--reps 20] [--seqs 4096,8192]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/ops.h"

using namespace moetrain;

namespace {

double median_ms(Context& ctx, int reps, const std::function<void()>& fn) {
  auto s = static_cast<cudaStream_t>(ctx.stream());
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  MT_CUDA_CHECK(cudaEventCreate(&a));
  MT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MT_CUDA_CHECK(cudaEventRecord(a, s));
    fn();
    MT_CUDA_CHECK(cudaEventRecord(b, s));
    MT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  MT_CUDA_CHECK(cudaEventDestroy(a));
  MT_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Tensor randn_dev(Context& ctx, const Shape& shape, DType dt, float std, uint64_t purpose) {
  Tensor t = Tensor::empty(shape, dt, ctx.device());
  ops::fill_normal(ctx, t, 0.0f, std, ctx.rng(purpose));
  return t;
}

void row(const std::string& name, double ms, double flops) {
  std::printf("%-34s %9.3f ms %8.1f TFLOP/s\n", name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

// Routed rows per expert: T tokens each pick k distinct experts uniformly at random.
std::vector<int32_t> route_offsets(int64_t T, int k, int E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> counts(E, 0), pick(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) pick[e] = e;
    for (int j = 0; j < k; ++j) {
      std::swap(pick[j], pick[j + g() % (E - j)]);
      ++counts[pick[j]];
    }
  }
  std::vector<int32_t> off(E + 1, 0);
  for (int e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

void bench_gemm(Context& ctx, int64_t T, int reps) {
  const int E = 128, k = 8;
  const int64_t N = T * k;
  Tensor off = Tensor::from_ints(route_offsets(T, k, E, 42), {E + 1}).to(ctx.device());
  struct Shape3 { const char* name; int64_t K, M; };
  for (const Shape3 s : {Shape3{"gate_up 2048->1536", 2048, 1536}, Shape3{"down 768->2048", 768, 2048}}) {
    Tensor x = randn_dev(ctx, {N, s.K}, DType::kBF16, 1.0f, 1);
    Tensor w = randn_dev(ctx, {E, s.M, s.K}, DType::kBF16, 0.02f, 2);
    Tensor y = Tensor::empty({N, s.M}, DType::kBF16, ctx.device());
    Tensor dy = randn_dev(ctx, {N, s.M}, DType::kBF16, 1.0f, 3);
    Tensor dx = Tensor::empty({N, s.K}, DType::kBF16, ctx.device());
    Tensor dw = Tensor::zeros({E, s.M, s.K}, DType::kF32, ctx.device());
    Tensor none;
    cudaDeviceSynchronize();
    const double f = 2.0 * N * s.K * s.M;
    const std::string tag = std::string("gmm ") + s.name + " T" + std::to_string(T);
    row(tag + " fwd", median_ms(ctx, reps, [&] { ops::grouped_matmul(ctx, x, w, off, y); }), f);
    // dx alone: the dw kernel is timed separately below (dw += is the same cost with dx skipped).
    const double both = median_ms(ctx, reps, [&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, dx, dw); });
    const double dwo = median_ms(ctx, reps, [&] { ops::grouped_matmul_backward(ctx, x, w, off, dy, none, dw); });
    row(tag + " dx", both - dwo, f);
    row(tag + " dw(f32+=)", dwo, f);
    row(tag + " bwd", both, 2 * f);
  }
}

void bench_attention(Context& ctx, int64_t T, int64_t doc, int reps) {
  const int64_t nh = 32, nkv = 4, d = 128;
  std::vector<int32_t> cu{0};
  while (cu.back() < T) cu.push_back(static_cast<int32_t>(std::min<int64_t>(cu.back() + doc, T)));
  int64_t pairs = 0;  // visible (query, key) pairs
  for (size_t i = 1; i < cu.size(); ++i) {
    const int64_t n = cu[i] - cu[i - 1];
    pairs += n * (n + 1) / 2;
  }
  Tensor cus = Tensor::from_ints(cu, {static_cast<int64_t>(cu.size())}).to(ctx.device());
  Tensor q = randn_dev(ctx, {T, nh, d}, DType::kBF16, 1.0f, 11), kk = randn_dev(ctx, {T, nkv, d}, DType::kBF16, 1.0f, 12);
  Tensor v = randn_dev(ctx, {T, nkv, d}, DType::kBF16, 1.0f, 13), g = randn_dev(ctx, {T, nh, d}, DType::kBF16, 1.0f, 14);
  Tensor out = Tensor::empty({T, nh, d}, DType::kBF16, ctx.device()), lse = Tensor::empty({nh, T}, DType::kF32, ctx.device());
  Tensor dq = Tensor::empty({T, nh, d}, DType::kBF16, ctx.device());
  Tensor dk = Tensor::empty({T, nkv, d}, DType::kBF16, ctx.device()), dv = Tensor::empty({T, nkv, d}, DType::kBF16, ctx.device());
  cudaDeviceSynchronize();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int maxlen = static_cast<int>(std::min(doc, T));
  const double f = 4.0 * pairs * d * nh;  // QK^T and PV over visible pairs
  const std::string tag = "attn T" + std::to_string(T) + " doc" + std::to_string(std::min(doc, T));
  row(tag + " fwd", median_ms(ctx, reps, [&] {
        ops::attention_forward(ctx, q, kk, v, cus, maxlen, scale, out, lse);
      }), f);
  row(tag + " bwd", median_ms(ctx, reps, [&] {
        ops::attention_backward(ctx, q, kk, v, out, lse, g, cus, maxlen, scale, dq, dk, dv);
      }), 2.5 * f);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096;
  int reps = 20;
  std::vector<int64_t> seqs{4096, 8192};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seqs")) seqs = parse_list(argv[i + 1]);
  }
  try {
    Context ctx(Device::cuda(0));
    std::printf("device: %s, %d SMs\n", ctx.facts().name.c_str(), ctx.facts().sm_count);
    bench_gemm(ctx, tokens, reps);
    for (int64_t T : seqs) bench_attention(ctx, T, T, reps);
    bench_attention(ctx, seqs.front(), 1024, reps);  // packed: documents of 1024 tokens
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
