// Linear layers on output tiles and GEMV items: nf::linear, the kernel of
// prefill steps (and of decode linears with weights other than bf16 or K
// not a multiple of 32). The spec S: nf_linear_groups.cuh.
//
// Strategy, chosen per group at run time from its row count:
//   - few rows (<= kGemvRows): one warp per output feature n streams W[n, :]
//     with 16-byte loads and dots it with every row (GEMV; weight-bandwidth
//     bound, each weight byte read once);
//   - more rows: 64x64 output tiles, 16-deep K slices staged in shared memory
//     (weights converted to f32 on the way), 4x4 outputs per thread, the next
//     slice prefetched into registers while the current one is multiplied.
// Both run in the same launch: every block first takes tiles (block-strided),
// then every warp takes GEMV items (warp-strided). f32 accumulation. With
// bf16 weights on sm_80+, the tiles run on tensor cores instead (mma_tile:
// 64 x 128 tiles, activations split into three bf16 terms, so products stay
// exact and only the summation order changes; big_mma_tile: 128 x 128 tiles
// for activations rounded to bf16, --matmul-inputs=bf16).
//
// Quantised weights (fp8e4m3 codes, S::kRowScales) take the f32 paths, each
// output scaled by its feature's scale (scaled_output).
//
// Decode steps with bf16 weights use skinny_linear instead
// (nf_linear_skinny.cuh: tensor cores with the operands swapped, for a
// few rows per weight) or row_linear (nf_linear_row.cuh).
#ifndef NF_KERNELS_LINEAR_GEMM_CUH
#define NF_KERNELS_LINEAR_GEMM_CUH

#include "nf_common.cuh"
#include "nf_linear_groups.cuh"
#include "nf_mma.cuh"
#include "nf_wgmma.cuh"

