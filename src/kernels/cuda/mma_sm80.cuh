// Tensor-core building blocks shared by the fast bf16 kernels (grouped GEMM, flash attention):
// cp.async 16-byte copies with zero fill, ldmatrix (plain and transposed) and the
// mma.sync.m16n8k16 bf16 -> fp32 instruction, as inline PTX (sm_80 and later, so also sm_90a).
// Fragment layouts follow the PTX ISA: thread lane holds row lane/4, columns 2*(lane%4)+{0,1}.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace moetrain::cuda::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; when !valid the 16 shared bytes are zero-filled and src is not read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col); fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold `kChunks` chunks,
// XOR-swizzled on the low 3 chunk bits so that 8 consecutive rows of one logical chunk (one
// ldmatrix 8x8 matrix) fall into 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  static_assert(kChunks % 8 == 0, "rows must hold a multiple of 128 bytes");
  return static_cast<uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
}

}  // namespace moetrain::cuda::mma
