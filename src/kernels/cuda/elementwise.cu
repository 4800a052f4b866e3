// Elementwise CUDA ops: cast, add_, scale_, sum_squares (fp64, deterministic two-pass reduction),
// fill_normal (the CPU's Philox/Box-Muller mapping: element 2j / 2j+1 take the cosine / sine of
// pair j), SwiGLU forward/backward, the device-side sum-of-squares accumulation (gradient norms
// without a host read) and the AdamW step (weights, grads, m, v each f32 or bf16; one kernel
// templated on the storage types, 16-byte vector loads when aligned; bit-identical to the CPU).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "kernels/cuda/adamw_kernel.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/need_rows.cuh"

namespace moetrain::cuda {

namespace {

namespace am = adamw_math;
constexpr int kThreads = 256;

template <typename S, typename D>
__global__ void cast_kernel(const S* __restrict__ s, D* __restrict__ d, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    d[i] = from_f<D>(to_f(s[i]));
}

// dst[r, :] = src[r, :] in 16-byte words (w16 per row; the strides in the same words).
__global__ void copy_rows16_kernel(const uint4* __restrict__ s, int64_t ss, uint4* __restrict__ d, int64_t ds,
                                   int64_t rows, int64_t w16) {
  pdl_wait();
  const int64_t n = rows * w16;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / w16, c = i - r * w16;
    d[r * ds + c] = s[r * ss + c];
  }
}

template <typename Y, typename X>
__global__ void add_kernel(Y* __restrict__ y, const X* __restrict__ x, float alpha, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<Y>(to_f(y[i]) + alpha * to_f(x[i]));
}

template <typename Y>
__global__ void scale_kernel(Y* __restrict__ y, float alpha, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_f<Y>(to_f(y[i]) * alpha);
}

// Pass 1: each block sums squares of a grid-stride subset in fp64; pass 2 adds the partials in
// block order. The grid size depends only on n, so the result is reproducible run to run.
// One block's share (block `b` of `nb`) of the squares of x, as sum_squares_partial computes it.
template <typename X>
__device__ double sum_squares_block(const X* __restrict__ x, int64_t n, int64_t b, int64_t nb, double* scratch) {
  double s = 0.0;
  const int64_t tid = b * (int64_t)blockDim.x + threadIdx.x, stride = nb * blockDim.x;
  // 16-byte loads when aligned (gradients always are): a fixed element-to-thread map, so the sum is
  // still deterministic; the scalar loop takes the tail (or everything when unaligned).
  constexpr int kVec = 16 / sizeof(X);
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t nv = n / kVec;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int64_t i = tid; i < nv; i += stride) {
      const uint4 raw = xv[i];
      const X* e = reinterpret_cast<const X*>(&raw);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const double v = to_f(e[j]);
        s += v * v;
      }
    }
    done = nv * kVec;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    double v = to_f(x[i]);
    s += v * v;
  }
  return block_sum(s, scratch);
}

