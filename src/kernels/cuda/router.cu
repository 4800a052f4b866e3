// CUDA MoE router: softmax + top-k (one warp per token; slots in descending probability, ties to
// the lower expert index, compared on the stored fp32 probabilities), optional renormalization,
// its backward (dlogits = p * (g - sum_e p_e g_e), g = dL/dprobs), load-balancing statistics
// (deterministic: integer histograms and fixed-order fp32 column sums, no float atomics), the
// aux-loss gradient and the ST-MoE z-loss. Expert ids outside [0, E) are ignored by the stats.
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxChunks = 256;

unsigned warp_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Max and logsumexp of a row of E values, computed by one warp (all lanes get the result).
__device__ __forceinline__ float row_lse(const float* __restrict__ x, int64_t E, int lane) {
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int64_t e = lane; e < E; e += 32) s += expf(x[e] - mx);
  s = warp_sum(s);
  return mx + logf(s);
}

// Is (pa, a) before (pb, b) in the pick order: higher probability first, then lower index.
__device__ __forceinline__ bool before(float pa, int a, float pb, int b) { return pa > pb || (pa == pb && a < b); }

__global__ void router_topk_kernel(const float* __restrict__ logits, int64_t T, int64_t E, int k, bool normalize,
                                   float* __restrict__ probs, int32_t* __restrict__ topk_idx,
                                   float* __restrict__ topk_w) {
  pdl_wait();
  const int64_t t = blockIdx.x * (int64_t)kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* x = logits + t * E;
  float* p = probs + t * E;
  const float lse = row_lse(x, E, lane);
  for (int64_t e = lane; e < E; e += 32) p[e] = expf(x[e] - lse);
  __syncwarp();
  // The j-th pick is the first element (in pick order) strictly after the (j-1)-th pick.
  float last_p = INFINITY;
  int last_i = -1;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bp = -INFINITY;
    int bi = INT32_MAX;
    for (int64_t e = lane; e < E; e += 32) {
      const float pe = p[e];
      const int ie = static_cast<int>(e);
      if (before(last_p, last_i, pe, ie) && (bi == INT32_MAX || before(pe, ie, bp, bi))) {
        bp = pe;
        bi = ie;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi != INT32_MAX && (bi == INT32_MAX || before(op, oi, bp, bi))) {
        bp = op;
        bi = oi;
      }
    }
    last_p = bp;
    last_i = bi;
    sum += bp;
    if (lane == 0) {
      topk_idx[t * k + j] = bi;
      topk_w[t * k + j] = bp;
    }
  }
  __syncwarp();
  if (normalize && lane == 0)
    for (int j = 0; j < k; ++j) topk_w[t * k + j] /= sum;
}

// The same top-k for E <= 32 * kPer with the row in registers: the logits are read once, and each
// pick is two warp reductions (the largest probability's bits + 1, where a lane without a candidate
// offers 0; then the smallest expert index among the lanes that offered it) instead of a re-read of
// the row and ten shuffles. Probabilities are non-negative, so their bits order as the floats do:
// the picks, ties to the lower index, are the generic kernel's, and so are every sum and product
// (row_lse's order, sum += pick in pick order, the same division). Expert e sits in lane e % 32,
// slot e / 32; pick j is stored by lane j (k <= 32), once, already divided.
template <int kPer>
__global__ void router_topk_reg_kernel(const float* __restrict__ logits, int64_t T, int64_t E, int k, bool normalize,
                                       float* __restrict__ probs, int32_t* __restrict__ topk_idx,
                                       float* __restrict__ topk_w) {
  pdl_wait();
  const int64_t t = blockIdx.x * (int64_t)kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* x = logits + t * E;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = lane + 32 * i < E ? x[lane + 32 * i] : 0.0f;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < E) mx = fmaxf(mx, v[i]);
  mx = warp_max(mx);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < E) s += expf(v[i] - mx);
  s = warp_sum(s);
  const float lse = mx + logf(s);
  float* p = probs + t * E;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    v[i] = expf(v[i] - lse);
    if (lane + 32 * i < E) p[lane + 32 * i] = v[i];
  }
  uint32_t taken = 0;
  float sum = 0.0f, my_w = 0.0f;  // lane j keeps pick j (k <= 32) and stores it once at the end
  int32_t my_i = 0;
  for (int j = 0; j < k; ++j) {
    int bi = -1;
    float bp = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < E && !((taken >> i) & 1u) && (bi < 0 || v[i] > bp)) {
        bi = i;
        bp = v[i];
      }
    const uint32_t key = bi < 0 ? 0u : __float_as_uint(bp) + 1u;
    const uint32_t best = __reduce_max_sync(0xffffffffu, key);
    const uint32_t mine = bi >= 0 && key == best ? static_cast<uint32_t>(lane + 32 * bi) : 0xffffffffu;
    const uint32_t win = __reduce_min_sync(0xffffffffu, mine);
    const float wp = __uint_as_float(best - 1u);
    if (lane == static_cast<int>(win & 31u)) taken |= 1u << (win >> 5);
    sum += wp;
    if (lane == j) {
      my_i = static_cast<int32_t>(win);
      my_w = wp;
    }
  }
  if (lane < k) {
    topk_idx[t * k + lane] = my_i;
    topk_w[t * k + lane] = normalize ? my_w / sum : my_w;
  }
}

