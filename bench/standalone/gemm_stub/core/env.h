// Stand-in for src/core/env.h in the standalone GEMM harnesses: env_int (what the kernels call) reads
// the variable with getenv, without the project library (src/core/env.cpp) behind the real header.
#pragma once
#include <cstdio>
#include <cstdlib>

namespace moetrain {

inline long env_int(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (!end || *end != '\0') {  // as the real one: not an integer is an error
    std::fprintf(stderr, "[env] %s='%s' is not an integer\n", name, v);
    std::exit(1);
  }
  return x;
}

}  // namespace moetrain
