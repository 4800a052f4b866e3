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
// The vector backward's rows per block: at least 16 (two per warp), at most about 512 blocks. The
// planner's rmsnorm_bwd_scratch (plan/mem_trace.cpp) sizes the partials [blocks, D] the same way.
int64_t rmsnorm_bwd_rows_per_block(int64_t R) {
  const int64_t per = (R + 511) / 512;
  return std::max<int64_t>(16, (per + kRowsPerBlock - 1) / kRowsPerBlock * kRowsPerBlock);
}

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

// ---- bf16 rows with D = 32 * EPL (EPL 4 .. 64: head_dim 128, hidden 1024 / 2048): one warp per row,
// each lane holding EPL columns in registers, read and written as 16-byte (or 8-byte) vectors.
// The scalar kernels above read 2 bytes per thread and read x and dy twice in backward (once for
// dx, once for the dw partials); these read each once. Backward also adds dx into the output when
// asked (the residual stream's gradient), which saves the separate add_.
template <int EPL>
struct Lanes {
  static constexpr int kVec = EPL >= 8 ? 8 : EPL;  // elements per vector
  static constexpr int kNV = EPL / kVec;           // vectors per lane
  __device__ static int col(int j, int lane) { return (j * 32 + lane) * kVec; }
  __device__ static void load(const __nv_bfloat16* row, int lane, float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      const __nv_bfloat16* p = row + col(j, lane);
      uint32_t w[kVec / 2];
      if constexpr (kVec == 8) {
        const uint4 q = *reinterpret_cast<const uint4*>(p);
        w[0] = q.x, w[1] = q.y, w[2] = q.z, w[3] = q.w;
      } else {
        const uint2 q = *reinterpret_cast<const uint2*>(p);
        w[0] = q.x, w[1] = q.y;
      }
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        f[j * kVec + 2 * i] = __uint_as_float(w[i] << 16);
        f[j * kVec + 2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
    }
  }
  __device__ static void store(__nv_bfloat16* row, int lane, const float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j) {
      uint32_t w[kVec / 2];
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[j * kVec + 2 * i], f[j * kVec + 2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
      __nv_bfloat16* p = row + col(j, lane);
      if constexpr (kVec == 8) *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
      else *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    }
  }
  template <typename W>
  __device__ static void load_w(const W* w, int lane, float (&f)[EPL]) {
#pragma unroll
    for (int j = 0; j < kNV; ++j)
#pragma unroll
      for (int i = 0; i < kVec; ++i) f[j * kVec + i] = to_f(w[col(j, lane) + i]);
  }
};

template <int EPL, typename W>
__global__ void __launch_bounds__(32 * kRowsPerBlock) rmsnorm_fwd_vec_kernel(
    const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, float eps, __nv_bfloat16* __restrict__ y,
    float* __restrict__ rstd, int64_t R) {
  using L = Lanes<EPL>;
  constexpr int D = 32 * EPL;
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  float v[EPL], wf[EPL];
  L::load(x + r * D, lane, v);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < EPL; ++i) ss += v[i] * v[i];
  ss = warp_sum(ss);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[r] = rs;
  L::load_w(w, lane, wf);
#pragma unroll
  for (int i = 0; i < EPL; ++i) v[i] = v[i] * rs * wf[i];
  L::store(y + r * D, lane, v);
}

// Rows [c * rows_per_block, ...) of block c: warp k takes rows k, k + 8, ...; dx as the scalar kernel
// (+ the old dx when accumulate), and partial[c, :] = sum over the block's rows of dy * x * rstd,
// the 8 warps' register sums added in warp order through shared memory (deterministic).
template <int EPL, typename W>
__global__ void __launch_bounds__(32 * kRowsPerBlock) rmsnorm_bwd_vec_kernel(
    const __nv_bfloat16* __restrict__ x, const W* __restrict__ w, const float* __restrict__ rstd,
    const __nv_bfloat16* __restrict__ dy, __nv_bfloat16* __restrict__ dx, bool accumulate, int64_t R,
    int64_t rows_per_block, float* __restrict__ partial) {
  using L = Lanes<EPL>;
  constexpr int D = 32 * EPL;
  __shared__ float sums[kRowsPerBlock / 2][D];  // 32 KB at D = 2048
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = blockIdx.x * rows_per_block, r1 = min(R, r0 + rows_per_block);
  float wf[EPL], acc[EPL];
  L::load_w(w, lane, wf);
#pragma unroll
  for (int i = 0; i < EPL; ++i) acc[i] = 0.0f;
  for (int64_t r = r0 + warp; r < r1; r += kRowsPerBlock) {
    float xv[EPL], g[EPL];
    L::load(x + r * D, lane, xv);
    L::load(dy + r * D, lane, g);
    const float rs = rstd[r];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) dot += g[i] * wf[i] * xv[i] * rs;
    const float mean_dot = warp_sum(dot) / static_cast<float>(D);
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      acc[i] += g[i] * xv[i] * rs;
      const float xhat = xv[i] * rs;
      g[i] = rs * (g[i] * wf[i] - xhat * mean_dot);
    }
    if (accumulate) {
      L::load(dx + r * D, lane, xv);
#pragma unroll
      for (int i = 0; i < EPL; ++i) g[i] += xv[i];
    }
    L::store(dx + r * D, lane, g);
  }
  // Warps h..2h-1 hand their sums to warps 0..h-1, for h = 4, 2, 1: a fixed tree.
  for (int h = kRowsPerBlock / 2; h >= 1; h /= 2) {
    if (warp >= h && warp < 2 * h)
#pragma unroll
      for (int j = 0; j < L::kNV; ++j)
#pragma unroll
        for (int i = 0; i < L::kVec; ++i) sums[warp - h][L::col(j, lane) + i] = acc[j * L::kVec + i];
    __syncthreads();
    if (warp < h)
#pragma unroll
      for (int j = 0; j < L::kNV; ++j)
#pragma unroll
        for (int i = 0; i < L::kVec; ++i) acc[j * L::kVec + i] += sums[warp][L::col(j, lane) + i];
    __syncthreads();
  }
  if (warp == 0) {
    float* out = partial + blockIdx.x * (int64_t)D;
#pragma unroll
    for (int j = 0; j < L::kNV; ++j)
#pragma unroll
      for (int i = 0; i < L::kVec; ++i) out[L::col(j, lane) + i] = acc[j * L::kVec + i];
  }
}