// aux_counts (optional): the block first forms aux_loss_bwd_kernel's row in shared memory [E].
// kPer > 0 (E <= 32 * kPer, k <= 8): a lane keeps its experts' p and g and the row's picks in
// registers (a pick's p comes from the lane that holds it), so the row is read once and g formed
// once; the same operations in the same order.
template <int kPer>
__global__ void router_topk_bwd_kernel(const float* __restrict__ probs, const int32_t* __restrict__ topk_idx,
                                       const float* __restrict__ dtopk_w, const float* __restrict__ dprobs_extra,
                                       bool normalize, int64_t T, int64_t E, int k, float* __restrict__ dlogits,
                                       const float* __restrict__ aux_counts, double aux_rows, double aux_coef) {
  pdl_wait();
  extern __shared__ float aux_row[];
  if (aux_counts) {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x)
      aux_row[e] = static_cast<float>(aux_coef * static_cast<double>(E) * aux_counts[e] / (aux_rows * aux_rows));
    __syncthreads();
  }
  const int64_t t = blockIdx.x * (int64_t)kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float* p = probs + t * E;
  const int32_t* idx = topk_idx + t * k;
  const float* dw = dtopk_w + t * k;
  if constexpr (kPer == 0) {
    // Gradient with respect to each picked probability (uniform across the warp; k is small).
    float s = 0.0f, dot = 0.0f;
    if (normalize) {
      for (int j = 0; j < k; ++j) s += p[idx[j]];
      for (int j = 0; j < k; ++j) dot += dw[j] * (p[idx[j]] / s);
    }
    auto g_of = [&](int64_t e) {
      float g = dprobs_extra ? dprobs_extra[t * E + e] : 0.0f;
      if (aux_counts) g += aux_row[e];
      for (int j = 0; j < k; ++j)
        if (idx[j] == e) g += normalize ? (dw[j] - dot) / s : dw[j];
      return g;
    };
    float pg = 0.0f;
    for (int64_t e = lane; e < E; e += 32) pg += p[e] * g_of(e);
    pg = warp_sum(pg);
    for (int64_t e = lane; e < E; e += 32) dlogits[t * E + e] = p[e] * (g_of(e) - pg);
  } else {
    constexpr int kMaxK = 8;
    float pv[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) pv[i] = lane + 32 * i < E ? p[lane + 32 * i] : 0.0f;
    // The picks, and their probabilities from the lanes that hold them.
    int32_t ix[kMaxK];
    float dv[kMaxK], pj[kMaxK];
#pragma unroll
    for (int j = 0; j < kMaxK; ++j) {
      ix[j] = j < k ? idx[j] : -1;
      dv[j] = j < k ? dw[j] : 0.0f;
      float held = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        if (j < k && i == (ix[j] >> 5)) held = pv[i];
      pj[j] = __shfl_sync(0xffffffffu, held, ix[j] & 31);
    }
    float s = 0.0f, dot = 0.0f;
    if (normalize) {
#pragma unroll
      for (int j = 0; j < kMaxK; ++j)
        if (j < k) s += pj[j];
#pragma unroll
      for (int j = 0; j < kMaxK; ++j)
        if (j < k) dot += dv[j] * (pj[j] / s);
    }
    // Each pick's term, formed once per row (the generic kernel forms it per expert: the same value).
#pragma unroll
    for (int j = 0; j < kMaxK; ++j)
      if (j < k && normalize) dv[j] = (dv[j] - dot) / s;
    float gv[kPer];
    float pg = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = lane + 32 * i;
      if (e >= E) continue;
      float g = dprobs_extra ? dprobs_extra[t * E + e] : 0.0f;
      if (aux_counts) g += aux_row[e];
#pragma unroll
      for (int j = 0; j < kMaxK; ++j)
        if (ix[j] == e) g += dv[j];
      gv[i] = g;
      pg += pv[i] * gv[i];
    }
    pg = warp_sum(pg);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i < E) dlogits[t * E + lane + 32 * i] = pv[i] * (gv[i] - pg);
  }
}