template <typename X>
__global__ void sum_squares_partial(const X* __restrict__ x, int64_t n, double* __restrict__ partial) {
  pdl_wait();
  __shared__ double scratch[32];
  const double s = sum_squares_block(x, n, blockIdx.x, gridDim.x, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Many tensors in one launch: tensor i owns blocks [first[i], first[i + 1]), as many as its own
// sum_squares_partial grid, so each partial is the one that launch would write.
constexpr int kManyMax = 48;
struct SquaresList {
  const void* p[kManyMax];
  int64_t n[kManyMax];
  int32_t first[kManyMax + 1];
  uint8_t bf16[kManyMax];
  int count;
};
__global__ void sum_squares_many_partial(const SquaresList L, double* __restrict__ partial) {
  pdl_wait();
  __shared__ double scratch[32];
  int i = 0;
  while (i + 1 < L.count && static_cast<int>(blockIdx.x) >= L.first[i + 1]) ++i;
  const int64_t b = blockIdx.x - L.first[i], nb = L.first[i + 1] - L.first[i];
  const double s = L.bf16[i] ? sum_squares_block(static_cast<const __nv_bfloat16*>(L.p[i]), L.n[i], b, nb, scratch)
                             : sum_squares_block(static_cast<const float*>(L.p[i]), L.n[i], b, nb, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

template <typename X>
__global__ void sum_partial(const X* __restrict__ x, int64_t n, double* __restrict__ partial) {
  pdl_wait();
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s += to_f(x[i]);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Thread t's part of a one-block sum: partial[t], partial[t + blockDim.x], ... added in that order,
// with up to 8 of the loads issued before the first add (an L2 round trip per 8 values instead of
// one per value; the adds and their order, and so the bits, are the plain loop's).
__device__ __forceinline__ double strided_sum(const double* __restrict__ partial, int n) {
  double s = 0.0;
  const int step = static_cast<int>(blockDim.x);
  int i = static_cast<int>(threadIdx.x);
  for (; i + 7 * step < n; i += 8 * step) {
    double v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = partial[i + u * step];
#pragma unroll
    for (int u = 0; u < 8; ++u) s += v[u];
  }
  for (; i < n; i += step) s += partial[i];
  return s;
}

__global__ void sum_partials(const double* __restrict__ partial, int n, double* __restrict__ out) {
  pdl_wait();
  __shared__ double scratch[32];
  double s = strided_sum(partial, n);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

template <typename T>
__global__ void fill_normal_kernel(T* __restrict__ t, int64_t n, float mean, float std, uint64_t key,
                                   uint64_t counter) {
  pdl_wait();
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < pairs; j += (int64_t)gridDim.x * blockDim.x) {
    float z0, z1;
    philox_normal2(philox4x32(key, counter, static_cast<uint64_t>(j)), &z0, &z1);
    t[2 * j] = from_f<T>(mean + std * z0);
    if (2 * j + 1 < n) t[2 * j + 1] = from_f<T>(mean + std * z1);
  }
}

// silu(g) * u rounded to T: the forward's stored value, and what the weighted backward recomputes.
template <typename T>
__device__ __forceinline__ T swiglu_value(float g, float u) {
  const float sg = 1.0f / (1.0f + expf(-g));
  return from_f<T>(g * sg * u);
}
// The forward's output: the value itself, or the row weight times it (rounded again).
template <typename T>
__device__ __forceinline__ T swiglu_out(float g, float u, const float* __restrict__ w, int64_t r) {
  const T a = swiglu_value<T>(g, u);
  return w ? from_f<T>(w[r] * to_f(a)) : a;
}

template <typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ gu, const float* __restrict__ w, T* __restrict__ h,
                                  int64_t rows, int64_t inter) {
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / inter, c = i - r * inter;
    h[i] = swiglu_out<T>(to_f(gu[r * 2 * inter + c]), to_f(gu[r * 2 * inter + inter + c]), w, r);
  }
}

template <typename T, typename DH>
__global__ void swiglu_bwd_kernel(const T* __restrict__ gu, const DH* __restrict__ dh, T* __restrict__ dgu,
                                  int64_t rows, int64_t inter) {
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / inter, c = i - r * inter;
    const float g = to_f(gu[r * 2 * inter + c]), u = to_f(gu[r * 2 * inter + inter + c]);
    const float d = to_f(dh[i]);
    const float sg = 1.0f / (1.0f + expf(-g));
    // d silu(g)/dg = sg * (1 + g * (1 - sg))
    dgu[r * 2 * inter + c] = from_f<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
    dgu[r * 2 * inter + inter + c] = from_f<T>(d * g * sg);
  }
}

// The same two kernels on 16-byte vectors of kV = 16 / sizeof(T) elements (inter % kV == 0, all
// pointers 16-byte aligned): the same arithmetic per element, so the same bits.
template <typename T>
__global__ void swiglu_fwd_vec_kernel(const T* __restrict__ gu, const float* __restrict__ w, T* __restrict__ h,
                                      int64_t rows, int64_t inter) {
  pdl_wait();
  constexpr int kV = 16 / sizeof(T);
  const int64_t iv = inter / kV, n = rows * iv;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = v / iv, c = (v - r * iv) * kV;
    const uint4 graw = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + c);
    const uint4 uraw = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c);
    const T* ge = reinterpret_cast<const T*>(&graw);
    const T* ue = reinterpret_cast<const T*>(&uraw);
    uint4 out;
    T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < kV; ++j) oe[j] = swiglu_out<T>(to_f(ge[j]), to_f(ue[j]), w, r);
    *reinterpret_cast<uint4*>(h + r * inter + c) = out;
  }
}