bool rmsnorm_vec_ok(const Tensor& x, const Tensor& w, std::initializer_list<const Tensor*> rows) {
  const int64_t D = x.size(-1);
  if (x.dtype() != DType::kBF16 || (w.dtype() != DType::kBF16 && w.dtype() != DType::kF32)) return false;
  if (D != 128 && D != 256 && D != 512 && D != 1024 && D != 2048) return false;
  for (const Tensor* t : rows)
    if (t->dtype() != DType::kBF16 || reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  return reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
}

// Runs body.template operator()<EPL>() for D = 32 * EPL.
template <typename F>
void with_epl(int64_t D, F&& body) {
  switch (D) {
    case 128: body.template operator()<4>(); break;
    case 256: body.template operator()<8>(); break;
    case 512: body.template operator()<16>(); break;
    case 1024: body.template operator()<32>(); break;
    default: body.template operator()<64>(); break;
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
  if (rmsnorm_vec_ok(x, w, {&y})) {
    MT_CUDA_DISPATCH(w.dtype(), W, op, with_epl(D, [&]<int EPL>() {
      rmsnorm_fwd_vec_kernel<EPL, W><<<blocks, 32 * kRowsPerBlock, 0, stream_of(ctx)>>>(
          static_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), eps,
          static_cast<__nv_bfloat16*>(y.data_ptr()), rstd.data<float>(), R);
    }));
    check_launch(op);
    return;
  }
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    MT_CUDA_DISPATCH(w.dtype(), W, op,
      rmsnorm_fwd_kernel<<<blocks, 32 * kRowsPerBlock, 0, stream_of(ctx)>>>(
          static_cast<const X*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), eps,
          static_cast<X*>(y.data_ptr()), rstd.data<float>(), R, D)));
  check_launch(op);
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool dx_accumulate) {
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
  if (rmsnorm_vec_ok(x, w, {&dy, &dx})) {
    const int64_t rows_per_block = rmsnorm_bwd_rows_per_block(R);
    const int64_t chunks = (R + rows_per_block - 1) / rows_per_block;
    Tensor scratch = device_scratch(ctx, chunks * D * 4);
    float* partial = static_cast<float*>(scratch.data_ptr());
    MT_CUDA_DISPATCH(w.dtype(), W, op, with_epl(D, [&]<int EPL>() {
      rmsnorm_bwd_vec_kernel<EPL, W><<<static_cast<unsigned>(chunks), 32 * kRowsPerBlock, 0, s>>>(
          static_cast<const __nv_bfloat16*>(x.data_ptr()), static_cast<const W*>(w.data_ptr()), rstd.data<float>(),
          static_cast<const __nv_bfloat16*>(dy.data_ptr()), static_cast<__nv_bfloat16*>(dx.data_ptr()), dx_accumulate,
          R, rows_per_block, partial);
    }));
    column_sum_add_kernel<<<static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, s>>>(partial, chunks, D,
                                                                                        dw.data<float>());
    check_launch(op);
    return;
  }
  // The scalar kernels overwrite dx; an accumulating call forms the norm's part first, then adds.
  Tensor part;
  Tensor* dx_out = &dx;
  if (dx_accumulate) {
    part = Tensor::empty(dx.shape(), dx.dtype(), dx.device(), MemCategory::kWorkspace);
    dx_out = &part;
  }
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
            static_cast<const G*>(dy.data_ptr()), static_cast<X*>(dx_out->data_ptr()), R, D));
      rmsnorm_dw_partial_kernel<<<pgrid, 128, 0, s>>>(static_cast<const X*>(x.data_ptr()), rstd.data<float>(),
                                                      static_cast<const G*>(dy.data_ptr()), partial, R, D,
                                                      rows_per_chunk)));
  column_sum_add_kernel<<<static_cast<unsigned>((D + 31) / 32), dim3(32, 32), 0, s>>>(partial, chunks, D, dw.data<float>());
  check_launch(op);
  if (dx_accumulate) add_(ctx, dx, part, 1.0f);
}

}  // namespace moetrain::cuda
