// ops.cpp: backend-neutral checks (shapes, dtypes, one device per op, contiguity) and dispatch.
// Each op ends in one MT_DISPATCH line: CPU tensors go to cpu::, CUDA tensors to cuda:: (a build
// without the CUDA backend fails with a clear message). Value checks that need the data (index
// ranges, cu_seqlens, offsets) live in the backends, which can read their own memory.
#include "kernels/ops.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/profiler.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef MT_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace moetrain::ops {

namespace {

[[noreturn]] void no_cuda_backend(const char* op) {
  MT_FAIL("[{}] the tensors are on a CUDA device but this build has no CUDA backend "
          "(configure with MT_CUDA=ON where nvcc is available)", op);
}
template <typename R>
R no_cuda(const char* op) {
  no_cuda_backend(op);
}

// Every dispatch is one profiler scope named after the op (core/profiler.h; free when it is off).
#ifdef MT_WITH_CUDA
#define MT_DISPATCH_CALL(dev, op, ...) \
  return (dev).is_cuda() ? cuda::op(__VA_ARGS__) : cpu::op(__VA_ARGS__)
#else
#define MT_DISPATCH_CALL(dev, op, ...) \
  return (dev).is_cuda() ? no_cuda<decltype(cpu::op(__VA_ARGS__))>(#op) : cpu::op(__VA_ARGS__)
#endif
#define MT_DISPATCH(dev, op, ...)               \
  const ProfileScope mt_profile_scope_(ctx, #op); \
  MT_DISPATCH_CALL(dev, op, __VA_ARGS__)

struct Arg {
  const Tensor& t;
  const char* name;
};
// kTokenRows: [T, heads, d] whose tokens (dim 0) have a stride of their own (a column block of a
// wider [T, n] matrix, such as q inside the fused q|k|v projection) and are contiguous inside.
enum class Layout : uint8_t { kContiguous, kRowStrided, kTokenRows };

// The device shared by the op's defined tensors; checks contiguity (or a unit-stride last dim
// for kRowStrided) and, for CUDA tensors, that the context drives that device.
Device device_of(const Context& ctx, const char* op, std::initializer_list<Arg> args,
                 Layout layout = Layout::kContiguous) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (!a.t.defined()) continue;
    if (!first) {
      first = &a;
    } else {
      MT_CHECK(a.t.device() == first->t.device(), "[{}] {} is on {} but {} is on {}; all tensors of one op "
               "must be on one device", op, a.name, a.t.device().str(), first->name, first->t.device().str());
    }
    if (layout == Layout::kContiguous) {
      MT_CHECK(a.t.is_contiguous(), "[{}] {} ({}) must be contiguous", op, a.name, a.t.desc());
    } else if (layout == Layout::kTokenRows) {
      const Tensor& t = a.t;
      MT_CHECK(t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2) &&
                   (t.size(0) <= 1 || t.stride(0) >= t.size(1) * t.size(2)),
               "[{}] {} ({}) must be [T, heads, d] with contiguous tokens (a token stride of its own is allowed)",
               op, a.name, t.desc());
    } else {
      MT_CHECK(a.t.dim() == 2 && (a.t.stride(1) == 1 || a.t.size(1) <= 1) &&
                   (a.t.size(0) <= 1 || a.t.stride(0) >= a.t.size(1)),
               "[{}] {} ({}) must be a 2-D matrix with unit-stride rows", op, a.name, a.t.desc());
    }
  }
  MT_CHECK(first, "[{}] called with no defined tensors", op);
  const Device dev = first->t.device();
  MT_CHECK(!dev.is_cuda() || ctx.device() == dev, "[{}] tensors are on {} but the context drives {}", op,
           dev.str(), ctx.device().str());
  return dev;
}

void check_float(const Tensor& t, const char* op, const char* name) {
  MT_CHECK(dtype_is_float(t.dtype()), "[{}] {} has dtype {}, expected a float type", op, name,
           dtype_name(t.dtype()));
}
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  MT_CHECK(a.dtype() == b.dtype(), "[{}] {} is {} but {} is {}; expected the same dtype", op, na,
           dtype_name(a.dtype()), nb, dtype_name(b.dtype()));
}
// Shape and dtype in one call.
void expect(const Tensor& t, const Shape& shape, DType dt, const char* op, const char* name) {
  check_shape(t, shape, op, name);
  check_dtype(t, dt, op, name);
}
void expect_float(const Tensor& t, const Shape& shape, const char* op, const char* name) {
  check_shape(t, shape, op, name);
  check_float(t, op, name);
}

}  // namespace

// ---- utilities -----------------------------------------------------------------------------
void cast(Context& ctx, const Tensor& src, Tensor& dst) {
  const Device dev = device_of(ctx, "cast", {{src, "src"}, {dst, "dst"}});
  MT_CHECK(src.numel() == dst.numel(), "[cast] src {} and dst {} differ in element count", src.desc(), dst.desc());
  check_float(src, "cast", "src");
  check_float(dst, "cast", "dst");
  MT_DISPATCH(dev, cast, ctx, src, dst);
}

void add_(Context& ctx, Tensor& y, const Tensor& x, float alpha) {
  const Device dev = device_of(ctx, "add_", {{y, "y"}, {x, "x"}});
  MT_CHECK(y.numel() == x.numel(), "[add_] y {} and x {} differ in element count", y.desc(), x.desc());
  check_float(y, "add_", "y");
  check_float(x, "add_", "x");
  MT_DISPATCH(dev, add_, ctx, y, x, alpha);
}

void scale_(Context& ctx, Tensor& y, float alpha) {
  const Device dev = device_of(ctx, "scale_", {{y, "y"}});
  check_float(y, "scale_", "y");
  MT_DISPATCH(dev, scale_, ctx, y, alpha);
}

double sum_squares(Context& ctx, const Tensor& x) {
  const Device dev = device_of(ctx, "sum_squares", {{x, "x"}});
  check_float(x, "sum_squares", "x");
  MT_DISPATCH(dev, sum_squares, ctx, x);
}

void sum_squares_accumulate(Context& ctx, const Tensor& x, Tensor& acc) {
  const char* op = "sum_squares_accumulate";
  const Device dev = device_of(ctx, op, {{x, "x"}, {acc, "acc"}});
  MT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "[{}] x is {}, expected f32 or bf16", op,
           dtype_name(x.dtype()));
  expect(acc, {1}, DType::kF64, op, "acc");
  MT_DISPATCH(dev, sum_squares_accumulate, ctx, x, acc);
}

