// The expert dW kernel's staging (grouped_gemm_ws_dw.cuh): a consumer warp's wgmma fragments of a 128-row
// tile, rounded to the gradient's dtype (+ the old values, when accumulating), into shared memory (padded
// rows, or Cfg::kTma's swizzled 64-column boxes), with the sums of squares of the stored values. Shared by
// the store epilogue and the fused AdamW walk (grouped_gemm_ws_dw_adamw.cuh); pure functions of registers
// and shared memory.
#pragma once
#include "kernels/cuda/mma_sm80.cuh"
#include "kernels/cuda/wgmma_sm90.cuh"

namespace moetrain::cuda::gwd {

constexpr int kBM = 128;  // tile rows (the tall bf16 tiles take two 128-row halves)

// stage_tile's f32 body (kAllIn as for stage_bf16).
template <int BN, int kPitch, bool kAllIn>
__device__ __forceinline__ void stage_f32(const float (&acc)[BN / 2], bool accumulate, unsigned char* out_p, int frow,
                                          int fcol, wg::SumSq4& sq, bool ss, const bool (&row_in)[2], int ncols) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    unsigned char* rp = out_p + (frow + 8 * h) * kPitch;
#pragma unroll
    for (int j = 0; j < BN / 8; j += 2) {
      float s4[4];  // the stored values of column blocks j and j + 1 (0 past the edge)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        float2* q = reinterpret_cast<float2*>(rp + (fcol + 8 * (j + jj)) * 4);
        float v0 = acc[4 * (j + jj) + 2 * h], v1 = acc[4 * (j + jj) + 2 * h + 1];
        if (accumulate) {
          const float2 o = *q;
          v0 = o.x + v0;
          v1 = o.y + v1;
        }
        *q = make_float2(v0, v1);
        const bool in = kAllIn || (row_in[h] && fcol + 8 * (j + jj) < ncols);
        s4[2 * jj] = in ? v0 : 0.0f;
        s4[2 * jj + 1] = in ? v1 : 0.0f;
      }
      if (kAllIn || ss) sq.add4(h, j, s4[0], s4[1], s4[2], s4[3]);
    }
  }
}

// stage_tile's bf16 body. kAllIn: every value this thread stores is inside the output (rows < nrows,
// columns < ncols), so the squares need no edge test: the same sums with about 40% fewer instructions
// (the per-value predicates and selects were most of what the sums cost), on every tile of the model's
// shapes.
// kSwz: Cfg::kTma's staging boxes (64 columns x 128 rows, 128-byte rows, 16-byte chunk c of row r at
// chunk c ^ (r & 7)), else rows at kPitch bytes.
// jlo, jhi: the column blocks of 8 to stage (kSwz's box b alone: 8 b, 8 b + 8, with sout moved back by b
// boxes so that the box lands at the slot); constants where inlined in an unrolled loop.
template <int BN, int kPitch, bool kAllIn, bool kSwz = false>
__device__ __forceinline__ void stage_bf16(const float (&acc)[BN / 2], bool accumulate, uint32_t sout, int lane,
                                           int warp, wg::SumSq4& sq, bool ss, const bool (&row_in)[2], int ncols,
                                           int jlo = 0, int jhi = BN / 8) {
  const int fcol = 2 * (lane & 3), q = lane >> 3, srow = 16 * warp + ((q & 1) << 3) + (lane & 7);
  const uint32_t rowaddr = sout + srow * (kSwz ? 128 : kPitch) + (kSwz ? 0 : (q >> 1) * 16);
  // this lane's matrix row address for column blocks j and j + 1 (j even)
  auto at = [&](int j) -> uint32_t {
    if constexpr (kSwz) return rowaddr + (j >> 3) * (kBM * 128) + ((((j & 7) + (q >> 1)) ^ (lane & 7)) << 4);
    else return rowaddr + j * 16;
  };
#pragma unroll
  for (int j = jlo; j < jhi; j += 2) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = acc[4 * j + i];
    if (accumulate) {
      uint32_t o[4];
      mma::ldmatrix_x4(o, at(j));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o[i]));
        v[2 * i] = f.x + v[2 * i];
        v[2 * i + 1] = f.y + v[2 * i + 1];
      }
    }
    // w[i]: row frow + 8 (i & 1), column block j + (i >> 1)
    const uint32_t w[4] = {mma::pack_bf16(v[0], v[1]), mma::pack_bf16(v[2], v[3]), mma::pack_bf16(v[4], v[5]),
                           mma::pack_bf16(v[6], v[7])};
    wg::stmatrix_x4(at(j), w[0], w[1], w[2], w[3]);
    if (kAllIn || ss) {  // groups: w[0], w[2] (row frow) and w[1], w[3] (row frow + 8); 0 past the edge
      float f[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool in = kAllIn || (row_in[i & 1] && fcol + 8 * (j + (i >> 1)) < ncols);
        f[2 * i] = in ? __uint_as_float(w[i] << 16) : 0.0f;
        f[2 * i + 1] = in ? __uint_as_float(w[i] & 0xffff0000u) : 0.0f;
      }
      sq.add4(0, j, f[0], f[1], f[4], f[5]);
      sq.add4(1, j, f[2], f[3], f[6], f[7]);
    }
  }
}

