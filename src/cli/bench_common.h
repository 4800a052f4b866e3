// Shared pieces of `moetrain bench` (cmd_bench.cpp, bench_kernels.cpp): timing a piece of device
// work as one profiler region (CUDA events on the GPU, the host clock on the CPU), medians, the
// bf16 GEMM ceiling and the kernel microbenchmarks at a model's shapes (docs/bench.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/context.h"
#include "model/config.h"

namespace moetrain::cli {

double median_of(std::vector<double> v);  // 0 for an empty vector

// Median over `reps` timed calls of fn() after `warmup` untimed ones, in ms. Each timed call is
// one profiler region, so on the GPU it is device time between two events on ctx's stream.
double median_ms(Context& ctx, int warmup, int reps, const std::function<void()>& fn);
// The same for several functions compared with each other: each is warmed up, then every repetition
// times each of them once, in turn. Their medians, in the order given.
std::vector<double> median_ms_interleaved(Context& ctx, int warmup, int reps,
                                          const std::vector<std::function<void()>>& fns);

// The dense GEMM ceiling: C[n,n] = A[n,n] B[n,n] through ops::matmul (cuBLAS bf16 on the GPU,
// OpenBLAS f32 on the CPU), median of `reps` calls.
struct GemmCeiling {
  int64_t n = 0;
  std::string dtype;
  double ms = 0, tflops = 0;
};
GemmCeiling measure_gemm_ceiling(Context& ctx, int64_t n, int reps);

struct KernelBenchOptions {
  int64_t tokens = 4096;      // T: tokens of one micro-batch
  int64_t doc = 1024;         // packed-document length of the second attention case
  int reps = 10, warmup = 3;
  double ceiling_tflops = 0;  // for "% of the GEMM ceiling" (0: not reported)
  std::vector<int64_t> ce_chunks;  // loss-head rows per chunk to time (empty: the model's default)
  double energy_s = 0;             // > 0: also each case's board energy over about this many seconds
  std::vector<std::string> groups;  // case groups to run (gmm, attn, proj, head); empty: all of them
};

// Grouped GEMM gate_up/down (fwd, dx, dW; random top-k routing), attention fwd/bwd (one document
// of T and documents of `doc`), the attention projections (q, k, v as three GEMMs and as one over
// the concatenated weight; o), and the loss head (chunked, the model's, vs full logits GEMM +
// cross-entropy) at the shapes of `mc`. Prints one row per case to stdout as it goes and returns
// them as a JSON array of {name, ms, flops, tflops, pct_of_gemm_ceiling[, peak_extra_bytes][, joules, watts]}.
nlohmann::json run_kernel_benchmarks(Context& ctx, const ModelConfig& mc, const KernelBenchOptions& o);
// Throws unless every group is one of gmm, attn, proj, head (the error names the first that is not).
void check_kernel_groups(const std::vector<std::string>& groups);

}  // namespace moetrain::cli