template <typename T>
__global__ void swiglu_bwd_vec_kernel(const T* __restrict__ gu, const T* __restrict__ dh, T* __restrict__ dgu,
                                      int64_t rows, int64_t inter) {
  pdl_wait();
  constexpr int kV = 16 / sizeof(T);
  const int64_t iv = inter / kV, n = rows * iv;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < n; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = v / iv, c = (v - r * iv) * kV;
    const uint4 graw = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + c);
    const uint4 uraw = *reinterpret_cast<const uint4*>(gu + r * 2 * inter + inter + c);
    const uint4 draw = *reinterpret_cast<const uint4*>(dh + r * inter + c);
    const T* ge = reinterpret_cast<const T*>(&graw);
    const T* ue = reinterpret_cast<const T*>(&uraw);
    const T* de = reinterpret_cast<const T*>(&draw);
    uint4 og, ou;
    T* oge = reinterpret_cast<T*>(&og);
    T* oue = reinterpret_cast<T*>(&ou);
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const float g = to_f(ge[j]), u = to_f(ue[j]), d = to_f(de[j]);
      const float sg = 1.0f / (1.0f + expf(-g));
      oge[j] = from_f<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
      oue[j] = from_f<T>(d * g * sg);
    }
    *reinterpret_cast<uint4*>(dgu + r * 2 * inter + c) = og;
    *reinterpret_cast<uint4*>(dgu + r * 2 * inter + inter + c) = ou;
  }
}

// Weighted backward, one warp per row: dgu from w[r] * dh (in f32), and dw[r] = sum_c dh * a with a
// the forward's rounded value. Each lane sums its columns in order (16-byte packs of kV when
// `packs`, else single columns strided by 32), then a fixed xor tree sums the lanes.
template <typename T>
__global__ void swiglu_bwd_weighted_kernel(const T* __restrict__ gu, const T* __restrict__ dh,
                                           const float* __restrict__ w, T* __restrict__ dgu, float* __restrict__ dw,
                                           int64_t rows, int64_t inter, bool packs) {
  pdl_wait();
  constexpr int kV = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const T* g_row = gu + r * 2 * inter;
  const T* d_row = dh + r * inter;
  T* dg_row = dgu + r * 2 * inter;
  const float wr = w[r];
  float dot = 0.0f;
  auto one = [&](float g, float u, float d, T& og, T& ou) {
    dot += d * to_f(swiglu_value<T>(g, u));
    const float sg = 1.0f / (1.0f + expf(-g));
    const float dd = wr * d;
    og = from_f<T>(dd * u * sg * (1.0f + g * (1.0f - sg)));
    ou = from_f<T>(dd * g * sg);
  };
  if (packs) {
    for (int64_t c = static_cast<int64_t>(lane) * kV; c < inter; c += 32 * kV) {
      const uint4 graw = *reinterpret_cast<const uint4*>(g_row + c);
      const uint4 uraw = *reinterpret_cast<const uint4*>(g_row + inter + c);
      const uint4 draw = *reinterpret_cast<const uint4*>(d_row + c);
      const T* ge = reinterpret_cast<const T*>(&graw);
      const T* ue = reinterpret_cast<const T*>(&uraw);
      const T* de = reinterpret_cast<const T*>(&draw);
      uint4 og, ou;
      T* oge = reinterpret_cast<T*>(&og);
      T* oue = reinterpret_cast<T*>(&ou);
#pragma unroll
      for (int j = 0; j < kV; ++j) one(to_f(ge[j]), to_f(ue[j]), to_f(de[j]), oge[j], oue[j]);
      *reinterpret_cast<uint4*>(dg_row + c) = og;
      *reinterpret_cast<uint4*>(dg_row + inter + c) = ou;
    }
  } else {
    for (int64_t c = lane; c < inter; c += 32) one(to_f(g_row[c]), to_f(g_row[inter + c]), to_f(d_row[c]), dg_row[c],
                                                   dg_row[inter + c]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (lane == 0) dw[r] = dot;
}

bool vec16_ok(int64_t inter, size_t elem, std::initializer_list<const void*> ptrs) {
  if (inter % static_cast<int64_t>(16 / elem) != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// acc[0] += sum of the partials, in block order (one thread: a handful of values).
__global__ void add_partials(const double* __restrict__ partial, int n, double* __restrict__ acc) {
  pdl_wait();
  __shared__ double scratch[32];
  double s = strided_sum(partial, n);
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) acc[0] += s;
}

}  // namespace

template <typename X>
double reduce_to_host(Context& ctx, const X* x, int64_t n, bool square) {
  if (n <= 0) return 0.0;
  const unsigned blocks = grid_for(n, kThreads, 1024);
  Tensor tmp = device_scratch(ctx, static_cast<int64_t>(blocks + 1) * 8);
  double* partial = static_cast<double*>(tmp.data_ptr());
  if (square) {
    launch_pdl(sum_squares_partial<X>, blocks, kThreads, 0, stream_of(ctx), x, n, partial);
  } else {
    launch_pdl(sum_partial<X>, blocks, kThreads, 0, stream_of(ctx), x, n, partial);
  }
  launch_pdl(sum_partials, 1, 1024, 0, stream_of(ctx), partial, blocks, partial + blocks);
  check_launch("reduce_to_host");
  double out = 0.0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&out, partial + blocks, 8, cudaMemcpyDeviceToHost, stream_of(ctx)));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  return out;
}
template double reduce_to_host<float>(Context&, const float*, int64_t, bool);
template double reduce_to_host<__nv_bfloat16>(Context&, const __nv_bfloat16*, int64_t, bool);