// Per row chunk c: pcount[c, e] = picks of e, pprob[c, e] = sum of probs[:, e] over the chunk; with
// logits, phealth[c] = (sum of the chunk's rows' logsumexp, sum of its probs * logits), each warp
// taking every 8th row and the warps' sums added in warp order.
__global__ void router_stats_partial_kernel(const float* __restrict__ probs, const int32_t* __restrict__ topk_idx,
                                            int64_t T, int64_t E, int k, int64_t rows_per_chunk,
                                            int32_t* __restrict__ pcount, float* __restrict__ pprob,
                                            const float* __restrict__ logits, float2* __restrict__ phealth) {
  pdl_wait();
  extern __shared__ int32_t hist[];  // [E]
  const int64_t c = blockIdx.x, r0 = c * rows_per_chunk, r1 = min(T, r0 + rows_per_chunk);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (int64_t i = r0 * k + threadIdx.x; i < r1 * k; i += blockDim.x) {
    const int32_t e = topk_idx[i];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);  // integer: order does not matter
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; ++r) acc += probs[r * E + e];
    pprob[c * E + e] = acc;
    pcount[c * E + e] = hist[e];
  }
  if (!logits) return;
  __shared__ float2 wsum[kWarpsPerBlock];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  float2 h = make_float2(0.0f, 0.0f);
  for (int64_t r = r0 + warp; r < r1; r += kWarpsPerBlock) {
    const float* l = logits + r * E;
    h.x += row_lse(l, E, lane);
    float pl = 0.0f;
    for (int64_t e = lane; e < E; e += 32) pl += probs[r * E + e] * l[e];
    h.y += warp_sum(pl);
  }
  if (lane == 0) wsum[warp] = h;
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = wsum[0];
    for (int w = 1; w < kWarpsPerBlock; ++w) t = make_float2(t.x + wsum[w].x, t.y + wsum[w].y);
    phealth[c] = t;
  }
}

// One block per expert: thread c takes chunk c (kMaxChunks >= chunks, one per thread), then a fixed
// tree over the block adds them (the same order on every run). A serial loop over the chunks per
// expert issued its 2 x 256 loads one at a time: 0.03 ms per layer for 2 MB of input.
static_assert((kMaxChunks & (kMaxChunks - 1)) == 0 && kMaxChunks <= 1024, "the final tree needs a power-of-two block");
// Block E (launched with the health sums) adds the chunks' health pairs with the same tree.
__global__ void router_stats_final_kernel(const int32_t* __restrict__ pcount, const float* __restrict__ pprob,
                                          int64_t chunks, int64_t E, float* __restrict__ counts,
                                          float* __restrict__ prob_sum, const float2* __restrict__ phealth,
                                          float* __restrict__ health) {
  pdl_wait();
  __shared__ int32_t sn[kMaxChunks];
  __shared__ float ss[kMaxChunks];
  __shared__ float2 sh[kMaxChunks];
  const int64_t e = blockIdx.x;
  const int c = threadIdx.x;
  if (e == E) {
    sh[c] = c < chunks ? phealth[c] : make_float2(0.0f, 0.0f);
    __syncthreads();
    for (int half = kMaxChunks / 2; half > 0; half >>= 1) {
      if (c < half) sh[c] = make_float2(sh[c].x + sh[c + half].x, sh[c].y + sh[c + half].y);
      __syncthreads();
    }
    if (c == 0) {
      health[0] = sh[0].x;
      health[1] = sh[0].y;
    }
    return;
  }
  sn[c] = c < chunks ? pcount[c * E + e] : 0;
  ss[c] = c < chunks ? pprob[c * E + e] : 0.0f;
  __syncthreads();
  for (int half = kMaxChunks / 2; half > 0; half >>= 1) {
    if (c < half) {
      sn[c] += sn[c + half];
      ss[c] += ss[c + half];
    }
    __syncthreads();
  }
  if (c == 0) {
    counts[e] += static_cast<float>(sn[0]);
    prob_sum[e] += ss[0];
  }
}

__global__ void aux_loss_bwd_kernel(const float* __restrict__ counts, int64_t T, int64_t E, double rows, double coef,
                                    float* __restrict__ dprobs) {
  pdl_wait();
  const int64_t n = T * E;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = i % E;
    dprobs[i] += static_cast<float>(coef * static_cast<double>(E) * counts[e] / (rows * rows));
  }
}

