// CUDA RMSNorm over the last dim: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), fp32 math.
// Backward (xhat = x * rstd, g = dy * w): dx = rstd * (g - xhat * mean(g * xhat)), one warp per
// row; dw += sum over rows of dy * xhat, as a deterministic two-pass column reduction in fp32
// (fixed chunks of 32 rows, then the chunk partials added in a fixed tree): no atomics.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row
constexpr int64_t kChunkRows = 32;             // dw: rows per chunk (short serial loops)
constexpr int64_t kMaxPartials = int64_t{4} << 20;  // dw: chunk partials held at most (16 MB of f32)

template <typename X, typename W>
__global__ void rmsnorm_fwd_kernel(const X* __restrict__ x, const W* __restrict__ w, float eps,
                                   X* __restrict__ y, float* __restrict__ rstd, int64_t R, int64_t D) {
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const X* xr = x + r * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float v = to_f(xr[i]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[r] = rs;
  X* yr = y + r * D;
  for (int64_t i = lane; i < D; i += 32) yr[i] = from_f<X>(to_f(xr[i]) * rs * to_f(w[i]));
}

template <typename X, typename W, typename G>
__global__ void rmsnorm_bwd_dx_kernel(const X* __restrict__ x, const W* __restrict__ w,
                                      const float* __restrict__ rstd, const G* __restrict__ dy,
                                      X* __restrict__ dx, int64_t R, int64_t D) {
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const X* xr = x + r * D;
  const G* gr = dy + r * D;
  const float rs = rstd[r];
  float dot = 0.0f;
  for (int64_t i = lane; i < D; i += 32) dot += to_f(gr[i]) * to_f(w[i]) * to_f(xr[i]) * rs;
  const float mean_dot = warp_sum(dot) / static_cast<float>(D);
  X* dr = dx + r * D;
  for (int64_t i = lane; i < D; i += 32) {
    const float xhat = to_f(xr[i]) * rs;
    dr[i] = from_f<X>(rs * (to_f(gr[i]) * to_f(w[i]) - xhat * mean_dot));
  }
}

// partial[c, j] = sum over rows of chunk c of dy[r, j] * x[r, j] * rstd[r]
template <typename X, typename G>
__global__ void rmsnorm_dw_partial_kernel(const X* __restrict__ x, const float* __restrict__ rstd,
                                          const G* __restrict__ dy, float* __restrict__ partial, int64_t R,
                                          int64_t D, int64_t rows_per_chunk) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (j >= D) return;
  const int64_t r0 = c * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f(dy[r * D + j]) * to_f(x[r * D + j]) * rstd[r];
  partial[c * D + j] = acc;
}

// out[j] += sum over chunks of partial[c, j]: a 32 x 32 block per 32 columns; thread (tx, ty) sums
// chunks ty, ty + 32, ... of column tx, then row 0 adds the 32 sums in ty order (fixed: deterministic).
__global__ void column_sum_add_kernel(const float* __restrict__ partial, int64_t chunks, int64_t D,
                                      float* __restrict__ out) {
  __shared__ float sums[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = blockIdx.x * 32 + tx;
  float acc = 0.0f;
  if (j < D)
    for (int64_t c = ty; c < chunks; c += 32) acc += partial[c * D + j];
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && j < D) {
    float t = 0.0f;
    for (int k = 0; k < 32; ++k) t += sums[k][tx];
    out[j] += t;
  }
}

}  // namespace

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  need_cuda(x, op, "x");
  need_cuda(w, op, "w");
  need_cuda(y, op, "y");
  need_cuda(rstd, op, "rstd");
  need_dtype(y, x.dtype(), op, "y");
  need_dtype(rstd, DType::kF32, op, "rstd");
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  need_numel(w, D, op, "w");
  need_numel(y, R * D, op, "y");
  need_numel(rstd, R, op, "rstd");
  if (!R) return;
  const unsigned blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    MT_CUDA_DISPATCH(w.dtype(), W, op,
      rmsnorm_fwd_kernel<<<blocks, 32 * kRowsPerBlock, 0, stream_of(ctx)>>>(
          static_cast<const X*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), eps,
          static_cast<X*>(y.data_ptr()), rstd.data<float>(), R, D)));
  check_launch(op);
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw) {
  const char* op = "rmsnorm_backward";
  need_cuda(x, op, "x");
  need_cuda(w, op, "w");
  need_cuda(rstd, op, "rstd");
  need_cuda(dy, op, "dy");
  need_cuda(dx, op, "dx");
  need_cuda(dw, op, "dw");
  need_dtype(dx, x.dtype(), op, "dx");
  need_dtype(rstd, DType::kF32, op, "rstd");
  need_dtype(dw, DType::kF32, op, "dw");
  const int64_t D = x.size(-1), R = D ? x.numel() / D : 0;
  need_numel(w, D, op, "w");
  need_numel(dw, D, op, "dw");
  need_numel(dy, R * D, op, "dy");
  need_numel(dx, R * D, op, "dx");
  need_numel(rstd, R, op, "rstd");
  if (!R) return;
  cudaStream_t s = stream_of(ctx);
  const unsigned blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
  // Chunks of about kChunkRows rows (many short loops: the q/k norms have R = tokens x heads rows
  // of D = 128), fewer when the partials would pass kMaxPartials.
  int64_t chunks = std::min<int64_t>({(R + kChunkRows - 1) / kChunkRows, std::max<int64_t>(kMaxPartials / D, 1),
                                      int64_t{65535} /* grid.y */});
  const int64_t rows_per_chunk = (R + chunks - 1) / chunks;
  chunks = (R + rows_per_chunk - 1) / rows_per_chunk;
  Tensor scratch = device_scratch(ctx, chunks * D * 4);
  float* partial = static_cast<float*>(scratch.data_ptr());
  const dim3 pgrid(static_cast<unsigned>((D + 127) / 128), static_cast<unsigned>(chunks));
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    MT_CUDA_DISPATCH(dy.dtype(), G, op,
      MT_CUDA_DISPATCH(w.dtype(), W, op,
        rmsnorm_bwd_dx_kernel<<<blocks, 32 * kRowsPerBlock, 0, s>>>(
            static_cast<const X*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), rstd.data<float>(),
            static_cast<const G*>(dy.data_ptr()), static_cast<X*>(dx.data_ptr()), R, D));
      rmsnorm_dw_partial_kernel<<<pgrid, 128, 0, s>>>(static_cast<const X*>(x.data_ptr()), rstd.data<float>(),
                                                      static_cast<const G*>(dy.data_ptr()), partial, R, D,
                                                      rows_per_chunk)));
  column_sum_add_kernel<<<static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, s>>>(partial, chunks, D, dw.data<float>());
  check_launch(op);
}

}  // namespace moetrain::cuda