void sum_squares_accumulate_many(Context& ctx, const std::vector<Tensor>& xs, Tensor& acc) {
  const char* op = "sum_squares_accumulate_many";
  const Device dev = device_of(ctx, op, {{acc, "acc"}});
  expect(acc, {1}, DType::kF64, op, "acc");
  for (const Tensor& x : xs) {
    MT_CHECK(x.device() == dev, "[{}] a tensor {} is on {}, acc on {}", op, x.desc(), x.device().str(), dev.str());
    MT_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16, "[{}] x is {}, expected f32 or bf16", op,
             dtype_name(x.dtype()));
  }
  MT_DISPATCH(dev, sum_squares_accumulate_many, ctx, xs, acc);
}

void sum_accumulate(Context& ctx, const Tensor& x, Tensor& acc) {
  const char* op = "sum_accumulate";
  const Device dev = device_of(ctx, op, {{x, "x"}, {acc, "acc"}});
  expect(x, {x.numel()}, DType::kF64, op, "x");
  expect(acc, {1}, DType::kF64, op, "acc");
  MT_DISPATCH(dev, sum_accumulate, ctx, x, acc);
}

void fill_normal(Context& ctx, Tensor& t, float mean, float std, RngStream stream) {
  const Device dev = device_of(ctx, "fill_normal", {{t, "t"}});
  check_float(t, "fill_normal", "t");
  MT_CHECK(std >= 0.0f, "[fill_normal] std = {} must be >= 0", std);
  MT_DISPATCH(dev, fill_normal, ctx, t, mean, std, stream);
}

// ---- embedding -----------------------------------------------------------------------------
void embedding_forward(Context& ctx, const Tensor& table, const Tensor& ids, Tensor& out) {
  const char* op = "embedding_forward";
  const Device dev = device_of(ctx, op, {{table, "table"}, {ids, "ids"}, {out, "out"}});
  expect_float(table, {-1, -1}, op, "table");
  expect(ids, {-1}, DType::kI32, op, "ids");
  check_shape(out, {ids.size(0), table.size(1)}, op, "out");
  check_same_dtype(out, table, op, "out", "table");
  MT_DISPATCH(dev, embedding_forward, ctx, table, ids, out);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const char* op = "embedding_backward";
  const Device dev = device_of(ctx, op, {{ids, "ids"}, {dout, "dout"}, {dtable, "dtable"}});
  expect(ids, {-1}, DType::kI32, op, "ids");
  expect(dtable, {-1, -1}, DType::kF32, op, "dtable");
  expect_float(dout, {ids.size(0), dtable.size(1)}, op, "dout");
  MT_DISPATCH(dev, embedding_backward, ctx, ids, dout, dtable);
}

// ---- RMSNorm -------------------------------------------------------------------------------
void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd,
                     Tensor* x_copy) {
  const char* op = "rmsnorm_forward";
  const Tensor none;
  const Device dev = device_of(ctx, op, {{x, "x"}, {w, "w"}, {y, "y"}, {rstd, "rstd"},
                                         {x_copy ? *x_copy : none, "x_copy"}});
  expect_float(x, {-1, -1}, op, "x");
  const int64_t R = x.size(0), D = x.size(1);
  expect_float(w, {D}, op, "w");
  check_shape(y, {R, D}, op, "y");
  check_same_dtype(y, x, op, "y", "x");
  expect(rstd, {R}, DType::kF32, op, "rstd");
  MT_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps = {} must be >= 0", eps);
  if (x_copy) {
    check_shape(*x_copy, {R, D}, op, "x_copy");
    check_same_dtype(*x_copy, x, op, "x_copy", "x");
    MT_CHECK(x_copy->data_ptr() != x.data_ptr() && x_copy->data_ptr() != y.data_ptr(),
             "[{}] x_copy {} must be memory of its own, not x's or y's", op, x_copy->desc());
  }
  MT_DISPATCH(dev, rmsnorm_forward, ctx, x, w, eps, y, rstd, x_copy);
}

void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dy, Tensor& dx, Tensor& dw, bool dx_accumulate) {
  const char* op = "rmsnorm_backward";
  const Device dev = device_of(ctx, op, {{x, "x"}, {w, "w"}, {rstd, "rstd"}, {dy, "dy"}, {dx, "dx"}, {dw, "dw"}});
  expect_float(x, {-1, -1}, op, "x");
  const int64_t R = x.size(0), D = x.size(1);
  expect_float(w, {D}, op, "w");
  expect(rstd, {R}, DType::kF32, op, "rstd");
  expect_float(dy, {R, D}, op, "dy");
  expect_float(dx, {R, D}, op, "dx");
  expect(dw, {D}, DType::kF32, op, "dw");
  MT_DISPATCH(dev, rmsnorm_backward, ctx, x, w, rstd, dy, dx, dw, dx_accumulate);
}

void copy_rows(Context& ctx, const Tensor& src, Tensor& dst) {
  const char* op = "copy_rows";
  const Device dev = device_of(ctx, op, {{src, "src"}, {dst, "dst"}}, Layout::kRowStrided);
  check_shape(dst, src.shape(), op, "dst");
  check_same_dtype(dst, src, op, "dst", "src");
  if (src.numel() == 0) return;
  MT_DISPATCH(dev, copy_rows, ctx, src, dst);
}

// ---- GEMM ----------------------------------------------------------------------------------
void matmul(Context& ctx, const Tensor& a, Trans ta, const Tensor& b, Trans tb, Tensor& c, float alpha,
            float beta) {
  const char* op = "matmul";
  const Device dev = device_of(ctx, op, {{a, "a"}, {b, "b"}, {c, "c"}}, Layout::kRowStrided);
  check_float(a, op, "a");
  check_float(b, op, "b");
  check_float(c, op, "c");
  check_same_dtype(a, b, op, "a", "b");
  const int64_t M = ta == Trans::kNo ? a.size(0) : a.size(1), K = ta == Trans::kNo ? a.size(1) : a.size(0);
  const int64_t Kb = tb == Trans::kNo ? b.size(0) : b.size(1), N = tb == Trans::kNo ? b.size(1) : b.size(0);
  MT_CHECK(K == Kb, "[matmul] inner dimensions differ: op(a) is [{}, {}], op(b) is [{}, {}]", M, K, Kb, N);
  check_shape(c, {M, N}, op, "c");
  MT_DISPATCH(dev, matmul, ctx, a, ta, b, tb, c, alpha, beta);
}

