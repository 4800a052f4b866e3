// CUDA causal GQA attention over packed documents (cu_seqlens), a simple tiled kernel with online
// softmax (flash-attention style, fp32 math in shared memory; not tensor cores yet).
// Forward: a block = 16 query rows of one head, 4 warps x 4 rows; K/V tiles of 32 keys, one key
// per lane for the scores, lanes own output dims for P.V. lse [nh, T] is saved.
// Backward (P recomputed from lse, D_i = dO_i . O_i): dq per query (same tiling as forward);
// dk/dv per key (a block = 16 keys of one kv head, lanes own queries), summing the group's query
// heads and later queries in a fixed order: deterministic, no atomics.
// bf16 with head dim 64 or 128 goes to the tensor-core kernels of attention_flash.cu instead.
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/need_rows.cuh"

namespace moetrain::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // query rows (forward, dq) or keys (dk/dv) per block
constexpr int kTile = 32;                     // keys (forward, dq) or queries (dk/dv) per tile
constexpr int kMaxU = 8;                      // head dim <= 32 * kMaxU

struct Dims {
  int64_t T, nh, nkv, d, group;
  int ndocs;
  float scale;
};

// Index s of the document holding token t: the largest s with cu[s] <= t.
__device__ __forceinline__ int doc_of(const int32_t* __restrict__ cu, int ndocs, int64_t t) {
  int lo = 0, hi = ndocs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <typename T>
__device__ __forceinline__ void load_rows(float* dst, int ld, const T* __restrict__ src, int64_t first, int count,
                                          int64_t row_stride, int64_t d, int64_t limit) {
  for (int e = threadIdx.x; e < count * d; e += blockDim.x) {
    const int r = e / d, c = e - r * d;
    const int64_t t = first + r;
    dst[r * ld + c] = t < limit ? to_f(src[t * row_stride + c]) : 0.0f;
  }
}

template <typename T>
__global__ void attn_fwd_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const int32_t* __restrict__ cu, Dims D, T* __restrict__ out,
                                float* __restrict__ lse) {
  pdl_wait();
  extern __shared__ float smem[];
  const int64_t d = D.d, ld = d + 1;
  float* Ks = smem;               // [kTile][d+1]
  float* Vs = Ks + kTile * ld;    // [kTile][d+1]
  float* Qs = Vs + kTile * ld;    // [kRows][d]
  const int64_t h = blockIdx.y, g = h / D.group, t0 = blockIdx.x * (int64_t)kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  load_rows(Qs, static_cast<int>(d), q + h * d, t0, kRows, D.nh * d, d, D.T);

  int64_t row_t[kRowsPerWarp], row_begin[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxU];
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    row_t[rr] = t0 + warp * kRowsPerWarp + rr;
    row_begin[rr] = row_t[rr] < D.T ? cu[doc_of(cu, D.ndocs, row_t[rr])] : 0;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
    for (int u = 0; u < kMaxU; ++u) acc[rr][u] = 0.0f;
  }
  const int64_t kmin = cu[doc_of(cu, D.ndocs, t0)];
  const int64_t kmax = min(t0 + kRows - 1, D.T - 1);
  for (int64_t kt = kmin; kt <= kmax; kt += kTile) {
    __syncthreads();
    load_rows(Ks, static_cast<int>(ld), k + g * d, kt, kTile, D.nkv * d, d, kmax + 1);
    load_rows(Vs, static_cast<int>(ld), v + g * d, kt, kTile, D.nkv * d, d, kmax + 1);
    __syncthreads();
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t t = row_t[rr];
      if (t >= D.T) continue;
      const int64_t j = kt + lane;
      const bool valid = j >= row_begin[rr] && j <= t;
      float s = -INFINITY;
      if (valid) {
        const float* qr = Qs + (warp * kRowsPerWarp + rr) * d;
        const float* kr = Ks + lane * ld;
        float dot = 0.0f;
        for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
        s = dot * D.scale;
      }
      const float mt = warp_max(s);
      if (mt == -INFINITY) continue;  // no key of this tile is visible to this row
      const float mn = fmaxf(m[rr], mt);
      const float p = valid ? expf(s - mn) : 0.0f;
      const float corr = expf(m[rr] - mn);  // 0 on the first visible tile (m = -inf)
      l[rr] = l[rr] * corr + warp_sum(p);
      m[rr] = mn;
      for (int u = 0; u < kMaxU; ++u) acc[rr][u] *= corr;
      for (int jj = 0; jj < kTile; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        if (pj == 0.0f) continue;
        const float* vr = Vs + jj * ld;
        for (int u = 0; u < kMaxU; ++u) {
          const int64_t c = lane + 32 * u;
          if (c < d) acc[rr][u] += pj * vr[c];
        }
      }
    }
  }
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t t = row_t[rr];
    if (t >= D.T) continue;
    const float inv = 1.0f / l[rr];
    T* o = out + (t * D.nh + h) * d;
    for (int u = 0; u < kMaxU; ++u) {
      const int64_t c = lane + 32 * u;
      if (c < d) o[c] = from_f<T>(acc[rr][u] * inv);
    }
    if (lane == 0) lse[h * D.T + t] = m[rr] + logf(l[rr]);
  }
}

