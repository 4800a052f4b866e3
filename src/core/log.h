// Leveled, rank-aware logging. Only rank 0 prints unless MT_LOG_ALL_RANKS=1.
// Usage: MT_LOG_INFO("step {} loss {:.4f}", step, loss);
#pragma once
#include <fmt/format.h>
#include <string>

namespace moetrain {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_rank(int rank);  // rank of this process; non-zero ranks are quiet by default
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const std::string& msg);
LogLevel parse_log_level(const std::string& name);  // "debug" | "info" | "warn" | "error" | "off"

}  // namespace moetrain

#define MT_LOG_AT(level, ...)                                                        \
  do {                                                                               \
    if (::moetrain::log_enabled(level)) ::moetrain::log_write(level, ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define MT_LOG_DEBUG(...) MT_LOG_AT(::moetrain::LogLevel::kDebug, __VA_ARGS__)
#define MT_LOG_INFO(...) MT_LOG_AT(::moetrain::LogLevel::kInfo, __VA_ARGS__)
#define MT_LOG_WARN(...) MT_LOG_AT(::moetrain::LogLevel::kWarn, __VA_ARGS__)
#define MT_LOG_ERROR(...) MT_LOG_AT(::moetrain::LogLevel::kError, __VA_ARGS__)
