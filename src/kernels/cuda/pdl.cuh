// Programmatic dependent launch (PDL, compute capability 9.0 and later). A kernel launched with
// launch_pdl may be scheduled while the kernel before it on the stream is still finishing; it must
// call pdl_wait() before it reads or writes global memory, and then sees everything that kernel
// wrote. Every kernel of src/kernels/cuda calls pdl_wait() first, so every launch there may use it.
// What it saves is the launch latency between dependent kernels (about 1-1.5 us each on an H100,
// docs/design/kernels.md, "Programmatic dependent launch"). No project dependencies: the standalone
// harnesses include it too.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

namespace moetrain::cuda {

// Waits until the kernels this launch depends on have completed and their writes are visible. A
// no-op for launches without the PDL attribute and on GPUs before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether launch_pdl asks for PDL: the current device is sm_90 or later and the environment variable
// MT_PDL is not "0" (a benchmark switch, read once per process).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MT_PDL");
    if (env && env[0] == '0' && env[1] == '\0') return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

// The attribute that lets a launch overlap the end of the kernel before it (see pdl_enabled).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL when pdl_enabled(). A failed launch is
// returned and, like any runtime error, left for cudaGetLastError (the callers' check_launch).
template <typename... P, typename... A>
cudaError_t launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  cudaLaunchAttribute attr[1] = {pdl_attribute()};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace moetrain::cuda
