// Host-side launchers of the fast bf16 attention kernels, free of project dependencies so that
// attention_flash.cu (the op) and bench/standalone/attn_bench.cu (the GPU harness) run the same
// code: sm90 (wgmma, attention_flash_sm90.cuh; fused backward in attention_flash_sm90_bwd.cuh) on
// compute capability 9.0, else sm80 (mma.sync). On sm90 the warp-specialized TMA kernels
// (attention_flash_sm90_ws.cuh) are the default; the knobs select the older ones.
// Functions return the first CUDA error instead of throwing; the caller checks.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's entry point
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention_flash_problem.cuh"
#include "kernels/cuda/attention_flash_sm90_bwd.cuh"
#include "kernels/cuda/attention_flash_sm90_ws.cuh"

namespace moetrain::cuda {

namespace flash {

enum class Arch { kSm80, kSm90 };

// Knobs of the sm90 path, tuned on an H200 (bench/standalone/attn_bench.py varies them): key tile
// of the forward and of the dQ kernel (64 or 128), and dK/dV CTAs per SM wanted when splitting heads.
struct Sm90Knobs {
  int fwd_key_tile = 128;   // 128 beat 64 by 10-13% (T 4096 / 8192)
  int dq_key_tile = 128;    // 128 beat 64 by 1-2% despite a 96-byte spill
  int kv_ctas_per_sm = 6;   // 6 beat 2-3 by 5-7%: finer head splits balance the causal tail
  int bwd_fused = 1;        // 1: fused 5-GEMM backward (attention_flash_sm90_bwd.cuh); 0: dQ + dK/dV kernels
  int fused_ctas_per_sm = 12;  // fused backward: 12 beat 6 by 1.6% at T 8192 (8 head splits, not 4)
  int fwd_ws = 1;      // 1: warp-specialized TMA forward (attention_flash_sm90_ws.cuh), 26-28% faster; 0: old
  int fwd_stages = 3;  // K / V ring depth of the ws forward: 3 beat 2 by 2-3% (H100, T 4096 / 8192)
  int bwd_ws = 1;      // 1: warp-specialized fused backward (needs bwd_fused), 35-39% faster det; 0: old
  int bwd_det_desc = 1;  // ws deterministic backward: query tiles backwards, 3-7% faster than forwards
};
inline Sm90Knobs& sm90_knobs() {
  static Sm90Knobs k;
  return k;
}

inline FlashArgs base_args(const FlashAttnProblem& p) {
  FlashArgs a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.cu = p.cu;
  a.T = p.T;
  a.nh = p.nh;
  a.nkv = p.nkv;
  a.group = p.nh / p.nkv;
  a.ndocs = p.ndocs;
  a.scale = p.scale;
  return a;
}

template <typename K>
cudaError_t set_smem(K kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

#define MT_FLASH_TRY(x)                  \
  do {                                   \
    const cudaError_t e_ = (x);          \
    if (e_ != cudaSuccess) return e_;    \
  } while (0)

using TmaEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                               const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                               CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// cuTensorMapEncodeTiled from the driver through the runtime (no libcuda link); null if missing.
inline TmaEncode tma_encoder() {
  static const TmaEncode fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    cudaGetLastError();
    return reinterpret_cast<TmaEncode>(f);
  }();
  return fn;
}
// Map of x [T][heads][d] bf16 with boxes of 64 columns x 1 head x `rows` rows, 128B swizzle, rows
// past T read as zero. False if it cannot be made (the caller falls back to the cp.async kernels).
inline bool tma_map(CUtensorMap* m, const void* x, int64_t T, int64_t heads, int64_t d, int rows) {
  const TmaEncode enc = tma_encoder();
  if (enc == nullptr || (reinterpret_cast<uintptr_t>(x) & 15) != 0 || T <= 0) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d * 2), static_cast<cuuint64_t>(heads * d * 2)};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(rows)}, estr[3] = {1, 1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(x), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kD, int kStages>
cudaError_t forward_ws(const FlashArgs& a, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                       cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.T + kWgBM - 1) / kWgBM), static_cast<unsigned>(a.nh));
  MT_FLASH_TRY(set_smem(attn_fwd_ws_kernel<kD, kStages>, fwd_ws_smem<kD, kStages>()));
  attn_fwd_ws_kernel<kD, kStages><<<grid, kWsThreads, fwd_ws_smem<kD, kStages>(), s>>>(mq, mk, mv, a);
  return cudaGetLastError();
}

