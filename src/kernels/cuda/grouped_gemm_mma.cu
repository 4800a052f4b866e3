// Fast bf16 grouped expert GEMM on tensor cores (mma.sync m16n8k16, fp32 accumulation):
// y = x W[e]^T, dx = dy W[e] over each expert's rows, and dw[e] (+)= dy_e^T x_e (dw f32 or bf16).
// 128x128x64 CTA tiles, 8 warps of 64x32, a 3-stage cp.async pipeline into XOR-swizzled shared
// memory, ldmatrix (.trans for operands whose contiguous dim is not K). Offsets stay on the
// device: a one-block scan turns them into a tile prefix that each CTA binary-searches.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_mma.cuh"
#include "kernels/cuda/mma_sm80.cuh"

namespace moetrain::cuda {

namespace {

using bf16 = __nv_bfloat16;
constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kThreads = 256;
constexpr int kTileBytes = kBM * kBK * 2;  // one operand tile of one stage (A and B are equal)
constexpr int kSmemBytes = kStages * 2 * kTileBytes;
constexpr int kScanThreads = 1024;

// One operand in global memory. "outer" is the strided index, "inner" the contiguous one; for a
// K-major operand inner is the reduction index k, otherwise outer is.
struct Operand {
  const bf16* p;
  int64_t ld, outer0, outer_lim, inner0, inner_lim;
};

struct GemmArgs {
  const bf16* a;
  const bf16* b;
  const int32_t* off;         // [E+1]
  const int32_t* tile_start;  // [E+2] m-tile prefix (rows mode); group E = rows past off[E]
  int E;
  int64_t N;                  // rows of x / dy
  int64_t lda, ldb, b_stride; // b_stride: elements between experts' weights
  int64_t kred;               // reduction length (rows mode)
  int64_t ci, cj;             // C is [ci, cj] (rows mode: ci unused, rows come from offsets)
  void* c;
  int accumulate;             // dw mode: 1 = dw += sum, 0 = dw = sum
};

// tile_start[g] = sum over g' < g of ceil(rows(g') / kBM), g in [0, E+1]; group E holds the
// rows in [off[E], N) (unused capacity, written as zeros).
__global__ void gmm_tile_prefix_kernel(const int32_t* __restrict__ off, int E, int64_t N,
                                       int32_t* __restrict__ tile_start) {
  pdl_wait();
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int32_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base <= E; base += kScanThreads) {
    const int g = base + static_cast<int>(threadIdx.x);
    int32_t tiles = 0;
    if (g <= E) {
      const int64_t lo = off[g], hi = g < E ? static_cast<int64_t>(off[g + 1]) : N;
      tiles = hi > lo ? static_cast<int32_t>((hi - lo + kBM - 1) / kBM) : 0;
    }
    int32_t excl, total;
    Scan(tmp).ExclusiveSum(tiles, excl, total);
    if (g <= E) tile_start[g] = carry + excl;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_start[E + 1] = carry;
}

// Per-thread state for loading one operand's tiles: this thread copies chunk `ch` of smem rows
// row0 + it * kRowStep (it < kIters). The pointer and remaining extents are fixed per CTA, the
// k offset moves the pointer along the inner (K-major) or outer dim.
template <bool kKMajor>
struct TileLoader {
  static constexpr int kCh = kKMajor ? kBK / 8 : kBM / 8;  // 16-byte chunks per smem row
  static constexpr int kRowStep = kThreads / kCh;
  static constexpr int kIters = kBM * kBK / 8 / kThreads;
  const bf16* gp;       // element (outer0 + row0, inner0 + ch * 8)
  int64_t ld;
  int64_t outer_rem;    // outer_lim - (outer0 + row0)
  int64_t inner_rem;    // inner_lim - (inner0 + ch * 8)
  uint32_t soff[kIters];

