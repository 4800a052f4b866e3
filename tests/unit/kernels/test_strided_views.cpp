// Column blocks of a wider matrix as op operands (the fused q|k|v projection's output): a
// row-strided view, norm + RoPE forward on a token-strided x and backward in place on a
// token-strided dy / dx, attention with a strided v writing strided dq / dk / dv, copy_rows, all
// bit-equal to the same ops on packed copies.
#include <gtest/gtest.h>

#include <cmath>
#include "kernels/ops.h"
#include "core/context.h"
using namespace moetrain;
TEST(StridedViews, NormRopeTakesATokenStrideForwardAndInPlaceBackward) {
  Context ctx(Device::cpu());
  const int64_t T = 5, nh = 4, nkv = 2, d = 8, W = (nh + 2 * nkv) * d;
  Tensor qkv = Tensor::empty({T, W}, DType::kF32);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.set(i, std::sin(0.37 * i));
  Tensor q = qkv.slice(1, 0, nh * d).view({T, nh, d});
  Tensor qc = q.contiguous();
  for (int64_t i = 0; i < qc.numel(); ++i) ASSERT_EQ(qc.get(i), static_cast<float>(std::sin(0.37 * ((i / (nh * d)) * W + i % (nh * d)))));
  Tensor w = Tensor::empty({d}, DType::kF32); w.fill_(1.0);
  Tensor pos = Tensor::from_ints({0, 1, 2, 3, 4}, {T});
  Tensor y1 = Tensor::empty({T, nh, d}, DType::kF32), y2 = Tensor::empty({T, nh, d}, DType::kF32);
  Tensor r1 = Tensor::empty({T * nh}, DType::kF32), r2 = Tensor::empty({T * nh}, DType::kF32);
  ops::norm_rope_forward(ctx, q, w, 1e-6f, pos, 10000.f, y1, r1);
  ops::norm_rope_forward(ctx, qc, w, 1e-6f, pos, 10000.f, y2, r2);
  for (int64_t i = 0; i < y1.numel(); ++i) ASSERT_EQ(y1.get(i), y2.get(i)) << i;
  // backward in place on a strided dy
  Tensor g = Tensor::empty({T, W}, DType::kF32);
  for (int64_t i = 0; i < g.numel(); ++i) g.set(i, std::cos(0.11 * i));
  Tensor dq = g.slice(1, 0, nh * d).view({T, nh, d});
  Tensor dqc = dq.contiguous();
  Tensor dw1 = Tensor::zeros({d}, DType::kF32), dw2 = Tensor::zeros({d}, DType::kF32);
  ops::norm_rope_backward(ctx, q, w, r1, pos, 10000.f, dq, dq, dw1);
  ops::norm_rope_backward(ctx, qc, w, r2, pos, 10000.f, dqc, dqc, dw2);
  Tensor dqa = dq.contiguous();
  for (int64_t i = 0; i < dqa.numel(); ++i) ASSERT_EQ(dqa.get(i), dqc.get(i)) << i;
}
TEST(StridedViews, AttentionTakesAStridedVAndWritesStridedGradients) {
  Context ctx(Device::cpu());
  const int64_t T = 5, nh = 4, nkv = 2, d = 8, W = (nh + 2 * nkv) * d;
  Tensor qkv = Tensor::empty({T, W}, DType::kF32);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.set(i, std::sin(0.37 * i));
  Tensor q = qkv.slice(1, 0, nh * d).view({T, nh, d}).contiguous();
  Tensor k = qkv.slice(1, nh * d, (nh + nkv) * d).view({T, nkv, d}).contiguous();
  Tensor v = qkv.slice(1, (nh + nkv) * d, W).view({T, nkv, d});
  Tensor vc = v.contiguous();
  Tensor cu = Tensor::from_ints({0, T}, {2});
  Tensor o1 = Tensor::empty({T, nh, d}, DType::kF32), o2 = Tensor::empty({T, nh, d}, DType::kF32);
  Tensor l1 = Tensor::empty({nh, T}, DType::kF32), l2 = Tensor::empty({nh, T}, DType::kF32);
  ops::attention_forward(ctx, q, k, v, cu, T, 0.3f, o1, l1);
  ops::attention_forward(ctx, q, k, vc, cu, T, 0.3f, o2, l2);
  for (int64_t i = 0; i < o1.numel(); ++i) ASSERT_EQ(o1.get(i), o2.get(i)) << i;
  Tensor dout = Tensor::empty({T, nh, d}, DType::kF32);
  for (int64_t i = 0; i < dout.numel(); ++i) dout.set(i, std::cos(0.3 * i));
  Tensor g = Tensor::empty({T, W}, DType::kF32);
  Tensor dq = g.slice(1, 0, nh * d).view({T, nh, d}), dk = g.slice(1, nh * d, (nh + nkv) * d).view({T, nkv, d});
  Tensor dv = g.slice(1, (nh + nkv) * d, W).view({T, nkv, d});
  Tensor dq2 = Tensor::empty({T, nh, d}, DType::kF32), dk2 = Tensor::empty({T, nkv, d}, DType::kF32),
         dv2 = Tensor::empty({T, nkv, d}, DType::kF32);
  ops::attention_backward(ctx, q, k, v, o1, l1, dout, cu, T, 0.3f, dq, dk, dv);
  ops::attention_backward(ctx, q, k, vc, o2, l2, dout, cu, T, 0.3f, dq2, dk2, dv2);
  Tensor a = dq.contiguous(), b = dk.contiguous(), c = dv.contiguous();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.get(i), dq2.get(i)) << i;
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(b.get(i), dk2.get(i)) << i;
  for (int64_t i = 0; i < c.numel(); ++i) ASSERT_EQ(c.get(i), dv2.get(i)) << i;
}

TEST(StridedViews, ViewKeepsTheRowStrideAndCopyRowsCopiesBlocks) {
  Context ctx(Device::cpu());
  Tensor m = Tensor::empty({3, 10}, DType::kF32);
  for (int64_t i = 0; i < m.numel(); ++i) m.set(i, static_cast<double>(i));
  Tensor blk = m.slice(1, 4, 10);  // [3, 6], rows 10 apart
  Tensor v = blk.view({3, 2, 3});
  EXPECT_EQ(v.stride(0), 10);
  EXPECT_EQ(v.stride(1), 3);
  EXPECT_EQ(v.get(5), 9.0);   // row 0, head 1, column 2 -> m[0, 9]
  EXPECT_EQ(v.get(6), 14.0);  // row 1 starts at m[1, 4]
  EXPECT_THROW(blk.view({6, 3}), std::exception);  // dim 0 must stay
  Tensor dst = Tensor::zeros({3, 10}, DType::kF32);
  Tensor dblk = dst.slice(1, 0, 6);
  ops::copy_rows(ctx, blk, dblk);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 10; ++c) EXPECT_EQ(dst.get(r * 10 + c), c < 6 ? static_cast<double>(r * 10 + 4 + c) : 0.0);
  Tensor wrong = Tensor::zeros({3, 5}, DType::kF32);
  EXPECT_THROW(ops::copy_rows(ctx, blk, wrong), std::exception);
}