// ---- RoPE ----------------------------------------------------------------------------------
void rope_forward(Context& ctx, const Tensor& x, const Tensor& pos, float theta, Tensor& y) {
  const char* op = "rope_forward";
  const Device dev = device_of(ctx, op, {{x, "x"}, {pos, "pos"}, {y, "y"}});
  expect_float(x, {-1, -1, -1}, op, "x");
  MT_CHECK(x.size(2) % 2 == 0, "[rope_forward] head dim {} must be even", x.size(2));
  expect(pos, {x.size(0)}, DType::kI32, op, "pos");
  check_shape(y, x.shape(), op, "y");
  check_same_dtype(y, x, op, "y", "x");
  MT_CHECK(theta > 0.0f, "[rope_forward] theta = {} must be > 0", theta);
  MT_DISPATCH(dev, rope_forward, ctx, x, pos, theta, y);
}

void rope_backward(Context& ctx, const Tensor& dy, const Tensor& pos, float theta, Tensor& dx) {
  const char* op = "rope_backward";
  const Device dev = device_of(ctx, op, {{dy, "dy"}, {pos, "pos"}, {dx, "dx"}});
  expect_float(dy, {-1, -1, -1}, op, "dy");
  MT_CHECK(dy.size(2) % 2 == 0, "[rope_backward] head dim {} must be even", dy.size(2));
  expect(pos, {dy.size(0)}, DType::kI32, op, "pos");
  check_shape(dx, dy.shape(), op, "dx");
  check_same_dtype(dx, dy, op, "dx", "dy");
  MT_CHECK(theta > 0.0f, "[rope_backward] theta = {} must be > 0", theta);
  MT_DISPATCH(dev, rope_backward, ctx, dy, pos, theta, dx);
}

// ---- RMSNorm + RoPE (q/k path) ---------------------------------------------------------------
namespace {
Device check_norm_rope_forward(Context& ctx, const char* op, const Tensor& x, const Tensor& w, float eps,
                               const Tensor& pos, float theta, const Tensor& y, const Tensor& rstd) {
  expect_float(x, {-1, -1, -1}, op, "x");
  device_of(ctx, op, {{x, "x"}}, Layout::kTokenRows);
  const Device dev = device_of(ctx, op, {{w, "w"}, {pos, "pos"}, {y, "y"}, {rstd, "rstd"}});
  MT_CHECK(x.device() == dev, "[{}] x is on {} but y is on {}; all tensors of one op must be on one device", op,
           x.device().str(), dev.str());
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2);
  MT_CHECK(d % 2 == 0, "[{}] head dim {} must be even", op, d);
  expect_float(w, {d}, op, "w");
  expect(pos, {T}, DType::kI32, op, "pos");
  check_shape(y, x.shape(), op, "y");
  check_same_dtype(y, x, op, "y", "x");
  expect(rstd, {T * heads}, DType::kF32, op, "rstd");
  MT_CHECK(eps >= 0.0f, "[{}] eps = {} must be >= 0", op, eps);
  MT_CHECK(theta > 0.0f, "[{}] theta = {} must be > 0", op, theta);
  return dev;
}

Device check_norm_rope_backward(Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                const Tensor& pos, float theta, const Tensor& dy, const Tensor& dx,
                                const Tensor& dw) {
  expect_float(x, {-1, -1, -1}, op, "x");
  expect_float(dx, x.shape(), op, "dx");
  expect_float(dy, x.shape(), op, "dy");
  device_of(ctx, op, {{x, "x"}, {dy, "dy"}, {dx, "dx"}}, Layout::kTokenRows);
  const Device dev = device_of(ctx, op, {{w, "w"}, {rstd, "rstd"}, {pos, "pos"}, {dw, "dw"}});
  MT_CHECK(x.device() == dev && dy.device() == dev && dx.device() == dev,
           "[{}] x ({}), dy ({}) and dx ({}) must be on w's device {}", op, x.device().str(), dy.device().str(),
           dx.device().str(), dev.str());
  MT_CHECK(dx.data_ptr() != dy.data_ptr() || dx.strides() == dy.strides(),
           "[{}] dx aliases dy with other strides ({} against {})", op, dx.desc(), dy.desc());
  const int64_t T = x.size(0), heads = x.size(1), d = x.size(2);
  MT_CHECK(d % 2 == 0, "[{}] head dim {} must be even", op, d);
  expect_float(w, {d}, op, "w");
  expect(rstd, {T * heads}, DType::kF32, op, "rstd");
  expect(pos, {T}, DType::kI32, op, "pos");
  check_shape(dy, x.shape(), op, "dy");
  check_shape(dx, x.shape(), op, "dx");
  check_same_dtype(dx, x, op, "dx", "x");
  check_same_dtype(dy, x, op, "dy", "x");
  expect(dw, {d}, DType::kF32, op, "dw");
  MT_CHECK(theta > 0.0f, "[{}] theta = {} must be > 0", op, theta);
  return dev;
}
}  // namespace

void norm_rope_forward(Context& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& pos, float theta,
                       Tensor& y, Tensor& rstd) {
  const Device dev = check_norm_rope_forward(ctx, "norm_rope_forward", x, w, eps, pos, theta, y, rstd);
  MT_DISPATCH(dev, norm_rope_forward, ctx, x, w, eps, pos, theta, y, rstd);
}

void norm_rope_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& pos,
                        float theta, const Tensor& dy, Tensor& dx, Tensor& dw) {
  const Device dev = check_norm_rope_backward(ctx, "norm_rope_backward", x, w, rstd, pos, theta, dy, dx, dw);
  MT_DISPATCH(dev, norm_rope_backward, ctx, x, w, rstd, pos, theta, dy, dx, dw);
}

void norm_rope_forward_qk(Context& ctx, NormRopeFwdIO& q, NormRopeFwdIO& k, float eps, const Tensor& pos,
                          float theta) {
  const Device dev = check_norm_rope_forward(ctx, "norm_rope_forward_qk (q)", q.x, q.w, eps, pos, theta, q.y, q.rstd);
  const Device dk = check_norm_rope_forward(ctx, "norm_rope_forward_qk (k)", k.x, k.w, eps, pos, theta, k.y, k.rstd);
  MT_CHECK(dk == dev, "[norm_rope_forward_qk] q is on {} but k is on {}", dev.str(), dk.str());
  MT_DISPATCH(dev, norm_rope_forward_qk, ctx, q, k, eps, pos, theta);
}