// Dsum[h, t] = dO[t, h] . O[t, h]; one warp per (t, h).
template <typename T>
__global__ void attn_bwd_dot_kernel(const T* __restrict__ out, const T* __restrict__ dout, Dims D,
                                    float* __restrict__ dsum) {
  pdl_wait();
  const int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= D.T * D.nh) return;
  const int64_t t = w / D.nh, h = w - t * D.nh;
  const T* o = out + w * D.d;
  const T* g = dout + w * D.d;
  float s = 0.0f;
  for (int64_t c = lane; c < D.d; c += 32) s += to_f(o[c]) * to_f(g[c]);
  s = warp_sum(s);
  if (lane == 0) dsum[h * D.T + t] = s;
}

template <typename T>
__global__ void attn_bwd_dq_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                   const float* __restrict__ lse, const float* __restrict__ dsum,
                                   const T* __restrict__ dout, const int32_t* __restrict__ cu, Dims D,
                                   T* __restrict__ dq) {
  pdl_wait();
  extern __shared__ float smem[];
  const int64_t d = D.d, ld = d + 1;
  float* Ks = smem;             // [kTile][d+1]
  float* Vs = Ks + kTile * ld;  // [kTile][d+1]
  float* Qs = Vs + kTile * ld;  // [kRows][d]
  float* Gs = Qs + kRows * d;   // [kRows][d]
  const int64_t h = blockIdx.y, g = h / D.group, t0 = blockIdx.x * (int64_t)kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  load_rows(Qs, static_cast<int>(d), q + h * d, t0, kRows, D.nh * d, d, D.T);
  load_rows(Gs, static_cast<int>(d), dout + h * d, t0, kRows, D.nh * d, d, D.T);

  int64_t row_t[kRowsPerWarp], row_begin[kRowsPerWarp];
  float row_lse[kRowsPerWarp], row_D[kRowsPerWarp], acc[kRowsPerWarp][kMaxU];
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t t = t0 + warp * kRowsPerWarp + rr;
    row_t[rr] = t;
    row_begin[rr] = t < D.T ? cu[doc_of(cu, D.ndocs, t)] : 0;
    row_lse[rr] = t < D.T ? lse[h * D.T + t] : 0.0f;
    row_D[rr] = t < D.T ? dsum[h * D.T + t] : 0.0f;
    for (int u = 0; u < kMaxU; ++u) acc[rr][u] = 0.0f;
  }
  const int64_t kmin = cu[doc_of(cu, D.ndocs, t0)];
  const int64_t kmax = min(t0 + kRows - 1, D.T - 1);
  for (int64_t kt = kmin; kt <= kmax; kt += kTile) {
    __syncthreads();
    load_rows(Ks, static_cast<int>(ld), k + g * d, kt, kTile, D.nkv * d, d, kmax + 1);
    load_rows(Vs, static_cast<int>(ld), v + g * d, kt, kTile, D.nkv * d, d, kmax + 1);
    __syncthreads();
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t t = row_t[rr];
      if (t >= D.T) continue;
      const int64_t j = kt + lane;
      float ds = 0.0f;
      if (j >= row_begin[rr] && j <= t) {
        const float* qr = Qs + (warp * kRowsPerWarp + rr) * d;
        const float* gr = Gs + (warp * kRowsPerWarp + rr) * d;
        const float* kr = Ks + lane * ld;
        const float* vr = Vs + lane * ld;
        float sq = 0.0f, dp = 0.0f;
        for (int64_t c = 0; c < d; ++c) {
          sq += qr[c] * kr[c];
          dp += gr[c] * vr[c];
        }
        const float p = expf(sq * D.scale - row_lse[rr]);
        ds = p * (dp - row_D[rr]);
      }
      for (int jj = 0; jj < kTile; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
        if (dsj == 0.0f) continue;
        const float* kr = Ks + jj * ld;
        for (int u = 0; u < kMaxU; ++u) {
          const int64_t c = lane + 32 * u;
          if (c < d) acc[rr][u] += dsj * kr[c];
        }
      }
    }
  }
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t t = row_t[rr];
    if (t >= D.T) continue;
    T* o = dq + (t * D.nh + h) * d;
    for (int u = 0; u < kMaxU; ++u) {
      const int64_t c = lane + 32 * u;
      if (c < d) o[c] = from_f<T>(acc[rr][u] * D.scale);
    }
  }
}

