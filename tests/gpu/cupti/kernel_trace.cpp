// kernel_trace.so: a CUDA injection library (CUDA_INJECTION64_PATH) that records every kernel,
// memcpy and memset of the process with CUPTI's activity API and writes them at exit as CSV
// ("Start (ns)","Duration (ns)","CorrId","Name", the columns tests/gpu/timeline_gaps.py reads)
// to $MT_TRACE_CSV (default kernel_trace.csv). For machines without Nsight Systems.
// Build (tests/gpu/timeline.sh does): g++ -O2 -shared -fPIC kernel_trace.cpp -I$CUDA/include
//   -L$CUDA/lib64 -lcupti -o kernel_trace.so
#include <cuda.h>
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Event {
  uint64_t start, end;
  uint32_t corr;
  std::string name;
};

std::mutex g_mu;
std::vector<Event>* g_events = nullptr;
constexpr size_t kBufBytes = 8u << 20;

std::string demangle(const char* s) {
  if (!s) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(s, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : s;
  std::free(d);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::vector<Event> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      got.push_back({k->start, k->end, k->correlationId, demangle(k->name)});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      got.push_back({m->start, m->end, m->correlationId, "[memcpy kind " + std::to_string(m->copyKind) + "]"});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      got.push_back({m->start, m->end, m->correlationId, "[memset]"});
    }
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mu);
  for (auto& e : got) g_events->push_back(std::move(e));
}

void write_csv() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("MT_TRACE_CSV");
  FILE* f = std::fopen(path ? path : "kernel_trace.csv", "w");
  if (!f) return;
  std::fprintf(f, "Start (ns),Duration (ns),CorrId,Name\n");
  const std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& e : *g_events) {
    std::string n = e.name;
    for (char& c : n)
      if (c == '"') c = '\'';
    std::fprintf(f, "%llu,%llu,%u,\"%s\"\n", static_cast<unsigned long long>(e.start),
                 static_cast<unsigned long long>(e.end - e.start), e.corr, n.c_str());
  }
  std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  g_events = new std::vector<Event>();
  g_events->reserve(1 << 20);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::atexit(write_csv);
  return 1;
}
