// CUDA token permutation into expert-contiguous order and back. route_index runs entirely on the
// device: a stable radix sort of the T*k picks by expert id (CUB; stable, so rows of one expert
// keep ascending flat pick order), offsets by binary search in the sorted ids, counts as their
// differences. permute gathers rows; unpermute is y[t] = sum_j w[t,j] yp[row_of[t*k+j]].
// Backwards are per-token gathers in j order (deterministic, no atomics).
#include <cub/device/device_radix_sort.cuh>

#include "core/env.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

__global__ void iota_kernel(int32_t* __restrict__ v, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// offsets[e] = first sorted position whose expert id is >= e, for e in [0, E].
__global__ void offsets_kernel(const int32_t* __restrict__ sorted, int64_t P, int E, int32_t* __restrict__ counts,
                               int32_t* __restrict__ offsets) {
  pdl_wait();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e > E) return;
  auto lower = [&](int v) {
    int64_t lo = 0, hi = P;
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (sorted[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  const int64_t a = lower(e);
  offsets[e] = static_cast<int32_t>(a);
  if (e < E) counts[e] = static_cast<int32_t>(lower(e + 1) - a);
}

__global__ void scatter_rows_kernel(const int32_t* __restrict__ sorted_pick, int64_t P, int k,
                                    int32_t* __restrict__ row_of, int32_t* __restrict__ token_of) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P; i += (int64_t)gridDim.x * blockDim.x) {
    const int32_t pick = sorted_pick[i];
    row_of[pick] = static_cast<int32_t>(i);
    token_of[i] = pick / k;
  }
}

// ---- route_index: a stable counting sort of the picks by expert, in three small launches ------
// Block b owns picks [b * kRouteChunk, (b + 1) * kRouteChunk), and warp w of it a contiguous eighth,
// walked 32 at a time: __match_any_sync groups a round's lanes by expert, the lowest lane of a group
// adds the group's size to the warp's count, and a lane's rank in it is the number of lower lanes.
// route_count_kernel writes each block's counts per expert; route_scan_kernel (one block) turns them
// into counts, offsets and each block's first row per expert (expert order, then block order);
// route_place_kernel counts again, adds the earlier warps of its block, and places the picks. Rows of
// one expert keep ascending pick order, as the radix sort and the CPU give. Picks whose expert lies
// outside [0, E) are left out of counts and offsets and get rows after offsets[E], in pick order.
// (Until 2026-11-23 this ran in one block of 32 warps: 34-41 us per call, bound by its 64 rounds.)
constexpr int kRouteWarps = 8;
constexpr int kRouteChunk = kRouteWarps * 32 * 4;  // picks per block: 4 rounds per warp
constexpr int kRouteMaxE = 256;                    // hist is [8][E + 1] ints in shared memory
constexpr int kRouteMaxBlocks = 1024;              // 2^20 picks

// This warp's picks [p0, p1): with kPlace, pick i goes to row hist[e] + rank (hist: the warp's first
// free row per expert); either way hist[e] grows by the round's group sizes. Column E: out of range.
template <bool kPlace>
__device__ __forceinline__ void route_walk(const int32_t* __restrict__ idx, int64_t p0, int64_t p1, int k, int E,
                                           int32_t* hist, int32_t* __restrict__ row_of,
                                           int32_t* __restrict__ token_of) {
  const int lane = threadIdx.x & 31;
  const unsigned lower = (1u << lane) - 1u;
  constexpr int kBatch = 4;  // rounds' ids loaded at once (their loads in flight together)
  for (int64_t chunk = p0; chunk < p1; chunk += 32 * kBatch) {
    int ev[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = chunk + b * 32 + lane;
      ev[b] = i < p1 ? idx[i] : 0;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = chunk + b * 32 + lane;
      const bool live = i < p1;
      int e = ev[b];
      if (e < 0 || e >= E) e = E;
      const unsigned active = __ballot_sync(0xffffffffu, live);
      if (live) {
        const unsigned peers = __match_any_sync(active, e);
        const int rank = __popc(peers & lower);
        if constexpr (kPlace) {
          const int32_t row = hist[e] + rank;
          row_of[i] = row;
          token_of[row] = static_cast<int32_t>(i / k);
        }
        __syncwarp(active);
        if (rank == 0) hist[e] += __popc(peers);
      }
      __syncwarp();
    }
  }
}

// The per-warp counts of block blockIdx.x in hist [kRouteWarps][E + 1] (zeroed here).
__device__ __forceinline__ void route_block_counts(const int32_t* __restrict__ idx, int64_t P, int k, int E,
                                                   int32_t (*hist)[kRouteMaxE + 1]) {
  const int warp = threadIdx.x >> 5, cols = E + 1;
  for (int i = threadIdx.x; i < kRouteWarps * cols; i += blockDim.x) hist[i / cols][i % cols] = 0;
  __syncthreads();
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kRouteChunk, seg = kRouteChunk / kRouteWarps;
  const int64_t p0 = min(P, c0 + warp * seg), p1 = min(P, p0 + seg);
  route_walk<false>(idx, p0, p1, k, E, hist[warp], nullptr, nullptr);
  __syncthreads();
}

__global__ void __launch_bounds__(32 * kRouteWarps) route_count_kernel(const int32_t* __restrict__ idx, int64_t P,
                                                                        int k, int E, int32_t* __restrict__ bhist) {
  pdl_wait();
  __shared__ int32_t hist[kRouteWarps][kRouteMaxE + 1];
  route_block_counts(idx, P, k, E, hist);
  const int cols = E + 1;
  for (int e = threadIdx.x; e < cols; e += blockDim.x) {
    int32_t t = 0;
    for (int w = 0; w < kRouteWarps; ++w) t += hist[w][e];
    bhist[static_cast<int64_t>(blockIdx.x) * cols + e] = t;
  }
}

// bhist [B][E + 1] counts -> each block's first row per expert; counts, offsets (offsets[E]: the end
// of the valid rows). One block: a thread per expert sums its column, one warp scans the totals.
__global__ void __launch_bounds__(256) route_scan_kernel(int B, int E, int32_t* __restrict__ bhist,
                                                         int32_t* __restrict__ counts, int32_t* __restrict__ offsets) {
  pdl_wait();
  __shared__ int32_t total[kRouteMaxE + 1];
  const int cols = E + 1;
  for (int e = threadIdx.x; e < cols; e += blockDim.x) {
    int32_t t = 0;
    for (int b = 0; b < B; ++b) t += bhist[static_cast<int64_t>(b) * cols + e];
    total[e] = t;
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // exclusive scan of total[0..cols): lane l takes a run of consecutive columns
    const int lane = threadIdx.x, per = (cols + 31) / 32, e0 = min(cols, lane * per), e1 = min(cols, e0 + per);
    int32_t mine = 0;
    for (int e = e0; e < e1; ++e) mine += total[e];
    int32_t incl = mine;
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    int32_t run = incl - mine;
    for (int e = e0; e < e1; ++e) {
      const int32_t t = total[e];
      if (e < E) counts[e] = t;
      offsets[e] = run;
      total[e] = run;
      run += t;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < cols; e += blockDim.x) {
    int32_t run = total[e];
    for (int b = 0; b < B; ++b) {
      const int64_t at = static_cast<int64_t>(b) * cols + e;
      const int32_t c = bhist[at];
      bhist[at] = run;
      run += c;
    }
  }
}

__global__ void __launch_bounds__(32 * kRouteWarps) route_place_kernel(const int32_t* __restrict__ idx, int64_t P,
                                                                        int k, int E,
                                                                        const int32_t* __restrict__ bbase,
                                                                        int32_t* __restrict__ row_of,
                                                                        int32_t* __restrict__ token_of) {
  pdl_wait();
  __shared__ int32_t hist[kRouteWarps][kRouteMaxE + 1];
  route_block_counts(idx, P, k, E, hist);
  const int cols = E + 1;
  for (int e = threadIdx.x; e < cols; e += blockDim.x) {  // counts -> each warp's first row per expert
    int32_t run = bbase[static_cast<int64_t>(blockIdx.x) * cols + e];
    for (int w = 0; w < kRouteWarps; ++w) {
      const int32_t c = hist[w][e];
      hist[w][e] = run;
      run += c;
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kRouteChunk, seg = kRouteChunk / kRouteWarps;
  const int64_t p0 = min(P, c0 + warp * seg), p1 = min(P, p0 + seg);
  route_walk<true>(idx, p0, p1, k, E, hist[warp], row_of, token_of);
}

template <typename S, typename D>
__global__ void gather_rows_kernel(const S* __restrict__ x, const int32_t* __restrict__ src_row, int64_t H,
                                   D* __restrict__ out) {
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int64_t s = src_row[r];
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) out[r * H + h] = from_f<D>(to_f(x[s * H + h]));
}

// 16-byte-aligned packs of 8 elements: the row kernels below move whole packs when H % 8 == 0 and
// the rows are aligned (the same per-element arithmetic, so the same bits as the scalar loops).
template <typename T>
struct alignas(16) Pack8 {
  T v[8];
};

// kGatherRows rows per block: a thread issues its pack of each row before it stores any (four 16-byte
// loads in flight instead of one): 68.9 -> 65.8 us a call at H 2048, 32768 rows (H100, round 26). The
// same change to combine_rows_vec_kernel (eight rows' loads first) took it from 59.9 to 95.6 us.
// The rows are stored with the streaming hint (st.global.cs, evict first): the 134 MB written then
// does not push the T source rows (16 MB, each read top-k times) out of L2. Alone on an H100
// (bench/standalone/gather_bench.cu, round 31): 73.2 -> 65.3 us a call, the same bytes.
constexpr int kGatherRows = 4;
template <typename D>
__device__ __forceinline__ void store_pack_streaming(Pack8<D>* p, const Pack8<D>& v) {
  static_assert(sizeof(Pack8<D>) == 16, "16-byte packs");
  const uint4 u = *reinterpret_cast<const uint4*>(&v);
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
               : "memory");
}
template <typename S, typename D>
__global__ void gather_rows_vec_kernel(const S* __restrict__ x, const int32_t* __restrict__ src_row, int64_t N,
                                       int64_t H, D* __restrict__ out) {
  pdl_wait();
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kGatherRows), hp = H / 8;
  const Pack8<S>* xs[kGatherRows];
#pragma unroll
  for (int i = 0; i < kGatherRows; ++i)
    xs[i] = r0 + i < N ? reinterpret_cast<const Pack8<S>*>(x + src_row[r0 + i] * H) : nullptr;
  Pack8<D>* o = reinterpret_cast<Pack8<D>*>(out + r0 * H);
  for (int64_t h = threadIdx.x; h < hp; h += blockDim.x) {
    Pack8<S> a[kGatherRows];
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i)
      if (xs[i]) a[i] = xs[i][h];
#pragma unroll
    for (int i = 0; i < kGatherRows; ++i) {
      if (!xs[i]) continue;
      Pack8<D> b;
#pragma unroll
      for (int e = 0; e < 8; ++e) b.v[e] = from_f<D>(to_f(a[i].v[e]));
      if constexpr (sizeof(Pack8<D>) == 16) store_pack_streaming(o + i * hp + h, b);
      else o[i * hp + h] = b;
    }
  }
}