template <int kD>
cudaError_t forward_d(const FlashAttnProblem& p, bf16* out, float* lse, Arch arch, cudaStream_t s) {
  FlashArgs a = base_args(p);
  a.out = out;
  a.lse_out = lse;
  if (arch == Arch::kSm90) {
    CUtensorMap mq, mk, mv;
    if (sm90_knobs().fwd_ws && tma_map(&mq, p.q, p.T, p.nh, kD, kWgBM) && tma_map(&mk, p.k, p.T, p.nkv, kD, kWsKeys) &&
        tma_map(&mv, p.v, p.T, p.nkv, kD, kWsKeys))
      return sm90_knobs().fwd_stages == 3 ? forward_ws<kD, 3>(a, mq, mk, mv, s) : forward_ws<kD, 2>(a, mq, mk, mv, s);
    const dim3 grid(static_cast<unsigned>((p.T + kWgBM - 1) / kWgBM), static_cast<unsigned>(p.nh));
    if (sm90_knobs().fwd_key_tile == 64) {
      MT_FLASH_TRY(set_smem(attn_fwd_wgmma_kernel<kD, 64>, fwd_wgmma_smem<kD, 64>()));
      attn_fwd_wgmma_kernel<kD, 64><<<grid, kWgThreads, fwd_wgmma_smem<kD, 64>(), s>>>(a);
    } else {
      MT_FLASH_TRY(set_smem(attn_fwd_wgmma_kernel<kD, 128>, fwd_wgmma_smem<kD, 128>()));
      attn_fwd_wgmma_kernel<kD, 128><<<grid, kWgThreads, fwd_wgmma_smem<kD, 128>(), s>>>(a);
    }
    return cudaGetLastError();
  }
  const size_t smem = (kFwdBM + 4 * kBN) * kD * 2;
  MT_FLASH_TRY(set_smem(attn_fwd_mma_kernel<kD>, smem));
  const dim3 grid(static_cast<unsigned>((p.T + kFwdBM - 1) / kFwdBM), static_cast<unsigned>(p.nh));
  attn_fwd_mma_kernel<kD><<<grid, 32 * kFwdWarps, smem, s>>>(a);
  return cudaGetLastError();
}

inline cudaError_t forward(const FlashAttnProblem& p, bf16* out, float* lse, Arch arch, cudaStream_t s) {
  return p.d == 128 ? forward_d<128>(p, out, lse, arch, s) : forward_d<64>(p, out, lse, arch, s);
}

inline bool fused_backward(Arch arch) { return arch == Arch::kSm90 && sm90_knobs().bwd_fused != 0; }
// Number of head splits of the dK/dV grid: the group's heads are divided over CTAs until the grid
// has about 4 CTAs per SM (sm80, 64 keys per CTA) or the sm90 knob's count (128 keys per CTA).
inline int64_t backward_splits(const FlashAttnProblem& p, Arch arch, int sm_count) {
  const int64_t keys = arch == Arch::kSm90 ? kWgBM : kKvBN;
  const int64_t kv_tiles = (p.T + keys - 1) / keys, group = p.nh / p.nkv;
  const int per_sm = arch == Arch::kSm80 ? 4 : fused_backward(arch) ? sm90_knobs().fused_ctas_per_sm : sm90_knobs().kv_ctas_per_sm;
  const int64_t want = per_sm * std::max(1, sm_count > 0 ? sm_count : 132);
  int64_t splits = 1;
  while (splits < group && kv_tiles * p.nkv * splits < want) {
    int64_t nx = splits + 1;
    while (group % nx) ++nx;
    splits = nx;
  }
  return splits;
}

