// Profiler: optional per-op and per-region timing. Off by default (zero cost beyond one branch).
// When enabled, each ProfileScope records a pair of CUDA events on the context's stream (or reads
// the host clock on the CPU); report() waits for the device once and sums the elapsed times per
// name. Nested scopes of the same kind are not double counted: only the outermost op is timed,
// while regions ("fwd", "bwd", "optimizer") and ops are kept as separate tables.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"

namespace moetrain {

enum class ProfileKind : uint8_t { kOp, kRegion };

struct ProfileEntry {
  std::string name;     // op or region name
  ProfileKind kind = ProfileKind::kOp;
  int64_t calls = 0;
  double total_ms = 0;  // summed over all calls since the last reset
};

class Profiler {
 public:
  static bool enabled() { return enabled_; }
  // Turns timing on or off; turning it on also clears what was recorded.
  static void enable(bool on);
  // Drops everything recorded so far (pending events included).
  static void reset();
  // Waits for the recorded work, then returns one entry per (kind, name), largest total first.
  static std::vector<ProfileEntry> report();

  // Used by ProfileScope.
  static int begin(const Context& ctx, const char* name, ProfileKind kind);
  static void end(const Context& ctx, int handle);

 private:
  static inline bool enabled_ = false;
};

// RAII timer for one op call or one region; does nothing while the profiler is off.
class ProfileScope {
 public:
  ProfileScope(const Context& ctx, const char* name, ProfileKind kind = ProfileKind::kOp)
      : ctx_(ctx), handle_(Profiler::enabled() ? Profiler::begin(ctx, name, kind) : -1) {}
  ~ProfileScope() {
    if (handle_ != -1) Profiler::end(ctx_, handle_);  // -2: a nested op (depth bookkeeping only)
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const Context& ctx_;
  int handle_;
};

}  // namespace moetrain
