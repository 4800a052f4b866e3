// Hopper (sm_90a) building blocks of the warp-specialized attention kernels (attention_flash_sm90_ws.cuh):
// the 128B-swizzled tile layout and its wgmma descriptors, wgmma m64n64 / m64n128 with A from shared
// memory or from registers, per-warpgroup row facts, and thread-predicated counter PTX for the ordered
// dQ adds. Masking, the softmax step and the epilogues are shared with attention_flash_sm80.cuh.
#pragma once
#include "kernels/cuda/attention_flash_sm80.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"  // MT_WGMMA_ENABLED, descriptors, fences, mbarriers, bulk copies

namespace moetrain::cuda::flash {

constexpr int kWgBM = 128;       // forward: queries per CTA; backward: keys per CTA
constexpr int kWgBN = 64;        // backward: queries per step
constexpr int kDqRows = kWgBN;   // queries per backward step, and the granularity of the dQ counters

// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// Tiles of kRows rows x kD bf16 are stored as kD/64 column blocks of [kRows][64], 128-byte rows
// with the 16-byte chunk index XORed with row & 7 (the wgmma 128B swizzle; tile bases 1024-aligned).
// The same bytes serve as a K-major operand and as an MN-major one.
template <int kRows>
__device__ __forceinline__ uint32_t sw_off(int r, int ch) {
  return static_cast<uint32_t>((ch >> 3) * (kRows * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}
// K-major operand (reduction over the kD columns): rows row0.. of the tile, k step ks (16 columns).
template <int kRows>
__device__ __forceinline__ uint64_t desc_kmaj(uint32_t tile, int row0, int ks) {
  return wg::smem_desc(tile + (ks >> 2) * (kRows * 128) + row0 * 128 + (ks & 3) * 32, 16, 1024);
}
// MN-major operand (reduction over rows k0 .. k0+15 of the tile, N = the kD columns).
template <int kRows>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0) {
  return wg::smem_desc(tile + k0 * 128, kRows * 128, 1024);
}
__device__ __forceinline__ uint32_t smem_base1024(const unsigned char* smem) {
  return (mma::smem_addr(smem) + 1023u) & ~1023u;
}

// wgmma asm pieces: "+f" operands of accumulator rows r .. r + 7 of d[N][4] (32 registers) and the
// matching register lists; undefined after the last wgmma below.
#define MT_ATTN_ACC1(d, r) "+f"(d[r][0]), "+f"(d[r][1]), "+f"(d[r][2]), "+f"(d[r][3])
#define MT_ATTN_ACC8(d, r)                                                                            \
  MT_ATTN_ACC1(d, r), MT_ATTN_ACC1(d, r + 1), MT_ATTN_ACC1(d, r + 2), MT_ATTN_ACC1(d, r + 3),         \
      MT_ATTN_ACC1(d, r + 4), MT_ATTN_ACC1(d, r + 5), MT_ATTN_ACC1(d, r + 6), MT_ATTN_ACC1(d, r + 7)
#define MT_ATTN_REGS_0_31                                                                   \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23," \
  "%24,%25,%26,%27,%28,%29,%30,%31"
#define MT_ATTN_REGS_32_63                                                                      \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

// d[8][4] = (accumulate ? d : 0) + A (64 x 16, smem) * B (16 x 64, smem); both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT_ATTN_REGS_0_31 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MT_ATTN_ACC8(d, 0)
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// d[8][4] += A (64 x 16 in registers, per warp as for mma.sync) * B (16 x 64, MN-major smem).
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT_ATTN_REGS_0_31
      "}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
      : MT_ATTN_ACC8(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

// d[16][4] = (accumulate ? d : 0) + A (64 x 16, smem) * B (16 x 128, smem); both K-major.
__device__ __forceinline__ void wgmma_ss(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MT_ATTN_REGS_0_31 "," MT_ATTN_REGS_32_63
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MT_ATTN_ACC8(d, 0), MT_ATTN_ACC8(d, 8)
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}
// d[16][4] += A (64 x 16 in registers, per warp as for mma.sync) * B (16 x 128, MN-major smem).
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" MT_ATTN_REGS_0_31 "," MT_ATTN_REGS_32_63
      "}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : MT_ATTN_ACC8(d, 0), MT_ATTN_ACC8(d, 8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}
// d[8][4] = (accumulate ? d : 0) + A (64 x 16) * B (16 x 64), both MN-major in shared memory.
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT_ATTN_REGS_0_31 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : MT_ATTN_ACC8(d, 0)
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}

#undef MT_ATTN_ACC1
#undef MT_ATTN_ACC8
#undef MT_ATTN_REGS_0_31
#undef MT_ATTN_REGS_32_63

// Thread-predicated counter accesses as single PTX statements, so they add no branch.
__device__ __forceinline__ int ld_acquire_gpu_if(bool pred, const int* p) {
  int v = 0;
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %1, 0;\n@q ld.acquire.gpu.global.b32 %0, [%2];\n}\n"
      : "+r"(v)
      : "r"(static_cast<int>(pred)), "l"(p)
      : "memory");
#endif
  return v;
}
// Release-add 1 (fence.acq_rel.gpu semantics first: every write ordered before it, including the
// other threads' writes before a preceding __syncthreads, is visible before the new count).
__device__ __forceinline__ void red_release_gpu_if(bool pred, const int* p) {
#if MT_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.b32 q, %0, 0;\n@q red.release.gpu.global.add.s32 [%1], 1;\n}\n" ::"r"(
          static_cast<int>(pred)),
      "l"(p)
      : "memory");