  __device__ __forceinline__ TileLoader(const Operand& o) {
    const int row0 = static_cast<int>(threadIdx.x) / kCh, ch = static_cast<int>(threadIdx.x) % kCh;
    ld = o.ld;
    outer_rem = o.outer_lim - (o.outer0 + row0);
    inner_rem = o.inner_lim - (o.inner0 + ch * 8);
    const bool in = outer_rem > 0 && inner_rem > 0;
    gp = in ? o.p + (o.outer0 + row0) * o.ld + o.inner0 + ch * 8 : o.p;
    if (!in) outer_rem = inner_rem = 0;
#pragma unroll
    for (int it = 0; it < kIters; ++it) soff[it] = mma::swz<kCh>(row0 + it * kRowStep, ch);
  }
  // Copies the tile at reduction offset k0 into the stage at shared address s.
  __device__ __forceinline__ void load(uint32_t s, int64_t k0) const {
    const int64_t orem = kKMajor ? outer_rem : outer_rem - k0;
    const bool inner_ok = kKMajor ? inner_rem > k0 : inner_rem > 0;
    const bf16* base = kKMajor ? gp + k0 : gp + k0 * ld;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const bool ok = inner_ok && it * kRowStep < orem;
      mma::cp_async16(s + soff[it], ok ? base + it * kRowStep * ld : gp, ok);
    }
  }
};

// C tile (128 x 128) += A B over k in [0, klen), fp32 accumulators acc[m-tile][n-tile][4].
template <bool kAMaj, bool kBMaj>
__device__ __forceinline__ void mainloop(const Operand& A, const Operand& B, int64_t klen, float (&acc)[4][4][4]) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = mma::smem_addr(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
  const int ktiles = static_cast<int>((klen + kBK - 1) / kBK);
  auto sa = [&](int st) { return s0 + st * 2 * kTileBytes; };
  auto sb = [&](int st) { return s0 + st * 2 * kTileBytes + kTileBytes; };
  const TileLoader<kAMaj> la(A);
  const TileLoader<kBMaj> lb(B);
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < ktiles) {
      la.load(sa(st), st * kBK);
      lb.load(sb(st), st * kBK);
    }
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    const int pf = kt + kStages - 1;
    if (pf < ktiles) {
      la.load(sa(pf % kStages), static_cast<int64_t>(pf) * kBK);
      lb.load(sb(pf % kStages), static_cast<int64_t>(pf) * kBK);
    }
    mma::cp_async_commit();
    const uint32_t ta = sa(kt % kStages), tb = sb(kt % kStages);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4][4], bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        if constexpr (kAMaj) {
          const int row = wm * 64 + mi * 16 + (lane & 15), ch = ks * 2 + (lane >> 4);
          mma::ldmatrix_x4(af[mi], ta + mma::swz<kBK / 8>(row, ch));
        } else {
          const int row = ks * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int ch = (wm * 64 + mi * 16) / 8 + ((lane >> 3) & 1);
          mma::ldmatrix_x4_trans(af[mi], ta + mma::swz<kBM / 8>(row, ch));
        }
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        if constexpr (kBMaj) {
          const int row = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3), ch = ks * 2 + ((lane >> 3) & 1);
          mma::ldmatrix_x4(r, tb + mma::swz<kBK / 8>(row, ch));
        } else {
          const int row = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          const int ch = (wn * 32 + np * 16) / 8 + (lane >> 4);
          mma::ldmatrix_x4_trans(r, tb + mma::swz<kBN / 8>(row, ch));
        }
        bfr[2 * np][0] = r[0];
        bfr[2 * np][1] = r[1];
        bfr[2 * np + 1][0] = r[2];
        bfr[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma::mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
    }
  }
  mma::cp_async_wait<0>();
}

// Rows mode: C[r, j] = sum_k A[r, k] B_e(k, j) for the rows r of expert e (y or dx, bf16 out).
// grid = (column tiles, m-tile bound); blockIdx.y indexes the tile prefix.
template <bool kBMaj>
__global__ void __launch_bounds__(kThreads, 2) gmm_rows_mma_kernel(GemmArgs g) {
  pdl_wait();
  const int32_t t = static_cast<int32_t>(blockIdx.y);
  if (t >= g.tile_start[g.E + 1]) return;
  int lo_g = 0, hi_g = g.E;  // the group whose tile range holds t
  while (lo_g < hi_g) {
    const int mid = (lo_g + hi_g + 1) >> 1;
    if (g.tile_start[mid] <= t) lo_g = mid; else hi_g = mid - 1;
  }
  const int e = lo_g;
  const int64_t lo = g.off[e], hi = e < g.E ? static_cast<int64_t>(g.off[e + 1]) : g.N;
  const int64_t i0 = lo + static_cast<int64_t>(t - g.tile_start[e]) * kBM, j0 = blockIdx.x * (int64_t)kBN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
  float acc[4][4][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
  if (e < g.E) {  // group E (rows past the last expert) keeps zeros
    const Operand A{g.a, g.lda, i0, hi, 0, g.kred};
    const bf16* be = g.b + e * g.b_stride;
    const Operand B = kBMaj ? Operand{be, g.ldb, j0, g.cj, 0, g.kred} : Operand{be, g.ldb, 0, g.kred, j0, g.cj};
    mainloop<true, kBMaj>(A, B, g.kred, acc);
  }
  bf16* c = static_cast<bf16*>(g.c);
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = i0 + wm * 64 + mi * 16 + (lane >> 2) + h * 8;
      if (r >= hi) continue;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t j = j0 + wn * 32 + ni * 8 + 2 * (lane & 3);
        if (j < g.cj)
          *reinterpret_cast<uint32_t*>(c + r * g.cj + j) = mma::pack_bf16(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }
    }
}