void copy_rows(Context& ctx, const Tensor& src, Tensor& dst) {
  need_cuda_rows(src, "copy_rows", "src");
  need_cuda_rows(dst, "copy_rows", "dst");
  const int64_t rows = src.size(0), es = static_cast<int64_t>(src.element_size());
  const int64_t row_bytes = src.size(1) * es, ss = src.stride(0) * es, ds = dst.stride(0) * es;
  const uintptr_t align = reinterpret_cast<uintptr_t>(src.data_ptr()) | reinterpret_cast<uintptr_t>(dst.data_ptr());
  if ((align | static_cast<uintptr_t>(row_bytes | ss | ds)) % 16 == 0) {
    const int64_t w16 = row_bytes / 16;
    launch_pdl(copy_rows16_kernel, grid_for(rows * w16), kThreads, 0, stream_of(ctx),
               static_cast<const uint4*>(src.data_ptr()), ss / 16, static_cast<uint4*>(dst.data_ptr()), ds / 16, rows, w16);
    check_launch("copy_rows");
    return;
  }
  MT_CUDA_CHECK(cudaMemcpy2DAsync(dst.data_ptr(), static_cast<size_t>(ds), src.data_ptr(), static_cast<size_t>(ss),
                                  static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                  stream_of(ctx)));
}

void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  need_cuda(src, "cast", "src");
  need_cuda(dst, "cast", "dst");
  need_numel(dst, src.numel(), "cast", "dst");
  const int64_t n = src.numel();
  if (!n) return;
  if (src.dtype() == dst.dtype()) {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                  stream_of(ctx)));
    return;
  }
  auto launch = [&](auto* s) {
    using S = std::remove_pointer_t<decltype(s)>;
    switch (dst.dtype()) {
      case DType::kF32: launch_pdl(cast_kernel<S, float>, grid_for(n), kThreads, 0, stream_of(ctx), s, dst.data<float>(), n); break;
      case DType::kBF16:
        launch_pdl(cast_kernel<S, __nv_bfloat16>, grid_for(n), kThreads, 0, stream_of(ctx), s, static_cast<__nv_bfloat16*>(dst.data_ptr()), n);
        break;
      case DType::kF16:
        launch_pdl(cast_kernel<S, __half>, grid_for(n), kThreads, 0, stream_of(ctx), s, static_cast<__half*>(dst.data_ptr()), n);
        break;
      default: MT_FAIL("[cast] destination dtype {} is not supported on CUDA", dtype_name(dst.dtype()));
    }
  };
  switch (src.dtype()) {
    case DType::kF32: launch(static_cast<const float*>(src.data_ptr())); break;
    case DType::kBF16: launch(static_cast<const __nv_bfloat16*>(src.data_ptr())); break;
    case DType::kF16: launch(static_cast<const __half*>(src.data_ptr())); break;
    default: MT_FAIL("[cast] source dtype {} is not supported on CUDA", dtype_name(src.dtype()));
  }
  check_launch("cast");
}

void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha) {
  need_cuda(y, "add_", "y");
  need_cuda(x, "add_", "x");
  need_numel(x, y.numel(), "add_", "x");
  const int64_t n = y.numel();
  if (!n) return;
  MT_CUDA_DISPATCH(y.dtype(), Y, "add_",
    MT_CUDA_DISPATCH(x.dtype(), X, "add_",
      launch_pdl(add_kernel<Y, X>, grid_for(n), kThreads, 0, stream_of(ctx), static_cast<Y*>(y.data_ptr()),
                                                               static_cast<const X*>(x.data_ptr()), alpha, n)));
  check_launch("add_");
}

