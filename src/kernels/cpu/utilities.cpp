// CPU utilities: dtype cast, y += alpha*x, y *= alpha, sum of squares (fp64, fixed-size blocks
// summed in block order so the result does not depend on the thread count; f32 or bf16 input
// for the accumulating form), and Philox normal
// fill (Box-Muller pairs addressed by element index; see cpu_ops.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/philox.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
constexpr int64_t kElemGrain = 1 << 15;        // elementwise work per thread at least
constexpr int64_t kSumBlock = 1 << 14;         // sum_squares partial-sum block (fixed)
}  // namespace

void require_f32(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.dtype() == DType::kF32, "[{}] {} is {}; the CPU backend computes in f32 only", op, name,
           dtype_name(t.dtype()));
}

void require_f32(const char* op, std::initializer_list<Named> tensors) {
  for (const Named& n : tensors) require_f32(n.t, op, n.name);
}

void copy_rows(Context& ctx, const Tensor& src, Tensor& dst) {
  const int64_t rows = src.size(0), row_bytes = src.size(1) * static_cast<int64_t>(src.element_size());
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const int64_t ss = src.stride(0) * static_cast<int64_t>(src.element_size());
  const int64_t ds = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  parallel_for(ctx, rows, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(src.size(1), 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(d + r * ds, s + r * ss, static_cast<size_t>(row_bytes));
  });
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  const DType sd = src.dtype(), dd = dst.dtype();
  const void* s = src.data_ptr();
  void* d = dst.data_ptr();
  parallel_for(ctx, n, kElemGrain, [&](int64_t b, int64_t e) {
    if (sd == DType::kF32 && dd == DType::kBF16) {
      const float* sp = static_cast<const float*>(s);
      uint16_t* dp = static_cast<uint16_t*>(d);
      for (int64_t i = b; i < e; ++i) dp[i] = float_to_bf16(sp[i]);
    } else if (sd == DType::kBF16 && dd == DType::kF32) {
      const uint16_t* sp = static_cast<const uint16_t*>(s);
      float* dp = static_cast<float*>(d);
      for (int64_t i = b; i < e; ++i) dp[i] = bf16_to_float(sp[i]);
    } else if (sd == dd) {
      const size_t es = dtype_size(sd);
      std::memcpy(static_cast<char*>(d) + b * es, static_cast<const char*>(s) + b * es, (e - b) * es);
    } else {
      // Other float pairs go through double (exact for every narrower float format).
      for (int64_t i = b; i < e; ++i) store_from_double(d, dd, i, load_as_double(s, sd, i));
    }
  });
}

void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha) {
  require_f32(y, "add_", "y");
  require_f32(x, "add_", "x");
  float* yp = y.data<float>();
  const float* xp = x.data<float>();
  parallel_for(ctx, y.numel(), kElemGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] += alpha * xp[i];
  });
}

void scale_(Context& ctx, Tensor& y, float alpha) {
  require_f32(y, "scale_", "y");
  float* yp = y.data<float>();
  parallel_for(ctx, y.numel(), kElemGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] *= alpha;
  });
}

namespace {
// Sum of squares in fp64 over fixed blocks of kSumBlock elements, added in block order.
template <typename Load>
double blocked_sum_squares(Context& ctx, int64_t n, Load load) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(ctx, blocks, 4, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      double s = 0.0;
      const int64_t end = std::min(n, (blk + 1) * kSumBlock);
      for (int64_t i = blk * kSumBlock; i < end; ++i) {
        const double v = load(i);
        s += v * v;
      }
      partial[blk] = s;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}
}  // namespace

double sum_squares(Context& ctx, const Tensor& x) {
  require_f32(x, "sum_squares", "x");
  const float* xp = x.data<float>();
  return blocked_sum_squares(ctx, x.numel(), [xp](int64_t i) { return static_cast<double>(xp[i]); });
}

void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc) {
  double s = 0.0;
  if (x.dtype() == DType::kBF16) {
    const uint16_t* xp = static_cast<const uint16_t*>(x.data_ptr());
    s = blocked_sum_squares(ctx, x.numel(), [xp](int64_t i) { return static_cast<double>(bf16_to_float(xp[i])); });
  } else {
    require_f32(x, "sum_squares_accumulate", "x");
    const float* xp = x.data<float>();
    s = blocked_sum_squares(ctx, x.numel(), [xp](int64_t i) { return static_cast<double>(xp[i]); });
  }
  acc.data<double>()[0] += s;
}

void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc) {
  for (const Tensor& x : xs) sum_squares_accumulate(ctx, x, acc);
}

void sum_accumulate(Context&, const Tensor& x, Tensor& acc) {
  const double* xp = x.data<double>();
  double s = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) s += xp[i];
  acc.data<double>()[0] += s;
}

void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream) {
  const int64_t n = t.numel();
  const DType dt = t.dtype();
  void* base = t.data_ptr();
  // Work in pairs so each Philox call is made once; chunk boundaries are pair-aligned.
  const int64_t pairs = (n + 1) / 2;
  parallel_for(ctx, pairs, kElemGrain / 2, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      float z0, z1;
      philox_normal2(philox4x32(stream.key, stream.counter, static_cast<uint64_t>(j)), &z0, &z1);
      const float v0 = mean + std * z0, v1 = mean + std * z1;
      const int64_t i = 2 * j;
      if (dt == DType::kF32) {
        float* p = static_cast<float*>(base);
        p[i] = v0;
        if (i + 1 < n) p[i + 1] = v1;
      } else {
        store_from_double(base, dt, i, v0);
        if (i + 1 < n) store_from_double(base, dt, i + 1, v1);
      }
    }
  });
}

}  // namespace moetrain::cpu
