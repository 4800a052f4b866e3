// CPU token permutation into expert-contiguous order and back. route_index is a counting sort
// of the T*k picks by expert, stable in flat pick order; permute gathers rows; unpermute is the
// weighted combine y[t] = sum_j w[t,j] yp[row_of[t*k+j]] (w = 1 without weights). Backwards:
// permute's is a per-token gather-sum over its k rows (j order, deterministic); unpermute's
// scatters w * dy into rows and gives dw[t,j] = dy[t] . yp[row] (double dot). rows_from_picks and
// picks_from_rows move one f32 value per pick between the two orders.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace moetrain::cpu {

namespace {
void check_rows(const int32_t* r, int64_t n, int64_t limit, const char* op, const char* name) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK(r[i] >= 0 && r[i] < limit, "[{}] {}[{}] = {} outside [0, {})", op, name, i, r[i], limit);
}
}  // namespace

void moe_route_index(Context& ctx, const Tensor& topk_idx, int num_experts, Tensor& counts,
                     Tensor& offsets, Tensor& row_of, Tensor& token_of) {
  const int64_t k = topk_idx.size(1), picks = topk_idx.numel();
  const int32_t* ip = topk_idx.data<int32_t>();
  check_rows(ip, picks, num_experts, "moe_route_index", "topk_idx");
  int32_t* cp = counts.data<int32_t>();
  int32_t* op = offsets.data<int32_t>();
  int32_t* rp = row_of.data<int32_t>();
  int32_t* tp = token_of.data<int32_t>();
  std::fill(cp, cp + num_experts, 0);
  for (int64_t i = 0; i < picks; ++i) ++cp[ip[i]];
  op[0] = 0;
  for (int e = 0; e < num_experts; ++e) op[e + 1] = op[e] + cp[e];
  std::vector<int32_t> next(op, op + num_experts);
  for (int64_t i = 0; i < picks; ++i) {
    const int32_t row = next[ip[i]]++;
    rp[i] = row;
    tp[row] = static_cast<int32_t>(i / k);
  }
}

void moe_permute(Context& ctx, const Tensor& x, const Tensor& token_of, Tensor& xp) {
  require_f32(x, "moe_permute", "x");
  require_f32(xp, "moe_permute", "xp");
  const int64_t T = x.size(0), H = x.size(1), N = xp.size(0);
  const int32_t* tp = token_of.data<int32_t>();
  check_rows(tp, N, T, "moe_permute", "token_of");
  const float* src = x.data<float>();
  float* dst = xp.data<float>();
  parallel_for(ctx, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::copy_n(src + tp[r] * H, H, dst + r * H);
  });
}

void moe_permute_backward(Context& ctx, const Tensor& dxp, const Tensor& row_of, Tensor& dx) {
  require_f32(dxp, "moe_permute_backward", "dxp");
  require_f32(dx, "moe_permute_backward", "dx");
  const int64_t T = dx.size(0), H = dx.size(1), N = dxp.size(0), k = T ? N / T : 0;
  const int32_t* rp = row_of.data<int32_t>();
  check_rows(rp, N, N, "moe_permute_backward", "row_of");
  const float* src = dxp.data<float>();
  float* dst = dx.data<float>();
  parallel_for(ctx, T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = dst + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float* g = src + static_cast<int64_t>(rp[t * k + j]) * H;
        for (int64_t h = 0; h < H; ++h) o[h] += g[h];
      }
    }
  });
}

void moe_unpermute(Context& ctx, const Tensor& yp, const Tensor& row_of, const Tensor& topk_w,
                   Tensor& y, const Tensor& residual) {
  require_f32(yp, "moe_unpermute", "yp");
  if (topk_w.defined()) require_f32(topk_w, "moe_unpermute", "topk_w");
  require_f32(y, "moe_unpermute", "y");
  const int64_t T = y.size(0), H = y.size(1), N = yp.size(0);
  const int64_t k = topk_w.defined() ? topk_w.size(1) : (T ? N / T : 0);
  const int32_t* rp = row_of.data<int32_t>();
  check_rows(rp, T * k, N, "moe_unpermute", "row_of");
  const float* src = yp.data<float>();
  const float* wp = topk_w.defined() ? topk_w.data<float>() : nullptr;
  float* dst = y.data<float>();
  if (residual.defined()) require_f32(residual, "moe_unpermute", "residual");
  const float* res = residual.defined() ? residual.data<float>() : nullptr;
  parallel_for(ctx, T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = dst + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float w = wp ? wp[t * k + j] : 1.0f;
        const float* r = src + static_cast<int64_t>(rp[t * k + j]) * H;
        for (int64_t h = 0; h < H; ++h) o[h] += w * r[h];
      }
      if (res)
        for (int64_t h = 0; h < H; ++h) o[h] += res[t * H + h];
    }
  });
}

void moe_unpermute_backward(Context& ctx, const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& topk_w, Tensor& dyp, Tensor& dtopk_w) {
  require_f32("moe_unpermute_backward",
              {{dy, "dy"}, {yp, "yp"}, {topk_w, "topk_w"}, {dyp, "dyp"}, {dtopk_w, "dtopk_w"}});
  const int64_t T = dy.size(0), H = dy.size(1), N = yp.size(0), k = topk_w.size(1);
  const int32_t* rp = row_of.data<int32_t>();
  check_rows(rp, T * k, N, "moe_unpermute_backward", "row_of");
  const float* gp = dy.data<float>();
  const float* yv = yp.data<float>();
  const float* wp = topk_w.data<float>();
  float* dr = dyp.data<float>();
  float* dw = dtopk_w.data<float>();
  // Each row is written by exactly one pick (row_of is a permutation), so threads never collide.
  std::vector<uint8_t> seen(static_cast<size_t>(N), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    MT_CHECK(!seen[rp[i]], "[moe_unpermute_backward] row_of names row {} twice; expected a permutation", rp[i]);
    seen[rp[i]] = 1;
  }
  parallel_for(ctx, T, 32, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* g = gp + t * H;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = rp[t * k + j];
        const float w = wp[t * k + j];
        const float* yr = yv + row * H;
        float* o = dr + row * H;
        double s = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          s += static_cast<double>(g[h]) * yr[h];
          o[h] = w * g[h];
        }
        dw[t * k + j] = static_cast<float>(s);
      }
    }
  });
}

void moe_rows_from_picks(Context& ctx, const Tensor& picks, const Tensor& row_of, Tensor& rows) {
  require_f32("moe_rows_from_picks", {{picks, "picks"}, {rows, "rows"}});
  const int64_t P = picks.numel();
  const int32_t* rp = row_of.data<int32_t>();
  check_rows(rp, P, P, "moe_rows_from_picks", "row_of");
  const float* src = picks.data<float>();
  float* dst = rows.data<float>();
  for (int64_t p = 0; p < P; ++p) dst[rp[p]] = src[p];
}

void moe_picks_from_rows(Context& ctx, const Tensor& rows, const Tensor& row_of, Tensor& picks) {
  require_f32("moe_picks_from_rows", {{rows, "rows"}, {picks, "picks"}});
  const int64_t P = picks.numel();
  const int32_t* rp = row_of.data<int32_t>();
  check_rows(rp, P, P, "moe_picks_from_rows", "row_of");
  const float* src = rows.data<float>();
  float* dst = picks.data<float>();
  for (int64_t p = 0; p < P; ++p) dst[p] = src[rp[p]];
}

}  // namespace moetrain::cpu
