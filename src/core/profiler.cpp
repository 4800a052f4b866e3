// Profiler implementation: records (name, kind, start, end) per scope. CUDA scopes use events from
// a reused pool, recorded on the context's stream; CPU scopes read the steady clock. Single
// threaded by design (ops are issued from one host thread per context).
#include "core/profiler.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/check.h"

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {

namespace {

struct Record {
  const char* name;
  ProfileKind kind;
  bool cuda;
  void* ev_start = nullptr;
  void* ev_end = nullptr;
  double t_start = 0, t_end = 0;  // host clock, ms (CPU scopes)
};

struct State {
  std::vector<Record> records;
  std::vector<void*> free_events;
  int op_depth = 0;
};

State& state() {
  static State s;
  return s;
}

double host_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

#ifdef MT_WITH_CUDA
void* take_event() {
  State& s = state();
  if (!s.free_events.empty()) {
    void* e = s.free_events.back();
    s.free_events.pop_back();
    return e;
  }
  cudaEvent_t e;
  MT_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}
#endif

}  // namespace

void Profiler::enable(bool on) {
  reset();
  enabled_ = on;
}

void Profiler::reset() {
  State& s = state();
  for (Record& r : s.records) {
    if (r.ev_start) s.free_events.push_back(r.ev_start);
    if (r.ev_end) s.free_events.push_back(r.ev_end);
  }
  s.records.clear();
  s.op_depth = 0;
}

int Profiler::begin(const Context& ctx, const char* name, ProfileKind kind) {
  State& s = state();
  if (kind == ProfileKind::kOp && s.op_depth++ > 0) return -2;  // nested op: counted by its parent
  Record r{name, kind, ctx.device().is_cuda()};
  if (r.cuda) {
#ifdef MT_WITH_CUDA
    r.ev_start = take_event();
    MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(r.ev_start), static_cast<cudaStream_t>(ctx.stream())));
#endif
  } else {
    r.t_start = host_ms();
  }
  s.records.push_back(r);
  return static_cast<int>(s.records.size()) - 1;
}

void Profiler::end(const Context& ctx, int handle) {
  State& s = state();
  if (handle == -2) {
    --s.op_depth;
    return;
  }
  if (handle < 0 || handle >= static_cast<int>(s.records.size())) return;  // reset() in between
  Record& r = s.records[static_cast<size_t>(handle)];
  if (r.kind == ProfileKind::kOp) s.op_depth = std::max(0, s.op_depth - 1);
  if (r.cuda) {
#ifdef MT_WITH_CUDA
    r.ev_end = take_event();
    MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(r.ev_end), static_cast<cudaStream_t>(ctx.stream())));
#endif
  } else {
    r.t_end = host_ms();
  }
}

std::vector<ProfileEntry> Profiler::report() {
  State& s = state();
  std::map<std::pair<int, std::string>, ProfileEntry> acc;
  for (const Record& r : s.records) {
    double ms = 0;
    if (r.cuda) {
#ifdef MT_WITH_CUDA
      if (!r.ev_end) continue;  // still open
      MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(r.ev_end)));
      float f = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&f, static_cast<cudaEvent_t>(r.ev_start), static_cast<cudaEvent_t>(r.ev_end)));
      ms = f;
#endif
    } else {
      if (r.t_end == 0) continue;
      ms = r.t_end - r.t_start;
    }
    ProfileEntry& e = acc[{static_cast<int>(r.kind), r.name}];
    e.name = r.name;
    e.kind = r.kind;
    ++e.calls;
    e.total_ms += ms;
  }
  std::vector<ProfileEntry> out;
  out.reserve(acc.size());
  for (auto& [key, e] : acc) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const ProfileEntry& a, const ProfileEntry& b) {
    return a.kind != b.kind ? a.kind < b.kind : a.total_ms > b.total_ms;
  });
  return out;
}

}  // namespace moetrain