// The rows a combine reads (T x top-k of them, each once) with the streaming hint (ld.global.cs), so
// that they leave L2 before the T-row output, which the next kernel reads.
template <typename S>
__device__ __forceinline__ Pack8<S> load_pack_streaming(const Pack8<S>* p) {
  if constexpr (sizeof(Pack8<S>) == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<const Pack8<S>*>(&u);
  } else {
    return *p;
  }
}
template <typename S, typename D>
__global__ void combine_rows_vec_kernel(const S* __restrict__ src, const int32_t* __restrict__ row_of,
                                        const float* __restrict__ w, int k, int64_t H, D* __restrict__ out,
                                        const D* __restrict__ residual) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H / 8; h += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; ++j) {
      const int64_t row = row_of[t * k + j];
      const float wj = w ? w[t * k + j] : 1.0f;
      const Pack8<S> a = load_pack_streaming(reinterpret_cast<const Pack8<S>*>(src + row * H) + h);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += wj * to_f(a.v[i]);
    }
    if (residual) {
      const Pack8<D> r = reinterpret_cast<const Pack8<D>*>(residual + t * H)[h];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += to_f(r.v[i]);
    }
    Pack8<D> b;
#pragma unroll
    for (int i = 0; i < 8; ++i) b.v[i] = from_f<D>(acc[i]);
    reinterpret_cast<Pack8<D>*>(out + t * H)[h] = b;
  }
}