void scale_(Context& ctx, Tensor& y, float alpha) {
  need_cuda(y, "scale_", "y");
  const int64_t n = y.numel();
  if (!n) return;
  MT_CUDA_DISPATCH(y.dtype(), Y, "scale_",
    launch_pdl(scale_kernel<Y>, grid_for(n), kThreads, 0, stream_of(ctx), static_cast<Y*>(y.data_ptr()), alpha, n));
  check_launch("scale_");
}

double sum_squares(Context& ctx, const Tensor& x) {
  need_cuda(x, "sum_squares", "x");
  const int64_t n = x.numel();
  if (!n) return 0.0;
  MT_CUDA_DISPATCH(x.dtype(), X, "sum_squares",
    return reduce_to_host(ctx, static_cast<const X*>(x.data_ptr()), n, true));
  return 0.0;
}

void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream) {
  need_cuda(t, "fill_normal", "t");
  const int64_t n = t.numel();
  if (!n) return;
  MT_CUDA_DISPATCH(t.dtype(), T, "fill_normal",
    launch_pdl(fill_normal_kernel<T>, grid_for((n + 1) / 2), kThreads, 0, stream_of(ctx),
        static_cast<T*>(t.data_ptr()), n, mean, std, stream.key, stream.counter));
  check_launch("fill_normal");
}

void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h, const Tensor& row_w) {
  need_cuda(gu, "swiglu_forward", "gu");
  need_cuda(h, "swiglu_forward", "h");
  need_dtype(h, gu.dtype(), "swiglu_forward", "h");
  const int64_t inter = h.size(-1), rows = inter ? h.numel() / inter : 0;
  need_numel(gu, rows * 2 * inter, "swiglu_forward", "gu");
  const float* w = nullptr;
  if (row_w.defined()) {
    need_cuda(row_w, "swiglu_forward", "row_w");
    need_dtype(row_w, DType::kF32, "swiglu_forward", "row_w");
    need_numel(row_w, rows, "swiglu_forward", "row_w");
    w = row_w.data<float>();
  }
  if (!rows || !inter) return;
  MT_CUDA_DISPATCH(gu.dtype(), T, "swiglu_forward",
    if (vec16_ok(inter, sizeof(T), {gu.data_ptr(), h.data_ptr()})) {
      launch_pdl(swiglu_fwd_vec_kernel<T>, grid_for(rows * inter / (16 / sizeof(T))), kThreads, 0, stream_of(ctx),
          static_cast<const T*>(gu.data_ptr()), w, static_cast<T*>(h.data_ptr()), rows, inter);
    } else {
      launch_pdl(swiglu_fwd_kernel<T>, grid_for(rows * inter), kThreads, 0, stream_of(ctx),
          static_cast<const T*>(gu.data_ptr()), w, static_cast<T*>(h.data_ptr()), rows, inter);
    });
  check_launch("swiglu_forward");
}

void swiglu_backward_weighted(Context& ctx, const Tensor& gu, const Tensor& dh, const Tensor& row_w, Tensor& dgu,
                              Tensor& drow_w) {
  const char* op = "swiglu_backward_weighted";
  for (const Tensor* t : {&gu, &dh, &row_w, static_cast<const Tensor*>(&dgu), static_cast<const Tensor*>(&drow_w)})
    need_cuda(*t, op, "tensor");
  need_dtype(dh, gu.dtype(), op, "dh");
  need_dtype(dgu, gu.dtype(), op, "dgu");
  need_dtype(row_w, DType::kF32, op, "row_w");
  need_dtype(drow_w, DType::kF32, op, "drow_w");
  const int64_t inter = dh.size(-1), rows = inter ? dh.numel() / inter : 0;
  need_numel(gu, rows * 2 * inter, op, "gu");
  need_numel(dgu, rows * 2 * inter, op, "dgu");
  need_numel(row_w, rows, op, "row_w");
  need_numel(drow_w, rows, op, "drow_w");
  if (!rows) return;
  constexpr int kRowsPerBlock = kThreads / 32;
  MT_CUDA_DISPATCH(gu.dtype(), T, op,
    const bool packs = vec16_ok(inter, sizeof(T), {gu.data_ptr(), dh.data_ptr(), dgu.data_ptr()});
    launch_pdl(swiglu_bwd_weighted_kernel<T>, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
        kThreads, 0, stream_of(ctx), static_cast<const T*>(gu.data_ptr()), static_cast<const T*>(dh.data_ptr()),
        row_w.data<float>(), static_cast<T*>(dgu.data_ptr()), drow_w.data<float>(), rows, inter, packs));
  check_launch(op);
}

