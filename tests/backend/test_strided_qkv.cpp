// CUDA vs CPU, and CUDA strided vs CUDA packed: the fused q|k|v projection's column blocks as op
// operands. q and k (norm + RoPE forward on a token-strided x, backward in place on a
// token-strided dy = dx), v (attention reads it strided) and dq, dk, dv (attention backward writes
// them strided) give the same bits as the same ops on packed copies, on the sm90 path that takes
// the strides (bf16) and on the paths that pack first (f32 attention, head dim 64 norm + RoPE);
// copy_rows matches the CPU exactly.
#include <cmath>
#include <cstring>

#include "backend_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace moetrain::test {
namespace {

// A packed host copy of a (possibly strided) [T, heads, d] device tensor.
Tensor host_packed(const Tensor& t) {
  Tensor p = Tensor::empty(t.shape(), t.dtype(), t.device());
  Tensor pv = p.view({t.size(0), t.size(1) * t.size(2)});
  ops::copy_rows(gpu_ctx(), t.view({t.size(0), t.size(1) * t.size(2)}), pv);
  device_sync();
  return p.to(Device::cpu());
}
void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << what;
}
// The columns [c0, c1) of a [T, W] tensor as [T, heads, d].
Tensor block(const Tensor& m, int64_t c0, int64_t c1, int64_t d) {
  return m.slice(1, c0, c1).view({m.size(0), (c1 - c0) / d, d});
}

TEST(Backend, StridedQkvNormRope) {
  MT_REQUIRE_GPU();
  for (const int64_t d : {128, 64}) {  // 128: the fused kernels with strides; 64: packed copies first
    const int64_t T = 301, nh = 8, nkv = 2, W = (nh + 2 * nkv) * d;
    const std::string tag = "d" + std::to_string(d);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 131) % 4096);
    Pair p = input_ints(pos, {T});
    Pair qkv = input(randn(T * W, 91, 2.0f), {T, W}, DType::kBF16);
    Pair w = input(randu(d, 92, 0.5f, 1.5f), {d}, DType::kBF16);
    for (const auto& [c0, heads] : {std::pair<int64_t, int64_t>{0, nh}, {nh * d, nkv}}) {
      const Tensor xs = block(qkv.gpu, c0, c0 + heads * d, d);
      const Tensor xp = host_packed(xs).to(Device::cuda(0));  // a packed device copy
      const std::string what = tag + (c0 ? " k" : " q");
      Tensor y1 = Tensor::empty({T, heads, d}, DType::kBF16, Device::cuda(0)), y2 = y1.clone();
      Tensor r1 = Tensor::empty({T * heads}, DType::kF32, Device::cuda(0)), r2 = r1.clone();
      ops::norm_rope_forward(gpu_ctx(), xs, w.gpu, 1e-6f, p.gpu, 1e6f, y1, r1);
      ops::norm_rope_forward(gpu_ctx(), xp, w.gpu, 1e-6f, p.gpu, 1e6f, y2, r2);
      device_sync();
      expect_same_bits(y1.to(Device::cpu()), y2.to(Device::cpu()), "norm_rope_forward y, strided x " + what);
      expect_same_bits(r1.to(Device::cpu()), r2.to(Device::cpu()), "norm_rope_forward rstd, strided x " + what);
      Pair y{Tensor::empty({T, heads, d}, DType::kF32), y1}, rs{Tensor::empty({T * heads}, DType::kF32), r1};
      cpu::norm_rope_forward(cpu_ctx(), block(qkv.cpu, c0, c0 + heads * d, d).contiguous(), w.cpu, 1e-6f, p.cpu, 1e6f,
                             y.cpu, rs.cpu);
      check("norm_rope_forward", "strided x " + what, y, kTolBf16);

      // Backward in place on a token-strided dy = dx, against the packed op.
      Pair g = input(randn(T * W, 93, 1.0f), {T, W}, DType::kBF16);
      Tensor ds = block(g.gpu, c0, c0 + heads * d, d);
      Tensor dp = host_packed(ds).to(Device::cuda(0));
      Tensor dw1 = Tensor::zeros({d}, DType::kF32, Device::cuda(0)), dw2 = dw1.clone();
      ops::norm_rope_backward(gpu_ctx(), xs, w.gpu, r1, p.gpu, 1e6f, ds, ds, dw1);
      ops::norm_rope_backward(gpu_ctx(), xp, w.gpu, r2, p.gpu, 1e6f, dp, dp, dw2);
      device_sync();
      expect_same_bits(host_packed(ds), dp.to(Device::cpu()), "norm_rope_backward dx in place, strided " + what);
      expect_same_bits(dw1.to(Device::cpu()), dw2.to(Device::cpu()), "norm_rope_backward dw, strided " + what);
      // The other columns of g are untouched.
      Tensor gh = g.gpu.to(Device::cpu()), g0 = input(randn(T * W, 93, 1.0f), {T, W}, DType::kBF16).gpu.to(Device::cpu());
      for (int64_t t = 0; t < T; t += 37) {
        const char* a = static_cast<const char*>(gh.data_ptr()) + t * W * 2;
        const char* b = static_cast<const char*>(g0.data_ptr()) + t * W * 2;
        EXPECT_EQ(std::memcmp(a, b, static_cast<size_t>(c0) * 2), 0) << "columns before the block, row " << t;
        const int64_t c1 = c0 + heads * d;
        EXPECT_EQ(std::memcmp(a + c1 * 2, b + c1 * 2, static_cast<size_t>(W - c1) * 2), 0) << "columns after, row " << t;
      }
    }
  }
}