bool packs_ok(int64_t H, const void* a, const void* b) {
  return H % 8 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

// out[t] = sum_j (w ? w[t,j] : 1) * src[row_of[t*k+j]] (+ residual[t], added last)
template <typename S, typename D>
__global__ void combine_rows_kernel(const S* __restrict__ src, const int32_t* __restrict__ row_of,
                                    const float* __restrict__ w, int k, int64_t H, D* __restrict__ out,
                                    const D* __restrict__ residual) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t row = row_of[t * k + j];
      acc += (w ? w[t * k + j] : 1.0f) * to_f(src[row * H + h]);
    }
    if (residual) acc += to_f(residual[t * H + h]);
    out[t * H + h] = from_f<D>(acc);
  }
}

template <typename G, typename Y, typename DY>
__global__ void unpermute_bwd_kernel(const G* __restrict__ dy, const Y* __restrict__ yp,
                                     const int32_t* __restrict__ row_of, const float* __restrict__ w, int k,
                                     int64_t H, DY* __restrict__ dyp, float* __restrict__ dw) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  for (int j = 0; j < k; ++j) {
    const int64_t row = row_of[t * k + j];
    const float wj = w[t * k + j];
    float dot = 0.0f;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
      const float g = to_f(dy[t * H + h]);
      dot += g * to_f(yp[row * H + h]);
      dyp[row * H + h] = from_f<DY>(wj * g);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dw[t * k + j] = dot;
  }
}

