// Standalone benchmark: how fast can the expert dW kernel's epilogue write its gradient? Round 49 timed
// the dW kernel with its stages left out: the epilogue alone (staging and stores, no loads, no MMA)
// wrote the gate_up gradient (128 x 1536 x 2048 bf16, 805 MB) at 2.0 TB/s. This program writes the same
// buffer, tile by tile as that kernel does (128 x 256 tiles, tile t on CTA t mod 132, one CTA of 384
// threads an SM: warps 1-3 "store warps", warps 4-11 "consumers"), in several ways, and prints GB/s:
//   memset        cudaMemsetAsync over the buffer (the driver's write rate)
//   stg_grid      a grid-stride kernel of 16-byte stores at full occupancy
//   stg_tiles     the consumers store each tile from registers (16-byte stores, no shared memory)
//   rows_1buf     the kernel's epilogue: the consumers write the 64 KB staging tile (st.shared), the
//                 store warps copy it out with one bulk copy per 512-byte row, then free it (wait for
//                 the copies' reads) before the consumers write the next tile
//   rows_2buf     the same with two staging tiles: the consumers fill one while the other drains
//   rows_nostage  rows_1buf without the consumers' shared-memory writes (the copies alone)
//   tma_1buf      as rows_1buf, the tile stored as four 3D TMA boxes (64 columns x 128 rows) by one thread
//   tma_2buf      as tma_1buf with two staging tiles
// Values are not checked (the buffer only receives a pattern); this measures rates. Median of 10
// (bench/standalone/median_events.cuh). Arguments: [E M K] (default 128 1536 2048; 128 2048 768 is down).
// On the GPU machine: bash bench/standalone/store_bw_run.sh (builds with nvcc -O3 -std=c++17 -arch=sm_90a -Isrc).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/wgmma_sm90.cuh"
#include "median_events.cuh"

namespace {

constexpr int kRows = 128, kCols = 256, kThreads = 384, kConsumers = 256, kStoreThreads = 96;
constexpr int kTileBytes = kRows * kCols * 2;  // 64 KB of bf16

#define CK(x)                                                                                     \
  do {                                                                                            \
    const cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace wg = moetrain::cuda::wg;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

struct Shape {
  int E, M, K;
  __host__ __device__ int64_t tiles() const { return static_cast<int64_t>(E) * (M / kRows) * (K / kCols); }
};

// Tile t: expert e, row tile i, column tile j (row-major within an expert, as the dW kernel's walk).
__device__ __forceinline__ void tile_of(const Shape& s, int64_t t, int& e, int& i, int& j) {
  const int per_e = (s.M / kRows) * (s.K / kCols), nj = s.K / kCols;
  e = static_cast<int>(t / per_e);
  const int r = static_cast<int>(t - static_cast<int64_t>(e) * per_e);
  i = r / nj;
  j = r - i * nj;
}

__global__ void stg_grid_kernel(uint4* out, int64_t n16) {
  const uint4 v = make_uint4(threadIdx.x, blockIdx.x, 1, 2);
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n16;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[k] = v;
}

// kMode 0: consumers store from registers; 1: per-row bulk copies; 2: TMA boxes. kStage: consumers
// write the staging tile each time (modes 1-2). kBufs: staging tiles (1 or 2).
template <int kMode, int kBufs, bool kStage>
__global__ void __launch_bounds__(kThreads, 1) epi_kernel(const __grid_constant__ CUtensorMap map, __nv_bfloat16* out,
                                                         const Shape s) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t bars = base + (kMode == 0 ? 0 : kBufs * kTileBytes);  // sfull[kBufs], sready[kBufs]
  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t total = s.tiles();
  if (tid == 0) {
    for (int b = 0; b < kBufs; ++b) {
      wg::mbar_init(bars + 8 * b, kConsumers);
      wg::mbar_init(bars + 8 * (kBufs + b), kMode == 2 ? 1 : kStoreThreads);
    }
    wg::fence_mbar_init();
  }
  __syncthreads();
  if (warp == 0) return;
  if (warp < 4) {  // store warps
    if (kMode == 0) return;
    const int st = tid - 32;
    if (kMode == 2 && st != 0) return;
    int64_t it = 0;
    for (int b = 0; b < kBufs; ++b) wg::mbar_arrive(bars + 8 * (kBufs + b));  // every staging tile free
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x, ++it) {
      const int b = static_cast<int>(it % kBufs);
      wg::mbar_wait(bars + 8 * b, static_cast<uint32_t>((it / kBufs) & 1));
      int e, i, j;
      tile_of(s, t, e, i, j);
      const uint32_t src = base + b * kTileBytes;
      if (kMode == 1) {
        for (int r = st; r < kRows; r += kStoreThreads)
          wg::bulk_store(out + (static_cast<int64_t>(e) * s.M + i * kRows + r) * s.K + j * kCols, src + r * kCols * 2,
                   kCols * 2);
      } else {
        for (int q = 0; q < kCols / 64; ++q)
          wg::tma_3d_store(&map, src + q * (kRows * 128), j * kCols + 64 * q, i * kRows, e);
      }
      wg::bulk_commit();
      if (kBufs == 1) {
        wg::bulk_wait_read();
        wg::mbar_arrive(bars + 8 * kBufs);
      } else if (it > 0) {  // the previous tile's copies have read their staging tile
        wg::bulk_wait_read_but_last();
        wg::mbar_arrive(bars + 8 * (kBufs + static_cast<int>((it - 1) % kBufs)));
      }
    }
    wg::bulk_wait_all();
    return;
  }
  // consumers
  const int ct = tid - 128;
  const uint4 v = make_uint4(ct, blockIdx.x, 3, 4);
  int64_t it = 0;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x, ++it) {
    if (kMode == 0) {
      int e, i, j;
      tile_of(s, t, e, i, j);
      uint4* tile = reinterpret_cast<uint4*>(out + (static_cast<int64_t>(e) * s.M + i * kRows) * s.K + j * kCols);
#pragma unroll 4
      for (int k = ct; k < kTileBytes / 16; k += kConsumers) {
        const int row = k / (kCols / 8), c = k - row * (kCols / 8);
        tile[static_cast<int64_t>(row) * (s.K / 8) + c] = v;
      }
      continue;
    }
    const int b = static_cast<int>(it % kBufs);
    wg::mbar_wait(bars + 8 * (kBufs + b), static_cast<uint32_t>((it / kBufs) & 1));
    if (kStage || it < kBufs) {
      for (int k = ct; k < kTileBytes / 16; k += kConsumers) {
        const uint32_t a = base + b * kTileBytes + 16 * k;
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
      }
      wg::fence_proxy_async();
    }
    wg::mbar_arrive(bars + 8 * b);
  }
}