template <typename T>
__global__ void attn_bwd_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     const float* __restrict__ lse, const float* __restrict__ dsum,
                                     const T* __restrict__ dout, const int32_t* __restrict__ cu, Dims D,
                                     T* __restrict__ dk, T* __restrict__ dv) {
  pdl_wait();
  extern __shared__ float smem[];
  const int64_t d = D.d, ld = d + 1;
  float* Qs = smem;                // [kTile][d+1]
  float* Gs = Qs + kTile * ld;     // [kTile][d+1]
  float* Ks = Gs + kTile * ld;     // [kRows][d]
  float* Vs = Ks + kRows * d;      // [kRows][d]
  float* Ls = Vs + kRows * d;      // [kTile] lse of the query tile
  float* Ds = Ls + kTile;          // [kTile] dsum of the query tile
  const int64_t g = blockIdx.y, j0 = blockIdx.x * (int64_t)kRows;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  load_rows(Ks, static_cast<int>(d), k + g * d, j0, kRows, D.nkv * d, d, D.T);
  load_rows(Vs, static_cast<int>(d), v + g * d, j0, kRows, D.nkv * d, d, D.T);

  int64_t key_j[kRowsPerWarp], key_end[kRowsPerWarp];
  float ak[kRowsPerWarp][kMaxU], av[kRowsPerWarp][kMaxU];
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    key_j[rr] = j0 + warp * kRowsPerWarp + rr;
    key_end[rr] = key_j[rr] < D.T ? cu[doc_of(cu, D.ndocs, key_j[rr]) + 1] : 0;
    for (int u = 0; u < kMaxU; ++u) ak[rr][u] = av[rr][u] = 0.0f;
  }
  const int64_t jlast = min(j0 + kRows - 1, D.T - 1);
  const int64_t qend = cu[doc_of(cu, D.ndocs, jlast) + 1];  // queries of the tile's keys end here
  for (int64_t h = g * D.group; h < (g + 1) * D.group; ++h) {
    for (int64_t qt = j0; qt < qend; qt += kTile) {
      __syncthreads();
      load_rows(Qs, static_cast<int>(ld), q + h * d, qt, kTile, D.nh * d, d, qend);
      load_rows(Gs, static_cast<int>(ld), dout + h * d, qt, kTile, D.nh * d, d, qend);
      for (int e = threadIdx.x; e < kTile; e += blockDim.x) {
        const int64_t i = qt + e;
        Ls[e] = i < qend ? lse[h * D.T + i] : 0.0f;
        Ds[e] = i < qend ? dsum[h * D.T + i] : 0.0f;
      }
      __syncthreads();
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int64_t j = key_j[rr];
        if (j >= D.T) continue;
        const int64_t i = qt + lane;
        float p = 0.0f, ds = 0.0f;
        if (i >= j && i < key_end[rr]) {
          const float* kr = Ks + (warp * kRowsPerWarp + rr) * d;
          const float* vr = Vs + (warp * kRowsPerWarp + rr) * d;
          const float* qr = Qs + lane * ld;
          const float* gr = Gs + lane * ld;
          float sq = 0.0f, dp = 0.0f;
          for (int64_t c = 0; c < d; ++c) {
            sq += qr[c] * kr[c];
            dp += gr[c] * vr[c];
          }
          p = expf(sq * D.scale - Ls[lane]);
          ds = p * (dp - Ds[lane]);
        }
        for (int ii = 0; ii < kTile; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii);
          const float dsi = __shfl_sync(0xffffffffu, ds, ii);
          if (pi == 0.0f && dsi == 0.0f) continue;
          const float* qr = Qs + ii * ld;
          const float* gr = Gs + ii * ld;
          for (int u = 0; u < kMaxU; ++u) {
            const int64_t c = lane + 32 * u;
            if (c < d) {
              av[rr][u] += pi * gr[c];
              ak[rr][u] += dsi * qr[c];
            }
          }
        }
      }
    }
  }
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t j = key_j[rr];
    if (j >= D.T) continue;
    T* ok = dk + (j * D.nkv + g) * d;
    T* ov = dv + (j * D.nkv + g) * d;
    for (int u = 0; u < kMaxU; ++u) {
      const int64_t c = lane + 32 * u;
      if (c < d) {
        ok[c] = from_f<T>(ak[rr][u] * D.scale);
        ov[c] = from_f<T>(av[rr][u]);
      }
    }
  }
}