// unpermute_bwd_kernel on 8-element packs (H % 8 == 0, aligned rows): each thread's dot covers 8
// neighbouring columns instead of 8 strided ones (a different, still fixed, summation order).
template <typename G, typename Y, typename DY>
__global__ void unpermute_bwd_vec_kernel(const G* __restrict__ dy, const Y* __restrict__ yp,
                                         const int32_t* __restrict__ row_of, const float* __restrict__ w, int k,
                                         int64_t H, DY* __restrict__ dyp, float* __restrict__ dw) {
  pdl_wait();
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const Pack8<G>* dyt = reinterpret_cast<const Pack8<G>*>(dy + t * H);
  for (int j = 0; j < k; ++j) {
    const int64_t row = row_of[t * k + j];
    const float wj = w[t * k + j];
    const Pack8<Y>* ypr = reinterpret_cast<const Pack8<Y>*>(yp + row * H);
    Pack8<DY>* out = reinterpret_cast<Pack8<DY>*>(dyp + row * H);
    float dot = 0.0f;
    for (int64_t h = threadIdx.x; h < H / 8; h += blockDim.x) {
      const Pack8<G> g = dyt[h];
      const Pack8<Y> y = ypr[h];
      Pack8<DY> o;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float gi = to_f(g.v[i]);
        dot += gi * to_f(y.v[i]);
        o.v[i] = from_f<DY>(wj * gi);
      }
      out[h] = o;
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dw[t * k + j] = dot;
  }
}

// Per-pick f32 values between pick order and permuted-row order (row_of is a permutation).
__global__ void rows_from_picks_kernel(const float* __restrict__ picks, const int32_t* __restrict__ row_of, int64_t P,
                                       float* __restrict__ rows) {
  pdl_wait();
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
    rows[row_of[p]] = picks[p];
}
__global__ void picks_from_rows_kernel(const float* __restrict__ rows, const int32_t* __restrict__ row_of, int64_t P,
                                       float* __restrict__ picks) {
  pdl_wait();
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x)
    picks[p] = rows[row_of[p]];
}

}  // namespace

