// CPU embedding lookup and its backward (scatter-add into the table gradient). The backward
// splits the hidden dimension across threads, so each dtable element is summed over tokens in
// token order by one thread: deterministic.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
void check_ids(const int32_t* ids, int64_t T, int64_t V, const char* op) {
  for (int64_t t = 0; t < T; ++t)
    MT_CHECK(ids[t] >= 0 && ids[t] < V, "[{}] ids[{}] = {} is outside the table's {} rows", op, t,
             ids[t], V);
}
}  // namespace

void embedding_forward(Context& ctx, const Tensor& table, const Tensor& ids, Tensor& out) {
  require_f32(table, "embedding_forward", "table");
  require_f32(out, "embedding_forward", "out");
  const int64_t V = table.size(0), H = table.size(1), T = ids.numel();
  const int32_t* id = ids.data<int32_t>();
  check_ids(id, T, V, "embedding_forward");
  const float* tab = table.data<float>();
  float* o = out.data<float>();
  parallel_for(ctx, T, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) std::copy_n(tab + id[t] * H, H, o + t * H);
  });
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  require_f32(dout, "embedding_backward", "dout");
  require_f32(dtable, "embedding_backward", "dtable");
  const int64_t V = dtable.size(0), H = dtable.size(1), T = ids.numel();
  const int32_t* id = ids.data<int32_t>();
  check_ids(id, T, V, "embedding_backward");
  const float* d = dout.data<float>();
  float* g = dtable.data<float>();
  parallel_for(ctx, H, 256, [&](int64_t b, int64_t e) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = g + id[t] * H;
      const float* src = d + t * H;
      for (int64_t h = b; h < e; ++h) row[h] += src[h];
    }
  });
}

}  // namespace moetrain::cpu
