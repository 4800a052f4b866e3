// CUDA embedding lookup and its backward. Forward copies table rows (rows of an id outside the
// table are filled with NaN so the fault is visible; the CPU path throws). Backward is
// deterministic without float atomics: a stable radix sort of (id, token) groups equal ids in
// token order, then one block per id sums its tokens' rows in that order and adds to dtable.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

template <typename T>
__global__ void embedding_fwd_kernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                     T* __restrict__ out, int64_t V, int64_t H) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < V;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    out[t * H + h] = ok ? table[id * H + h] : from_f<T>(NAN);
}

__global__ void iota_kernel(int32_t* __restrict__ v, int64_t n) {
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    v[i] = static_cast<int32_t>(i);
}

// One block per sorted position; only the first position of each run of equal ids works.
template <typename D>
__global__ void embedding_bwd_kernel(const int32_t* __restrict__ sorted_ids, const int32_t* __restrict__ sorted_tok,
                                     const D* __restrict__ dout, float* __restrict__ dtable, int64_t T,
                                     int64_t V, int64_t H) {
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int32_t id = sorted_ids[i];
  if (i > 0 && sorted_ids[i - 1] == id) return;
  if (id < 0 || id >= V) return;
  int64_t end = i + 1;
  while (end < T && sorted_ids[end] == id) ++end;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = i; j < end; ++j) acc += to_f(dout[static_cast<int64_t>(sorted_tok[j]) * H + h]);
    dtable[id * H + h] += acc;
  }
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& table, const Tensor& ids, Tensor& out) {
  const char* op = "embedding_forward";
  need_cuda(table, op, "table");
  need_cuda(ids, op, "ids");
  need_cuda(out, op, "out");
  need_dtype(ids, DType::kI32, op, "ids");
  need_dtype(out, table.dtype(), op, "out");
  const int64_t V = table.size(0), H = table.size(1), T = ids.numel();
  need_numel(out, T * H, op, "out");
  if (!T || !H) return;
  MT_CUDA_DISPATCH(table.dtype(), T_, op,
    launch_pdl(embedding_fwd_kernel<T_>, static_cast<unsigned>(T), 256, 0, stream_of(ctx),
        static_cast<const T_*>(table.data_ptr()), ids.data<int32_t>(), static_cast<T_*>(out.data_ptr()), V, H));
  check_launch(op);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const char* op = "embedding_backward";
  need_cuda(ids, op, "ids");
  need_cuda(dout, op, "dout");
  need_cuda(dtable, op, "dtable");
  need_dtype(ids, DType::kI32, op, "ids");
  need_dtype(dtable, DType::kF32, op, "dtable");
  const int64_t V = dtable.size(0), H = dtable.size(1), T = ids.numel();
  need_numel(dout, T * H, op, "dout");
  if (!T || !H) return;
  cudaStream_t s = stream_of(ctx);
  // [4 x T] i32: token iota, sorted ids, sorted tokens; then CUB's temporary storage.
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<int>(T), 0, 32, s));
  const int64_t idx_bytes = (3 * T * 4 + 255) / 256 * 256;
  Tensor scratch = device_scratch(ctx, idx_bytes + static_cast<int64_t>(temp_bytes));
  int32_t* tok = static_cast<int32_t*>(scratch.data_ptr());
  int32_t* sorted_ids = tok + T;
  int32_t* sorted_tok = tok + 2 * T;
  void* temp = static_cast<char*>(scratch.data_ptr()) + idx_bytes;
  launch_pdl(iota_kernel, grid_for(T), 256, 0, s, tok, T);
  check_launch(op);
  // All 32 key bits: ids outside [0, V) form their own runs and are skipped below.
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids.data<int32_t>(), sorted_ids, tok, sorted_tok,
                                                static_cast<int>(T), 0, 32, s));
  MT_CUDA_DISPATCH(dout.dtype(), D, op,
    launch_pdl(embedding_bwd_kernel<D>, static_cast<unsigned>(T), 256, 0, s, sorted_ids, sorted_tok,
        static_cast<const D*>(dout.data_ptr()), dtable.data<float>(), T, V, H));
  check_launch(op);
}

}  // namespace moetrain::cuda
