// Standalone GPU harness library for the fast attention kernels (no project libraries): exposes the
// launchers of src/kernels/cuda/attention_flash_launch.cuh (sm80 mma.sync and sm90 warp-specialized
// paths) to attn_bench.py through a C ABI, which checks them against torch fp64 math and times them next to
// torch flash sdpa. Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo
//   -Isrc -shared -Xcompiler -fPIC bench/standalone/attn_bench.cu -o attn_bench.so
#include "kernels/cuda/attention_flash_launch.cuh"

using moetrain::cuda::FlashAttnProblem;
namespace flash = moetrain::cuda::flash;

namespace {
FlashAttnProblem problem(const void* q, const void* k, const void* v, const int* cu, long T, long nh, long nkv,
                         long d, int ndocs, float scale) {
  return FlashAttnProblem{static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
                          static_cast<const __nv_bfloat16*>(v), cu, T, nh, nkv, d, ndocs, scale};
}
flash::Arch arch_of(int arch) { return arch == 90 ? flash::Arch::kSm90 : flash::Arch::kSm80; }
}  // namespace

extern "C" {

// Sets the sm90 knobs (attention_flash_launch.cuh): fwd_stages 2 or 3, bwd_ctas_per_sm, bwd_det_desc 0 or
// 1; -1 keeps a value.
void attn_set_knobs(int fwd_stages, int bwd_ctas_per_sm, int bwd_det_desc) {
  flash::Sm90Knobs& k = flash::sm90_knobs();
  if (fwd_stages >= 0) k.fwd_stages = fwd_stages;
  if (bwd_ctas_per_sm >= 0) k.bwd_ctas_per_sm = bwd_ctas_per_sm;
  if (bwd_det_desc >= 0) k.bwd_det_desc = bwd_det_desc;
}

// arch 80 or 90 (90: the warp-specialized kernels). Returns a cudaError_t.
int attn_fwd(int arch, const void* q, const void* k, const void* v, const int* cu, long T, long nh, long nkv, long d,
             int ndocs, float scale, void* out, float* lse, void* stream) {
  return flash::forward(problem(q, k, v, cu, T, nh, nkv, d, ndocs, scale), static_cast<__nv_bfloat16*>(out), lse,
                        arch_of(arch), static_cast<cudaStream_t>(stream));
}

long attn_bwd_workspace(int arch, long T, long nh, long nkv, long d, int sms) {
  return static_cast<long>(flash::backward_workspace_bytes(problem(nullptr, nullptr, nullptr, nullptr, T, nh, nkv, d,
                                                                   1, 1.0f),
                                                           arch_of(arch), sms));
}

int attn_bwd(int arch, const void* q, const void* k, const void* v, const int* cu, long T, long nh, long nkv, long d,
             int ndocs, float scale, const void* out, const float* lse, const void* dout, void* dq, void* dk, void* dv,
             void* ws, int sms, int deterministic, void* stream) {
  using bf = __nv_bfloat16;
  return flash::backward(problem(q, k, v, cu, T, nh, nkv, d, ndocs, scale), static_cast<const bf*>(out), lse,
                         static_cast<const bf*>(dout), static_cast<bf*>(dq), static_cast<bf*>(dk),
                         static_cast<bf*>(dv), ws, arch_of(arch), sms, deterministic != 0,
                         static_cast<cudaStream_t>(stream));
}

}  // extern "C"