namespace nf {

constexpr int kGemvRows = 8;
constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kLinearThreads = 256;

/// Four consecutive elements [k, k + 4) of a row of K elements, zero past K.
template <int K, class T>
__device__ __forceinline__ void load4_row(const T *row, int k, float *out,
                                          bool activation) {
  if (row == nullptr) {
    out[0] = out[1] = out[2] = out[3] = 0.0f;
    return;
  }
  if (K % 4 == 0) {
    if (k < K) {
      if (activation)
        load4_act(reinterpret_cast<const float *>(row) + k, out);
      else
        load4(row + k, out);
    } else {
      out[0] = out[1] = out[2] = out[3] = 0.0f;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    out[i] = k + i < K ? to_float(row[k + i]) : 0.0f;
}

/// One 64x64 output tile: rows [row0, row0 + rows) of group g (global row
/// indices), features [n0, n0 + 64).
template <class S>
__device__ __forceinline__ void gemm_tile(Step a, int g, int row0, int rows,
                                          int n0, float (*As)[kTileM + 4],
                                          float (*Bs)[kTileN + 4]) {
  using W = typename S::W;
  const int tid = threadIdx.x;
  // Loader: thread -> (row / feature lr, k offset lk) of the 64x16 slices.
  const int lr = tid >> 2, lk = (tid & 3) * 4;
  const float *xrow = lr < rows ? S::row(a, row0 + lr) : nullptr;
  const int wn = n0 + lr;
  const W *wrow =
      wn < S::N ? S::weight(a, g) + static_cast<long long>(wn) * S::K : nullptr;
  // Compute: thread -> rows ty*4 + i, features tx + 16*j.
  const int ty = tid >> 4, tx = tid & 15;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      acc[i][j] = 0.0f;
  float ra[4], rb[4];
  load4_row<S::K>(xrow, lk, ra, true);
  load4_row<S::K>(wrow, lk, rb, false);
  for (int k0 = 0; k0 < S::K; k0 += kTileK) {
    __syncthreads(); // the previous slice is consumed
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      As[lk + i][lr] = ra[i];
      Bs[lk + i][lr] = rb[i];
    }
    __syncthreads();
    if (k0 + kTileK < S::K) { // prefetch the next slice
      load4_row<S::K>(xrow, k0 + kTileK + lk, ra, true);
      load4_row<S::K>(wrow, k0 + kTileK + lk, rb, false);
    }
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 av = *reinterpret_cast<const float4 *>(&As[kk][ty * 4]);
      const float b[4] = {Bs[kk][tx], Bs[kk][tx + 16], Bs[kk][tx + 32],
                          Bs[kk][tx + 48]};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[0][j] = fmaf(av.x, b[j], acc[0][j]);
        acc[1][j] = fmaf(av.y, b[j], acc[1][j]);
        acc[2][j] = fmaf(av.z, b[j], acc[2][j]);
        acc[3][j] = fmaf(av.w, b[j], acc[3][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i;
    if (r >= rows)
      continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n < S::N)
        S::store(a, row0 + r, n, scaled_output<S>(a, g, n, acc[i][j]));
    }
  }
}

// ---------------------------------------------------------------------------
// Tensor-core tiles for bf16 weights (sm_80+): mma.sync m16n8k16 bf16 with
// f32 accumulation. Weights are exact in bf16; each f32 activation is split
// into three bf16 terms (x = hi + mid + lo to 2^-24 relative), so every
// product is the f32 product and only the summation order differs from the
// f32 SIMT path. 64 x 128 output tiles, 8 warps of 32 x 32, 32-deep K
// slices; the next slice is prefetched into registers.

constexpr int kMmaTileN = 128, kMmaTileK = 32, kMmaPad = 8;

template <int TERMS> struct MmaSmem {
  unsigned short a[TERMS][kTileM][kMmaTileK + kMmaPad]; // hi, mid, lo
  unsigned short b[kMmaTileN][kMmaTileK + kMmaPad];
};

/// Stores a warp's MI x 4 accumulator fragments (m16n8k16 C layout) of an
/// output tile of group g at (row0, n0) (scaled_output: quantised weights'
/// row scales): the warp's rows start at wm * 16 * MI, its
/// features at wn * 32; rows past `rows` and features past S::N are skipped.
template <class S, int MI>
__device__ __forceinline__ void
store_warp_tile(Step a, const float (&acc)[MI][4][4], int g, int row0, int rows,
                int n0, int wm, int wn) {
  const int lane = lane_id(), gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = wm * 16 * MI + i * 16 + gid + (c >> 1) * 8;
        const int n = n0 + wn * 32 + j * 8 + 2 * tig + (c & 1);
        if (r < rows && n < S::N)
          S::store(a, row0 + r, n, scaled_output<S>(a, g, n, acc[i][j][c]));
      }
}

/// The mma tiles' register staging of a K slice from column k: the f32
/// activations of `row` (4 at a time) and two 16-byte runs of bf16 weights
/// of `wrow` (through the read-only cache); zeros for a null row and past K.
template <int K, int N>
__device__ __forceinline__ void load_act_slice(float (&r)[N], const float *row,
                                               int k) {
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    const int ki = k + i;
    if (row && ki < K)
      load4_act(row + ki, r + i);
    else
      r[i] = r[i + 1] = r[i + 2] = r[i + 3] = 0.0f;
  }
}
template <int K>
__device__ __forceinline__ void load_weight_slice(uint4 (&r)[2],
                                                  const bf16 *wrow, int k) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int ki = k + 8 * i;
    r[i] = wrow && ki < K ? __ldg(reinterpret_cast<const uint4 *>(wrow + ki))
                          : make_uint4(0u, 0u, 0u, 0u);
  }
}