// dw mode: dw[e][i, j] (+)= sum over rows r of expert e of dy[r, i] x[r, j]; grid (j tiles, i tiles, E).
// One CTA owns one output tile and walks the expert's rows in order: deterministic, no atomics.
// DwT float: f32 +=; bf16: old value + fp32 sum, rounded to nearest even.
template <typename DwT>
__global__ void __launch_bounds__(kThreads, 2) gmm_dw_mma_kernel(GemmArgs g) {
  pdl_wait();
  const int e = blockIdx.z;
  const int64_t lo = g.off[e], hi = g.off[e + 1];
  if (hi <= lo && g.accumulate) return;  // overwrite mode writes zeros for an expert without rows
  const int64_t i0 = blockIdx.y * (int64_t)kBM, j0 = blockIdx.x * (int64_t)kBN;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
  float acc[4][4][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
  if (hi > lo) {
    const Operand A{g.a, g.lda, lo, hi, i0, g.ci};
    const Operand B{g.b, g.ldb, lo, hi, j0, g.cj};
    mainloop<false, false>(A, B, hi - lo, acc);
  }
  DwT* c = static_cast<DwT*>(g.c) + static_cast<int64_t>(e) * g.ci * g.cj;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = i0 + wm * 64 + mi * 16 + (lane >> 2) + h * 8;
      if (i >= g.ci) continue;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t j = j0 + wn * 32 + ni * 8 + 2 * (lane & 3);
        if (j < g.cj) {
          if constexpr (sizeof(DwT) == 4) {
            float2* p = reinterpret_cast<float2*>(c + i * g.cj + j);
            float2 v = g.accumulate ? *p : make_float2(0.0f, 0.0f);
            v.x += acc[mi][ni][2 * h];
            v.y += acc[mi][ni][2 * h + 1];
            *p = v;
          } else {
            uint32_t* p = reinterpret_cast<uint32_t*>(c + i * g.cj + j);
            const float2 v = g.accumulate ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p))
                                          : make_float2(0.0f, 0.0f);
            *p = mma::pack_bf16(v.x + acc[mi][ni][2 * h], v.y + acc[mi][ni][2 * h + 1]);
          }
        }
      }
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <typename K>
void allow_smem(K kernel) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
}

// Rows-mode launch: the tile prefix, then the GEMM over (column tiles, m-tile bound).
template <bool kBMaj>
void launch_rows(Context& ctx, GemmArgs g, const char* op) {
  Tensor scratch = device_scratch(ctx, (g.E + 2) * 4);
  int32_t* ts = static_cast<int32_t*>(scratch.data_ptr());
  cudaStream_t s = stream_of(ctx);
  launch_pdl(gmm_tile_prefix_kernel, 1, kScanThreads, 0, s, g.off, g.E, g.N, ts);
  check_launch(op);
  g.tile_start = ts;
  const dim3 grid(static_cast<unsigned>((g.cj + kBN - 1) / kBN), static_cast<unsigned>(g.N / kBM + g.E + 1));
  allow_smem(gmm_rows_mma_kernel<kBMaj>);
  launch_pdl(gmm_rows_mma_kernel<kBMaj>, grid, kThreads, kSmemBytes, s, g);
  check_launch(op);
}

}  // namespace

bool grouped_gemm_mma_supported(int64_t N, int64_t K, int64_t M, int64_t E, const void* x, const void* w,
                                const void* out) {
  return K % 8 == 0 && M % 8 == 0 && N / kBM + E + 1 <= 65535 && aligned16(x) && aligned16(w) && aligned16(out);
}

void grouped_gemm_mma_forward(Context& ctx, const bf16* x, const bf16* w, const int32_t* off, int E, int64_t N,
                              int64_t K, int64_t M, bf16* y) {
  GemmArgs g{};
  g.a = x;
  g.b = w;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = K;
  g.ldb = K;
  g.b_stride = M * K;
  g.kred = K;
  g.cj = M;
  g.c = y;
  launch_rows<true>(ctx, g, "grouped_matmul");
}

void grouped_gemm_mma_dx(Context& ctx, const bf16* dy, const bf16* w, const int32_t* off, int E, int64_t N,
                         int64_t K, int64_t M, bf16* dx) {
  GemmArgs g{};
  g.a = dy;
  g.b = w;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = M;
  g.ldb = K;
  g.b_stride = M * K;
  g.kred = M;
  g.cj = K;
  g.c = dx;
  launch_rows<false>(ctx, g, "grouped_matmul_backward");
}

void grouped_gemm_mma_dw(Context& ctx, const bf16* x, const bf16* dy, const int32_t* off, int E, int64_t N,
                         int64_t K, int64_t M, void* dw, bool dw_bf16, bool accumulate) {
  GemmArgs g{};
  g.accumulate = accumulate ? 1 : 0;
  g.a = dy;
  g.b = x;
  g.off = off;
  g.E = E;
  g.N = N;
  g.lda = M;
  g.ldb = K;
  g.ci = M;
  g.cj = K;
  g.c = dw;
  const dim3 grid(static_cast<unsigned>((K + kBN - 1) / kBN), static_cast<unsigned>((M + kBM - 1) / kBM),
                  static_cast<unsigned>(E));
  if (dw_bf16) {
    allow_smem(gmm_dw_mma_kernel<bf16>);
    launch_pdl(gmm_dw_mma_kernel<bf16>, grid, kThreads, kSmemBytes, stream_of(ctx), g);
  } else {
    allow_smem(gmm_dw_mma_kernel<float>);
    launch_pdl(gmm_dw_mma_kernel<float>, grid, kThreads, kSmemBytes, stream_of(ctx), g);
  }
  check_launch("grouped_matmul_backward");
}

}  // namespace moetrain::cuda