void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu) {
  need_cuda(gu, "swiglu_backward", "gu");
  need_cuda(dh, "swiglu_backward", "dh");
  need_cuda(dgu, "swiglu_backward", "dgu");
  need_dtype(dgu, gu.dtype(), "swiglu_backward", "dgu");
  const int64_t inter = dh.size(-1), rows = inter ? dh.numel() / inter : 0;
  need_numel(gu, rows * 2 * inter, "swiglu_backward", "gu");
  need_numel(dgu, rows * 2 * inter, "swiglu_backward", "dgu");
  if (!rows || !inter) return;
  if (dh.dtype() == gu.dtype()) {
    MT_CUDA_DISPATCH(gu.dtype(), T, "swiglu_backward",
      if (vec16_ok(inter, sizeof(T), {gu.data_ptr(), dh.data_ptr(), dgu.data_ptr()})) {
        launch_pdl(swiglu_bwd_vec_kernel<T>, grid_for(rows * inter / (16 / sizeof(T))), kThreads, 0, stream_of(ctx),
            static_cast<const T*>(gu.data_ptr()), static_cast<const T*>(dh.data_ptr()), static_cast<T*>(dgu.data_ptr()),
            rows, inter);
        check_launch("swiglu_backward");
        return;
      });
  }
  MT_CUDA_DISPATCH(gu.dtype(), T, "swiglu_backward",
    MT_CUDA_DISPATCH(dh.dtype(), DH, "swiglu_backward",
      launch_pdl(swiglu_bwd_kernel<T, DH>, grid_for(rows * inter), kThreads, 0, stream_of(ctx),
          static_cast<const T*>(gu.data_ptr()), static_cast<const DH*>(dh.data_ptr()),
          static_cast<T*>(dgu.data_ptr()), rows, inter)));
  check_launch("swiglu_backward");
}

namespace {
// Runtime dtype -> storage pointer (float* or uint16_t* of bf16 bits).
template <typename Fn>
void with_storage(const Tensor& t, const char* op, const char* name, Fn&& fn) {
  switch (t.dtype()) {
    case DType::kF32: fn(static_cast<float*>(t.data_ptr())); break;
    case DType::kBF16: fn(static_cast<uint16_t*>(t.data_ptr())); break;
    default: MT_FAIL("[{}] {} is {}, expected f32 or bf16", op, name, dtype_name(t.dtype()));
  }
}
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// AdamW's operands on this device with master's element count (compute optional); returns it.
int64_t checked_adamw_numel(const char* op, const Tensor& master, const Tensor& grad, const Tensor& m,
                            const Tensor& v, const Tensor& compute, int64_t step) {
  need_cuda(master, op, "master");
  need_cuda(grad, op, "grad");
  need_cuda(m, op, "m");
  need_cuda(v, op, "v");
  const int64_t n = master.numel();
  need_numel(grad, n, op, "grad");
  need_numel(m, n, op, "m");
  need_numel(v, n, op, "v");
  if (compute.defined()) {
    need_cuda(compute, op, "compute");
    need_numel(compute, n, op, "compute");
  }
  MT_CHECK(step >= 1, "[{}] step is {}, expected >= 1 (1-based for bias correction)", op, step);
  return n;
}
}  // namespace