void moe_route_index(Context& ctx, const Tensor& topk_idx, int num_experts, Tensor& counts, Tensor& offsets,
                     Tensor& row_of, Tensor& token_of) {
  const char* op = "moe_route_index";
  for (const Tensor* t : {&topk_idx, static_cast<const Tensor*>(&counts), static_cast<const Tensor*>(&offsets),
                          static_cast<const Tensor*>(&row_of), static_cast<const Tensor*>(&token_of)}) {
    need_cuda(*t, op, "index tensor");
    need_dtype(*t, DType::kI32, op, "index tensor");
  }
  const int64_t P = topk_idx.numel(), k = topk_idx.dim() == 2 ? topk_idx.size(1) : 1;
  const int E = num_experts;
  MT_CHECK(E >= 1, "[moe_route_index] num_experts = {}, expected >= 1", E);
  need_numel(counts, E, op, "counts");
  need_numel(offsets, E + 1, op, "offsets");
  need_numel(row_of, P, op, "row_of");
  need_numel(token_of, P, op, "token_of");
  MT_CHECK(P < (int64_t{1} << 31), "[moe_route_index] {} picks exceed the i32 range", P);
  cudaStream_t s = stream_of(ctx);
  // Up to 256 experts and 2^20 picks (128K tokens at top-8): the counting sort; beyond, the radix sort.
  const int64_t blocks = (P + kRouteChunk - 1) / kRouteChunk;
  if (E <= kRouteMaxE && blocks <= kRouteMaxBlocks && env_int("MT_ROUTE_INDEX_CUB", 0) == 0) {
    const int B = static_cast<int>(blocks > 0 ? blocks : 1);
    Tensor scratch = device_scratch(ctx, static_cast<int64_t>(B) * (E + 1) * 4);
    int32_t* bhist = static_cast<int32_t*>(scratch.data_ptr());
    const int32_t* ids = topk_idx.data<int32_t>();
    launch_pdl(route_count_kernel, B, 32 * kRouteWarps, 0, s, ids, P, static_cast<int>(k), E, bhist);
    launch_pdl(route_scan_kernel, 1, 256, 0, s, B, E, bhist, counts.data<int32_t>(), offsets.data<int32_t>());
    launch_pdl(route_place_kernel, B, 32 * kRouteWarps, 0, s, ids, P, static_cast<int>(k), E,
               static_cast<const int32_t*>(bhist), row_of.data<int32_t>(), token_of.data<int32_t>());
    check_launch(op);
    return;
  }
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(P), 0, 32, s));
  const int64_t idx_bytes = (3 * P * 4 + 255) / 256 * 256;
  Tensor scratch = device_scratch(ctx, idx_bytes + static_cast<int64_t>(temp_bytes));
  int32_t* pick = static_cast<int32_t*>(scratch.data_ptr());
  int32_t* sorted_e = pick + P;
  int32_t* sorted_pick = pick + 2 * P;
  void* temp = static_cast<char*>(scratch.data_ptr()) + idx_bytes;
  if (P > 0) {
    launch_pdl(iota_kernel, grid_for(P), 256, 0, s, pick, P);
    check_launch(op);
    // All 32 bits: out-of-range ids sort outside [0, E) and are left out of counts/offsets.
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, topk_idx.data<int32_t>(), sorted_e, pick,
                                                  sorted_pick, static_cast<int>(P), 0, 32, s));
    launch_pdl(scatter_rows_kernel, grid_for(P), 256, 0, s, sorted_pick, P, static_cast<int>(k), row_of.data<int32_t>(),
                                                    token_of.data<int32_t>());
  }
  launch_pdl(offsets_kernel, static_cast<unsigned>((E + 1 + 255) / 256), 256, 0, s, sorted_e, P, E, counts.data<int32_t>(),
                                                                            offsets.data<int32_t>());
  check_launch(op);
}