// norm_rope_forward_qk / backward_qk (q and k in one grid when both are fused) on the q|k|v column
// blocks: the bits of the single op on each, and for d 64 (not fused) and mixed weight dtypes (one
// after the other) as well.
TEST(Backend, StridedQkvNormRopePair) {
  MT_REQUIRE_GPU();
  struct Case { int64_t T, nh, nkv, d; DType wk_dt; };
  for (const Case c : {Case{301, 8, 2, 128, DType::kBF16}, Case{4096, 32, 4, 128, DType::kBF16},
                       Case{77, 8, 2, 64, DType::kBF16}, Case{301, 8, 2, 128, DType::kF32}}) {
    const int64_t T = c.T, d = c.d, W = (c.nh + 2 * c.nkv) * d;
    const std::string tag = "T" + std::to_string(T) + " d" + std::to_string(d) + (c.wk_dt == DType::kF32 ? " k w f32" : "");
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>((t * 131) % 4096);
    Pair p = input_ints(pos, {T});
    Pair qkv = input(randn(T * W, 95, 2.0f), {T, W}, DType::kBF16);
    Pair wq = input(randu(d, 96, 0.5f, 1.5f), {d}, DType::kBF16), wk = input(randu(d, 97, 0.5f, 1.5f), {d}, c.wk_dt);
    const Tensor xq = block(qkv.gpu, 0, c.nh * d, d), xk = block(qkv.gpu, c.nh * d, (c.nh + c.nkv) * d, d);
    auto dev_empty = [](const Shape& s, DType dt) { return Tensor::empty(s, dt, Device::cuda(0)); };
    ops::NormRopeFwdIO q{xq, wq.gpu, dev_empty({T, c.nh, d}, DType::kBF16), dev_empty({T * c.nh}, DType::kF32)};
    ops::NormRopeFwdIO k{xk, wk.gpu, dev_empty({T, c.nkv, d}, DType::kBF16), dev_empty({T * c.nkv}, DType::kF32)};
    ops::norm_rope_forward_qk(gpu_ctx(), q, k, 1e-6f, p.gpu, 1e6f);
    Tensor yq = q.y.clone(), rq = q.rstd.clone(), yk = k.y.clone(), rk = k.rstd.clone();
    ops::norm_rope_forward(gpu_ctx(), xq, wq.gpu, 1e-6f, p.gpu, 1e6f, yq, rq);
    ops::norm_rope_forward(gpu_ctx(), xk, wk.gpu, 1e-6f, p.gpu, 1e6f, yk, rk);
    device_sync();
    expect_same_bits(q.y.to(Device::cpu()), yq.to(Device::cpu()), "qk forward y (q) " + tag);
    expect_same_bits(q.rstd.to(Device::cpu()), rq.to(Device::cpu()), "qk forward rstd (q) " + tag);
    expect_same_bits(k.y.to(Device::cpu()), yk.to(Device::cpu()), "qk forward y (k) " + tag);
    expect_same_bits(k.rstd.to(Device::cpu()), rk.to(Device::cpu()), "qk forward rstd (k) " + tag);
    // The k side against the CPU twin too.
    Pair yc{Tensor::empty({T, c.nkv, d}, DType::kF32), k.y}, rc{Tensor::empty({T * c.nkv}, DType::kF32), k.rstd};
    cpu::norm_rope_forward(cpu_ctx(), block(qkv.cpu, c.nh * d, (c.nh + c.nkv) * d, d).contiguous(), wk.cpu, 1e-6f,
                           p.cpu, 1e6f, yc.cpu, rc.cpu);
    check("norm_rope_forward_qk", "k y " + tag, yc, kTolBf16);

    // Backward in place on the dq | dk blocks of one gradient matrix, against the single ops on a copy.
    Pair g = input(randn(T * W, 98, 1.0f), {T, W}, DType::kBF16);
    Tensor g2 = g.gpu.clone();
    Tensor dq = block(g.gpu, 0, c.nh * d, d), dk = block(g.gpu, c.nh * d, (c.nh + c.nkv) * d, d);
    Tensor dq2 = block(g2, 0, c.nh * d, d), dk2 = block(g2, c.nh * d, (c.nh + c.nkv) * d, d);
    const auto w0 = randn(d, 99);
    ops::NormRopeBwdIO bq{xq, wq.gpu, rq, dq, dq, input(w0, {d}, DType::kF32).gpu};
    ops::NormRopeBwdIO bk{xk, wk.gpu, rk, dk, dk, input(w0, {d}, DType::kF32).gpu};
    Tensor dwq = input(w0, {d}, DType::kF32).gpu, dwk = input(w0, {d}, DType::kF32).gpu;
    ops::norm_rope_backward_qk(gpu_ctx(), bq, bk, p.gpu, 1e6f);
    ops::norm_rope_backward(gpu_ctx(), xq, wq.gpu, rq, p.gpu, 1e6f, dq2, dq2, dwq);
    ops::norm_rope_backward(gpu_ctx(), xk, wk.gpu, rk, p.gpu, 1e6f, dk2, dk2, dwk);
    device_sync();
    expect_same_bits(g.gpu.to(Device::cpu()), g2.to(Device::cpu()), "qk backward dq | dk | (untouched dv) " + tag);
    expect_same_bits(bq.dw.to(Device::cpu()), dwq.to(Device::cpu()), "qk backward dw (q) " + tag);
    expect_same_bits(bk.dw.to(Device::cpu()), dwk.to(Device::cpu()), "qk backward dw (k) " + tag);
  }
}

