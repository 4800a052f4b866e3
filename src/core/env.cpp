// Environment settings (see env.h for the list and defaults).
#include "core/env.h"

#include <cstdlib>
#include <thread>

#include "core/check.h"

namespace moetrain {

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

long env_int(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  MT_CHECK(end && *end == '\0', "[env] {}='{}' is not an integer", name, v);
  return x;
}

bool env_log_all_ranks() { return env_int("MT_LOG_ALL_RANKS", 0) != 0; }
bool env_sync_debug() { return env_int("MT_SYNC_DEBUG", 0) != 0; }
int env_num_threads() {
  long n = env_int("MT_NUM_THREADS", 0);
  if (n <= 0) n = static_cast<long>(std::thread::hardware_concurrency());
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace moetrain