void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& p, Tensor& compute) {
  const char* op = "adamw_step";
  const int64_t n = checked_adamw_numel(op, master, grad, m, v, compute, p.step);
  if (!n) return;
  // Bias corrections in double, then rounded once (the CPU twin's constants, kernels/adamw_math.h).
  const am::Consts k = am::make_consts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale);
  const bool vec = aligned16(master.data_ptr()) && aligned16(grad.data_ptr()) && aligned16(m.data_ptr()) &&
                   aligned16(v.data_ptr()) && (!compute.defined() || aligned16(compute.data_ptr()));
  auto launch = [&](auto* wp, auto* gp, auto* mp, auto* vp, auto* cp) {
    using W = std::remove_pointer_t<decltype(wp)>;
    using G = std::remove_pointer_t<decltype(gp)>;
    using M = std::remove_pointer_t<decltype(mp)>;
    using V = std::remove_pointer_t<decltype(vp)>;
    using C = std::remove_pointer_t<decltype(cp)>;
    if (vec)
      launch_pdl(adamw_detail::adamw_kernel<W, G, M, V, C, true>, grid_for((n + 7) / 8), kThreads, 0, stream_of(ctx),
          wp, gp, mp, vp, cp, n, k, p.stochastic_rounding, p.rng.key, p.rng.counter);
    else
      launch_pdl(adamw_detail::adamw_kernel<W, G, M, V, C, false>, grid_for(n), kThreads, 0, stream_of(ctx),
          wp, gp, mp, vp, cp, n, k, p.stochastic_rounding, p.rng.key, p.rng.counter);
  };
  with_storage(master, op, "master", [&](auto* wp) {
    with_storage(grad, op, "grad", [&](auto* gp) {
      with_storage(m, op, "m", [&](auto* mp) {
        with_storage(v, op, "v", [&](auto* vp) {
          if (!compute.defined()) launch(wp, gp, mp, vp, static_cast<float*>(nullptr));
          else with_storage(compute, op, "compute", [&](auto* cp) { launch(wp, gp, mp, vp, cp); });
        });
      });
    });
  });
  check_launch(op);
}

void adamw_step_many(Context& ctx, std::vector<ops::AdamWTarget>& targets, const std::vector<Tensor>& grads) {
  const char* op = "adamw_step_many";
  namespace ad = adamw_detail;
  // Jobs grouped by the storage types of (master, grad, m, v, compute or none): one kernel each.
  std::vector<std::array<int, 5>> keys;
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < targets.size(); ++i) {
    ops::AdamWTarget& t = targets[i];
    const Tensor& g = grads[i];
    const int64_t n = checked_adamw_numel(op, t.master, g, t.m, t.v, t.compute, t.params.step);
    if (!n) continue;
    const std::array<int, 5> key = {static_cast<int>(t.master.dtype()), static_cast<int>(g.dtype()),
                                     static_cast<int>(t.m.dtype()), static_cast<int>(t.v.dtype()),
                                     t.compute.defined() ? static_cast<int>(t.compute.dtype()) : -1};
    size_t k = 0;
    while (k < keys.size() && keys[k] != key) ++k;
    if (k == keys.size()) {
      keys.push_back(key);
      groups.emplace_back();
    }
    groups[k].push_back(i);
  }
  for (const std::vector<size_t>& group : groups) {
    for (size_t b0 = 0; b0 < group.size(); b0 += ad::kMultiJobs) {
      ad::MultiBatch b{};
      b.njobs = static_cast<int>(std::min<size_t>(ad::kMultiJobs, group.size() - b0));
      for (int q = 0; q < b.njobs; ++q) {
        ops::AdamWTarget& t = targets[group[b0 + q]];
        const Tensor& g = grads[group[b0 + q]];
        const ops::AdamWParams& p = t.params;
        ad::MultiJob& job = b.job[q];
        job.w = t.master.data_ptr();
        job.g = g.data_ptr();
        job.m = t.m.data_ptr();
        job.v = t.v.data_ptr();
        job.comp = t.compute.defined() ? t.compute.data_ptr() : nullptr;
        job.n = t.master.numel();
        job.k = am::make_consts(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale);
        job.key = p.rng.key;
        job.counter = p.rng.counter;
        job.sr = p.stochastic_rounding ? 1 : 0;
        job.vec = aligned16(job.w) && aligned16(job.g) && aligned16(job.m) && aligned16(job.v) &&
                  (!job.comp || aligned16(job.comp));
        b.start[q + 1] = b.start[q] + (job.vec ? (job.n + 7) / 8 : job.n);
      }
      const int64_t total = b.start[b.njobs];
      // The storage types of the group, from its first job (the same for all).
      ops::AdamWTarget& t0 = targets[group[b0]];
      auto launch = [&](auto* wp, auto* gp, auto* mp, auto* vp, auto* cp) {
        launch_pdl(ad::adamw_multi_kernel<std::remove_pointer_t<decltype(wp)>, std::remove_pointer_t<decltype(gp)>,
                               std::remove_pointer_t<decltype(mp)>, std::remove_pointer_t<decltype(vp)>,
                               std::remove_pointer_t<decltype(cp)>>, grid_for(total), kThreads, 0, stream_of(ctx), b);
      };
      with_storage(t0.master, op, "master", [&](auto* wp) {
        with_storage(grads[group[b0]], op, "grad", [&](auto* gp) {
          with_storage(t0.m, op, "m", [&](auto* mp) {
            with_storage(t0.v, op, "v", [&](auto* vp) {
              if (!t0.compute.defined()) launch(wp, gp, mp, vp, static_cast<float*>(nullptr));
              else with_storage(t0.compute, op, "compute", [&](auto* cp) { launch(wp, gp, mp, vp, cp); });
            });
          });
        });
      });
      check_launch(op);
    }
  }
}