void norm_rope_backward_qk(Context& ctx, NormRopeBwdIO& q, NormRopeBwdIO& k, const Tensor& pos, float theta) {
  const Device dev =
      check_norm_rope_backward(ctx, "norm_rope_backward_qk (q)", q.x, q.w, q.rstd, pos, theta, q.dy, q.dx, q.dw);
  const Device dk =
      check_norm_rope_backward(ctx, "norm_rope_backward_qk (k)", k.x, k.w, k.rstd, pos, theta, k.dy, k.dx, k.dw);
  MT_CHECK(dk == dev, "[norm_rope_backward_qk] q is on {} but k is on {}", dev.str(), dk.str());
  MT_DISPATCH(dev, norm_rope_backward_qk, ctx, q, k, pos, theta);
}

// ---- attention -----------------------------------------------------------------------------
namespace {
void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& cu_seqlens, int max_seqlen) {
  expect_float(q, {-1, -1, -1}, op, "q");
  const int64_t T = q.size(0), nh = q.size(1), d = q.size(2);
  expect_float(k, {T, -1, d}, op, "k");
  const int64_t nkv = k.size(1);
  MT_CHECK(nkv > 0 && nh % nkv == 0, "[{}] {} query heads are not a multiple of {} kv heads", op, nh, nkv);
  check_shape(v, k.shape(), op, "v");
  check_same_dtype(k, q, op, "k", "q");
  check_same_dtype(v, q, op, "v", "q");
  expect(cu_seqlens, {-1}, DType::kI32, op, "cu_seqlens");
  MT_CHECK(cu_seqlens.size(0) >= 2, "[{}] cu_seqlens has {} entries, expected at least 2 (0 and T)", op,
           cu_seqlens.size(0));
  MT_CHECK(max_seqlen >= 0, "[{}] max_seqlen = {} must be >= 0", op, max_seqlen);
}
}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& cu_seqlens, int max_seqlen, float scale, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  const Device dev = device_of(ctx, op, {{q, "q"}, {k, "k"}, {cu_seqlens, "cu_seqlens"}, {out, "out"}, {lse, "lse"}});
  device_of(ctx, op, {{v, "v"}}, Layout::kTokenRows);
  MT_CHECK(v.device() == dev, "[{}] v is on {} but q is on {}", op, v.device().str(), dev.str());
  check_attention(op, q, k, v, cu_seqlens, max_seqlen);
  check_shape(out, q.shape(), op, "out");
  check_same_dtype(out, q, op, "out", "q");
  expect(lse, {q.size(1), q.size(0)}, DType::kF32, op, "lse");
  // The CPU kernels read packed tensors; the CUDA ones take v's token stride themselves.
  const Tensor vp = dev.is_cpu() && !v.is_contiguous() ? v.clone(MemCategory::kWorkspace) : v;
  MT_DISPATCH(dev, attention_forward, ctx, q, k, vp, cu_seqlens, max_seqlen, scale, out, lse);
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, const Tensor& cu_seqlens, int max_seqlen,
                        float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  const Device dev = device_of(ctx, op, {{q, "q"}, {k, "k"}, {out, "out"}, {lse, "lse"}, {dout, "dout"},
                                         {cu_seqlens, "cu_seqlens"}});
  device_of(ctx, op, {{v, "v"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}}, Layout::kTokenRows);
  MT_CHECK(v.device() == dev && dq.device() == dev && dk.device() == dev && dv.device() == dev,
           "[{}] v, dq, dk and dv must be on q's device {}", op, dev.str());
  check_attention(op, q, k, v, cu_seqlens, max_seqlen);
  expect_float(out, q.shape(), op, "out");
  expect(lse, {q.size(1), q.size(0)}, DType::kF32, op, "lse");
  expect_float(dout, q.shape(), op, "dout");
  expect_float(dq, q.shape(), op, "dq");
  expect_float(dk, k.shape(), op, "dk");
  expect_float(dv, k.shape(), op, "dv");
  if (dev.is_cuda()) {  // the CUDA kernels take the token strides of v, dq, dk, dv themselves
    MT_DISPATCH(dev, attention_backward, ctx, q, k, v, out, lse, dout, cu_seqlens, max_seqlen, scale, dq, dk, dv);
    return;
  }
  // The CPU kernels read and write packed tensors.
  auto packed_out = [](Tensor& t) {
    return t.is_contiguous() ? t : Tensor::empty(t.shape(), t.dtype(), t.device(), MemCategory::kWorkspace);
  };
  const Tensor vp = v.is_contiguous() ? v : v.clone(MemCategory::kWorkspace);
  Tensor dqp = packed_out(dq), dkp = packed_out(dk), dvp = packed_out(dv);
  {
    const ProfileScope scope(ctx, "attention_backward");
    cpu::attention_backward(ctx, q, k, vp, out, lse, dout, cu_seqlens, max_seqlen, scale, dqp, dkp, dvp);
  }
  for (auto [buf, dst] : {std::pair<Tensor*, Tensor*>{&dqp, &dq}, {&dkp, &dk}, {&dvp, &dv}}) {
    if (buf->data_ptr() == dst->data_ptr()) continue;
    Tensor to = dst->view({dst->size(0), dst->size(1) * dst->size(2)});
    copy_rows(ctx, buf->view({to.size(0), to.size(1)}), to);
  }
}

// ---- SwiGLU --------------------------------------------------------------------------------
void swiglu_forward(Context& ctx, const Tensor& gu, Tensor& h, const Tensor& row_w) {
  const char* op = "swiglu_forward";
  const Device dev = device_of(ctx, op, {{gu, "gu"}, {h, "h"}, {row_w, "row_w"}});
  expect_float(gu, {-1, -1}, op, "gu");
  MT_CHECK(gu.size(1) % 2 == 0, "[swiglu_forward] gu width {} must be even (gate|up)", gu.size(1));
  check_shape(h, {gu.size(0), gu.size(1) / 2}, op, "h");
  check_same_dtype(h, gu, op, "h", "gu");
  if (row_w.defined()) expect(row_w, {gu.size(0)}, DType::kF32, op, "row_w");
  MT_DISPATCH(dev, swiglu_forward, ctx, gu, h, row_w);
}

void swiglu_backward(Context& ctx, const Tensor& gu, const Tensor& dh, Tensor& dgu) {
  const char* op = "swiglu_backward";
  const Device dev = device_of(ctx, op, {{gu, "gu"}, {dh, "dh"}, {dgu, "dgu"}});
  expect_float(gu, {-1, -1}, op, "gu");
  MT_CHECK(gu.size(1) % 2 == 0, "[swiglu_backward] gu width {} must be even (gate|up)", gu.size(1));
  expect_float(dh, {gu.size(0), gu.size(1) / 2}, op, "dh");
  expect_float(dgu, gu.shape(), op, "dgu");
  MT_DISPATCH(dev, swiglu_backward, ctx, gu, dh, dgu);
}

