// Error construction for the check macros.
#include "core/check.h"

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {

void throw_error(const char* expr, const char* file, int line, const std::string& msg) {
  // Keep the user's message first: it is what a user reads. Location follows for developers.
  std::string full = msg;
  if (expr) full += fmt::format("\n  check failed: {} ({}:{})", expr, file, line);
  else full += fmt::format("\n  at {}:{}", file, line);
  throw Error(full);
}

#ifdef MT_WITH_CUDA
std::string cuda_error_string(int err) {
  return fmt::format("{} ({})", cudaGetErrorString(static_cast<cudaError_t>(err)), err);
}
#endif

}  // namespace moetrain
