// Standalone experiment: how fast can the MoE row gather (moe_permute: xp[r] = x[token_of[r]], T 4096
// tokens x top-8 = 32768 rows of 2048 bf16, 134 MB written) go on this GPU? The kernel of
// src/kernels/cuda/moe_permute.cu (gather_rows_vec_kernel: 4 rows a block, 16-byte packs, every
// row's load before any store; a copy, kept here so that this file builds alone) with plain stores
// (as until round 31) and with the streaming hint (shipped since round 31), against variants that
// change only how the bytes move, and against the copy engines' ceilings (a memset and a device copy
// of the same bytes). Every variant's output is compared with the plain kernel's, byte for byte. Cases are timed interleaved (one sample of
// each per repetition) so that clock and power drift alike for all. Build / run:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/standalone/gather_bench.cu -o /tmp/gb
//   /tmp/gb [reps]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using bf16 = __nv_bfloat16;
struct alignas(16) Pack8 {
  uint4 v;
};

constexpr int kRows = 4;
// gather_rows_vec_kernel for S = D = bf16 (the conversion is the identity, so a pack is moved as is).
template <bool kStream>
__global__ void gather_rows_copy(const bf16* __restrict__ x, const int32_t* __restrict__ src_row, int64_t N, int64_t H,
                               bf16* __restrict__ out) {
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kRows), hp = H / 8;
  const uint4* xs[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) xs[i] = r0 + i < N ? reinterpret_cast<const uint4*>(x + src_row[r0 + i] * H) : nullptr;
  uint4* o = reinterpret_cast<uint4*>(out + r0 * H);
  for (int64_t h = threadIdx.x; h < hp; h += blockDim.x) {
    uint4 a[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (xs[i]) a[i] = xs[i][h];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (!xs[i]) continue;
      if constexpr (kStream) {
        asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(o + i * hp + h), "r"(a[i].x), "r"(a[i].y),
                     "r"(a[i].z), "r"(a[i].w)
                     : "memory");
      } else {
        o[i * hp + h] = a[i];
      }
    }
  }
}