// Device workspace of flash backward, f32 unless noted, each part 256-byte aligned: D [nh, T]; the
// dK/dV partials [splits, T, nkv, d] twice; for the fused sm90 path also dq_acc [nh, T, d] and the
// i32 dQ counters [nh, ceil(T / 64)], the CTA ticket and jb_lo [ceil(T / 64)].
struct BwdWorkspace {
  size_t dsum, part_k, part_v, dq_acc, sems, bytes;
  int64_t splits, ncounters;
};
inline size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }
inline BwdWorkspace backward_workspace(const FlashAttnProblem& p, Arch arch, int sm_count) {
  BwdWorkspace w{};
  w.splits = backward_splits(p, arch, sm_count);
  const size_t n_kv = static_cast<size_t>(w.splits * p.T * p.nkv * p.d) * 4;
  w.part_k = align256(static_cast<size_t>(p.nh * p.T) * 4);
  w.part_v = w.part_k + align256(n_kv);
  w.dq_acc = w.part_v + align256(n_kv);
  w.sems = w.dq_acc;
  if (fused_backward(arch)) {
    w.sems = w.dq_acc + align256(static_cast<size_t>(p.nh * p.T * p.d) * 4);
    w.ncounters = p.nh * ((p.T + kDqRows - 1) / kDqRows) + 1;
  }
  const int64_t nqt = fused_backward(arch) ? (p.T + kDqRows - 1) / kDqRows : 0;
  w.bytes = w.sems + align256(static_cast<size_t>(w.ncounters + nqt) * 4);
  return w;
}
inline size_t backward_workspace_bytes(const FlashAttnProblem& p, Arch arch, int sm_count) {
  return backward_workspace(p, arch, sm_count).bytes;
}

// Fused sm90 backward: prep (D, counters), the 5-GEMM kernel over a 1-D grid of tickets, finish.
template <int kD>
cudaError_t backward_fused_d(FlashArgs a, float* dsum, const BwdWorkspace& w, bf16* dk, bf16* dv, bool deterministic,
                             int sm_count, cudaStream_t s) {
  a.deterministic = deterministic ? 1 : 0;
  const int64_t rows = a.T * a.nh;
  const unsigned prep_blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, 16 * std::max(sm_count, 1))));
  int* jb_lo = a.sems + w.ncounters;
  a.jb_lo = jb_lo;
  attn_bwd_prep_kernel<kD><<<prep_blocks, 256, 0, s>>>(a, dsum, jb_lo, w.ncounters, deterministic ? 0 : 1);
  MT_FLASH_TRY(cudaGetLastError());
  const int64_t ctas = (a.T + kWgBM - 1) / kWgBM * a.nkv * w.splits;
  CUtensorMap mq, mk, mv, mg;
  if (sm90_knobs().bwd_ws && tma_map(&mq, a.q, a.T, a.nh, kD, kWgBN) && tma_map(&mg, a.dout, a.T, a.nh, kD, kWgBN) &&
      tma_map(&mk, a.k, a.T, a.nkv, kD, kWgBM) && tma_map(&mv, a.v, a.T, a.nkv, kD, kWgBM)) {
    MT_FLASH_TRY(set_smem(attn_bwd_ws_kernel<kD>, bwd_ws_smem<kD>()));
    attn_bwd_ws_kernel<kD><<<static_cast<unsigned>(ctas), kWsThreads, bwd_ws_smem<kD>(), s>>>(mq, mk, mv, mg, a, sm90_knobs().bwd_det_desc);
  } else {
    MT_FLASH_TRY(set_smem(attn_bwd_fused_wgmma_kernel<kD>, bwd_fused_smem<kD>()));
    attn_bwd_fused_wgmma_kernel<kD><<<static_cast<unsigned>(ctas), kWgThreads, bwd_fused_smem<kD>(), s>>>(a);
  }
  MT_FLASH_TRY(cudaGetLastError());
  const int64_t n4 = a.T * (a.nkv + a.nh) * kD / 4;
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n4 + 255) / 256, 32 * std::max(sm_count, 1))));
  attn_bwd_finish_kernel<kD><<<blocks, 256, 0, s>>>(a, static_cast<int>(w.splits), dk, dv);
  return cudaGetLastError();
}

