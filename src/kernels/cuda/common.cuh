// Helpers shared by the CUDA kernels: the Context's stream, dtype dispatch over {f32, bf16},
// fp32 load/store of element types, launch checks, grid sizing and warp/block reductions.
// Kernels compute in fp32 (fp64 where a value is returned to the host) whatever the storage type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/cuda/pdl.cuh"

namespace moetrain::cuda {

// Defined in device_info.cu: throws "[op] kernel launch failed: ..." on a pending launch error.
void check_launch(const char* op);

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream()); }

// Every tensor a kernel touches must live on a CUDA device and be contiguous.
inline void need_cuda(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(t.defined(), "[{}] {} is undefined", op, name);
  MT_CHECK(t.device().is_cuda(), "[{}] {} is on {}, expected a CUDA tensor", op, name, t.device().str());
  MT_CHECK(t.is_contiguous(), "[{}] {} ({}) must be contiguous", op, name, t.desc());
}
inline void need_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  MT_CHECK(t.dtype() == dt, "[{}] {} is {}, expected {}", op, name, dtype_name(t.dtype()), dtype_name(dt));
}
inline void need_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  MT_CHECK(t.numel() == n, "[{}] {} has {} elements ({}), expected {}", op, name, t.numel(), t.desc(), n);
}

// Device scratch memory from the caching allocator, accounted as workspace. Safe to free while
// kernels that use it are queued: every op runs on the Context's one stream.
inline Tensor device_scratch(const Context& ctx, int64_t bytes) {
  return Tensor::empty({bytes > 0 ? bytes : 1}, DType::kU8, ctx.device(), MemCategory::kWorkspace);
}

// Copies on the Context's stream, then waits for it (the host buffer may be pageable).
inline void copy_to_host(const Context& ctx, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(ctx)));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}
inline void copy_to_device(const Context& ctx, void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ctx)));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

// Deterministic sum (or sum of squares) of n device values in fp64, returned to the host
// (synchronizes the stream). Defined in elementwise.cu for float and bf16.
template <typename X>
double reduce_to_host(Context& ctx, const X* x, int64_t n, bool square);

// acc[0] += partial[0] + ... + partial[n-1] (device f64, fixed order; one small kernel).
void add_partials_into(Context& ctx, const double* partial, int64_t n, double* acc);

// 1-D grid for n elements with a grid-stride loop inside the kernel.
inline unsigned grid_for(int64_t n, int threads = 256, int64_t cap = 65536) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

// ---- element access ------------------------------------------------------------------------
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

// ---- reductions ------------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds 32 values. Fixed reduction tree: deterministic for a given blockDim.
template <typename T> __device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[wid] = v;
  __syncthreads();
  T r = lane < nw ? scratch[lane] : T(0);
  r = warp_sum(r);
  return r;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[wid] = v;
  __syncthreads();
  float r = lane < nw ? scratch[lane] : -INFINITY;
  return warp_max(r);
}

}  // namespace moetrain::cuda

// Runs the statement list with `T` bound to the element type of a float dtype (f32 or bf16).
#define MT_CUDA_DISPATCH(dt, T, op, ...)                                                     \
  do {                                                                                       \
    switch (dt) {                                                                            \
      case ::moetrain::DType::kF32: { using T = float; __VA_ARGS__; } break;                 \
      case ::moetrain::DType::kBF16: { using T = __nv_bfloat16; __VA_ARGS__; } break;        \
      default: MT_FAIL("[{}] dtype {} is not supported on CUDA (f32 or bf16)", op,          \
                       ::moetrain::dtype_name(dt));                                          \
    }                                                                                        \
  } while (0)