void swiglu_backward_weighted(Context& ctx, const Tensor& gu, const Tensor& dh, const Tensor& row_w, Tensor& dgu,
                              Tensor& drow_w) {
  const char* op = "swiglu_backward_weighted";
  const Device dev = device_of(ctx, op, {{gu, "gu"}, {dh, "dh"}, {row_w, "row_w"}, {dgu, "dgu"}, {drow_w, "drow_w"}});
  expect_float(gu, {-1, -1}, op, "gu");
  MT_CHECK(gu.size(1) % 2 == 0, "[swiglu_backward_weighted] gu width {} must be even (gate|up)", gu.size(1));
  expect_float(dh, {gu.size(0), gu.size(1) / 2}, op, "dh");
  check_same_dtype(dh, gu, op, "dh", "gu");
  expect(row_w, {gu.size(0)}, DType::kF32, op, "row_w");
  expect_float(dgu, gu.shape(), op, "dgu");
  check_same_dtype(dgu, gu, op, "dgu", "gu");
  expect(drow_w, {gu.size(0)}, DType::kF32, op, "drow_w");
  MT_DISPATCH(dev, swiglu_backward_weighted, ctx, gu, dh, row_w, dgu, drow_w);
}

// ---- MoE router ----------------------------------------------------------------------------
void router_topk(Context& ctx, const Tensor& logits, int k, bool normalize, Tensor& probs,
                 Tensor& topk_idx, Tensor& topk_w) {
  const char* op = "router_topk";
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {probs, "probs"}, {topk_idx, "topk_idx"},
                                         {topk_w, "topk_w"}});
  expect(logits, {-1, -1}, DType::kF32, op, "logits");
  const int64_t T = logits.size(0), E = logits.size(1);
  MT_CHECK(k >= 1 && k <= E, "[router_topk] k = {} must be in [1, {}] (the number of experts)", k, E);
  expect(probs, {T, E}, DType::kF32, op, "probs");
  expect(topk_idx, {T, k}, DType::kI32, op, "topk_idx");
  expect(topk_w, {T, k}, DType::kF32, op, "topk_w");
  MT_DISPATCH(dev, router_topk, ctx, logits, k, normalize, probs, topk_idx, topk_w);
}

void router_topk_backward(Context& ctx, const Tensor& probs, const Tensor& topk_idx, const Tensor& topk_w,
                          const Tensor& dtopk_w, const Tensor& dprobs_extra, bool normalize, Tensor& dlogits,
                          const Tensor& aux_counts, int64_t aux_rows, float aux_coef) {
  const char* op = "router_topk_backward";
  const Device dev = device_of(ctx, op, {{probs, "probs"}, {topk_idx, "topk_idx"}, {topk_w, "topk_w"},
                                         {dtopk_w, "dtopk_w"}, {dprobs_extra, "dprobs_extra"},
                                         {dlogits, "dlogits"}, {aux_counts, "aux_counts"}});
  expect(probs, {-1, -1}, DType::kF32, op, "probs");
  const int64_t T = probs.size(0), E = probs.size(1);
  expect(topk_idx, {T, -1}, DType::kI32, op, "topk_idx");
  const int64_t k = topk_idx.size(1);
  expect(topk_w, {T, k}, DType::kF32, op, "topk_w");
  expect(dtopk_w, {T, k}, DType::kF32, op, "dtopk_w");
  if (dprobs_extra.defined()) expect(dprobs_extra, {T, E}, DType::kF32, op, "dprobs_extra");
  expect(dlogits, {T, E}, DType::kF32, op, "dlogits");
  if (aux_counts.defined()) {
    expect(aux_counts, {E}, DType::kF32, op, "aux_counts");
    MT_CHECK(aux_rows > 0, "[{}] aux_rows = {} must be > 0 with aux_counts", op, aux_rows);
  }
  MT_DISPATCH(dev, router_topk_backward, ctx, probs, topk_idx, topk_w, dtopk_w, dprobs_extra, normalize, dlogits,
              aux_counts, aux_rows, aux_coef);
}

void router_stats(Context& ctx, const Tensor& probs, const Tensor& topk_idx, Tensor& counts, Tensor& prob_sum,
                  const Tensor& logits, Tensor* health) {
  const char* op = "router_stats";
  MT_CHECK(logits.defined() == (health != nullptr),
           "[router_stats] the health sums need both the logits and an output (got {} and {})",
           logits.defined() ? logits.desc() : "no logits", health ? "an output" : "none");
  const Tensor none;
  const Device dev = device_of(ctx, op, {{probs, "probs"}, {topk_idx, "topk_idx"}, {counts, "counts"},
                                         {prob_sum, "prob_sum"}, {logits, "logits"}, {health ? *health : none, "health"}});
  expect(probs, {-1, -1}, DType::kF32, op, "probs");
  const int64_t T = probs.size(0), E = probs.size(1);
  expect(topk_idx, {T, -1}, DType::kI32, op, "topk_idx");
  expect(counts, {E}, DType::kF32, op, "counts");
  expect(prob_sum, {E}, DType::kF32, op, "prob_sum");
  if (health) {
    expect(logits, {T, E}, DType::kF32, op, "logits");
    expect(*health, {2}, DType::kF32, op, "health");
  }
  MT_DISPATCH(dev, router_stats, ctx, probs, topk_idx, counts, prob_sum, logits, health);
}

double aux_loss_value(const Tensor& counts, const Tensor& prob_sum, int64_t rows) {
  const char* op = "aux_loss_value";
  MT_CHECK(counts.device() == prob_sum.device(), "[aux_loss_value] counts on {} but prob_sum on {}",
           counts.device().str(), prob_sum.device().str());
  expect(counts, {-1}, DType::kF32, op, "counts");
  expect(prob_sum, {counts.size(0)}, DType::kF32, op, "prob_sum");
  MT_CHECK(rows >= 0, "[aux_loss_value] rows = {} must be >= 0", rows);
  MT_DISPATCH_CALL(counts.device(), aux_loss_value, counts, prob_sum, rows);
}

