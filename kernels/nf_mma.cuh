// Tensor-core primitives shared by the GEMM (nf_linear.cuh) and attention
// (nf_attention.cuh) kernels: mma.sync m16n8k16 with bf16 operands and f32
// accumulation (sm_80+), bf16 conversion, and the split of an f32 value into
// bf16 terms that keeps products exact.
//
// Fragment layout of m16n8k16 (g = lane / 4, c = lane % 4; PTX ISA, "Matrix
// Fragments for mma.m16n8k16"): A (16 x 16, row-major) a0 = A[g][2c..2c+1],
// a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]; B (16 x 8,
// column-major) b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]; C (16 x 8)
// c0, c1 = C[g][2c..2c+1], c2, c3 = C[g+8][2c..2c+1]. A pair of elements
// is one 32-bit register, the lower index in the low half.
#ifndef NF_KERNELS_MMA_CUH
#define NF_KERNELS_MMA_CUH

#include "nf_common.cuh"

namespace nf {

__device__ __forceinline__ void mma_bf16(float *c, const unsigned *a,
                                         unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// A lane's weights of one K step where a warp multiplies MT tiles of 16
/// features as mma's A operand (skinny_linear, feature_tile_linear: rows gid
/// and gid + 8 of each tile from column 8 tig, null past N), 8 values a row,
/// as loaded: bf16 (16 bytes a row) or FP8 E4M3 codes (8 bytes). Codes stay
/// codes in the load ring and are widened only where the mma reads them
/// (widen): widened at the load, every conversion waits for its load, and
/// the ring's later loads are no longer in flight across the loop.
template <class W> struct WeightStep;
template <> struct WeightStep<bf16> {
  using Vec = uint4;
  __device__ static __forceinline__ Vec load(const bf16 *p) {
    return load_stream16(p);
  }
  __device__ static __forceinline__ uint4 widen(Vec v) { return v; }
};
template <> struct WeightStep<fp8e4m3> {
  using Vec = uint2;
  __device__ static __forceinline__ Vec load(const fp8e4m3 *p) {
    return load_stream8(p);
  }
  /// The bf16 layout of the bf16 Vec (fp8x4_to_bf16x4: exact).
  __device__ static __forceinline__ uint4 widen(Vec c) {
    const uint2 lo = fp8x4_to_bf16x4(c.x), hi = fp8x4_to_bf16x4(c.y);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
};

/// K step ks of those rows, streamed past L1, 32 values a step; zeros for
/// null rows and from KSTEPS on.
template <int KSTEPS, int MT, class W>
__device__ __forceinline__ void
load_weight_step(typename WeightStep<W>::Vec (&wv)[MT][2],
                 const W *const (&wr)[MT][2], int ks) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wv[mt][h] = wr[mt][h] && ks < KSTEPS
                      ? WeightStep<W>::load(wr[mt][h] + ks * 32)
                      : typename WeightStep<W>::Vec{};
}

/// A K step's loaded weights in the bf16 layout mma reads.
template <int MT, class W>
__device__ __forceinline__ void
widen_weight_step(uint4 (&out)[MT][2],
                  const typename WeightStep<W>::Vec (&wv)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      out[mt][h] = WeightStep<W>::widen(wv[mt][h]);
}

/// Stores a warp's MT x NT accumulator tiles of such a product (mma's C
/// layout: features n0 + 16 mt + gid (+ 8), rows 8 nt + 2 tig (+ 1)) of
/// group g by S::store (scaled_output: quantised weights' row scales),
/// those within N and `rows`.
template <class S, int MT, int NT>
__device__ __forceinline__ void
store_mma_tiles(Step a, const float (&acc)[MT][NT][4], int g, int row0,
                int rows, int n0, int lane) {
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + mt * 16 + gid + (c >> 1) * 8;
        const int r = nt * 8 + 2 * tig + (c & 1);
        if (n < S::N && r < rows)
          S::store(a, row0 + r, n, scaled_output<S>(a, g, n, acc[mt][nt][c]));
      }
}

__device__ __forceinline__ unsigned pack_bf16x2(unsigned short lo,
                                                unsigned short hi) {
  return static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
}

/// TERMS bf16 terms of x: 3 (hi, mid, lo: x to 2^-24 relative, exact
/// products) or 1 (x rounded to bf16, as bf16 frameworks compute).
template <int TERMS>
__device__ __forceinline__ void split_bf16(float x, unsigned short (&t)[3]) {
  t[0] = f32_to_bf16_rn(x);
  if (TERMS > 1) {
    const float r1 = x - bf16_bits_to_f32(t[0]);
    t[1] = f32_to_bf16_rn(r1);
    t[2] = f32_to_bf16_rn(r1 - bf16_bits_to_f32(t[1]));
  }
}

/// TERMS bf16 terms of four consecutive values; term p as the packed pairs
/// (x, y) and (z, w), eight bytes ready to store.
template <int TERMS>
__device__ __forceinline__ void split4_bf16(float4 v, uint2 (&t)[3]) {
  unsigned short x[3], y[3], z[3], w[3];
  split_bf16<TERMS>(v.x, x);
  split_bf16<TERMS>(v.y, y);
  split_bf16<TERMS>(v.z, z);
  split_bf16<TERMS>(v.w, w);
#pragma unroll
  for (int p = 0; p < TERMS; ++p)
    t[p] = make_uint2(pack_bf16x2(x[p], y[p]), pack_bf16x2(z[p], w[p]));
}

/// The A fragment (16 rows x 16 k) of a row-major bf16 tile whose rows are
/// STRIDE elements apart; p points at element (lane / 4, k0 + 2 (lane % 4)).
template <int STRIDE>
__device__ __forceinline__ void load_a_frag(unsigned (&a)[4],
                                            const unsigned short *p) {
  a[0] = *reinterpret_cast<const unsigned *>(p);
  a[1] = *reinterpret_cast<const unsigned *>(p + 8 * STRIDE);
  a[2] = *reinterpret_cast<const unsigned *>(p + 8);
  a[3] = *reinterpret_cast<const unsigned *>(p + 8 * STRIDE + 8);
}

/// The B fragment (16 k x 8 n) of a bf16 tile stored n-major (B[k][n] at
/// [n][k]); p points at element (n0 + lane / 4, k0 + 2 (lane % 4)).
__device__ __forceinline__ void load_b_frag(unsigned (&b)[2],
                                            const unsigned short *p) {
  b[0] = *reinterpret_cast<const unsigned *>(p);
  b[1] = *reinterpret_cast<const unsigned *>(p + 8);
}

/// c (+)= A B over the bf16 term pairs (i, j) with i + j < TERMS, smallest
/// first (3 terms: products exact; 1: bf16 inputs). b(j, r): register r (0
/// or 1) of term j's B fragment.
template <int TERMS, class BFrag>
__device__ __forceinline__ void
mma_bf16_terms(float *c, const unsigned (&a)[TERMS][4], BFrag b) {
#pragma unroll
  for (int sum = TERMS - 1; sum >= 0; --sum)
#pragma unroll
    for (int ti = sum; ti >= 0; --ti)
      mma_bf16(c, a[ti], b(sum - ti, 0), b(sum - ti, 1));
}

/// The C fragments of two adjacent n-tiles (columns 16 kk .. 16 kk + 15 of
/// rows g and g + 8) as the A fragment of k-step kk, in TERMS bf16 terms:
/// a product's result reused as the next product's operand without shared
/// memory (FlashAttention's P).
template <int TERMS>
__device__ __forceinline__ void c_pair_to_a(const float (&c0)[4],
                                            const float (&c1)[4],
                                            unsigned (&a)[TERMS][4]) {
  unsigned short e[8][3];
  const float v[8] = {c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]};
#pragma unroll
  for (int u = 0; u < 8; ++u)
    split_bf16<TERMS>(v[u], e[u]);
#pragma unroll
  for (int te = 0; te < TERMS; ++te) {
    a[te][0] = pack_bf16x2(e[0][te], e[1][te]);
    a[te][1] = pack_bf16x2(e[2][te], e[3][te]);
    a[te][2] = pack_bf16x2(e[4][te], e[5][te]);
    a[te][3] = pack_bf16x2(e[6][te], e[7][te]);
  }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned *r, const void *p) {
  const unsigned addr =
      static_cast<unsigned>(__cvta_generic_to_shared(const_cast<void *>(p)));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// ldmatrix with each 8 x 8 matrix transposed: for a [k][n] row-major tile,
/// the mma B fragments (lanes 0-15 address rows k0..k0+15 at column n0,
/// lanes 16-31 the same rows at column n0 + 8: r[0..1] for n0, r[2..3] for
/// n0 + 8).
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned *r, const void *p) {
  const unsigned addr =
      static_cast<unsigned>(__cvta_generic_to_shared(const_cast<void *>(p)));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

} // namespace nf

#endif // NF_KERNELS_MMA_CUH