void add_partials_into(Context& ctx, const double* partial, int64_t n, double* acc) {
  MT_CHECK(n >= 0 && n <= INT32_MAX, "[add_partials_into] {} partials", n);
  launch_pdl(add_partials, 1, 1024, 0, stream_of(ctx), partial, static_cast<int>(n), acc);
  check_launch("add_partials_into");
}

void sum_accumulate(Context& ctx, const Tensor& x, Tensor& acc) {
  need_cuda(x, "sum_accumulate", "x");
  need_cuda(acc, "sum_accumulate", "acc");
  need_dtype(x, DType::kF64, "sum_accumulate", "x");
  need_dtype(acc, DType::kF64, "sum_accumulate", "acc");
  if (x.numel()) add_partials_into(ctx, static_cast<const double*>(x.data_ptr()), x.numel(), static_cast<double*>(acc.data_ptr()));
}

void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc) {
  const char* op = "sum_squares_accumulate";
  need_cuda(x, op, "x");
  need_cuda(acc, op, "acc");
  need_dtype(acc, DType::kF64, op, "acc");
  const int64_t n = x.numel();
  if (!n) return;
  // The same partials as sum_squares, then one block adds them into acc: no host read.
  const unsigned blocks = grid_for(n, kThreads, 1024);
  Tensor tmp = device_scratch(ctx, static_cast<int64_t>(blocks) * 8);
  double* partial = static_cast<double*>(tmp.data_ptr());
  MT_CUDA_DISPATCH(x.dtype(), X, op,
    launch_pdl(sum_squares_partial<X>, blocks, kThreads, 0, stream_of(ctx), static_cast<const X*>(x.data_ptr()), n, partial));
  launch_pdl(add_partials, 1, 1024, 0, stream_of(ctx), partial, static_cast<int>(blocks), static_cast<double*>(acc.data_ptr()));
  check_launch(op);
}

// sum_squares_accumulate over a list, in launches of up to kManyMax tensors: one partial kernel and
// one add per launch instead of two launches per tensor (the ~10 small gradients of each layer).
void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc) {
  const char* op = "sum_squares_accumulate_many";
  need_cuda(acc, op, "acc");
  need_dtype(acc, DType::kF64, op, "acc");
  size_t i = 0;
  while (i < xs.size()) {
    SquaresList L{};
    int64_t blocks = 0;
    for (; i < xs.size() && L.count < kManyMax; ++i) {
      const Tensor& x = xs[i];
      need_cuda(x, op, "x");
      if (!x.numel()) continue;
      MT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "[{}] x is {}, expected f32 or bf16", op,
               dtype_name(x.dtype()));
      L.p[L.count] = x.data_ptr();
      L.n[L.count] = x.numel();
      L.bf16[L.count] = x.dtype() == DType::kBF16;
      L.first[L.count] = static_cast<int32_t>(blocks);
      blocks += grid_for(x.numel(), kThreads, 1024);
      ++L.count;
    }
    if (!L.count) continue;
    L.first[L.count] = static_cast<int32_t>(blocks);
    Tensor tmp = device_scratch(ctx, blocks * 8);
    double* partial = static_cast<double*>(tmp.data_ptr());
    launch_pdl(sum_squares_many_partial, static_cast<unsigned>(blocks), kThreads, 0, stream_of(ctx), L, partial);
    launch_pdl(add_partials, 1, 1024, 0, stream_of(ctx), partial, static_cast<int>(blocks), static_cast<double*>(acc.data_ptr()));
    check_launch(op);
  }
}

}  // namespace moetrain::cuda