void aux_loss_backward(Context& ctx, const Tensor& counts, int64_t rows, float coef, Tensor& dprobs) {
  const char* op = "aux_loss_backward";
  const Device dev = device_of(ctx, op, {{counts, "counts"}, {dprobs, "dprobs"}});
  expect(counts, {-1}, DType::kF32, op, "counts");
  expect(dprobs, {-1, counts.size(0)}, DType::kF32, op, "dprobs");
  MT_CHECK(rows > 0, "[aux_loss_backward] rows = {} must be > 0", rows);
  MT_DISPATCH(dev, aux_loss_backward, ctx, counts, rows, coef, dprobs);
}

double router_zloss_forward(Context& ctx, const Tensor& logits, Tensor& lse) {
  const char* op = "router_zloss_forward";
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {lse, "lse"}});
  expect(logits, {-1, -1}, DType::kF32, op, "logits");
  expect(lse, {logits.size(0)}, DType::kF32, op, "lse");
  MT_DISPATCH(dev, router_zloss_forward, ctx, logits, lse);
}

void router_zloss_backward(Context& ctx, const Tensor& logits, const Tensor& lse, float scale, Tensor& dlogits) {
  const char* op = "router_zloss_backward";
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {lse, "lse"}, {dlogits, "dlogits"}});
  expect(logits, {-1, -1}, DType::kF32, op, "logits");
  expect(lse, {logits.size(0)}, DType::kF32, op, "lse");
  expect(dlogits, logits.shape(), DType::kF32, op, "dlogits");
  MT_DISPATCH(dev, router_zloss_backward, ctx, logits, lse, scale, dlogits);
}

// ---- token permutation ---------------------------------------------------------------------
void moe_route_index(Context& ctx, const Tensor& topk_idx, int num_experts, Tensor& counts, Tensor& offsets,
                     Tensor& row_of, Tensor& token_of) {
  const char* op = "moe_route_index";
  const Device dev = device_of(ctx, op, {{topk_idx, "topk_idx"}, {counts, "counts"}, {offsets, "offsets"},
                                         {row_of, "row_of"}, {token_of, "token_of"}});
  expect(topk_idx, {-1, -1}, DType::kI32, op, "topk_idx");
  MT_CHECK(num_experts > 0, "[moe_route_index] num_experts = {} must be > 0", num_experts);
  const int64_t picks = topk_idx.numel();
  expect(counts, {num_experts}, DType::kI32, op, "counts");
  expect(offsets, {num_experts + 1}, DType::kI32, op, "offsets");
  expect(row_of, {picks}, DType::kI32, op, "row_of");
  expect(token_of, {picks}, DType::kI32, op, "token_of");
  MT_DISPATCH(dev, moe_route_index, ctx, topk_idx, num_experts, counts, offsets, row_of, token_of);
}

void moe_permute(Context& ctx, const Tensor& x, const Tensor& token_of, Tensor& xp) {
  const char* op = "moe_permute";
  const Device dev = device_of(ctx, op, {{x, "x"}, {token_of, "token_of"}, {xp, "xp"}});
  expect_float(x, {-1, -1}, op, "x");
  expect(token_of, {-1}, DType::kI32, op, "token_of");
  check_shape(xp, {token_of.size(0), x.size(1)}, op, "xp");
  check_same_dtype(xp, x, op, "xp", "x");
  MT_DISPATCH(dev, moe_permute, ctx, x, token_of, xp);
}

void moe_permute_backward(Context& ctx, const Tensor& dxp, const Tensor& row_of, Tensor& dx) {
  const char* op = "moe_permute_backward";
  const Device dev = device_of(ctx, op, {{dxp, "dxp"}, {row_of, "row_of"}, {dx, "dx"}});
  expect_float(dxp, {-1, -1}, op, "dxp");
  expect(row_of, {dxp.size(0)}, DType::kI32, op, "row_of");
  expect_float(dx, {-1, dxp.size(1)}, op, "dx");
  const int64_t T = dx.size(0), N = dxp.size(0);
  MT_CHECK(T > 0 ? N % T == 0 : N == 0, "[moe_permute_backward] {} permuted rows are not k per token for "
           "{} tokens", N, T);
  MT_DISPATCH(dev, moe_permute_backward, ctx, dxp, row_of, dx);
}

void moe_unpermute(Context& ctx, const Tensor& yp, const Tensor& row_of, const Tensor& topk_w, Tensor& y,
                   const Tensor& residual) {
  const char* op = "moe_unpermute";
  const Device dev = device_of(ctx, op, {{yp, "yp"}, {row_of, "row_of"}, {topk_w, "topk_w"}, {y, "y"}});
  expect_float(y, {-1, -1}, op, "y");
  const int64_t T = y.size(0);
  if (topk_w.defined()) expect(topk_w, {T, -1}, DType::kF32, op, "topk_w");
  expect_float(yp, {-1, y.size(1)}, op, "yp");
  const int64_t k = topk_w.defined() ? topk_w.size(1) : (T > 0 ? yp.size(0) / T : 0);
  check_shape(yp, {T * k, y.size(1)}, op, "yp");  // without weights: k whole rows per token
  expect(row_of, {T * k}, DType::kI32, op, "row_of");
  check_same_dtype(y, yp, op, "y", "yp");
  if (residual.defined()) {
    MT_CHECK(residual.device() == y.device(), "[moe_unpermute] residual is on {}, y on {}", residual.device().str(),
             y.device().str());
    check_shape(residual, y.shape(), op, "residual");
    check_same_dtype(residual, y, op, "residual", "y");
  }
  MT_DISPATCH(dev, moe_unpermute, ctx, yp, row_of, topk_w, y, residual);
}

void moe_unpermute_backward(Context& ctx, const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                            const Tensor& topk_w, Tensor& dyp, Tensor& dtopk_w) {
  const char* op = "moe_unpermute_backward";
  const Device dev = device_of(ctx, op, {{dy, "dy"}, {yp, "yp"}, {row_of, "row_of"}, {topk_w, "topk_w"},
                                         {dyp, "dyp"}, {dtopk_w, "dtopk_w"}});
  expect(topk_w, {-1, -1}, DType::kF32, op, "topk_w");
  const int64_t T = topk_w.size(0), k = topk_w.size(1);
  expect_float(dy, {T, -1}, op, "dy");
  const int64_t H = dy.size(1);
  expect_float(yp, {T * k, H}, op, "yp");
  expect(row_of, {T * k}, DType::kI32, op, "row_of");
  expect_float(dyp, {T * k, H}, op, "dyp");
  expect(dtopk_w, {T, k}, DType::kF32, op, "dtopk_w");
  MT_DISPATCH(dev, moe_unpermute_backward, ctx, dy, yp, row_of, topk_w, dyp, dtopk_w);
}

