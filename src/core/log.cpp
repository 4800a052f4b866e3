// Logging sink: stderr, one line per message, prefixed with level and (when > 0) rank.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/check.h"
#include "core/env.h"

namespace moetrain {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_rank{0};
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_rank(int rank) { g_rank = rank; }

bool log_enabled(LogLevel level) {
  if (static_cast<int>(level) < g_level.load()) return false;
  if (g_rank.load() != 0 && !env_log_all_ranks()) return level >= LogLevel::kError;
  return true;
}

void log_write(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (level == LogLevel::kInfo && g_rank.load() == 0) {
    std::fprintf(stderr, "%s\n", msg.c_str());
  } else {
    std::fprintf(stderr, "[%s%s] %s\n", names[static_cast<int>(level)],
                 g_rank.load() ? fmt::format(" rank {}", g_rank.load()).c_str() : "", msg.c_str());
  }
}

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  MT_FAIL("[log] unknown log level '{}', expected debug, info, warn, error or off", name);
}

}  // namespace moetrain