void moe_permute(Context& ctx, const Tensor& x, const Tensor& token_of, Tensor& xp) {
  const char* op = "moe_permute";
  need_cuda(x, op, "x");
  need_cuda(token_of, op, "token_of");
  need_cuda(xp, op, "xp");
  need_dtype(token_of, DType::kI32, op, "token_of");
  const int64_t H = x.size(-1), N = xp.size(0);
  need_numel(token_of, N, op, "token_of");
  need_numel(xp, N * H, op, "xp");
  if (!N || !H) return;
  const bool packs = packs_ok(H, x.data_ptr(), xp.data_ptr());
  MT_CUDA_DISPATCH(x.dtype(), S, op,
    MT_CUDA_DISPATCH(xp.dtype(), D, op,
      if (packs) {
        launch_pdl(gather_rows_vec_kernel<S, D>, static_cast<unsigned>((N + kGatherRows - 1) / kGatherRows), 256, 0,
            stream_of(ctx), static_cast<const S*>(x.data_ptr()), token_of.data<int32_t>(), N, H,
            static_cast<D*>(xp.data_ptr()));
      } else {
        launch_pdl(gather_rows_kernel<S, D>, static_cast<unsigned>(N), 256, 0, stream_of(ctx),
            static_cast<const S*>(x.data_ptr()), token_of.data<int32_t>(), H, static_cast<D*>(xp.data_ptr()));
      }));
  check_launch(op);
}

void moe_permute_backward(Context& ctx, const Tensor& dxp, const Tensor& row_of, Tensor& dx) {
  const char* op = "moe_permute_backward";
  need_cuda(dxp, op, "dxp");
  need_cuda(row_of, op, "row_of");
  need_cuda(dx, op, "dx");
  need_dtype(row_of, DType::kI32, op, "row_of");
  const int64_t T = dx.size(0), H = dx.size(-1), N = dxp.size(0), k = T ? N / T : 0;
  MT_CHECK(T == 0 || k * T == N, "[moe_permute_backward] dxp has {} rows, not a multiple of the {} tokens", N, T);
  need_numel(row_of, N, op, "row_of");
  if (!T || !H) return;
  const bool packs = packs_ok(H, dxp.data_ptr(), dx.data_ptr());
  MT_CUDA_DISPATCH(dxp.dtype(), S, op,
    MT_CUDA_DISPATCH(dx.dtype(), D, op,
      if (packs) {
        launch_pdl(combine_rows_vec_kernel<S, D>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
            static_cast<const S*>(dxp.data_ptr()), row_of.data<int32_t>(), nullptr, static_cast<int>(k), H,
            static_cast<D*>(dx.data_ptr()), static_cast<const D*>(nullptr));
      } else {
        launch_pdl(combine_rows_kernel<S, D>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
            static_cast<const S*>(dxp.data_ptr()), row_of.data<int32_t>(), nullptr, static_cast<int>(k), H,
            static_cast<D*>(dx.data_ptr()), static_cast<const D*>(nullptr));
      }));
  check_launch(op);
}

void moe_unpermute(Context& ctx, const Tensor& yp, const Tensor& row_of, const Tensor& topk_w, Tensor& y,
                   const Tensor& residual) {
  const char* op = "moe_unpermute";
  need_cuda(yp, op, "yp");
  need_cuda(row_of, op, "row_of");
  need_cuda(y, op, "y");
  need_dtype(row_of, DType::kI32, op, "row_of");
  const int64_t T = y.size(0), H = y.size(-1);
  const int64_t k = topk_w.defined() ? topk_w.size(-1) : (T ? yp.size(0) / T : 0);
  const float* w = nullptr;  // without weights every row counts once
  if (topk_w.defined()) {
    need_cuda(topk_w, op, "topk_w");
    need_dtype(topk_w, DType::kF32, op, "topk_w");
    need_numel(topk_w, T * k, op, "topk_w");
    w = topk_w.data<float>();
  }
  need_numel(row_of, T * k, op, "row_of");
  if (residual.defined()) {
    need_cuda(residual, op, "residual");
    need_dtype(residual, y.dtype(), op, "residual");
    need_numel(residual, T * H, op, "residual");
  }
  if (!T || !H) return;
  const bool packs = packs_ok(H, yp.data_ptr(), y.data_ptr()) &&
                     (!residual.defined() || reinterpret_cast<uintptr_t>(residual.data_ptr()) % 16 == 0);
  MT_CUDA_DISPATCH(yp.dtype(), S, op,
    MT_CUDA_DISPATCH(y.dtype(), D, op,
      const D* res = residual.defined() ? static_cast<const D*>(residual.data_ptr()) : nullptr;
      if (packs) {
        launch_pdl(combine_rows_vec_kernel<S, D>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
            static_cast<const S*>(yp.data_ptr()), row_of.data<int32_t>(), w, static_cast<int>(k), H,
            static_cast<D*>(y.data_ptr()), res);
      } else {
        launch_pdl(combine_rows_kernel<S, D>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
            static_cast<const S*>(yp.data_ptr()), row_of.data<int32_t>(), w, static_cast<int>(k), H,
            static_cast<D*>(y.data_ptr()), res);
      }));
  check_launch(op);
}

