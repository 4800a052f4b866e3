// CUDA cross-entropy over a large vocabulary, one block per row, fp32 math on bf16 or f32 logits:
// lse by an online (max, sum) pass, losses[t] = weights[t] * (lse - logits[t, label]);
// dlogits[t] = scale * weights[t] * (softmax(logits[t]) - onehot(label)). Rows labelled -100
// give zero loss and gradient (lse is still written); a label outside the vocabulary gives a
// NaN loss (the CPU path throws; the device does not stop to check).
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace moetrain::cuda {

namespace {

constexpr int32_t kIgnoreIndex = -100;
constexpr int kThreads = 512;

template <typename L>
__global__ void ce_fwd_kernel(const L* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ weights, int64_t V, float* __restrict__ losses,
                              float* __restrict__ lse) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  const L* x = logits + t * V;
  float m = -INFINITY, s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = to_f(x[v]);
    if (xv > m) {
      s = s * expf(m - xv) + 1.0f;
      m = xv;
    } else {
      s += expf(xv - m);
    }
  }
  const float M = block_max(m, scratch);
  s = m == -INFINITY ? 0.0f : s * expf(m - M);
  const float S = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const float l = M + logf(S);
    lse[t] = l;
    const int32_t lab = labels[t];
    if (lab == kIgnoreIndex) {
      losses[t] = 0.0f;
    } else if (lab < 0 || lab >= V) {
      losses[t] = NAN;
    } else {
      const float w = weights ? weights[t] : 1.0f;
      losses[t] = w * (l - to_f(x[lab]));
    }
  }
}

template <typename L, typename D>
__global__ void ce_bwd_kernel(const L* __restrict__ logits, const int32_t* __restrict__ labels,
                              const float* __restrict__ weights, const float* __restrict__ lse, float scale,
                              int64_t V, D* __restrict__ dlogits) {
  const int64_t t = blockIdx.x;
  const int32_t lab = labels[t];
  const float w = weights ? weights[t] : 1.0f;
  D* d = dlogits + t * V;
  if (lab == kIgnoreIndex || w == 0.0f) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) d[v] = from_f<D>(0.0f);
    return;
  }
  const L* x = logits + t * V;
  const float c = scale * w, l = lse[t];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float p = expf(to_f(x[v]) - l);
    d[v] = from_f<D>(c * (v == lab ? p - 1.0f : p));
  }
}

void check_ce(const Tensor& logits, const Tensor& labels, const Tensor& weights, const char* op) {
  need_cuda(logits, op, "logits");
  need_cuda(labels, op, "labels");
  need_dtype(labels, DType::kI32, op, "labels");
  MT_CHECK(logits.dim() == 2, "[{}] logits is {}, expected [T, V]", op, logits.desc());
  need_numel(labels, logits.size(0), op, "labels");
  if (weights.defined()) {
    need_cuda(weights, op, "weights");
    need_dtype(weights, DType::kF32, op, "weights");
    need_numel(weights, logits.size(0), op, "weights");
  }
}

}  // namespace

void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& weights,
                           Tensor& losses, Tensor& lse) {
  const char* op = "cross_entropy_forward";
  check_ce(logits, labels, weights, op);
  need_cuda(losses, op, "losses");
  need_cuda(lse, op, "lse");
  need_dtype(losses, DType::kF32, op, "losses");
  need_dtype(lse, DType::kF32, op, "lse");
  const int64_t T = logits.size(0), V = logits.size(1);
  need_numel(losses, T, op, "losses");
  need_numel(lse, T, op, "lse");
  if (!T) return;
  MT_CUDA_DISPATCH(logits.dtype(), L, op,
    ce_fwd_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream_of(ctx)>>>(
        static_cast<const L*>(logits.data_ptr()), labels.data<int32_t>(),
        weights.defined() ? weights.data<float>() : nullptr, V, losses.data<float>(), lse.data<float>()));
  check_launch(op);
}

void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& weights,
                            const Tensor& lse, float dloss_scale, Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  check_ce(logits, labels, weights, op);
  need_cuda(lse, op, "lse");
  need_cuda(dlogits, op, "dlogits");
  need_dtype(lse, DType::kF32, op, "lse");
  const int64_t T = logits.size(0), V = logits.size(1);
  need_numel(lse, T, op, "lse");
  need_numel(dlogits, T * V, op, "dlogits");
  if (!T || !V) return;
  MT_CUDA_DISPATCH(logits.dtype(), L, op,
    MT_CUDA_DISPATCH(dlogits.dtype(), D, op,
      ce_bwd_kernel<<<static_cast<unsigned>(T), kThreads, 0, stream_of(ctx)>>>(
          static_cast<const L*>(logits.data_ptr()), labels.data<int32_t>(),
          weights.defined() ? weights.data<float>() : nullptr, lse.data<float>(), dloss_scale, V,
          static_cast<D*>(dlogits.data_ptr()))));
  check_launch(op);
}

// Synchronizes twice: once to count the valid positions (the mean's divisor), once for the sum.
double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     Reduction reduction, Tensor* dlogits) {
  const char* op = "cross_entropy";
  check_ce(logits, labels, Tensor(), op);
  const int64_t T = logits.size(0);
  if (!T) return 0.0;
  std::vector<int32_t> lab(static_cast<size_t>(T));
  std::vector<uint8_t> mk;
  copy_to_host(ctx, lab.data(), labels.data_ptr(), static_cast<size_t>(T) * 4);
  if (mask.defined()) {
    need_cuda(mask, op, "mask");
    need_dtype(mask, DType::kU8, op, "mask");
    need_numel(mask, T, op, "mask");
    mk.resize(static_cast<size_t>(T));
    copy_to_host(ctx, mk.data(), mask.data_ptr(), static_cast<size_t>(T));
  }
  auto valid = [&](int64_t t) { return lab[t] != kIgnoreIndex && (mk.empty() || mk[t] != 0); };
  int64_t n = 0;
  for (int64_t t = 0; t < T; ++t) n += valid(t);
  const float unit = reduction == Reduction::kMean && n > 0 ? static_cast<float>(1.0 / n) : 1.0f;
  std::vector<float> w(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) w[t] = valid(t) ? unit : 0.0f;
  Tensor weights = Tensor::empty({T}, DType::kF32, ctx.device(), MemCategory::kWorkspace);
  Tensor losses = Tensor::empty({T}, DType::kF32, ctx.device(), MemCategory::kWorkspace);
  Tensor lse = Tensor::empty({T}, DType::kF32, ctx.device(), MemCategory::kWorkspace);
  copy_to_device(ctx, weights.data_ptr(), w.data(), static_cast<size_t>(T) * 4);
  cross_entropy_forward(ctx, logits, labels, weights, losses, lse);
  if (dlogits && dlogits->defined()) cross_entropy_backward(ctx, logits, labels, weights, lse, 1.0f, *dlogits);
  return reduce_to_host(ctx, losses.data<float>(), T, false);
}

}  // namespace moetrain::cuda
