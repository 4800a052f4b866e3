// Helpers for the CUDA-vs-CPU backend tests: paired inputs (the same values on the CPU in f32 and
// on the GPU in the tested dtype), guarded GPU outputs (poisoned guard bytes on both sides,
// checked after the op; poisoned interiors for overwritten outputs, so skipped writes show up),
// normalized-error comparison with NaN/Inf checks, and a results table printed at exit.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"

namespace moetrain::test {

// Tolerances on ||gpu - cpu|| / ||cpu||. bf16 outputs carry one bf16 rounding (2^-9 relative) plus
// fp32 reordering; f32 outputs of f32 runs only fp32 reordering against the CPU's double sums.
constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32FromBf16 = 2e-3;  // f32 outputs computed from bf16 intermediates
constexpr double kTolF32 = 2e-5;

bool have_gpu();
#define MT_REQUIRE_GPU()                                             \
  do {                                                               \
    if (!::moetrain::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

Context& cpu_ctx();
Context& gpu_ctx();
void device_sync();  // waits for all device work (Context stream and legacy copies)

// Same values on both sides: `cpu` is f32 (the reference backend computes in f32 only), `gpu`
// holds them in `dt` (the CPU side gets the values rounded to dt, so both see equal inputs).
struct Pair {
  Tensor cpu;
  Tensor gpu;
};

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f);
std::vector<float> randu(int64_t n, uint64_t seed, float lo, float hi);
Pair input(const std::vector<float>& v, const Shape& shape, DType dt);
Pair input_ints(const std::vector<int32_t>& v, const Shape& shape);
Pair input_u8(const std::vector<uint8_t>& v, const Shape& shape);
// An output: the GPU tensor sits between guard bytes (0xFF); its interior is poisoned with NaN
// (0xFF bytes) unless `init` is given: then both sides start from those values (rounded to dt),
// for += and in-place outputs.
Pair output(const Shape& shape, DType dt, const std::vector<float>* init = nullptr);
Pair output_ints(const Shape& shape);  // poisoned with -1

// Compares the GPU tensor with the CPU one (normalized error <= tol, finite where the reference
// is), checks the guard bytes and records a row for the table. Returns the error.
double check(const std::string& op, const std::string& what, const Pair& p, double tol);
// Exact comparison for integer outputs (indices, counts).
void check_exact(const std::string& op, const std::string& what, const Pair& p);
// Records a scalar comparison (|a - b| / max(|b|, tiny)).
void check_scalar(const std::string& op, const std::string& what, double gpu, double cpu, double tol);

const char* dt_name(DType dt);
double tol_for(DType dt);

}  // namespace moetrain::test