void moe_rows_from_picks(Context& ctx, const Tensor& picks, const Tensor& row_of, Tensor& rows) {
  const char* op = "moe_rows_from_picks";
  const Device dev = device_of(ctx, op, {{picks, "picks"}, {row_of, "row_of"}, {rows, "rows"}});
  expect(picks, {-1, -1}, DType::kF32, op, "picks");
  expect(row_of, {picks.numel()}, DType::kI32, op, "row_of");
  expect(rows, {picks.numel()}, DType::kF32, op, "rows");
  MT_DISPATCH(dev, moe_rows_from_picks, ctx, picks, row_of, rows);
}

void moe_picks_from_rows(Context& ctx, const Tensor& rows, const Tensor& row_of, Tensor& picks) {
  const char* op = "moe_picks_from_rows";
  const Device dev = device_of(ctx, op, {{rows, "rows"}, {row_of, "row_of"}, {picks, "picks"}});
  expect(picks, {-1, -1}, DType::kF32, op, "picks");
  expect(row_of, {picks.numel()}, DType::kI32, op, "row_of");
  expect(rows, {picks.numel()}, DType::kF32, op, "rows");
  MT_DISPATCH(dev, moe_picks_from_rows, ctx, rows, row_of, picks);
}

// ---- grouped expert GEMM -------------------------------------------------------------------
void grouped_matmul(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets, Tensor& y) {
  const char* op = "grouped_matmul";
  const Device dev = device_of(ctx, op, {{x, "x"}, {w, "w"}, {offsets, "offsets"}, {y, "y"}});
  expect_float(x, {-1, -1}, op, "x");
  expect_float(w, {-1, -1, x.size(1)}, op, "w");
  check_same_dtype(w, x, op, "w", "x");
  expect(offsets, {w.size(0) + 1}, DType::kI32, op, "offsets");
  expect_float(y, {x.size(0), w.size(1)}, op, "y");
  MT_DISPATCH(dev, grouped_matmul, ctx, x, w, offsets, y);
}

namespace {
// The operand checks shared by grouped_matmul_backward and grouped_matmul_backward_adamw.
void check_gmm_backward(const char* op, const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy,
                        const Tensor& dx, const Tensor* sum_squares) {
  if (sum_squares) expect(*sum_squares, {1}, DType::kF64, op, "sum_squares");
  expect_float(x, {-1, -1}, op, "x");
  expect_float(w, {-1, -1, x.size(1)}, op, "w");
  check_same_dtype(w, x, op, "w", "x");
  expect(offsets, {w.size(0) + 1}, DType::kI32, op, "offsets");
  expect_float(dy, {x.size(0), w.size(1)}, op, "dy");
  if (dx.defined()) expect_float(dx, x.shape(), op, "dx");
}
}  // namespace

void grouped_matmul_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                             const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dw, Tensor* dw_sum_squares) {
  const char* op = "grouped_matmul_backward";
  static const Tensor kNone;
  const Tensor& ss = dw_sum_squares ? *dw_sum_squares : kNone;
  const Device dev = device_of(ctx, op, {{x, "x"}, {w, "w"}, {offsets, "offsets"}, {dy, "dy"}, {dx, "dx"},
                                         {dw, "dw"}, {ss, "dw_sum_squares"}});
  check_gmm_backward(op, x, w, offsets, dy, dx, dw_sum_squares);
  check_shape(dw, w.shape(), op, "dw");
  MT_CHECK(dw.dtype() == DType::kF32 || dw.dtype() == DType::kBF16, "[{}] dw is {}, expected f32 or bf16", op,
           dtype_name(dw.dtype()));
  MT_DISPATCH(dev, grouped_matmul_backward, ctx, x, w, offsets, dy, dx, dw, accumulate_dw, dw_sum_squares);
}

// ---- cross-entropy -------------------------------------------------------------------------
namespace {
void check_ce(const char* op, const Tensor& logits, const Tensor& labels, const Tensor& weights) {
  expect_float(logits, {-1, -1}, op, "logits");
  expect(labels, {logits.size(0)}, DType::kI32, op, "labels");
  if (weights.defined()) expect(weights, {logits.size(0)}, DType::kF32, op, "weights");
}
}  // namespace

void cross_entropy_forward(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& weights,
                           Tensor& losses, Tensor& lse) {
  const char* op = "cross_entropy_forward";
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {labels, "labels"}, {weights, "weights"},
                                         {losses, "losses"}, {lse, "lse"}});
  check_ce(op, logits, labels, weights);
  expect(losses, {logits.size(0)}, DType::kF32, op, "losses");
  expect(lse, {logits.size(0)}, DType::kF32, op, "lse");
  MT_DISPATCH(dev, cross_entropy_forward, ctx, logits, labels, weights, losses, lse);
}

void cross_entropy_backward(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& weights,
                            const Tensor& lse, float dloss_scale, Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {labels, "labels"}, {weights, "weights"},
                                         {lse, "lse"}, {dlogits, "dlogits"}});
  check_ce(op, logits, labels, weights);
  expect(lse, {logits.size(0)}, DType::kF32, op, "lse");
  expect_float(dlogits, logits.shape(), op, "dlogits");
  MT_DISPATCH(dev, cross_entropy_backward, ctx, logits, labels, weights, lse, dloss_scale, dlogits);
}

double cross_entropy(Context& ctx, const Tensor& logits, const Tensor& labels, const Tensor& mask,
                     Reduction reduction, Tensor* dlogits) {
  const char* op = "cross_entropy";
  static const Tensor kNone;
  const Tensor& dl = dlogits ? *dlogits : kNone;
  const Device dev = device_of(ctx, op, {{logits, "logits"}, {labels, "labels"}, {mask, "mask"},
                                         {dl, "dlogits"}});
  check_ce(op, logits, labels, Tensor());
  if (mask.defined()) expect(mask, {logits.size(0)}, DType::kU8, op, "mask");
  if (dl.defined()) expect_float(dl, logits.shape(), op, "dlogits");
  MT_DISPATCH(dev, cross_entropy, ctx, logits, labels, mask, reduction, dlogits);
}