TEST(Backend, StridedQkvAttention) {
  MT_REQUIRE_GPU();
  const std::vector<int32_t> docs = {0, 1, 130, 131, 400, 641};
  const int64_t T = docs.back(), nh = 8, nkv = 2;
  for (const int64_t d : {128, 64}) {
    for (const DType dt : {DType::kBF16, DType::kF32}) {  // bf16: strides in the kernels; f32: packed copies
      const int64_t W = (nh + 2 * nkv) * d;
      const std::string tag = std::string(dt_name(dt)) + " d" + std::to_string(d);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      Pair qkv = input(randn(T * W, 101, 1.0f), {T, W}, dt);
      Pair cu = input_ints(docs, {static_cast<int64_t>(docs.size())});
      const Tensor q = host_packed(block(qkv.gpu, 0, nh * d, d)).to(Device::cuda(0));
      const Tensor k = host_packed(block(qkv.gpu, nh * d, (nh + nkv) * d, d)).to(Device::cuda(0));
      const Tensor vs = block(qkv.gpu, (nh + nkv) * d, W, d);
      const Tensor vp = host_packed(vs).to(Device::cuda(0));
      Tensor o1 = Tensor::empty({T, nh, d}, dt, Device::cuda(0)), o2 = o1.clone();
      Tensor l1 = Tensor::empty({nh, T}, DType::kF32, Device::cuda(0)), l2 = l1.clone();
      ops::attention_forward(gpu_ctx(), q, k, vs, cu.gpu, 300, scale, o1, l1);
      ops::attention_forward(gpu_ctx(), q, k, vp, cu.gpu, 300, scale, o2, l2);
      device_sync();
      expect_same_bits(o1.to(Device::cpu()), o2.to(Device::cpu()), "attention_forward out, strided v " + tag);
      expect_same_bits(l1.to(Device::cpu()), l2.to(Device::cpu()), "attention_forward lse, strided v " + tag);

      const Tensor dout = input(randn(T * nh * d, 102, 1.0f), {T, nh, d}, dt).gpu;
      Tensor g = Tensor::empty({T, W}, dt, Device::cuda(0));
      Tensor dq1 = block(g, 0, nh * d, d), dk1 = block(g, nh * d, (nh + nkv) * d, d), dv1 = block(g, (nh + nkv) * d, W, d);
      Tensor dq2 = Tensor::empty({T, nh, d}, dt, Device::cuda(0));
      Tensor dk2 = Tensor::empty({T, nkv, d}, dt, Device::cuda(0)), dv2 = dk2.clone();
      ops::attention_backward(gpu_ctx(), q, k, vs, o2, l2, dout, cu.gpu, 300, scale, dq1, dk1, dv1);
      ops::attention_backward(gpu_ctx(), q, k, vp, o2, l2, dout, cu.gpu, 300, scale, dq2, dk2, dv2);
      device_sync();
      expect_same_bits(host_packed(dq1), dq2.to(Device::cpu()), "attention_backward dq strided " + tag);
      expect_same_bits(host_packed(dk1), dk2.to(Device::cpu()), "attention_backward dk strided " + tag);
      expect_same_bits(host_packed(dv1), dv2.to(Device::cpu()), "attention_backward dv strided " + tag);
      // And the CPU twin with the same strided layout.
      Pair dv{Tensor::empty({T, nkv, d}, DType::kF32), dv2};
      Tensor dqc = Tensor::empty({T, nh, d}, DType::kF32), dkc = Tensor::empty({T, nkv, d}, DType::kF32);
      Tensor vcpu = block(qkv.cpu, (nh + nkv) * d, W, d);
      Tensor o2c = o2.to(Device::cpu()).to(DType::kF32);
      ops::attention_backward(cpu_ctx(), q.to(Device::cpu()).to(DType::kF32), k.to(Device::cpu()).to(DType::kF32), vcpu,
                              o2c, l2.to(Device::cpu()), dout.to(Device::cpu()).to(DType::kF32),
                              cu.cpu, 300, scale, dqc, dkc, dv.cpu);
      check("attention_backward", "dv, strided v " + tag, dv, dt == DType::kBF16 ? kTolBf16 : 1e-5);
    }
  }
}

TEST(Backend, CopyRows) {
  MT_REQUIRE_GPU();
  for (const DType dt : {DType::kBF16, DType::kF32}) {
    for (const int64_t w : {512, 3}) {  // 16-byte rows, and rows that are not (the 2-D memcpy)
      Pair src = input(randn(37 * 900, 111), {37, 900}, dt);
      Tensor dst = Tensor::zeros({37, 1000}, dt, Device::cuda(0));
      Tensor db = dst.slice(1, 8, 8 + w);
      ops::copy_rows(gpu_ctx(), src.gpu.slice(1, 16, 16 + w), db);
      Tensor ref = Tensor::zeros({37, 1000}, dt);
      Tensor rb = ref.slice(1, 8, 8 + w);
      ops::copy_rows(cpu_ctx(), src.gpu.to(Device::cpu()).slice(1, 16, 16 + w), rb);
      device_sync();
      expect_same_bits(dst.to(Device::cpu()), ref, std::string("copy_rows ") + dt_name(dt) + " width " + std::to_string(w));
    }
  }
}

}  // namespace
}  // namespace moetrain::test