Dims make_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens, float scale,
               const char* op) {
  need_cuda(q, op, "q");
  need_cuda(k, op, "k");
  need_cuda_rows(v, op, "v");  // may have a token stride of its own (the fused q|k|v projection)
  need_cuda(cu_seqlens, op, "cu_seqlens");
  need_dtype(cu_seqlens, DType::kI32, op, "cu_seqlens");
  MT_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "[{}] q, k, v must be [T, heads, d]; got {}, {}, {}", op,
           q.desc(), k.desc(), v.desc());
  need_dtype(k, q.dtype(), op, "k");
  need_dtype(v, q.dtype(), op, "v");
  Dims D{};
  D.T = q.size(0);
  D.nh = q.size(1);
  D.d = q.size(2);
  D.nkv = k.size(1);
  MT_CHECK(D.nkv > 0 && D.nh % D.nkv == 0, "[{}] {} query heads are not a multiple of {} kv heads", op, D.nh, D.nkv);
  MT_CHECK(D.d > 0 && D.d <= 32 * kMaxU, "[{}] head dim {} not supported on CUDA (1..{})", op, D.d, 32 * kMaxU);
  MT_CHECK(k.size(0) == D.T && v.size(0) == D.T && v.size(1) == D.nkv && k.size(2) == D.d && v.size(2) == D.d,
           "[{}] k {} / v {} do not match q {}", op, k.desc(), v.desc(), q.desc());
  MT_CHECK(cu_seqlens.numel() >= 2, "[{}] cu_seqlens needs at least 2 entries, has {}", op, cu_seqlens.numel());
  D.group = D.nh / D.nkv;
  D.ndocs = static_cast<int>(cu_seqlens.numel() - 1);
  D.scale = scale;
  return D;
}

