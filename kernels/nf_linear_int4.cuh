// Linears over int4 weights with group scales (compressed-tensors W4A16,
// `nfc compile --weights=int4`): int4_linear, for every step (prefill and
// decode) on CUDA cores, the codes dequantised in registers. The spec S
// (nf_linear_groups.cuh) has W = nf::int4x8 (S::weight(a, g): group g's
// [N, K / 8] words, eight codes a word, code i of a word in bits 4i..4i+3,
// stored as code + 8), and
//   static constexpr int kGroupSize;              // K elements a scale
//   static const float *group_scales(a, g);       // [N, K / kGroupSize]
#ifndef NF_KERNELS_LINEAR_INT4_CUH
#define NF_KERNELS_LINEAR_INT4_CUH

#include "nf_common.cuh"
#include "nf_linear_groups.cuh"

namespace nf {

/// The 8 codes of a word (each in [-8, 7]) as exact floats: the nibble
/// placed in the mantissa of 2^23 and 2^23 + 8 subtracted (no int-to-float
/// conversion, whose rate is a quarter of an FMA's).
__device__ __forceinline__ void int4x8_to_f32(unsigned w, float *out) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] =
        __uint_as_float(0x4b000000u | ((w >> (4 * i)) & 0xfu)) - 8388616.0f;
}

/// y[r, n] = sum over groups j of scale[n, j] * sum_{k in j} code[n, k] x[r,
/// k]. A warp per item of R rows x F features of a group (row_linear's
/// numbering): each lane streams VW words (16, 8 or 4 bytes) of each
/// feature's codes at a time, all its loads of a round of up to 4 in flight,
/// and sums each word's products before scaling them by the word's group
/// scale (a word lies in one group: kGroupSize is a multiple of 8). The
/// products of codes and activations are exact, as are the CPU backend's of
/// dequantised weights; the sums differ from its by f32 rounding only.
/// Activations are read once a lane for the F features; weights once per R
/// rows (items of more rows read them again, from L2). The launch waits for
/// the launches before it first (the rows, the dispatch's groups).
template <class S, int R, int F> __device__ void int4_linear(Step a) {
  static_assert(S::K % 8 == 0, "whole words a row");
  static_assert(S::kGroupSize % 8 == 0 && S::K % S::kGroupSize == 0,
                "a word in one group");
  static_assert(R >= 1 && F >= 1 && R * F <= 64, "accumulators");
  constexpr int KW = S::K / 8;                              // words a row
  constexpr int VW = KW % 4 == 0 ? 4 : KW % 2 == 0 ? 2 : 1; // words a load
  constexpr int C = KW / VW;                                // loads a row
  constexpr int J = (C + 31) / 32;                          // a lane's
  constexpr int UJ = J < 4 ? J : 4;                         // a round's
  constexpr int NG = S::K / S::kGroupSize;                  // scales a row
  constexpr int NF = (S::N + F - 1) / F;
  using T = RowElem<S>;
  __shared__ GroupItems<S> s_groups;
  s_groups.build(a, [](int c) { return (c + R - 1) / R * NF; });
  const int items = s_groups.total();
  const int lane = lane_id();
  for (long long item = global_warp(a); item < items; item += grid_warps(a)) {
    const int g = s_groups.group_of(static_cast<int>(item));
    const int local = static_cast<int>(item) - s_groups.first[g];
    const int n0 = local % NF * F;
    const int row0 = s_groups.begin[g] + local / NF * R;
    const int rows = min(R, s_groups.count[g] - local / NF * R);
    const unsigned *wrow[F];
    const float *srow[F];
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const long long n = min(n0 + f, S::N - 1);
      wrow[f] = reinterpret_cast<const unsigned *>(S::weight(a, g)) + n * KW;
      srow[f] = S::group_scales(a, g) + n * NG;
    }
    const T *xr[R];
    float acc[R][F];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      xr[r] = r < rows ? S::row(a, row0 + r) : nullptr;
#pragma unroll
      for (int f = 0; f < F; ++f)
        acc[r][f] = 0.0f;
    }
#pragma unroll
    for (int j0 = 0; j0 < J; j0 += UJ) {
      unsigned wv[UJ][F][VW];
      float sv[UJ][F][VW];
#pragma unroll
      for (int j = 0; j < UJ; ++j) {
        const int c = lane + 32 * (j0 + j);
#pragma unroll
        for (int f = 0; f < F; ++f) {
          if (c < C) {
            const unsigned *p = wrow[f] + VW * c;
            if constexpr (VW == 4) {
              const uint4 v = load_stream16(p);
              wv[j][f][0] = v.x, wv[j][f][1] = v.y;
              wv[j][f][2] = v.z, wv[j][f][3] = v.w;
            } else if constexpr (VW == 2) {
              const uint2 v = load_stream8(p);
              wv[j][f][0] = v.x, wv[j][f][1] = v.y;
            } else {
              wv[j][f][0] = __ldg(p);
            }
#pragma unroll
            for (int v = 0; v < VW; ++v)
              sv[j][f][v] = __ldg(srow[f] + (8 * (VW * c + v)) / S::kGroupSize);
          } else {
#pragma unroll
            for (int v = 0; v < VW; ++v)
              wv[j][f][v] = 0x88888888u, sv[j][f][v] = 0.0f;
          }
        }
      }
#pragma unroll
      for (int j = 0; j < UJ; ++j) {
        const int c = lane + 32 * (j0 + j);
        if (j0 + j >= J || c >= C)
          continue;
#pragma unroll
        for (int v = 0; v < VW; ++v) {
          const int k = 8 * (VW * c + v);
          float wf[F][8];
#pragma unroll
          for (int f = 0; f < F; ++f)
            int4x8_to_f32(wv[j][f][v], wf[f]);
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (r < rows) {
              float xv[8];
              load4_act(xr[r] + k, xv);
              load4_act(xr[r] + k + 4, xv + 4);
#pragma unroll
              for (int f = 0; f < F; ++f) {
                float p = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e)
                  p = fmaf(wf[f][e], xv[e], p);
                acc[r][f] = fmaf(sv[j][f][v], p, acc[r][f]);
              }
            }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const float v = warp_sum(acc[r][f]); // a fixed butterfly
        if (lane == 0 && n0 + f < S::N && r < rows)
          S::store(a, row0 + r, n0 + f, v);
      }
  }
}

} // namespace nf

#endif // NF_KERNELS_LINEAR_INT4_CUH
