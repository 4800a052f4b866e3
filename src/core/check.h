// Error type and the one family of check macros used everywhere.
// MT_CHECK(cond, fmt, args...) throws moetrain::Error with the expression, file and line.
// Messages start with the op or component in brackets: "[rmsnorm] x has 3 dims, expected 2".
#pragma once
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
// nvcc cannot compile fmt's compile-time format checks, so .cu files get a small run-time
// "{}" substituter with the same message syntax (format specs inside braces are ignored).
#include <sstream>
namespace moetrain::detail {
inline void format_rest(std::ostringstream& os, const char* f) { os << f; }
template <typename A, typename... R>
void format_rest(std::ostringstream& os, const char* f, const A& a, const R&... r) {
  for (; *f; ++f) {
    if (*f == '{') {
      while (*f && *f != '}') ++f;
      os << a;
      if (*f) ++f;
      format_rest(os, f, r...);
      return;
    }
    os << *f;
  }
}
template <typename... A>
std::string format_message(const char* f, const A&... a) {
  std::ostringstream os;
  format_rest(os, f, a...);
  return os.str();
}
}  // namespace moetrain::detail
#define MT_FORMAT_ ::moetrain::detail::format_message
#else
#include <fmt/format.h>
#define MT_FORMAT_ ::fmt::format
#endif

namespace moetrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] void throw_error(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace moetrain

#define MT_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::moetrain::throw_error(#cond, __FILE__, __LINE__, MT_FORMAT_(__VA_ARGS__)); \
  } while (0)

// For user-facing failures where the condition is already known to be false.
#define MT_FAIL(...) ::moetrain::throw_error(nullptr, __FILE__, __LINE__, MT_FORMAT_(__VA_ARGS__))

#ifdef MT_WITH_CUDA
#define MT_CUDA_CHECK(call)                                                                   \
  do {                                                                                        \
    auto mt_err_ = (call);                                                                    \
    if (mt_err_ != 0) [[unlikely]]                                                            \
      ::moetrain::throw_error(#call, __FILE__, __LINE__,                                      \
                              std::string("[cuda] ") + ::moetrain::cuda_error_string(mt_err_)); \
  } while (0)
#define MT_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                        \
    int mt_err_ = static_cast<int>(call);                                                     \
    if (mt_err_ != 0) [[unlikely]]                                                            \
      ::moetrain::throw_error(#call, __FILE__, __LINE__, "[cublas] status " + std::to_string(mt_err_)); \
  } while (0)
#define MT_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    int mt_err_ = static_cast<int>(call);                                                     \
    if (mt_err_ != 0) [[unlikely]]                                                            \
      ::moetrain::throw_error(#call, __FILE__, __LINE__, "[nccl] status " + std::to_string(mt_err_)); \
  } while (0)
namespace moetrain {
std::string cuda_error_string(int err);
}
#endif