FlashAttnProblem flash_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, const Dims& D) {
  return FlashAttnProblem{static_cast<const __nv_bfloat16*>(q.data_ptr()), static_cast<const __nv_bfloat16*>(k.data_ptr()),
                          static_cast<const __nv_bfloat16*>(v.data_ptr()), cu.data<int32_t>(), D.T, D.nh, D.nkv, D.d,
                          D.ndocs, D.scale};
}

template <typename K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

int64_t token_stride(const Tensor& t) { return t.is_contiguous() ? 0 : t.stride(0); }
void attention_backward_packed_(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, float scale,
                                Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace

// cu_seqlens is trusted to be well formed (first 0, non-decreasing, last T): the kernels read it
// on the device and do not synchronize to check it; the CPU path checks. max_seqlen is unused.
// v (and backward's dq, dk, dv) may have a token stride of their own (the fused q|k|v projection's
// column blocks): the sm90 kernels read and write them in place, the others through packed copies.
void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v_in, const Tensor& cu_seqlens,
                       int max_seqlen, float scale, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  const bool keep = q.dtype() == DType::kBF16 && flash_attention_supported(q.size(2), {v_in.data_ptr()}) &&
                    flash_attention_strided_ok(ctx, {token_stride(v_in)});
  const Tensor v = keep ? v_in : packed_rows(ctx, v_in);
  const Dims D = make_dims(q, k, v, cu_seqlens, scale, op);
  need_cuda(out, op, "out");
  need_cuda(lse, op, "lse");
  need_dtype(out, q.dtype(), op, "out");
  need_dtype(lse, DType::kF32, op, "lse");
  need_numel(out, q.numel(), op, "out");
  need_numel(lse, D.nh * D.T, op, "lse");
  if (!D.T || !D.nh) return;
  if (q.dtype() == DType::kBF16 &&
      flash_attention_supported(D.d, {q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()})) {
    FlashAttnProblem fp = flash_problem(q, k, v, cu_seqlens, D);
    fp.v_row = token_stride(v);
    flash_attention_forward(ctx, fp, static_cast<__nv_bfloat16*>(out.data_ptr()), lse.data<float>());
    return;
  }
  MT_CHECK(v.is_contiguous(), "[{}] internal: a strided v reached the packed kernels", op);
  const size_t smem = (2 * kTile * (D.d + 1) + kRows * D.d) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((D.T + kRows - 1) / kRows), static_cast<unsigned>(D.nh));
  MT_CUDA_DISPATCH(q.dtype(), T, op,
    set_smem(attn_fwd_kernel<T>, smem);
    launch_pdl(attn_fwd_kernel<T>, grid, 32 * kWarps, smem, stream_of(ctx),
        static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
        static_cast<const T*>(v.data_ptr()), cu_seqlens.data<int32_t>(), D, static_cast<T*>(out.data_ptr()),
        lse.data<float>()));
  check_launch(op);
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v_in, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, int max_seqlen,
                        float scale, Tensor& dq_out, Tensor& dk_out, Tensor& dv_out) {
  const char* op = "attention_backward";
  const bool keep =
      q.dtype() == DType::kBF16 &&
      flash_attention_supported(q.size(2), {v_in.data_ptr(), dq_out.data_ptr(), dk_out.data_ptr(), dv_out.data_ptr()}) &&
      flash_attention_strided_ok(ctx, {token_stride(v_in), token_stride(dq_out), token_stride(dk_out),
                                       token_stride(dv_out)});
  const Tensor v = keep ? v_in : packed_rows(ctx, v_in);
  Tensor dq = keep ? dq_out : packed_like(dq_out), dk = keep ? dk_out : packed_like(dk_out),
         dv = keep ? dv_out : packed_like(dv_out);
  attention_backward_packed_(ctx, q, k, v, out, lse, dout, cu_seqlens, scale, dq, dk, dv);
  copy_back(ctx, dq, dq_out);
  copy_back(ctx, dk, dk_out);
  copy_back(ctx, dv, dv_out);
  (void)max_seqlen;
}