template <int kD>
cudaError_t backward_d(const FlashAttnProblem& p, const bf16* o, const float* lse, const bf16* dout, bf16* dq,
                       bf16* dk, bf16* dv, void* workspace, Arch arch, int sm_count, bool deterministic,
                       cudaStream_t s) {
  FlashArgs a = base_args(p);
  a.o = o;
  a.lse = lse;
  a.dout = dout;
  a.dq = dq;
  const BwdWorkspace w = backward_workspace(p, arch, sm_count);
  const int64_t splits = w.splits;
  a.heads_per_cta = static_cast<int>(a.group / splits);
  const int64_t n_kv = p.T * p.nkv * kD;
  char* ws = static_cast<char*>(workspace);
  float* dsum = reinterpret_cast<float*>(ws + w.dsum);
  a.dsum = dsum;
  a.part_k = reinterpret_cast<float*>(ws + w.part_k);
  a.part_v = reinterpret_cast<float*>(ws + w.part_v);
  if (fused_backward(arch)) {
    a.dq_acc = reinterpret_cast<float*>(ws + w.dq_acc);
    a.sems = reinterpret_cast<int*>(ws + w.sems);
    a.ticket = a.sems + (w.ncounters - 1);
    return backward_fused_d<kD>(a, dsum, w, dk, dv, deterministic, sm_count, s);
  }
  attn_dot_kernel<kD><<<static_cast<unsigned>((p.T * p.nh + 7) / 8), 256, 0, s>>>(a, dsum);
  MT_FLASH_TRY(cudaGetLastError());
  if (arch == Arch::kSm90) {
    const dim3 grid_q(static_cast<unsigned>((p.T + kWgBM - 1) / kWgBM), static_cast<unsigned>(p.nh));
    if (sm90_knobs().dq_key_tile == 128) {
      MT_FLASH_TRY(set_smem(attn_dq_wgmma_kernel<kD, 128>, dq_wgmma_smem<kD, 128>()));
      attn_dq_wgmma_kernel<kD, 128><<<grid_q, kWgThreads, dq_wgmma_smem<kD, 128>(), s>>>(a);
    } else {
      MT_FLASH_TRY(set_smem(attn_dq_wgmma_kernel<kD, 64>, dq_wgmma_smem<kD, 64>()));
      attn_dq_wgmma_kernel<kD, 64><<<grid_q, kWgThreads, dq_wgmma_smem<kD, 64>(), s>>>(a);
    }
    MT_FLASH_TRY(cudaGetLastError());
    MT_FLASH_TRY(set_smem(attn_dkdv_wgmma_kernel<kD>, dkdv_wgmma_smem<kD>()));
    const dim3 grid_kv(static_cast<unsigned>((p.T + kWgBM - 1) / kWgBM), static_cast<unsigned>(p.nkv),
                       static_cast<unsigned>(splits));
    attn_dkdv_wgmma_kernel<kD><<<grid_kv, kWgThreads, dkdv_wgmma_smem<kD>(), s>>>(a);
    MT_FLASH_TRY(cudaGetLastError());
  } else {
    const size_t smem_dq = (2 * kFwdBM + 4 * kBN) * kD * 2;
    MT_FLASH_TRY(set_smem(attn_dq_mma_kernel<kD>, smem_dq));
    const dim3 grid_q(static_cast<unsigned>((p.T + kFwdBM - 1) / kFwdBM), static_cast<unsigned>(p.nh));
    attn_dq_mma_kernel<kD><<<grid_q, 32 * kFwdWarps, smem_dq, s>>>(a);
    MT_FLASH_TRY(cudaGetLastError());
    const size_t smem_kv = (2 * kKvBN + 4 * kKvBM) * kD * 2 + 4 * kKvBM * 4;
    MT_FLASH_TRY(set_smem(attn_dkdv_mma_kernel<kD>, smem_kv));
    const dim3 grid_kv(static_cast<unsigned>((p.T + kKvBN - 1) / kKvBN), static_cast<unsigned>(p.nkv),
                       static_cast<unsigned>(splits));
    attn_dkdv_mma_kernel<kD><<<grid_kv, 32 * kKvWarps, smem_kv, s>>>(a);
    MT_FLASH_TRY(cudaGetLastError());
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n_kv + 255) / 256, 65536));
  attn_kv_reduce_kernel<<<blocks, 256, 0, s>>>(a.part_k, a.part_v, static_cast<int>(splits), n_kv, dk, dv);
  return cudaGetLastError();
}

// deterministic = false lets the fused sm90 path add dQ partials in any order (bitwise results
// may then vary between runs); the other paths are always deterministic.
inline cudaError_t backward(const FlashAttnProblem& p, const bf16* o, const float* lse, const bf16* dout, bf16* dq,
                            bf16* dk, bf16* dv, void* workspace, Arch arch, int sm_count, bool deterministic,
                            cudaStream_t s) {
  return p.d == 128 ? backward_d<128>(p, o, lse, dout, dq, dk, dv, workspace, arch, sm_count, deterministic, s)
                    : backward_d<64>(p, o, lse, dout, dq, dk, dv, workspace, arch, sm_count, deterministic, s);
}

#undef MT_FLASH_TRY

}  // namespace flash
}  // namespace moetrain::cuda
