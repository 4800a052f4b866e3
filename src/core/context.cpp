// Context setup: reads device facts, creates the stream and cuBLAS/cuBLASLt handles.
#include "core/context.h"

#include "core/check.h"
#include "core/env.h"
#include "core/philox.h"

#ifdef MT_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace moetrain {

int cuda_device_count() {
#ifdef MT_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

Context::Context(Device device, uint64_t seed, int rank)
    : device_(device), seed_(seed), rank_(rank), num_threads_(env_num_threads()),
      sync_debug_(env_sync_debug()) {
  if (device.is_cpu()) return;
#ifdef MT_WITH_CUDA
  int n = cuda_device_count();
  MT_CHECK(n > 0, "[context] no CUDA GPU is visible (cudaGetDeviceCount found none); run on the CPU "
                  "with device=cpu or check the driver and CUDA_VISIBLE_DEVICES");
  MT_CHECK(device.index < n, "[context] cuda:{} requested but only {} GPU(s) are visible", device.index, n);
  MT_CUDA_CHECK(cudaSetDevice(device.index));
  cudaDeviceProp p{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&p, device.index));
  facts_.name = p.name;
  facts_.sm_count = p.multiProcessorCount;
  facts_.cc_major = p.major;
  facts_.cc_minor = p.minor;
  facts_.total_memory = p.totalGlobalMem;
  facts_.smem_per_block_optin = p.sharedMemPerBlockOptin;
  facts_.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  MT_CHECK(p.major >= 8, "[context] {} has compute capability {}.{}; moetrain needs sm_80 or newer "
                         "(Ampere, Hopper)", p.name, p.major, p.minor);
  // A blocking stream: it orders with the legacy default stream, so the synchronous copies in
  // Tensor (cudaMemcpy/cudaMemset on the default stream) see this stream's finished work.
  cudaStream_t s;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
  stream_ = s;
  cublasHandle_t h;
  MT_CUBLAS_CHECK(cublasCreate(&h));
  MT_CUBLAS_CHECK(cublasSetStream(h, s));
  cublas_ = h;
  cublasLtHandle_t lt;
  MT_CUBLAS_CHECK(cublasLtCreate(&lt));
  cublaslt_ = lt;
  MT_CUDA_CHECK(cudaMalloc(&cublaslt_ws_, kCublasLtWorkspaceBytes + 16 + 8));
  MT_CUDA_CHECK(cudaMemset(schedule_counter(), 0, 8));
#else
  MT_FAIL("[context] device {} requested, but this build has no CUDA backend", device.str());
#endif
}

Context::~Context() {
#ifdef MT_WITH_CUDA
  if (workspace_) allocator_for(device_).deallocate(workspace_, workspace_bytes_, MemCategory::kWorkspace);
  if (cublaslt_ws_) cudaFree(cublaslt_ws_);
  if (cublaslt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
  if (cublas_) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

RngStream Context::rng(uint64_t purpose, uint64_t step) const {
  // Key mixes seed and rank through one Philox round so nearby seeds give unrelated keys.
  Philox4 k = philox4x32(seed_, 0x5eed, static_cast<uint64_t>(rank_));
  RngStream s;
  s.key = (static_cast<uint64_t>(k.v[1]) << 32) | k.v[0];
  s.counter = (purpose << 40) ^ step;
  return s;
}

void* Context::workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (workspace_) {
    synchronize();
    allocator_for(device_).deallocate(workspace_, workspace_bytes_, MemCategory::kWorkspace);
  }
  workspace_ = allocator_for(device_).allocate(bytes, MemCategory::kWorkspace);
  workspace_bytes_ = bytes;
  return workspace_;
}

void Context::synchronize() const {
#ifdef MT_WITH_CUDA
  if (stream_) MT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
#endif
}

void Context::debug_sync(const char* op) const {
  if (!sync_debug_ || device_.is_cpu()) return;
#ifdef MT_WITH_CUDA
  cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (e == cudaSuccess) e = cudaGetLastError();
  MT_CHECK(e == cudaSuccess, "[{}] device error after this op: {}", op, cudaGetErrorString(e));
#endif
}

}  // namespace moetrain