namespace {
void attention_backward_packed_(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, float scale,
                                Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  const Dims D = make_dims(q, k, v, cu_seqlens, scale, op);
  need_cuda(out, op, "out");
  need_cuda(lse, op, "lse");
  need_cuda(dout, op, "dout");
  need_cuda_rows(dq, op, "dq");
  need_cuda_rows(dk, op, "dk");
  need_cuda_rows(dv, op, "dv");
  for (const Tensor* t : {&out, &dout}) need_dtype(*t, q.dtype(), op, "out/dout");
  need_dtype(dq, q.dtype(), op, "dq");
  need_dtype(dk, q.dtype(), op, "dk");
  need_dtype(dv, q.dtype(), op, "dv");
  need_dtype(lse, DType::kF32, op, "lse");
  need_numel(lse, D.nh * D.T, op, "lse");
  need_numel(dq, q.numel(), op, "dq");
  need_numel(dk, k.numel(), op, "dk");
  need_numel(dv, v.numel(), op, "dv");
  if (!D.T || !D.nh) return;
  if (q.dtype() == DType::kBF16 &&
      flash_attention_supported(D.d, {q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
                                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr()})) {
    using bf = __nv_bfloat16;
    FlashAttnProblem fp = flash_problem(q, k, v, cu_seqlens, D);
    fp.v_row = token_stride(v);
    fp.dq_row = token_stride(dq);
    fp.dk_row = token_stride(dk);
    fp.dv_row = token_stride(dv);
    flash_attention_backward(ctx, fp, static_cast<const bf*>(out.data_ptr()),
                             lse.data<float>(), static_cast<const bf*>(dout.data_ptr()),
                             static_cast<bf*>(dq.data_ptr()), static_cast<bf*>(dk.data_ptr()),
                             static_cast<bf*>(dv.data_ptr()));
    return;
  }
  cudaStream_t s = stream_of(ctx);
  Tensor scratch = device_scratch(ctx, D.nh * D.T * 4);
  float* dsum = static_cast<float*>(scratch.data_ptr());
  const size_t smem_dq = (2 * kTile * (D.d + 1) + 2 * kRows * D.d) * sizeof(float);
  const size_t smem_kv = (2 * kTile * (D.d + 1) + 2 * kRows * D.d + 2 * kTile) * sizeof(float);
  const dim3 grid_q(static_cast<unsigned>((D.T + kRows - 1) / kRows), static_cast<unsigned>(D.nh));
  const dim3 grid_kv(static_cast<unsigned>((D.T + kRows - 1) / kRows), static_cast<unsigned>(D.nkv));
  const unsigned dot_blocks = static_cast<unsigned>((D.T * D.nh + 7) / 8);
  MT_CHECK(v.is_contiguous() && dq.is_contiguous() && dk.is_contiguous() && dv.is_contiguous(),
           "[{}] internal: a strided tensor reached the packed kernels", op);
  MT_CUDA_DISPATCH(q.dtype(), T, op,
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    const T* gp = static_cast<const T*>(dout.data_ptr());
    launch_pdl(attn_bwd_dot_kernel<T>, dot_blocks, 256, 0, s, static_cast<const T*>(out.data_ptr()), gp, D, dsum);
    set_smem(attn_bwd_dq_kernel<T>, smem_dq);
    launch_pdl(attn_bwd_dq_kernel<T>, grid_q, 32 * kWarps, smem_dq, s, qp, kp, vp, lse.data<float>(), dsum, gp,
        cu_seqlens.data<int32_t>(), D, static_cast<T*>(dq.data_ptr()));
    set_smem(attn_bwd_dkdv_kernel<T>, smem_kv);
    launch_pdl(attn_bwd_dkdv_kernel<T>, grid_kv, 32 * kWarps, smem_kv, s, qp, kp, vp, lse.data<float>(), dsum, gp,
        cu_seqlens.data<int32_t>(), D, static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr())));
  check_launch(op);
}

}  // namespace

}  // namespace moetrain::cuda
