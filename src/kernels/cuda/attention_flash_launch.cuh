// Host-side launchers of the fast bf16 attention kernels, free of project dependencies so that
// attention_flash.cu (the op) and bench/standalone/attn_bench.cu (the GPU harness) run the same
// code: on compute capability 9.0 the warp-specialized TMA + wgmma kernels (attention_flash_sm90_ws.cuh),
// else, and wherever a TMA map cannot be encoded, the mma.sync kernels (attention_flash_sm80.cuh).
// Functions return the first CUDA error instead of throwing; the caller checks.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the runtime's entry point
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_flash_problem.cuh"
#include "kernels/cuda/attention_flash_sm90_ws.cuh"

namespace moetrain::cuda {

namespace flash {

enum class Arch { kSm80, kSm90 };

// Knobs of the sm90 path, measured on an H100 / H200 (bench/standalone/attn_bench.py varies them).
struct Sm90Knobs {
  // K / V ring depth of the forward. 3 beat 2 by 2-3% until round 29 launched the query tiles longest
  // first; since then 2 is as fast or faster (H100: 1-3% at T 4096 and 10% at T 8192 in attn_bench,
  // 2.7% at T 4096 and equal at T 8192 in the step's kernel trace).
  int fwd_stages = 2;
  int bwd_ctas_per_sm = 2;    // backward head splits (from 2 heads per CTA) aim at this many CTAs per SM
  int bwd_det_desc = 1;       // deterministic backward: query tiles backwards, 3-7% faster than forwards
};
// A benchmark override from the environment: unset or empty keeps `fallback`; anything but an integer
// in [lo, hi] is an error naming the variable.
inline int knob_env(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw std::invalid_argument(std::string("[attention] ") + name + "='" + v + "': expected an integer from " +
                                std::to_string(lo) + " to " + std::to_string(hi));
  return static_cast<int>(x);
}
// Benchmark overrides (read once): MT_ATTN_FWD_STAGES (2 or 3), MT_ATTN_BWD_CTAS (1..8). Every
// setting gives the same bits.
inline Sm90Knobs& sm90_knobs() {
  static Sm90Knobs k = [] {
    Sm90Knobs d;
    d.fwd_stages = knob_env("MT_ATTN_FWD_STAGES", d.fwd_stages, 2, 3);
    d.bwd_ctas_per_sm = knob_env("MT_ATTN_BWD_CTAS", d.bwd_ctas_per_sm, 1, 8);
    return d;
  }();
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
  a.dq_row = p.dq_row ? p.dq_row : p.nh * p.d;
  a.dk_row = p.dk_row ? p.dk_row : p.nkv * p.d;
  a.dv_row = p.dv_row ? p.dv_row : p.nkv * p.d;
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
// Map of x [T][heads][d] bf16 (tokens `tok` elements apart; 0: heads * d) with boxes of 64 columns x
// 1 head x `rows` rows, 128B swizzle, rows past T read as zero. False if it cannot be made (the caller
// falls back to the sm80 kernels).
inline bool tma_map(CUtensorMap* m, const void* x, int64_t T, int64_t heads, int64_t d, int rows, int64_t tok = 0) {
  const TmaEncode enc = tma_encoder();
  if (tok == 0) tok = heads * d;
  if (enc == nullptr || (reinterpret_cast<uintptr_t>(x) & 15) != 0 || T <= 0 || (tok * 2) % 16 != 0) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d * 2), static_cast<cuuint64_t>(tok * 2)};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(rows)}, estr[3] = {1, 1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(x), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int kD, int kStages>
cudaError_t forward_ws(const FlashArgs& a, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                       cudaStream_t s) {
  if (!query_grid_ok(a.T, kWgBM)) return cudaErrorInvalidValue;
  const dim3 grid = query_grid(a.T, a.nh, kWgBM);
  MT_FLASH_TRY(set_smem(attn_fwd_ws_kernel<kD, kStages>, fwd_ws_smem<kD, kStages>()));
  launch_pdl(attn_fwd_ws_kernel<kD, kStages>, grid, kWsThreads, fwd_ws_smem<kD, kStages>(), s, mq, mk, mv, a);
  return cudaGetLastError();
}

template <int kD>
cudaError_t forward_d(const FlashAttnProblem& p, bf16* out, float* lse, Arch arch, cudaStream_t s) {
  FlashArgs a = base_args(p);
  a.out = out;
  a.lse_out = lse;
  CUtensorMap mq, mk, mv;
  if (arch == Arch::kSm90 && tma_map(&mq, p.q, p.T, p.nh, kD, kWgBM) && tma_map(&mk, p.k, p.T, p.nkv, kD, kWsKeys) &&
      tma_map(&mv, p.v, p.T, p.nkv, kD, kWsKeys, p.v_row))
    return sm90_knobs().fwd_stages == 3 ? forward_ws<kD, 3>(a, mq, mk, mv, s) : forward_ws<kD, 2>(a, mq, mk, mv, s);
  if (p.v_row != 0 && p.v_row != p.nkv * p.d) return cudaErrorInvalidValue;  // strided_ok() was not asked
  const size_t smem = (kFwdBM + 4 * kBN) * kD * 2;
  MT_FLASH_TRY(set_smem(attn_fwd_mma_kernel<kD>, smem));
  if (!query_grid_ok(p.T, kFwdBM)) return cudaErrorInvalidValue;
  const dim3 grid = query_grid(p.T, p.nh, kFwdBM);
  launch_pdl(attn_fwd_mma_kernel<kD>, grid, 32 * kFwdWarps, smem, s, a);
  return cudaGetLastError();
}

inline cudaError_t forward(const FlashAttnProblem& p, bf16* out, float* lse, Arch arch, cudaStream_t s) {
  return p.d == 128 ? forward_d<128>(p, out, lse, arch, s) : forward_d<64>(p, out, lse, arch, s);
}

// The fused sm90 backward runs where the TMA encoder exists; a pointer it cannot map still falls back
// to the sm80 kernels, in the same workspace.
inline bool fused_backward(Arch arch) { return arch == Arch::kSm90 && tma_encoder() != nullptr; }
// Whether a problem's token strides (v_row, dq_row, dk_row, dv_row) may be other than packed: the sm90
// kernels take them when every pointer is 16-byte aligned and every stride a multiple of 8 elements.
inline bool strided_ok(Arch arch, std::initializer_list<int64_t> strides) {
  if (!fused_backward(arch)) return false;
  for (const int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}
// Number of head splits of the dK/dV grid: the group's heads are divided over CTAs until the grid
// has about 4 CTAs per SM (sm80, 64 keys per CTA) or the sm90 knob's count (128 keys per CTA). The
// sm90 grid starts at two heads per CTA (a CTA loads its K/V tile once for both, and there are half
// the dK/dV partials to sum): at GQA 32/4 that is 4 splits, 0.94-0.97 ms against 1.00-1.02 for 8 at
// T 4096 and 3.39-3.51 against 3.51-3.70 at T 8192; 2 splits (4 heads) were slower at both (H100,
// docs/performance.md, round 16).
inline int64_t backward_splits(const FlashAttnProblem& p, Arch arch, int sm_count) {
  const int64_t keys = fused_backward(arch) ? kWgBM : kKvBN;
  const int64_t kv_tiles = (p.T + keys - 1) / keys, group = p.nh / p.nkv;
  const int per_sm = fused_backward(arch) ? sm90_knobs().bwd_ctas_per_sm : 4;
  const int64_t want = per_sm * std::max(1, sm_count > 0 ? sm_count : 132);
  int64_t splits = 1;
  if (fused_backward(arch)) {  // the largest divisor of the group that is at most half of it
    splits = std::max<int64_t>(1, group / 2);
    while (group % splits) --splits;
  }
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
  if (fused_backward(arch)) w.bytes = std::max(w.bytes, backward_workspace(p, Arch::kSm80, sm_count).bytes);
  return w;
}
inline size_t backward_workspace_bytes(const FlashAttnProblem& p, Arch arch, int sm_count) {
  return backward_workspace(p, arch, sm_count).bytes;
}

// Fused sm90 backward: prep (D, counters), the 5-GEMM kernel over a 1-D grid of tickets, finish.
// Maps: q, dO with 64-row boxes, k, v with 128-row boxes.
template <int kD>
cudaError_t backward_fused_d(FlashArgs a, float* dsum, const BwdWorkspace& w, const CUtensorMap (&m)[4], bf16* dk,
                             bf16* dv, bool deterministic, int sm_count, cudaStream_t s) {
  a.deterministic = deterministic ? 1 : 0;
  const int64_t rows = a.T * a.nh;
  const unsigned prep_blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, 16 * std::max(sm_count, 1))));
  int* jb_lo = a.sems + w.ncounters;
  a.jb_lo = jb_lo;
  launch_pdl(attn_bwd_prep_kernel<kD>, prep_blocks, 256, 0, s, a, dsum, jb_lo, w.ncounters, deterministic ? 0 : 1);
  MT_FLASH_TRY(cudaGetLastError());
  const int64_t ctas = (a.T + kWgBM - 1) / kWgBM * a.nkv * w.splits;
  MT_FLASH_TRY(set_smem(attn_bwd_ws_kernel<kD>, bwd_ws_smem<kD>()));
  launch_pdl(attn_bwd_ws_kernel<kD>, static_cast<unsigned>(ctas), kWsThreads, bwd_ws_smem<kD>(), s,
      m[0], m[1], m[2], m[3], a, sm90_knobs().bwd_det_desc);
  MT_FLASH_TRY(cudaGetLastError());
  const int64_t n4 = a.T * (a.nkv + a.nh) * kD / 4;
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n4 + 255) / 256, 32 * std::max(sm_count, 1))));
  launch_pdl(attn_bwd_finish_kernel<kD>, blocks, 256, 0, s, a, static_cast<int>(w.splits), dk, dv);
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
  CUtensorMap m[4];  // q, k, v, dO
  const bool fused = fused_backward(arch) && tma_map(&m[0], p.q, p.T, p.nh, kD, kWgBN) &&
                     tma_map(&m[1], p.k, p.T, p.nkv, kD, kWgBM) &&
                     tma_map(&m[2], p.v, p.T, p.nkv, kD, kWgBM, p.v_row) && tma_map(&m[3], dout, p.T, p.nh, kD, kWgBN);
  const auto packed = [](int64_t row, int64_t heads) { return row == 0 || row == heads * kD; };
  if (!fused && !(packed(p.v_row, p.nkv) && packed(p.dq_row, p.nh) && packed(p.dk_row, p.nkv) && packed(p.dv_row, p.nkv)))
    return cudaErrorInvalidValue;  // strided_ok() was not asked
  const BwdWorkspace w = backward_workspace(p, fused ? Arch::kSm90 : Arch::kSm80, sm_count);
  const int64_t splits = w.splits;
  a.heads_per_cta = static_cast<int>(a.group / splits);
  const int64_t n_kv = p.T * p.nkv * kD;
  char* ws = static_cast<char*>(workspace);
  float* dsum = reinterpret_cast<float*>(ws + w.dsum);
  a.dsum = dsum;
  a.part_k = reinterpret_cast<float*>(ws + w.part_k);
  a.part_v = reinterpret_cast<float*>(ws + w.part_v);
  if (fused) {
    a.dq_acc = reinterpret_cast<float*>(ws + w.dq_acc);
    a.sems = reinterpret_cast<int*>(ws + w.sems);
    a.ticket = a.sems + (w.ncounters - 1);
    return backward_fused_d<kD>(a, dsum, w, m, dk, dv, deterministic, sm_count, s);
  }
  launch_pdl(attn_dot_kernel<kD>, static_cast<unsigned>((p.T * p.nh + 7) / 8), 256, 0, s, a, dsum);
  MT_FLASH_TRY(cudaGetLastError());
  const size_t smem_dq = (2 * kFwdBM + 4 * kBN) * kD * 2;
  MT_FLASH_TRY(set_smem(attn_dq_mma_kernel<kD>, smem_dq));
  if (!query_grid_ok(p.T, kFwdBM)) return cudaErrorInvalidValue;
  const dim3 grid_q = query_grid(p.T, p.nh, kFwdBM);
  launch_pdl(attn_dq_mma_kernel<kD>, grid_q, 32 * kFwdWarps, smem_dq, s, a);
  MT_FLASH_TRY(cudaGetLastError());
  const size_t smem_kv = (2 * kKvBN + 4 * kKvBM) * kD * 2 + 4 * kKvBM * 4;
  MT_FLASH_TRY(set_smem(attn_dkdv_mma_kernel<kD>, smem_kv));
  const dim3 grid_kv(static_cast<unsigned>((p.T + kKvBN - 1) / kKvBN), static_cast<unsigned>(p.nkv),
                     static_cast<unsigned>(splits));
  launch_pdl(attn_dkdv_mma_kernel<kD>, grid_kv, 32 * kKvWarps, smem_kv, s, a);
  MT_FLASH_TRY(cudaGetLastError());
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n_kv + 255) / 256, 65536));
  launch_pdl(attn_kv_reduce_kernel, blocks, 256, 0, s, a.part_k, a.part_v, static_cast<int>(splits), n_kv, dk, dv);
  return cudaGetLastError();
}

// deterministic = false lets the sm90 path add dQ partials in any order (bitwise results
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