using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

CUtensorMap box_map(void* out, const Shape& s) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || !f) {
    std::fprintf(stderr, "store_bw: no cuTensorMapEncodeTiled\n");
    std::exit(1);
  }
  CUtensorMap m;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(s.K), static_cast<cuuint64_t>(s.M),
                              static_cast<cuuint64_t>(s.E)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(s.K) * 2, static_cast<cuuint64_t>(s.M) * s.K * 2};
  const cuuint32_t box[3] = {64, kRows, 1}, estr[3] = {1, 1, 1};
  const CUresult r = reinterpret_cast<EncodeFn>(f)(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, out, dims, strides, box,
                                                   estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "store_bw: cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}

template <int kMode, int kBufs, bool kStage>
float time_epi(const CUtensorMap& map, __nv_bfloat16* out, const Shape& s, int sms) {
  auto k = epi_kernel<kMode, kBufs, kStage>;
  const int smem = kMode == 0 ? 1024 + 64 : kBufs * kTileBytes + 1024 + 64;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return median_event_ms([&] { k<<<sms, kThreads, smem>>>(map, out, s); });
}

}  // namespace

int main(int argc, char** argv) {
  Shape s{128, 1536, 2048};
  if (argc == 4) s = {std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3])};
  if (s.E <= 0 || s.M % kRows || s.K % kCols) {
    std::fprintf(stderr, "store_bw: E > 0, M a multiple of %d and K of %d (got %d %d %d)\n", kRows, kCols, s.E, s.M,
                 s.K);
    return 1;
  }
  const double bytes = 2.0 * s.E * s.M * s.K;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  __nv_bfloat16* out = nullptr;
  CK(cudaMalloc(&out, static_cast<size_t>(bytes)));
  const CUtensorMap map = box_map(out, s);
  std::printf("store_bw: %s, %d SMs; dw [%d, %d, %d] bf16, %.1f MB, %lld tiles of %d x %d\n", prop.name, sms, s.E,
              s.M, s.K, bytes / 1e6, static_cast<long long>(s.tiles()), kRows, kCols);
  auto row = [&](const char* name, float ms) {
    std::printf("| %-13s | %8.3f ms | %6.0f GB/s |\n", name, ms, bytes / (ms * 1e-3) / 1e9);
  };
  row("memset", median_event_ms([&] { CK(cudaMemsetAsync(out, 0, static_cast<size_t>(bytes))); }));
  const int64_t n16 = static_cast<int64_t>(bytes / 16);
  row("stg_grid", median_event_ms([&] { stg_grid_kernel<<<sms * 8, 256>>>(reinterpret_cast<uint4*>(out), n16); }));
  row("stg_tiles", time_epi<0, 1, false>(map, out, s, sms));
  row("rows_1buf", time_epi<1, 1, true>(map, out, s, sms));
  row("rows_2buf", time_epi<1, 2, true>(map, out, s, sms));
  row("rows_nostage", time_epi<1, 1, false>(map, out, s, sms));
  row("tma_1buf", time_epi<2, 1, true>(map, out, s, sms));
  row("tma_2buf", time_epi<2, 2, true>(map, out, s, sms));
  CK(cudaFree(out));
  return 0;
}