__global__ void zloss_fwd_kernel(const float* __restrict__ logits, int64_t T, int64_t E, float* __restrict__ lse) {
  pdl_wait();
  const int64_t t = blockIdx.x * (int64_t)kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float l = row_lse(logits + t * E, E, lane);
  if (lane == 0) lse[t] = l;
}

__global__ void zloss_bwd_kernel(const float* __restrict__ logits, const float* __restrict__ lse, float scale,
                                 int64_t T, int64_t E, float* __restrict__ dlogits) {
  pdl_wait();
  const int64_t n = T * E;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float l = lse[i / E];
    dlogits[i] += scale * 2.0f * l * expf(logits[i] - l);
  }
}

void need_f32(const Tensor& t, const char* op, const char* name) {
  need_cuda(t, op, name);
  need_dtype(t, DType::kF32, op, name);
}

}  // namespace

void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs, Tensor& topk_idx,
                 Tensor& topk_w) {
  const char* op = "router_topk";
  need_f32(logits, op, "logits");
  need_f32(probs, op, "probs");
  need_f32(topk_w, op, "topk_w");
  need_cuda(topk_idx, op, "topk_idx");
  need_dtype(topk_idx, DType::kI32, op, "topk_idx");
  const int64_t T = logits.size(0), E = logits.size(1);
  MT_CHECK(k >= 1 && k <= E, "[router_topk] k = {} must be in [1, {}]", k, E);
  need_numel(probs, T * E, op, "probs");
  need_numel(topk_idx, T * k, op, "topk_idx");
  need_numel(topk_w, T * k, op, "topk_w");
  if (!T) return;
  auto launch = [&](auto kernel) {
    launch_pdl(kernel, warp_blocks(T), 32 * kWarpsPerBlock, 0, stream_of(ctx), logits.data<float>(), T, E, k,
               normalize, probs.data<float>(), topk_idx.data<int32_t>(), topk_w.data<float>());
  };
  if (k <= 32 && E <= 128) launch(router_topk_reg_kernel<4>);
  else if (k <= 32 && E <= 256) launch(router_topk_reg_kernel<8>);
  else launch(router_topk_kernel);
  check_launch(op);
}

void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx, const Tensor& topk_w,
                          const Tensor& dtopk_w, const Tensor& dprobs_extra, bool normalize, Tensor& dlogits,
                          const Tensor& aux_counts, int64_t aux_rows, float aux_coef) {
  const char* op = "router_topk_backward";
  need_f32(probs, op, "probs");
  need_f32(dtopk_w, op, "dtopk_w");
  need_f32(dlogits, op, "dlogits");
  need_cuda(topk_idx, op, "topk_idx");
  need_dtype(topk_idx, DType::kI32, op, "topk_idx");
  const int64_t T = probs.size(0), E = probs.size(1), k = topk_idx.size(1);
  need_numel(dtopk_w, T * k, op, "dtopk_w");
  need_numel(dlogits, T * E, op, "dlogits");
  if (dprobs_extra.defined()) {
    need_f32(dprobs_extra, op, "dprobs_extra");
    need_numel(dprobs_extra, T * E, op, "dprobs_extra");
  }
  if (aux_counts.defined()) {
    need_f32(aux_counts, op, "aux_counts");
    need_numel(aux_counts, E, op, "aux_counts");
    MT_CHECK(E * 4 <= 48 * 1024, "[{}] {} experts exceed the shared-memory aux-loss row", op, E);
  }
  if (!T) return;
  auto launch = [&](auto kernel) {
    launch_pdl(kernel, warp_blocks(T), 32 * kWarpsPerBlock, aux_counts.defined() ? E * 4 : 0,
        stream_of(ctx), probs.data<float>(), topk_idx.data<int32_t>(), dtopk_w.data<float>(),
        dprobs_extra.defined() ? dprobs_extra.data<float>() : nullptr, normalize, T, E, static_cast<int>(k),
        dlogits.data<float>(), aux_counts.defined() ? aux_counts.data<float>() : nullptr,
        static_cast<double>(aux_rows), static_cast<double>(aux_coef));
  };
  if (k <= 8 && E <= 128) launch(router_topk_bwd_kernel<4>);
  else if (k <= 8 && E <= 256) launch(router_topk_bwd_kernel<8>);
  else launch(router_topk_bwd_kernel<0>);
  check_launch(op);
}

