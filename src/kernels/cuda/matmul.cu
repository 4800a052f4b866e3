// CUDA GEMM through cuBLAS: C[M,N] = alpha * op(A) op(B) + beta * C, row-major, computed as the
// column-major product C^T = op(B)^T op(A)^T. bf16 inputs with bf16 or f32 output, or all f32;
// fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32). Matrices may have a row stride larger than
// their width (leading dimension), like the CPU twin.
#include <cublas_v2.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

template <typename T>
__global__ void scale_matrix_kernel(T* __restrict__ c, int64_t M, int64_t N, int64_t ldc, float beta) {
  pdl_wait();
  const int64_t n = M * N;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / N, j = e - i * N;
    c[i * ldc + j] = beta == 0.0f ? from_f<T>(0.0f) : from_f<T>(beta * to_f(c[i * ldc + j]));
  }
}

void need_matrix(const Tensor& t, const char* name) {
  MT_CHECK(t.defined(), "[matmul] {} is undefined", name);
  MT_CHECK(t.device().is_cuda(), "[matmul] {} is on {}, expected a CUDA tensor", name, t.device().str());
  MT_CHECK(t.dim() == 2, "[matmul] {} is {}, expected a 2-D matrix", name, t.desc());
  MT_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "[matmul] {} ({}) needs unit stride along its last dim", name,
           t.desc());
  MT_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), "[matmul] {} ({}) has overlapping rows", name, t.desc());
}

int64_t ld_of(const Tensor& t) {
  const int64_t cols = std::max<int64_t>(t.size(1), 1);
  return t.size(0) > 1 ? std::max(t.stride(0), cols) : cols;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: MT_FAIL("[matmul] dtype {} is not supported on CUDA", dtype_name(t));
  }
}

}  // namespace

void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, float alpha,
            float beta) {
  need_matrix(a, "a");
  need_matrix(b, "b");
  need_matrix(c, "c");
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = ta == Trans::kNo ? a.size(1) : a.size(0);
  const int64_t am = ta == Trans::kNo ? a.size(0) : a.size(1);
  const int64_t bk = tb == Trans::kNo ? b.size(0) : b.size(1);
  const int64_t bn = tb == Trans::kNo ? b.size(1) : b.size(0);
  MT_CHECK(am == M && bk == K && bn == N, "[matmul] op(a) is [{}, {}], op(b) is [{}, {}], c is [{}, {}]", am, K, bk,
           bn, M, N);
  MT_CHECK(a.dtype() == b.dtype(), "[matmul] a is {} but b is {}; both must have one dtype", dtype_name(a.dtype()),
           dtype_name(b.dtype()));
  MT_CHECK(a.dtype() != DType::kF32 || c.dtype() == DType::kF32, "[matmul] f32 inputs need an f32 output, c is {}",
           dtype_name(c.dtype()));
  if (M == 0 || N == 0) return;
  const int64_t ldc = ld_of(c);
  if (K == 0) {  // op(A) op(B) is empty: C = beta * C (beta == 0 clears NaNs too)
    MT_CUDA_DISPATCH(c.dtype(), T, "matmul",
      launch_pdl(scale_matrix_kernel<T>, grid_for(M * N), 256, 0, stream_of(ctx), static_cast<T*>(c.data_ptr()), M, N, ldc,
                                                                        beta));
    check_launch("matmul");
    return;
  }
  MT_CHECK(M < (int64_t{1} << 31) && N < (int64_t{1} << 31) && K < (int64_t{1} << 31),
           "[matmul] dims [{}, {}, {}] exceed cuBLAS's int range", M, N, K);
  auto h = static_cast<cublasHandle_t>(ctx.cublas_handle());
  MT_CHECK(h, "[matmul] the Context has no cuBLAS handle (is it a CUDA context?)");
  MT_CUBLAS_CHECK(cublasSetStream(h, stream_of(ctx)));
  const cublasOperation_t opa = ta == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t opb = tb == Trans::kNo ? CUBLAS_OP_N : CUBLAS_OP_T;
  MT_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha,
                               b.data_ptr(), cuda_type(b.dtype()), static_cast<int>(ld_of(b)), a.data_ptr(),
                               cuda_type(a.dtype()), static_cast<int>(ld_of(a)), &beta, c.data_ptr(),
                               cuda_type(c.dtype()), static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

}  // namespace moetrain::cuda