template <class S, int TERMS>
__device__ __forceinline__ void mma_tile(Step a, int g, int row0, int rows,
                                         int n0, MmaSmem<TERMS> &sm) {
  static_assert(S::K % 8 == 0, "16-byte weight rows");
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  // Loader: A 64 x 32 f32 (8 per thread), B 128 x 32 bf16 (16 per thread).
  const int ar = tid >> 2, ak = (tid & 3) * 8;
  const float *xrow = ar < rows ? S::row(a, row0 + ar) : nullptr;
  const int bn = tid >> 1, bk = (tid & 1) * 16;
  const bf16 *wrow =
      n0 + bn < S::N ? S::weight(a, g) + static_cast<long long>(n0 + bn) * S::K
                     : nullptr;
  float ra[8];
  uint4 rb[2];
  auto fetch = [&](int k0) {
    load_act_slice<S::K>(ra, xrow, k0 + ak);
    load_weight_slice<S::K>(rb, wrow, k0 + bk);
  };
  // Warp tile: rows wm*32 .. +32, features wn*32 .. +32.
  const int wm = warp >> 2, wn = warp & 3, gid = lane >> 2, tig = lane & 3;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        acc[i][j][c] = 0.0f;
  fetch(0);
  for (int k0 = 0; k0 < S::K; k0 += kMmaTileK) {
    __syncthreads(); // the previous slice is consumed
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      unsigned short t0[3], t1[3];
      split_bf16<TERMS>(ra[i], t0);
      split_bf16<TERMS>(ra[i + 1], t1);
#pragma unroll
      for (int sp = 0; sp < TERMS; ++sp)
        *reinterpret_cast<unsigned *>(&sm.a[sp][ar][ak + i]) =
            t0[sp] | (static_cast<unsigned>(t1[sp]) << 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      unsigned *dst = reinterpret_cast<unsigned *>(&sm.b[bn][bk + 8 * i]);
      dst[0] = rb[i].x;
      dst[1] = rb[i].y;
      dst[2] = rb[i].z;
      dst[3] = rb[i].w;
    }
    __syncthreads();
    if (k0 + kMmaTileK < S::K)
      fetch(k0 + kMmaTileK);
    // The slice's sum in its own accumulator, added to the total with f32
    // adds: tensor-core accumulation truncates, and over a long K that bias
    // would add up (measured: 3e-5 relative at K = 2688; per slice it stays
    // at rounding level).
    float part[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          part[i][j][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kMmaTileK; kk += 16) {
      unsigned bf[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn * 32 + j * 8 + gid;
        load_b_frag(bf[j], &sm.b[n][kk + 2 * tig]);
      }
#pragma unroll
      for (int sp = TERMS - 1; sp >= 0; --sp) { // small terms first
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = wm * 32 + i * 16 + gid;
          unsigned af[4];
          load_a_frag<kMmaTileK + kMmaPad>(af, &sm.a[sp][r][kk + 2 * tig]);
#pragma unroll
          for (int j = 0; j < 4; ++j)
            mma_bf16(part[i][j], af, bf[j][0], bf[j][1]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          acc[i][j][c] += part[i][j][c];
  }
  store_warp_tile<S>(a, acc, g, row0, rows, n0, wm, wn);
}

// ---------------------------------------------------------------------------
// Large tensor-core tiles for bf16 inputs (--matmul-inputs=bf16): 128 x 128
// outputs, 8 warps of 64 x 32, 32-deep K slices double-buffered in shared
// memory (one barrier per slice; the next slice's global loads are in flight
// while the current one is multiplied), fragments read with ldmatrix, the
// whole K accumulated on the tensor cores (as cuBLAS does for bf16).

constexpr int kBigTileM = 128;

struct BigMmaSmem {
  unsigned short a[2][kBigTileM][kMmaTileK + kMmaPad];
  unsigned short b[2][kMmaTileN][kMmaTileK + kMmaPad];
};

template <class S>
__device__ __forceinline__ void big_mma_tile(Step a, int g, int row0, int rows,
                                             int n0, BigMmaSmem &sm) {
  static_assert(S::K % 8 == 0, "16-byte weight rows");
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  // Loader: A 128 x 32 f32 (16 per thread: row tid / 2, half (tid & 1)),
  // B 128 x 32 bf16 (16 per thread: feature tid / 2, half (tid & 1)).
  const int lr = tid >> 1, lk = (tid & 1) * 16;
  const float *xrow = lr < rows ? S::row(a, row0 + lr) : nullptr;
  const bf16 *wrow =
      n0 + lr < S::N ? S::weight(a, g) + static_cast<long long>(n0 + lr) * S::K
                     : nullptr;
  float ra[16];
  uint4 rb[2];
  auto fetch = [&](int k0) {
    load_act_slice<S::K>(ra, xrow, k0 + lk);
    load_weight_slice<S::K>(rb, wrow, k0 + lk);
  };
  auto stash = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 16; i += 2)
      *reinterpret_cast<unsigned *>(&sm.a[buf][lr][lk + i]) =
          pack_bf16x2(f32_to_bf16_rn(ra[i]), f32_to_bf16_rn(ra[i + 1]));
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint4 *>(&sm.b[buf][lr][lk + 8 * i]) = rb[i];
  };
  // Warp tile: rows wm*64 .. +64 (4 m16), features wn*32 .. +32 (4 n8).
  const int wm = warp >> 2, wn = warp & 3;
  float acc[4][4][4] = {};
  __syncthreads(); // the previous tile is done with the buffers
  fetch(0);
  stash(0);
  __syncthreads();
  int buf = 0;
  for (int k0 = 0; k0 < S::K; k0 += kMmaTileK) {
    const bool more = k0 + kMmaTileK < S::K;
    if (more)
      fetch(k0 + kMmaTileK);
#pragma unroll
    for (int kk = 0; kk < kMmaTileK; kk += 16) {
      unsigned af[4][4], bfr[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ldmatrix_x4(
            af[i],
            &sm.a[buf][wm * 64 + i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        ldmatrix_x4(bfr[jj],
                    &sm.b[buf][wn * 32 + jj * 16 + (lane >> 4) * 8 + (lane & 7)]
                         [kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma_bf16(acc[i][j], af[i], bfr[j >> 1][(j & 1) * 2],
                   bfr[j >> 1][(j & 1) * 2 + 1]);
    }
    if (more)
      stash(buf ^ 1);
    __syncthreads();
    buf ^= 1;
  }
  store_warp_tile<S>(a, acc, g, row0, rows, n0, wm, wn);
}

// ---------------------------------------------------------------------------
// Pipelined tensor-core tiles for prefill with bf16 weights: the activation
// rows were first split into TERMS bf16 planes (split_rows_bf16, one launch
// before the GEMM: 1 plane = rounded to bf16, 3 planes = exact products),
// so both operands stream into shared memory with cp.async, kGemmStages
// 32-deep K slices in flight. 128 x 128 outputs, 8 warps of 64 x 32,
// fragments by ldmatrix, the whole K accumulated on the tensor cores (for
// TERMS 3 each fragment takes the planes small first). The spec adds
//   static const unsigned short *row16(a, r);   // plane 0 of row r
//   static constexpr long long PLANE;            // elements between planes

/// Plane p of row r = bf16 term p of the f32 row (split_bf16<TERMS>):
/// rows [0, a->num_tokens * RPT) of a [rows, K] f32 activation.
template <int TERMS, int K, int RPT, long long PLANE>
__device__ void split_rows_bf16(Step a, const float *src, unsigned short *dst) {
  static_assert(K % 4 == 0, "rows of whole float4s");
  const long long n = static_cast<long long>(a->num_tokens) * RPT * (K / 4);
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    uint2 t[3];
    split4_bf16<TERMS>(reinterpret_cast<const float4 *>(src)[i], t);
#pragma unroll
    for (int p = 0; p < TERMS; ++p)
      reinterpret_cast<uint2 *>(dst + p * PLANE)[i] = t[p];
  }
}

/// Rows [0, a->num_tokens * RPT) of a [rows, K] f32 activation quantised to
/// FP8 E4M3 and back to f32, as the CPU backend's fakeQuantE4M3 computes
/// them (bit for bit): with the static scale *scale, or (scale null) each
/// row's max|x| / 448 in f64 (1 for a row of zeros); x / s in f64, clamped
/// to +-448, rounded to f32, then to E4M3, then times s in f64, rounded to
/// f32. A warp per row.
template <int K, int RPT>
__device__ void quantize_rows_e4m3(Step a, const float *src, float *dst,
                                   const float *scale) {
  const long long rows = static_cast<long long>(a->num_tokens) * RPT;
  const int lane = lane_id();
  for (long long r = global_warp(a); r < rows; r += grid_warps(a)) {
    const float *x = src + r * K;
    float *y = dst + r * K;
    double s;
    if (scale) {
      s = *scale;
    } else {
      float amax = 0.0f;
      for (int k = lane; k < K; k += 32)
        amax = fmaxf(amax, fabsf(x[k]));
      amax = warp_max(amax);
      s = amax == 0.0f ? 1.0 : static_cast<double>(amax) / 448.0;
    }
    for (int k = lane; k < K; k += 32) {
      double q = static_cast<double>(x[k]) / s;
      q = q < -448.0 ? -448.0 : q > 448.0 ? 448.0 : q; // NaN stays
      y[k] = static_cast<float>(
          static_cast<double>(round_to_e4m3(static_cast<float>(q))) * s);
    }
  }
}

/// A weight of COUNT FP8 E4M3 codes widened to bf16 bits (the same values:
/// codes are exact in bf16), for the plane GEMMs, which read bf16 weights
/// and scale each output by its row's scale (scaled_output).
template <long long COUNT>
__device__ void widen_fp8_codes(const fp8e4m3 *src, bf16 *dst) {
  constexpr long long kVectors = COUNT / 16;
  for (long long i = global_thread(); i < kVectors; i += grid_threads()) {
    const uint4 c = load_stream16(src + 16 * i);
    const uint2 p0 = fp8x4_to_bf16x4(c.x), p1 = fp8x4_to_bf16x4(c.y),
                p2 = fp8x4_to_bf16x4(c.z), p3 = fp8x4_to_bf16x4(c.w);
    uint4 *d = reinterpret_cast<uint4 *>(dst) + 2 * i;
    d[0] = make_uint4(p0.x, p0.y, p1.x, p1.y);
    d[1] = make_uint4(p2.x, p2.y, p3.x, p3.y);
  }
  for (long long i = 16 * kVectors + global_thread(); i < COUNT;
       i += grid_threads())
    dst[i].bits =
        static_cast<unsigned short>(fp8x2_to_bf16x2(src[i].bits, 0x1404u));
}

constexpr int kGemmTile = 128, kGemmK = 32, kGemmLd = kGemmK + 8;
template <int TERMS> __host__ __device__ constexpr int gemm_stages() {
  return TERMS == 1 ? 4 : 3;
}
/// Dynamic shared memory of pipelined_mma_tile, in bytes.
template <int TERMS> __host__ __device__ constexpr int pipelined_gemm_smem() {
  return gemm_stages<TERMS>() * (TERMS + 1) * kGemmTile * kGemmLd * 2;
}

/// Barrier of the kLinearThreads threads that run pipelined_mma_tile: the
/// whole block, or its first 256 threads where the block is larger (the
/// kWsThreads of a warp-specialised launch running this PTX fallback).
__device__ __forceinline__ void tile_threads_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kLinearThreads) : "memory");
}

template <class S, int TERMS>
__device__ __forceinline__ void pipelined_mma_tile(Step a, int g, int row0,
                                                   int rows, int n0,
                                                   unsigned short *smem) {
  static_assert(S::K % 8 == 0, "16-byte rows");
  constexpr int ST = gemm_stages<TERMS>(), BM = kGemmTile, LD = kGemmLd;
  constexpr int A_ELEMS = TERMS * BM * LD, STAGE = A_ELEMS + BM * LD;
  constexpr int KT = (S::K + kGemmK - 1) / kGemmK;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  // Loader: chunk c = tid + 256 j (j < 2) is row c / 4, K offset (c % 4) * 8
  // of the A planes and of the B (weight) tile.
  const bf16 *wbase = S::weight(a, g);
  const unsigned short *arow[2];
  const bf16 *brow[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int c = tid + 256 * j, r = c >> 2, kc = (c & 3) * 8;
    arow[j] = r < rows ? S::row16(a, row0 + r) + kc : nullptr;
    brow[j] = n0 + r < S::N ? wbase + static_cast<long long>(n0 + r) * S::K + kc
                            : nullptr;
  }
  auto load_stage = [&](int stage, int k0) {
    unsigned short *sA = smem + stage * STAGE, *sB = sA + A_ELEMS;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = tid + 256 * j, r = c >> 2, kc = (c & 3) * 8;
      const bool kin = k0 + kc < S::K;
#pragma unroll
      for (int p = 0; p < TERMS; ++p)
        copy_async16_or_zero(
            &sA[(p * BM + r) * LD + kc],
            arow[j] ? static_cast<const void *>(arow[j] + p * S::PLANE + k0)
                    : wbase, // not read
            arow[j] && kin);
      copy_async16_or_zero(&sB[r * LD + kc],
                           brow[j] ? static_cast<const void *>(brow[j] + k0)
                                   : wbase, // not read
                           brow[j] && kin);
    }
  };
  const int wm = warp >> 2, wn = warp & 3;
  float acc[4][4][4] = {};
  tile_threads_sync(); // the previous tile is done with the stages
#pragma unroll
  for (int st = 0; st < ST - 1; ++st) {
    if (st < KT)
      load_stage(st, st * kGemmK);
    copy_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    copy_async_wait<ST - 2>(); // slice kt has landed (this thread's part)
    tile_threads_sync();       // everyone's part; slice kt - 1 is consumed
    if (kt + ST - 1 < KT)
      load_stage((kt + ST - 1) % ST, (kt + ST - 1) * kGemmK);
    copy_async_commit();
    const unsigned short *sA = smem + (kt % ST) * STAGE, *sB = sA + A_ELEMS;
    // Exact inputs: each slice in its own accumulator, added with f32 adds
    // (tensor-core accumulation truncates; see mma_tile). bf16 inputs: the
    // whole K on the tensor cores.
    float part[4][4][4] = {};
    float(&sum)[4][4][4] = TERMS > 1 ? part : acc;
#pragma unroll
    for (int kk = 0; kk < kGemmK; kk += 16) {
      unsigned af[TERMS][4][4], bfr[2][4];
#pragma unroll
      for (int p = 0; p < TERMS; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          ldmatrix_x4(af[p][i],
                      &sA[(p * BM + wm * 64 + i * 16 + (lane & 15)) * LD + kk +
                          (lane >> 4) * 8]);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        ldmatrix_x4(
            bfr[jj],
            &sB[(wn * 32 + jj * 16 + (lane >> 4) * 8 + (lane & 7)) * LD + kk +
                ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int p = TERMS - 1; p >= 0; --p) // small terms first
            mma_bf16(sum[i][j], af[p][i], bfr[j >> 1][(j & 1) * 2],
                     bfr[j >> 1][(j & 1) * 2 + 1]);
    }
    if (TERMS > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            acc[i][j][c] += part[i][j][c];
    }
  }
  copy_async_wait<0>(); // only empty groups remain; none may outlive the tile
  store_warp_tile<S>(a, acc, g, row0, rows, n0, wm, wn);
}

template <class T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<bf16> { static constexpr bool value = true; };

/// Output feature n for `count` (<= kGemvRows) rows starting at `begin`.
/// Rows stored as bf16 (HasRowsBf16) are read through S::row16.
template <class S> __device__ __forceinline__ auto gemv_row(Step a, int r) {
  if constexpr (HasRowsBf16<S>::value)
    return S::row16(a, r);
  else
    return S::row(a, r);
}

/// kCodes: the GEMV reads the FP8 codes (S::codes, HasCodesOnLoad) instead
/// of S::weight, their widened copy, which no launch writes where the GEMM
/// widens codes as it loads them.
template <class S, bool kCodes> struct GemvWeight {
  using W = typename S::W;
  __device__ static __forceinline__ const W *of(Step a, int g) {
    return S::weight(a, g);
  }
};
template <class S> struct GemvWeight<S, true> {
  using W = fp8e4m3;
  __device__ static __forceinline__ const W *of(Step a, int g) {
    return S::codes(a, g);
  }
};

template <class S, bool kCodes = false>
__device__ __forceinline__ void gemv_item(Step a, int g, int begin, int count,
                                          int n, int lane) {
  using W = typename GemvWeight<S, kCodes>::W;
  constexpr int V = Vec16<W>::N;
  const W *w =
      GemvWeight<S, kCodes>::of(a, g) + static_cast<long long>(n) * S::K;
  decltype(gemv_row<S>(a, 0)) x[kGemvRows];
  float acc[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    x[r] = r < count ? gemv_row<S>(a, begin + r) : nullptr;
    acc[r] = 0.0f;
  }
  if (S::K % V == 0) {
    for (int k = lane * V; k < S::K; k += 32 * V) {
      float wv[V];
      load16(w + k, wv);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r < count) {
          float xv[V];
#pragma unroll
          for (int v = 0; v < V; v += 4)
            load4_act(x[r] + k + v, xv + v);
#pragma unroll
          for (int v = 0; v < V; ++v)
            acc[r] = fmaf(wv[v], xv[v], acc[r]);
        }
      }
    }
  } else {
    for (int k = lane; k < S::K; k += 32) {
      const float wk = load(w, k);
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
        if (r < count) {
          float xk;
          if constexpr (HasRowsBf16<S>::value)
            xk = bf16_bits_to_f32(x[r][k]);
          else
            xk = x[r][k];
          acc[r] = fmaf(wk, xk, acc[r]);
        }
    }
  }
  float mine = 0.0f;
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (r < count) {
      const float s = warp_sum(acc[r]);
      if (lane == r)
        mine = s;
    }
  }
  if (lane < count)
    S::store(a, begin + lane, n, scaled_output<S>(a, g, n, mine));
}

/// kPlanes: the rows were split into bf16 planes by split_rows_bf16 (S has
/// row16 / PLANE; launched with pipelined_gemm_smem<TERMS>() bytes of
/// dynamic shared memory): tiles use pipelined_mma_tile, or with kWgmma
/// (launched with at least wgmma_gemm_smem<TERMS>() bytes) wgmma_tile where
/// compiled for sm_90a. kWsTileN > 0 (bf16 inputs with kWgmma; launched with
/// kWsThreads threads and at least wgmma_ws_smem<kWsTileN>() bytes): the
/// sm_90a cubin runs the warp-specialised wgmma_ws_gemm on 128 x kWsTileN
/// tiles instead, and the PTX fallback runs pipelined_mma_tile on the first
/// kLinearThreads threads.
template <class S, int TERMS = 3, bool kPlanes = false, bool kWgmma = false,
          int kWsTileN = 0>
__device__ void linear(Step a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool kMma = IsBf16<typename S::W>::value && S::K % 8 == 0;
#else
  constexpr bool kMma = false;
#endif
  constexpr bool kPipe = kMma && kPlanes;
  constexpr bool kBig = kMma && TERMS == 1 && !kPipe;
#ifdef NF_HAS_WGMMA
  constexpr bool kWs = kPipe && kWgmma && TERMS == 1 && kWsTileN > 0;
#else
  constexpr bool kWs = false;
#endif
  constexpr int TN = kWs ? kWsTileN : kMma ? kMmaTileN : kTileN;
  constexpr int TM = kPipe ? kGemmTile : kBig ? kBigTileM : kTileM;
  constexpr int NT = (S::N + TN - 1) / TN;
  constexpr int kSimtBytes = 2 * kTileK * (kTileM + 4) * sizeof(float);
  constexpr int kTileBytes = kPipe  ? 16 // dynamic shared memory instead
                             : kBig ? static_cast<int>(sizeof(BigMmaSmem))
                             : kMma ? static_cast<int>(sizeof(MmaSmem<TERMS>))
                                    : kSimtBytes;
  __shared__ GroupItems<S> s_groups;
  __shared__ __align__(16) unsigned char s_tiles[kTileBytes];
  const int lane = lane_id();
  // Tiles of the groups with more than kGemvRows rows.
  s_groups.build(
      a, [](int c) { return c > kGemvRows ? (c + TM - 1) / TM * NT : 0; });
  const int *s_begin = s_groups.begin, *s_count = s_groups.count;
  const int tiles = s_groups.total();
  // Tile t: group g, its rows [row0, row0 + rows) and features from n0.
  auto tile_of = [&](int t, int &g, int &row0, int &rows, int &n0) {
    g = s_groups.group_of(t);
    const int local = t - s_groups.first[g];
    const int mt = local / NT;
    row0 = s_begin[g] + mt * TM;
    rows = min(TM, s_count[g] - mt * TM);
    n0 = (local % NT) * TN;
  };
#ifdef NF_HAS_WGMMA
  if constexpr (kWs) {
    extern __shared__ float4 nf_gemm_smem[];
    wgmma_ws_gemm<S, kWsTileN>(a, tiles, tile_of,
                               reinterpret_cast<unsigned char *>(nf_gemm_smem));
  }
#endif
  // Threads past kLinearThreads (a kWsThreads launch running the PTX
  // fallback) take no tiles.
  const int tileBlocks =
      kWs || (kPipe && threadIdx.x >= kLinearThreads) ? 0 : tiles;
  for (int tile = blockIdx.x; tile < tileBlocks; tile += gridDim.x) {
    int g, row0, rows, n0;
    tile_of(tile, g, row0, rows, n0);
    if constexpr (kPipe) {
      extern __shared__ float4 nf_gemm_smem[];
#ifdef NF_HAS_WGMMA
      if constexpr (kWgmma && !kWs) {
        static_assert(kWgTile == TM && kWgTile == TN, "same tiles");
        wgmma_tile<S, TERMS>(a, g, row0, rows, n0,
                             reinterpret_cast<unsigned char *>(nf_gemm_smem));
        continue;
      }
#endif
      pipelined_mma_tile<S, TERMS>(
          a, g, row0, rows, n0,
          reinterpret_cast<unsigned short *>(nf_gemm_smem));
    } else if constexpr (kBig) {
      big_mma_tile<S>(a, g, row0, rows, n0,
                      *reinterpret_cast<BigMmaSmem *>(s_tiles));
    } else if constexpr (kMma) {
      mma_tile<S, TERMS>(a, g, row0, rows, n0,
                         *reinterpret_cast<MmaSmem<TERMS> *>(s_tiles));
    } else {
      gemm_tile<S>(
          a, g, row0, rows, n0, reinterpret_cast<float(*)[kTileM + 4]>(s_tiles),
          reinterpret_cast<float(*)[kTileN + 4]>(s_tiles + kSimtBytes / 2));
    }
  }
  // GEMV items of the groups with 1..kGemvRows rows.
  const long long items = static_cast<long long>(S::G) * S::N;
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    const int g = static_cast<int>(item / S::N);
    const int c = s_count[g];
    if (c == 0 || c > kGemvRows)
      continue;
    gemv_item<S, kWs && HasCodesOnLoad<S>::value>(
        a, g, s_begin[g], c, static_cast<int>(item % S::N), lane);
  }
}

} // namespace nf

#endif // NF_KERNELS_LINEAR_GEMM_CUH
