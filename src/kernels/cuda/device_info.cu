// Small CUDA helpers shared by the backend: a launch check used after every kernel launch.
#include <cuda_runtime.h>

#include "core/check.h"

namespace moetrain::cuda {

void check_launch(const char* op) {
  cudaError_t e = cudaGetLastError();
  MT_CHECK(e == cudaSuccess, "[{}] kernel launch failed: {}", op, cudaGetErrorString(e));
}

}  // namespace moetrain::cuda