void moe_unpermute_backward(Context& ctx, const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& topk_w, Tensor& dyp, Tensor& dtopk_w) {
  const char* op = "moe_unpermute_backward";
  need_cuda(dy, op, "dy");
  need_cuda(yp, op, "yp");
  need_cuda(row_of, op, "row_of");
  need_cuda(topk_w, op, "topk_w");
  need_cuda(dyp, op, "dyp");
  need_cuda(dtopk_w, op, "dtopk_w");
  need_dtype(row_of, DType::kI32, op, "row_of");
  need_dtype(topk_w, DType::kF32, op, "topk_w");
  need_dtype(dtopk_w, DType::kF32, op, "dtopk_w");
  const int64_t T = dy.size(0), H = dy.size(-1), k = topk_w.size(-1);
  need_numel(row_of, T * k, op, "row_of");
  need_numel(dtopk_w, T * k, op, "dtopk_w");
  need_numel(dyp, yp.numel(), op, "dyp");
  if (!T) return;
  const bool packs = packs_ok(H, dy.data_ptr(), yp.data_ptr()) && packs_ok(H, dyp.data_ptr(), dyp.data_ptr());
  MT_CUDA_DISPATCH(dy.dtype(), G, op,
    MT_CUDA_DISPATCH(yp.dtype(), Y, op,
      MT_CUDA_DISPATCH(dyp.dtype(), DY, op,
        if (packs) {
          launch_pdl(unpermute_bwd_vec_kernel<G, Y, DY>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
              static_cast<const G*>(dy.data_ptr()), static_cast<const Y*>(yp.data_ptr()), row_of.data<int32_t>(),
              topk_w.data<float>(), static_cast<int>(k), H, static_cast<DY*>(dyp.data_ptr()), dtopk_w.data<float>());
        } else {
          launch_pdl(unpermute_bwd_kernel<G, Y, DY>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
              static_cast<const G*>(dy.data_ptr()), static_cast<const Y*>(yp.data_ptr()), row_of.data<int32_t>(),
              topk_w.data<float>(), static_cast<int>(k), H, static_cast<DY*>(dyp.data_ptr()), dtopk_w.data<float>());
        })));
  check_launch(op);
}

namespace {
// rows_from_picks (to_rows) or picks_from_rows: src and dst hold one f32 per pick.
void move_pick_values(Context& ctx, const char* op, const Tensor& src, const Tensor& row_of, Tensor& dst,
                      bool to_rows) {
  need_cuda(src, op, "source");
  need_cuda(row_of, op, "row_of");
  need_cuda(dst, op, "destination");
  need_dtype(src, DType::kF32, op, "source");
  need_dtype(row_of, DType::kI32, op, "row_of");
  need_dtype(dst, DType::kF32, op, "destination");
  const int64_t P = dst.numel();
  need_numel(row_of, P, op, "row_of");
  need_numel(src, P, op, "source");
  if (!P) return;
  launch_pdl(to_rows ? rows_from_picks_kernel : picks_from_rows_kernel, grid_for(P), 256, 0, stream_of(ctx),
             src.data<float>(), row_of.data<int32_t>(), P, dst.data<float>());
  check_launch(op);
}
}  // namespace

void moe_rows_from_picks(Context& ctx, const Tensor& picks, const Tensor& row_of, Tensor& rows) {
  move_pick_values(ctx, "moe_rows_from_picks", picks, row_of, rows, true);
}

void moe_picks_from_rows(Context& ctx, const Tensor& rows, const Tensor& row_of, Tensor& picks) {
  move_pick_values(ctx, "moe_picks_from_rows", rows, row_of, picks, false);
}

}  // namespace moetrain::cuda