// ---- AdamW ---------------------------------------------------------------------------------
namespace {
// adamw_step's argument checks (grad: its shape and dtype; also used by grouped_matmul_backward_adamw).
void check_adamw(const Tensor& master, const Shape& grad_shape, DType grad_dtype, const Tensor& m, const Tensor& v,
                 const AdamWParams& p, const Tensor& compute) {
  const char* op = "adamw_step";
  auto f32_or_bf16 = [&](DType t, const char* name) {
    MT_CHECK(t == DType::kF32 || t == DType::kBF16, "[adamw_step] {} is {}, expected f32 or bf16", name, dtype_name(t));
  };
  f32_or_bf16(master.dtype(), "master");
  MT_CHECK(grad_shape == master.shape(), "[adamw_step] grad is {}, expected master's shape {}", shape_str(grad_shape),
           shape_str(master.shape()));
  check_shape(m, master.shape(), op, "m");
  check_shape(v, master.shape(), op, "v");
  f32_or_bf16(grad_dtype, "grad");
  f32_or_bf16(m.dtype(), "m");
  f32_or_bf16(v.dtype(), "v");
  if (compute.defined()) {
    MT_CHECK(compute.numel() == master.numel(), "[adamw_step] compute {} and master {} differ in element count",
             compute.desc(), master.desc());
    f32_or_bf16(compute.dtype(), "compute");
    MT_CHECK(compute.storage() != master.storage(), "[adamw_step] compute shares storage with master; pass an "
             "undefined compute tensor when the weights are their own master");
  }
  MT_CHECK(p.step >= 1, "[adamw_step] step = {} must be >= 1 (1-based, for bias correction)", p.step);
  MT_CHECK(p.beta1 >= 0.0f && p.beta1 < 1.0f && p.beta2 >= 0.0f && p.beta2 < 1.0f,
           "[adamw_step] betas ({}, {}) must be in [0, 1)", p.beta1, p.beta2);
}
}  // namespace

void adamw_step(Context& ctx, Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                Tensor& compute) {
  const char* op = "adamw_step";
  const Device dev = device_of(ctx, op, {{master, "master"}, {grad, "grad"}, {m, "m"}, {v, "v"},
                                         {compute, "compute"}});
  MT_CHECK(grad.defined(), "[adamw_step] grad is undefined");
  check_adamw(master, grad.shape(), grad.dtype(), m, v, p, compute);
  MT_DISPATCH(dev, adamw_step, ctx, master, grad, m, v, p, compute);
}

void adamw_step_many(Context& ctx, std::vector<AdamWTarget>& targets, const std::vector<Tensor>& grads) {
  const char* op = "adamw_step_many";
  MT_CHECK(grads.size() == targets.size(), "[{}] {} targets but {} gradients", op, targets.size(), grads.size());
  if (targets.empty()) return;
  Device dev = Device::cpu();
  for (size_t i = 0; i < targets.size(); ++i) {
    AdamWTarget& t = targets[i];
    MT_CHECK(grads[i].defined(), "[{}] gradient {} is undefined", op, i);
    const Device d = device_of(ctx, op, {{t.master, "master"}, {grads[i], "grad"}, {t.m, "m"}, {t.v, "v"},
                                         {t.compute, "compute"}});
    MT_CHECK(i == 0 || d == dev, "[{}] target {} is on {}, target 0 on {}", op, i, d.str(), dev.str());
    dev = d;
    check_adamw(t.master, grads[i].shape(), grads[i].dtype(), t.m, t.v, t.params, t.compute);
  }
  // The updates run in any order, even at once: two masters sharing bytes would race.
  std::vector<std::pair<uintptr_t, size_t>> spans;  // (first byte, target) of every non-empty master
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i].master.nbytes()) spans.emplace_back(reinterpret_cast<uintptr_t>(targets[i].master.data_ptr()), i);
  std::sort(spans.begin(), spans.end());
  for (size_t j = 1; j < spans.size(); ++j) {
    const size_t a = spans[j - 1].second, b = spans[j].second;
    MT_CHECK(spans[j - 1].first + targets[a].master.nbytes() <= spans[j].first,
             "[{}] the masters of targets {} and {} overlap in memory; each parameter may appear once", op, a, b);
  }
  MT_DISPATCH(dev, adamw_step_many, ctx, targets, grads);
}

void grouped_matmul_backward_adamw(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& offsets,
                                   const Tensor& dy, Tensor& dx, DType grad_dtype, Tensor& grad, bool accumulate,
                                   AdamWTarget& target, Tensor* sum_squares) {
  const char* op = "grouped_matmul_backward_adamw";
  MT_CHECK(grad_dtype == DType::kF32 || grad_dtype == DType::kBF16, "[{}] grad_dtype is {}, expected f32 or bf16", op,
           dtype_name(grad_dtype));
  MT_CHECK(grad.defined() || !accumulate, "[{}] accumulate needs the gradient buffer (grad is undefined)", op);
  if (grad.defined()) {
    check_shape(grad, w.shape(), op, "grad");
    MT_CHECK(grad.dtype() == grad_dtype, "[{}] grad is {}, expected {}", op, grad.desc(), dtype_name(grad_dtype));
  }
  check_shape(target.master, w.shape(), op, "master");
  check_adamw(target.master, w.shape(), grad_dtype, target.m, target.v, target.params, target.compute);
  static const Tensor kNone;
  const Tensor& ss = sum_squares ? *sum_squares : kNone;
  const Device dev = device_of(ctx, op, {{x, "x"}, {w, "w"}, {offsets, "offsets"}, {dy, "dy"}, {dx, "dx"},
                                         {grad, "grad"}, {target.master, "master"}, {target.m, "m"},
                                         {target.v, "v"}, {target.compute, "compute"}, {ss, "sum_squares"}});
  check_gmm_backward(op, x, w, offsets, dy, dx, sum_squares);
#ifdef MT_WITH_CUDA
  // The Hopper dW kernel applies the update in its epilogue (false: not this configuration).
  if (dev.is_cuda()) {
    const ProfileScope scope(ctx, op);  // (near zero when it declines: the two ops below count themselves)
    if (cuda::grouped_matmul_backward_adamw(ctx, x, w, offsets, dy, dx, grad_dtype, accumulate ? grad : Tensor(),
                                            target, sum_squares))
      return;
  }
#endif
  // Elsewhere: the gradient into its buffer (or a workspace tensor), then adamw_step.
  Tensor g = grad.defined() ? grad : Tensor::empty(w.shape(), grad_dtype, dev, MemCategory::kWorkspace);
  grouped_matmul_backward(ctx, x, w, offsets, dy, dx, g, accumulate, sum_squares);
  adamw_step(ctx, target.master, g, target.m, target.v, target.params, target.compute);
}

}  // namespace moetrain::ops
