// CPU grouped expert GEMM: rows [offsets[e], offsets[e+1]) of x multiply W[e]^T. One
// cblas_sgemm per expert with rows (OpenBLAS threads inside each call, splitting M/N only, so
// results are thread-count independent); experts with no rows are skipped. Rows past
// offsets[E] (unused capacity) get zeros in y and dx. dw may be bf16: f32 sum, one rounding.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace moetrain::cpu {

namespace {
void check_offsets(const int32_t* off, int64_t E, int64_t N, const char* op) {
  MT_CHECK(off[0] == 0, "[{}] offsets[0] = {}, expected 0", op, off[0]);
  for (int64_t e = 0; e < E; ++e)
    MT_CHECK(off[e + 1] >= off[e], "[{}] offsets decrease at expert {} ({} -> {})", op, e, off[e], off[e + 1]);
  MT_CHECK(off[E] <= N, "[{}] offsets[{}] = {} exceeds the {} rows of x", op, E, off[E], N);
}
}  // namespace

void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y) {
  require_f32(x, "grouped_matmul", "x");
  require_f32(w, "grouped_matmul", "w");
  require_f32(y, "grouped_matmul", "y");
  const int64_t N = x.size(0), K = x.size(1), E = w.size(0), M = w.size(1);
  const int32_t* off = offsets.data<int32_t>();
  check_offsets(off, E, N, "grouped_matmul");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (n == 0 || M == 0) continue;
    float* ye = yp + off[e] * M;
    if (K == 0) {
      std::fill(ye, ye + n * M, 0.0f);
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(M),
                static_cast<int>(K), 1.0f, xp + off[e] * K, static_cast<int>(K), wp + e * M * K,
                static_cast<int>(K), 0.0f, ye, static_cast<int>(M));
  }
  std::fill(yp + off[E] * M, yp + N * M, 0.0f);
}

void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dw,
                             Tensor* dw_sum_squares) {
  require_f32(x, "grouped_matmul_backward", "x");
  require_f32(w, "grouped_matmul_backward", "w");
  require_f32(dy, "grouped_matmul_backward", "dy");
  const bool dw_bf16 = dw.dtype() == DType::kBF16;
  if (!dw_bf16) require_f32(dw, "grouped_matmul_backward", "dw");
  if (dx.defined()) require_f32(dx, "grouped_matmul_backward", "dx");
  const int64_t N = x.size(0), K = x.size(1), E = w.size(0), M = w.size(1);
  const int32_t* off = offsets.data<int32_t>();
  check_offsets(off, E, N, "grouped_matmul_backward");
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = dx.defined() ? dx.data<float>() : nullptr;
  float* dwp = dw_bf16 ? nullptr : dw.data<float>();
  uint16_t* dwb = dw_bf16 ? static_cast<uint16_t*>(dw.data_ptr()) : nullptr;
  // bf16 dw: one expert at a time is widened into f32 scratch (outside the allocator: the CUDA
  // kernels round in their epilogue), accumulated, and rounded once (RNE).
  std::vector<float> scratch(dw_bf16 ? static_cast<size_t>(M * K) : 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = off[e + 1] - off[e];
    if (!accumulate_dw && (n == 0 || K == 0)) {  // overwrite mode: an expert with no rows gets zeros
      if (dwp) std::fill(dwp + e * M * K, dwp + (e + 1) * M * K, 0.0f);
      if (dwb) std::fill(dwb + e * M * K, dwb + (e + 1) * M * K, uint16_t{0});
    }
    if (n == 0 || K == 0) continue;
    const float* ge = gp + off[e] * M;
    const float* xe = xp + off[e] * K;
    if (dxp) {
      float* dxe = dxp + off[e] * K;
      if (M == 0) {
        std::fill(dxe, dxe + n * K, 0.0f);
      } else {
        // dx_e [n,K] = dy_e [n,M] W_e [M,K]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(K),
                    static_cast<int>(M), 1.0f, ge, static_cast<int>(M), wp + e * M * K,
                    static_cast<int>(K), 0.0f, dxe, static_cast<int>(K));
      }
    }
    // dW_e [M,K] += dy_e^T [M,n] x_e [n,K]
    if (M > 0) {
      float* de = dwp ? dwp + e * M * K : scratch.data();
      if (dwb && accumulate_dw)
        for (int64_t i = 0; i < M * K; ++i) de[i] = bf16_to_float(dwb[e * M * K + i]);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(M), static_cast<int>(K),
                  static_cast<int>(n), 1.0f, ge, static_cast<int>(M), xe, static_cast<int>(K),
                  accumulate_dw ? 1.0f : 0.0f,
                  de, static_cast<int>(K));
      if (dwb)
        for (int64_t i = 0; i < M * K; ++i) dwb[e * M * K + i] = float_to_bf16(de[i]);
    }
  }
  if (dxp) std::fill(dxp + off[E] * K, dxp + N * K, 0.0f);
  if (dw_sum_squares) {  // of the stored values, in element order
    double s = 0.0;
    for (int64_t i = 0; i < E * M * K; ++i) {
      const double v = dwb ? bf16_to_float(dwb[i]) : dwp[i];
      s += v * v;
    }
    dw_sum_squares->data<double>()[0] += s;
  }
}

}  // namespace moetrain::cpu