#endif
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// A descriptor whose start address is `bytes` further on: one add to the 14-bit address field, which
// cannot carry into the fields above it (shared memory addresses stay below 256 KB).
__device__ __forceinline__ uint64_t desc_plus(uint64_t d, uint32_t bytes) {
  return (d & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(d) + (bytes >> 4));
}
// d = A (64 rows of a kRowsA-row tile) * B^T (a kRowsB-row tile), reduced over kD columns: both
// K-major, issued as kD / 16 wgmma (the first one overwrites d). da and db are the descriptors of the
// first k step (desc_kmaj(tile, row0, 0)); each k step adds a constant instead of rebuilding them (a
// rebuild was about 8 uniform instructions a wgmma, round 37).
template <int kD, int kRowsA, int kRowsB, int N>
__device__ __forceinline__ void gemm_kmaj(float (&d)[N][4], uint64_t da, uint64_t db) {
#pragma unroll
  for (int kq = 0; kq < kD / 16; ++kq)
    wgmma_ss(d, desc_plus(da, (kq >> 2) * (kRowsA * 128) + (kq & 3) * 32),
             desc_plus(db, (kq >> 2) * (kRowsB * 128) + (kq & 3) * 32), kq);
}
// d += P (registers: the A fragments of a 64 x kRows block) * a kRows-row MN-major tile whose first
// k step's descriptor is db (desc_mn(tile, 0)).
template <int kRows, int N>
__device__ __forceinline__ void gemm_regs_mn(float (&d)[N][4], const uint32_t (&pa)[kRows / 16][4], uint64_t db) {
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) wgmma_rs(d, pa[kk], desc_plus(db, 16 * kk * 128));
}
// 2^x without the denormal-result path of exp2f (results below 2^-126 are 0).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// All A fragments of a 64 x 8N accumulator block (packed before wgmma.fence: see kernels.md).
template <int N>
__device__ __forceinline__ void pack_a(uint32_t (&pa)[N / 2][4], const float (&p)[N][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 2; ++kk) acc_to_a(pa[kk], p, kk);
}

// The 64 rows of one warpgroup: first/last valid row and their documents' bounds.
struct WgRows {
  int64_t lo, hi, beg_lo, beg_hi, end_lo, end_hi;
};
__device__ __forceinline__ WgRows wg_rows(const FlashArgs& a, int64_t r0) {
  WgRows w;
  w.lo = r0;
  w.hi = min(r0 + 63, a.T - 1);
  const bool any = w.hi >= w.lo;
  const int dl = any ? doc_of(a.cu, a.ndocs, w.lo) : 0, dh = any ? doc_of(a.cu, a.ndocs, w.hi) : 0;
  w.beg_lo = any ? a.cu[dl] : 0;
  w.beg_hi = any ? a.cu[dh] : 0;
  w.end_lo = any ? a.cu[dl + 1] : 0;
  w.end_hi = any ? a.cu[dh + 1] : 0;
  return w;
}

// Work item of CTA ticket tk: key block first (ascending, so longest causal work first and every
// dQ counter wait is on a smaller ticket, hence on a CTA already running or done), then kv head
// and head split.
struct FusedItem {
  int64_t jb, g, split;
};
__device__ __forceinline__ FusedItem fused_item(const FlashArgs& a, int64_t tk) {
  const int64_t splits = a.group / a.heads_per_cta, per_j = a.nkv * splits;
  return FusedItem{tk / per_j, (tk % per_j) / splits, tk % splits};
}

}  // namespace moetrain::cuda::flash