void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts, Tensor& prob_sum,
                  const Tensor& logits, Tensor* health) {
  const char* op = "router_stats";
  need_f32(probs, op, "probs");
  need_f32(counts, op, "counts");
  need_f32(prob_sum, op, "prob_sum");
  need_cuda(topk_idx, op, "topk_idx");
  need_dtype(topk_idx, DType::kI32, op, "topk_idx");
  const int64_t T = probs.size(0), E = probs.size(1), k = T ? topk_idx.numel() / T : 0;
  need_numel(counts, E, op, "counts");
  need_numel(prob_sum, E, op, "prob_sum");
  if (!T || !E) return;
  MT_CHECK(E * 4 <= 48 * 1024, "[router_stats] {} experts exceed the shared-memory histogram", E);
  if (health) {
    need_f32(logits, op, "logits");
    need_f32(*health, op, "health");
  }
  const int64_t chunks = std::min<int64_t>(T, kMaxChunks), rows_per_chunk = (T + chunks - 1) / chunks;
  Tensor scratch = device_scratch(ctx, chunks * E * 8 + (health ? chunks * 8 : 0));
  int32_t* pcount = static_cast<int32_t*>(scratch.data_ptr());
  float* pprob = reinterpret_cast<float*>(pcount + chunks * E);
  float2* phealth = health ? reinterpret_cast<float2*>(pprob + chunks * E) : nullptr;
  launch_pdl(router_stats_partial_kernel, static_cast<unsigned>(chunks), 32 * kWarpsPerBlock, E * 4, stream_of(ctx),
      probs.data<float>(), topk_idx.data<int32_t>(), T, E, static_cast<int>(k), rows_per_chunk, pcount, pprob,
      health ? logits.data<float>() : nullptr, phealth);
  launch_pdl(router_stats_final_kernel, static_cast<unsigned>(E + (health ? 1 : 0)), kMaxChunks, 0, stream_of(ctx),
      pcount, pprob, chunks, E, counts.data<float>(), prob_sum.data<float>(), phealth,
      health ? health->data<float>() : nullptr);
  check_launch(op);
}

double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows) {
  if (rows <= 0) return 0.0;
  // No Context here: finish all device work so the copies below see the latest statistics.
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> c = counts.to_floats(), p = prob_sum.to_floats();  // synchronous copies
  MT_CHECK(c.size() == p.size(), "[aux_loss_value] counts has {} values, prob_sum {}", c.size(), p.size());
  const double n = static_cast<double>(rows);
  double s = 0.0;
  for (size_t e = 0; e < c.size(); ++e) s += (c[e] / n) * (p[e] / n);
  return static_cast<double>(c.size()) * s;
}

void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef, Tensor& dprobs) {
  const char* op = "aux_loss_backward";
  need_f32(counts, op, "counts");
  need_f32(dprobs, op, "dprobs");
  const int64_t T = dprobs.size(0), E = dprobs.size(1);
  need_numel(counts, E, op, "counts");
  MT_CHECK(rows > 0, "[aux_loss_backward] rows = {}, expected > 0", rows);
  if (!T || !E) return;
  launch_pdl(aux_loss_bwd_kernel, grid_for(T * E), 256, 0, stream_of(ctx), counts.data<float>(), T, E,
                                                                    static_cast<double>(rows), coef,
                                                                    dprobs.data<float>());
  check_launch(op);
}

double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse) {
  const char* op = "router_zloss_forward";
  need_f32(logits, op, "logits");
  need_f32(lse, op, "lse");
  const int64_t T = logits.size(0), E = logits.size(1);
  need_numel(lse, T, op, "lse");
  if (!T) return 0.0;
  launch_pdl(zloss_fwd_kernel, warp_blocks(T), 32 * kWarpsPerBlock, 0, stream_of(ctx), logits.data<float>(), T, E,
                                                                               lse.data<float>());
  check_launch(op);
  return reduce_to_host(ctx, lse.data<float>(), T, true);
}

void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale, Tensor& dlogits) {
  const char* op = "router_zloss_backward";
  need_f32(logits, op, "logits");
  need_f32(lse, op, "lse");
  need_f32(dlogits, op, "dlogits");
  const int64_t T = logits.size(0), E = logits.size(1);
  need_numel(lse, T, op, "lse");
  need_numel(dlogits, T * E, op, "dlogits");
  if (!T || !E) return;
  launch_pdl(zloss_bwd_kernel, grid_for(T * E), 256, 0, stream_of(ctx), logits.data<float>(), lse.data<float>(), scale, T,
                                                                E, dlogits.data<float>());
  check_launch(op);
}

}  // namespace moetrain::cuda