// One warp moves whole rows with the bulk copy engine: global -> shared (mbarrier) -> global, a ring
// of kSlots row buffers per warp; lane 0 issues everything. Persistent: warp w of the grid takes rows
// w, w + warps, ...
constexpr int kSlots = 6, kWarpsPerBlock = 4;
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gather_bulk(const bf16* __restrict__ x,
                                                                  const int32_t* __restrict__ src_row, int64_t N,
                                                                  int64_t H, bf16* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kWarpsPerBlock][kSlots];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t row_bytes = static_cast<uint32_t>(H * 2);
  unsigned char* buf = smem + static_cast<size_t>(warp) * kSlots * row_bytes;
  if (lane == 0) {
    for (int s = 0; s < kSlots; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bars[warp][s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  if (lane != 0) return;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t w0 = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  uint32_t phase[kSlots] = {};
  auto load = [&](int64_t r, int s) {
    const uint32_t bar = smem_u32(&bars[warp][s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(row_bytes) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_u32(buf + s * row_bytes)),
        "l"(x + static_cast<int64_t>(src_row[r]) * H), "r"(row_bytes), "r"(bar)
        : "memory");
  };
  // prologue: kSlots - 1 loads in flight; each step stores slot s, then refills the slot stored in the
  // step before (its store has read it once at most one newer group is pending)
  int64_t r_load = w0;
  for (int s = 0; s < kSlots - 1 && r_load < N; ++s, r_load += warps) load(r_load, s);
  int s = 0;
  for (int64_t r = w0; r < N; r += warps) {
    const uint32_t bar = smem_u32(&bars[warp][s]);
    asm volatile(
        "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
        "r"(phase[s])
        : "memory");
    phase[s] ^= 1u;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(out + r * H),
                 "r"(smem_u32(buf + s * row_bytes)), "r"(row_bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    const int refill = s == 0 ? kSlots - 1 : s - 1;
    if (r_load < N) {
      asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
      load(r_load, refill);
      r_load += warps;
    }
    if (++s == kSlots) s = 0;
  }
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t T = 4096, k = 8, E = 128, H = 2048, N = T * k;
  // routing: each token picks k distinct experts at random; rows in expert order, tokens ascending
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> by_e(E);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> es(E);
    std::iota(es.begin(), es.end(), 0);
    for (int j = 0; j < k; ++j) {
      std::uniform_int_distribution<int> d(j, static_cast<int>(E) - 1);
      std::swap(es[j], es[d(rng)]);
      by_e[es[j]].push_back(static_cast<int32_t>(t));
    }
  }
  std::vector<int32_t> token_of;
  for (auto& v : by_e) token_of.insert(token_of.end(), v.begin(), v.end());
  std::vector<uint16_t> hx(T * H);
  for (auto& v : hx) v = static_cast<uint16_t>(rng() & 0x7fff);
  bf16 *x, *o0, *o1;
  int32_t* idx;
  CK(cudaMalloc(&x, T * H * 2));
  CK(cudaMalloc(&o0, N * H * 2));
  CK(cudaMalloc(&o1, N * H * 2));
  CK(cudaMalloc(&idx, N * 4));
  CK(cudaMemcpy(x, hx.data(), T * H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(idx, token_of.data(), N * 4, cudaMemcpyHostToDevice));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t bulk_smem = static_cast<size_t>(kWarpsPerBlock) * kSlots * H * 2;
  CK(cudaFuncSetAttribute(gather_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bulk_smem)));
  const unsigned g4 = static_cast<unsigned>((N + kRows - 1) / kRows);
  struct Case {
    std::string name;
    std::function<void()> run;
    bool check;
  };
  std::vector<Case> cases = {
      {"plain stores (until round 31)", [&] { gather_rows_copy<false><<<g4, 256>>>(x, idx, N, H, o1); }, true},
      {"st.global.cs (shipped since round 31)", [&] { gather_rows_copy<true><<<g4, 256>>>(x, idx, N, H, o1); }, true},
      {"bulk copies, 1 block/SM", [&] { gather_bulk<<<sms, 32 * kWarpsPerBlock, bulk_smem>>>(x, idx, N, H, o1); }, true},
      {"bulk copies, 2 blocks/SM",
       [&] { gather_bulk<<<2 * sms, 32 * kWarpsPerBlock, bulk_smem>>>(x, idx, N, H, o1); }, true},
      {"memset of the output (ceiling)", [&] { CK(cudaMemsetAsync(o1, 0, N * H * 2)); }, false},
      {"device copy of the output (ceiling)", [&] { CK(cudaMemcpyAsync(o1, o0, N * H * 2, cudaMemcpyDeviceToDevice)); },
       false},
  };
  // reference output, then each variant checked against it
  gather_rows_copy<false><<<g4, 256>>>(x, idx, N, H, o0);
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> ref(N * H), got(N * H);
  CK(cudaMemcpy(ref.data(), o0, N * H * 2, cudaMemcpyDeviceToHost));
  for (auto& c : cases) {
    if (!c.check) continue;
    CK(cudaMemset(o1, 0xff, N * H * 2));
    c.run();
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), o1, N * H * 2, cudaMemcpyDeviceToHost));
    if (std::memcmp(ref.data(), got.data(), N * H * 2) != 0) {
      std::printf("MISMATCH: %s\n", c.name.c_str());
      return 1;
    }
  }
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<std::vector<float>> ms(cases.size());
  for (int w = 0; w < 3; ++w)
    for (auto& c : cases) c.run();
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      CK(cudaEventRecord(a));
      cases[i].run();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float t = 0;
      CK(cudaEventElapsedTime(&t, a, b));
      ms[i].push_back(t);
    }
  const double bytes = static_cast<double>(N * H * 2);
  std::printf("gather: %lld rows x %lld bf16 (%.0f MB written), %d reps, interleaved; outputs equal\n",
              static_cast<long long>(N), static_cast<long long>(H), bytes / 1e6, reps);
  std::printf("| case | median us | min us | TB/s written |\n|---|---|---|---|\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    const double med = ms[i][ms[i].size() / 2] * 1e3, mn = ms[i][0] * 1e3;
    std::printf("| %s | %.1f | %.1f | %.2f |\n", cases[i].name.c_str(), med, mn, bytes / (med * 1e-6) / 1e12);
  }
  return 0;
}