// Consumers: the tile's fragments (+ the old rows the store warps loaded into the staging tile, when
// accumulating; added in f32) rounded to DwT into the staging tile. stage_rows does one accumulator:
// rows 16 vw + lane / 4 and + 8 of the tile, where vw is the consumer warp (0..7), or on the tall tiles
// 4 (2 cw + i) + warp % 4 for warpgroup cw's accumulator i. With ss it also adds the squares of the
// stored values of its rows < nrows, columns < ncols to sq (wg::SumSq4's groups of four, in fragment order,
// summed per 64-column span).
template <int BN, typename DwT, int kPitch>
__device__ __forceinline__ void stage_rows(const float (&acc)[BN / 2], bool accumulate, uint32_t sout,
                                           unsigned char* out_p, int lane, int vw, wg::SumSq4& sq, bool ss,
                                           int nrows, int ncols) {
  const int frow = 16 * vw + (lane >> 2), fcol = 2 * (lane & 3);
  const bool row_in[2] = {frow < nrows, frow + 8 < nrows};
  if constexpr (sizeof(DwT) == 4) {
    if (ss && row_in[0] && row_in[1] && ncols >= BN)
      stage_f32<BN, kPitch, true>(acc, accumulate, out_p, frow, fcol, sq, true, row_in, ncols);
    else
      stage_f32<BN, kPitch, false>(acc, accumulate, out_p, frow, fcol, sq, ss, row_in, ncols);
  } else if (ss && row_in[0] && row_in[1] && ncols >= BN) {  // every value of this thread is in the tile
    stage_bf16<BN, kPitch, true>(acc, accumulate, sout, lane, vw, sq, true, row_in, ncols);
  } else {
    stage_bf16<BN, kPitch, false>(acc, accumulate, sout, lane, vw, sq, ss, row_in, ncols);
  }
}

// The warp's partial of the tile's sum of squares (an xor butterfly of the threads' totals) into red[warp].
__device__ __forceinline__ void warp_sum_squares(const wg::SumSq4& sq, int lane, int warp, double* red) {
  double ss = sq.total();
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) red[warp] = ss;
}

// Consumer warp `warp` rounds its NA accumulators into the staging tile (stage_rows each, in order); with
// red non-null, red[warp] gets its partial of the tile's sum of squares (the xor butterfly above).
template <int BN, typename DwT, int kPitch, int NA>
__device__ __forceinline__ void stage_tile(const float (&acc)[NA][BN / 2], bool accumulate, uint32_t sout,
                                           unsigned char* out_p, int lane, int warp, double* red, int nrows,
                                           int ncols) {
  wg::SumSq4 sq;
#pragma unroll
  for (int i = 0; i < NA; ++i) {
    const int vw = NA == 1 ? warp : 4 * ((warp >> 2) * NA + i) + (warp & 3);
    stage_rows<BN, DwT, kPitch>(acc[i], accumulate, sout, out_p, lane, vw, sq, red != nullptr, nrows, ncols);
  }
  if (red) warp_sum_squares(sq, lane, warp, red);
}

// The wide f32 tile's half HF (columns 128 HF .. 128 HF + 127) into the staging tile, as stored (no old
// rows: the store warps add them in global memory with a bulk reduce-add, f32 old + new rounded once,
// the bits of stage_f32's accumulate, so with += there are no sums of squares). With `ss` (= only) it
// adds the squares of the values inside the output (rows < nrows, tile columns < ncols) to sq, in
// groups of four (column blocks j and j + 1 of one row), summed per 64-column span. Consumer warp `warp`
// holds rows 16 warp + lane / 4 and + 8.
template <int BN, int kPitch, int HF>
__device__ __forceinline__ void stage_f32_half(const float (&acc)[BN / 2], unsigned char* out_p, int lane, int warp,
                                               wg::SumSq4& sq, bool ss, int nrows, int ncols) {
  const int frow = 16 * warp + (lane >> 2), fcol = 2 * (lane & 3);
  const bool all_in = frow + 8 < nrows && ncols >= BN / 2 * (HF + 1);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    unsigned char* rp = out_p + (frow + 8 * h) * kPitch;
    const bool row_in = frow + 8 * h < nrows;
#pragma unroll
    for (int j = 0; j < BN / 16; j += 2) {
      float s4[4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int ja = BN / 16 * HF + j + jj;  // the fragment's column block
        const float v0 = acc[4 * ja + 2 * h], v1 = acc[4 * ja + 2 * h + 1];
        *reinterpret_cast<float2*>(rp + (fcol + 8 * (j + jj)) * 4) = make_float2(v0, v1);
        const bool in = all_in || (row_in && fcol + 8 * ja < ncols);
        s4[2 * jj] = in ? v0 : 0.0f;
        s4[2 * jj + 1] = in ? v1 : 0.0f;
      }
      if (ss) sq.add4(h, BN / 16 * HF + j, s4[0], s4[1], s4[2], s4[3]);
    }
  }
}

}  // namespace moetrain::cuda::gwd
