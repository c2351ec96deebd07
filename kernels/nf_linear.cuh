// Linear layers: y[r, n] = sum_k x[r, k] * W[n, k] for one weight (nf.linear,
// nf.lm_head, nf_moe.latent_proj, the shared expert) or one weight per group
// of rows (routed experts: the rows of expert g are a contiguous range of the
// dispatch, W = weights[g]).
//
// A spec struct S, generated per op, describes the problem:
//   using W = float | nf::bf16 | nf::f16;  static constexpr int N, K, G;
//   static void group(a, g, int &begin, int &count);    // rows of group g
//   static const W *weight(a, g);                        // [N, K] row-major
//   static const float *row(a, r);                       // input row r, K f32
//   static void store(a, r, n, float v);                 // epilogue
// (DenseGroups / DispatchGroups below provide `group`).
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
// Decode steps use skinny_linear instead (below): tensor cores with the
// operands swapped, for a few rows per weight.
#ifndef NF_KERNELS_LINEAR_CUH
#define NF_KERNELS_LINEAR_CUH

#include "nf_common.cuh"
#include "nf_mma.cuh"
#include "nf_rows.cuh"
#include "nf_wgmma.cuh"

namespace nf {

constexpr int kGemvRows = 8;
constexpr int kTileM = 64, kTileN = 64, kTileK = 16;
constexpr int kLinearThreads = 256;

/// Groups of a dense layer: one group, every token row.
struct DenseGroups {
  static constexpr int G = 1;
  /// The rows come from the step's arguments, not from an earlier launch's
  /// output: a launch may fetch weights before waiting for the launches
  /// before it (programmatic dependent launch).
  static constexpr bool kGroupsEarly = true;
  __device__ static __forceinline__ void group(Step a, int, int &begin,
                                               int &count) {
    begin = 0;
    count = a->num_tokens;
  }
};

/// The LM head's one group: the rows whose logits the runtime reads (every
/// token's row when a->logit_rows is null); row r of the group is token row
/// logit_row(a, r).
struct LogitRowGroups {
  static constexpr int G = 1;
  static constexpr bool kGroupsEarly = true;
  __device__ static __forceinline__ void group(Step a, int, int &begin,
                                               int &count) {
    begin = 0;
    count = a->logit_rows ? a->num_logit_rows : a->num_tokens;
  }
};

/// Groups of routed experts: expert g owns dispatch rows
/// [offsets[g], offsets[g + 1]) (dispatch layout of nf_moe.cuh).
/// kEarly: the dispatch was complete before the launch before this one
/// passed its wait (the expert down projection: the up projection between
/// them lets the next launch start only after its wait), so the groups may
/// be read, and weights fetched, before waiting.
template <int E, long long DISPATCH, bool kEarly = false>
struct DispatchGroups {
  static constexpr int G = E;
  static constexpr bool kGroupsEarly = kEarly;
  __device__ static __forceinline__ const int32_t *offsets(Step a) {
    return arena<int32_t>(a, DISPATCH);
  }
  /// Token of each assignment row.
  __device__ static __forceinline__ const int32_t *row_token(Step a) {
    return arena<int32_t>(a, DISPATCH) + E + 1;
  }
  __device__ static __forceinline__ void group(Step a, int g, int &begin,
                                               int &count) {
    const int32_t *off = offsets(a);
    begin = off[g];
    count = off[g + 1] - off[g];
  }
};

/// Groups of a one-token step's routed experts, straight from the ranking
/// (nf_moe.select's experts [1, KW] and counts [1] at arena offsets
/// EXPERTS and COUNTS; no dispatch): group g is the token's slot g, one
/// row (row g) when the slot is used (g < counts[0], a valid expert), none
/// otherwise; its weights are expert(a, g)'s. kEarly as in DispatchGroups
/// (the ranking is complete before the launch before this one passes its
/// wait).
template <int KW, int E, long long EXPERTS, long long COUNTS,
          bool kEarly = false>
struct SlotGroups {
  static constexpr int G = KW;
  static constexpr bool kGroupsEarly = kEarly;
  __device__ static __forceinline__ int expert(Step a, int g) {
    return arena<int32_t>(a, EXPERTS)[g];
  }
  /// The input row of slot row r: the step's one token.
  __device__ static __forceinline__ int token_of(Step, int) { return 0; }
  __device__ static __forceinline__ bool used(Step a, int g) {
    const int e = expert(a, g);
    return g < arena<int32_t>(a, COUNTS)[0] && e >= 0 && e < E;
  }
  __device__ static __forceinline__ void group(Step a, int g, int &begin,
                                               int &count) {
    begin = g;
    count = used(a, g) ? 1 : 0;
  }
};

/// Work items over the groups of a linear: each group's rows (S::group)
/// and the first item of each group, from a per-group item count. Both
/// GEMM paths number their work this way (tiles or skinny items), so a
/// block can loop over items and find each item's group by binary search.
template <class S> struct GroupItems {
  int begin[S::G], count[S::G], first[S::G + 1];

  /// Call from every thread of the block (contains __syncthreads).
  /// items_of(rows) = the items of a group of that many rows.
  template <class ItemsOf>
  __device__ __forceinline__ void build(Step a, ItemsOf items_of) {
    const int tid = threadIdx.x, lane = lane_id();
    for (int g = tid; g < S::G; g += blockDim.x) {
      int b, c;
      S::group(a, g, b, c);
      begin[g] = b;
      count[g] = c;
    }
    __syncthreads();
    if (tid < 32) { // prefix over the groups, 32 at a time
      int carry = 0;
      for (int g0 = 0; g0 < S::G; g0 += 32) {
        const int g = g0 + lane;
        const int n = g < S::G ? items_of(count[g]) : 0;
        int incl = n;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int u = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o)
            incl += u;
        }
        if (g < S::G)
          first[g] = carry + incl - n;
        carry += __shfl_sync(0xffffffffu, incl, 31);
      }
      if (lane == 0)
        first[S::G] = carry;
    }
    __syncthreads();
  }
  __device__ __forceinline__ int total() const { return first[S::G]; }
  /// The last group whose first item is <= item.
  __device__ __forceinline__ int group_of(int item) const {
    int lo = 0, hi = S::G - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (first[mid] <= item)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
};

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
        S::store(a, row0 + r, n, acc[i][j]);
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
/// output tile at (row0, n0): the warp's rows start at wm * 16 * MI, its
/// features at wn * 32; rows past `rows` and features past S::N are skipped.
template <class S, int MI>
__device__ __forceinline__ void
store_warp_tile(Step a, const float (&acc)[MI][4][4], int row0, int rows,
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
          S::store(a, row0 + r, n, acc[i][j][c]);
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
#pragma unroll
    for (int i = 0; i < 8; i += 4) {
      const int k = k0 + ak + i;
      if (xrow && k < S::K) {
        load4_act(xrow + k, ra + i);
      } else {
        ra[i] = ra[i + 1] = ra[i + 2] = ra[i + 3] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = k0 + bk + 8 * i;
      rb[i] = wrow && k < S::K
                  ? __ldg(reinterpret_cast<const uint4 *>(wrow + k))
                  : make_uint4(0u, 0u, 0u, 0u);
    }
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
  store_warp_tile<S>(a, acc, row0, rows, n0, wm, wn);
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
#pragma unroll
    for (int i = 0; i < 16; i += 4) {
      const int k = k0 + lk + i;
      if (xrow && k < S::K)
        load4_act(xrow + k, ra + i);
      else
        ra[i] = ra[i + 1] = ra[i + 2] = ra[i + 3] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = k0 + lk + 8 * i;
      rb[i] = wrow && k < S::K
                  ? __ldg(reinterpret_cast<const uint4 *>(wrow + k))
                  : make_uint4(0u, 0u, 0u, 0u);
    }
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
  store_warp_tile<S>(a, acc, row0, rows, n0, wm, wn);
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
  store_warp_tile<S>(a, acc, row0, rows, n0, wm, wn);
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

template <class S>
__device__ __forceinline__ void gemv_item(Step a, int g, int begin, int count,
                                          int n, int lane) {
  using W = typename S::W;
  constexpr int V = Vec16<W>::N;
  const W *w = S::weight(a, g) + static_cast<long long>(n) * S::K;
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
    S::store(a, begin + lane, n, mine);
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
    gemv_item<S>(a, g, s_begin[g], c, static_cast<int>(item % S::N), lane);
  }
}

// ---------------------------------------------------------------------------
// Skinny linears on tensor cores (decode: a few rows per weight), bf16
// weights, K a multiple of 32. The operands are swapped: the weight is mma's
// A (16 output features per m-tile), the activation rows are B (8 rows per
// n-tile), so one row costs the same weight traffic as 16. Each thread
// loads 16 contiguous bytes of a weight row per 32-deep K step and the
// activations of the same 8 K positions: the dot product does not care in
// which order K is visited, so the mma fragments take K permuted (physical
// 8*tig + 4*s + {0,1,2,3} is logical {2tig, 2tig+1, 2tig+8, 2tig+9} of mma s)
// and every load is a full 16-byte vector. Activations are split into TERMS
// bf16 terms: 3 as in mma_tile (products exact, only the order of the f32
// sums differs from the other paths), or 1 (--matmul-inputs=bf16).
//
// A block (KW warps) owns one item: MT m-tiles of features of one
// group and up to ROWS of its rows; its warps split K (warp w takes the K
// steps w, w + KW, ...) with STAGES steps' weight loads in flight, and the
// partial sums are folded pairwise through shared memory in
// a fixed order (deterministic). Two variants, chosen per launch by the
// step's token count (the plan's launch token ranges): narrow (MT 1, 4 K
// steps in flight: many bytes in flight for few rows) and wide (MT 2, 2 K
// steps in flight: half the activation reads per weight byte). Items take
// at most ROWS rows: 16 (NT <= 2: few registers, several blocks per SM),
// or 32 (NT <= 4) where 16-row items would not all fit on the GPU at once
// (the generator's choice; a second round of items costs more than the
// registers). A group with more rows takes several items of the same
// feature tile, neighbours in the item order, so the second read of a
// weight tile comes from L2.

__device__ __forceinline__ unsigned uint4_at(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <class P> struct PointeeOf;
template <class T> struct PointeeOf<const T *> { using type = T; };
/// The element type of a spec's activation rows (f32, or bf16 bits).
template <class S>
using RowElem = typename PointeeOf<decltype(S::row(Step{}, 0))>::type;

/// The activation rows a skinny item reads: S::row (f32), or with kX16 the
/// rows' bf16 copy S::row16 (ShadowedRows).
template <class S, bool kX16> struct SkinnyRows {
  using T = RowElem<S>;
  __device__ static __forceinline__ const T *row(Step a, int r) {
    return S::row(a, r);
  }
};
template <class S> struct SkinnyRows<S, true> {
  using T = unsigned short;
  __device__ static __forceinline__ const T *row(Step a, int r) {
    return S::row16(a, r);
  }
};

/// skinny_item's staging of activations: per warp, two K steps (the current
/// and the next) of NT x 8 rows (elements XT), each lane's 8 elements of a
/// row as XV 16-byte pieces, piece-major so that a warp's 16-byte reads of
/// one piece are consecutive (no bank conflicts).
template <class XT, int NT> struct SkinnyXRing {
  static constexpr int XV = 8 * static_cast<int>(sizeof(XT)) / 16;
  static constexpr int kPerWarp = 2 * NT * XV * 32; // uint4
};

/// One 32-deep K step of a skinny item for n-tile nt: acc[mt][nt] += the
/// products of the weight fragments w (each thread's 16 bytes of rows gid
/// and gid + 8 of m-tile mt, K permuted) with x, the 8 activations of the
/// same K positions of row gid of the n-tile, split into TERMS bf16 terms
/// (small first).
template <int MT, int NT, int TERMS>
__device__ __forceinline__ void skinny_mma(float (&acc)[MT][NT][4],
                                           const uint4 (&w)[MT][2], int nt,
                                           const float (&x)[8]) {
  unsigned b[3][4]; // [term: hi, mid, lo][2 * s + reg]
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    unsigned short t0[3], t1[3];
    split_bf16<TERMS>(x[i], t0);
    split_bf16<TERMS>(x[i + 1], t1);
#pragma unroll
    for (int term = 0; term < TERMS; ++term)
      b[term][i / 2] = pack_bf16x2(t0[term], t1[term]);
  }
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const unsigned af[4] = {
          uint4_at(w[mt][0], 2 * s), uint4_at(w[mt][1], 2 * s),
          uint4_at(w[mt][0], 2 * s + 1), uint4_at(w[mt][1], 2 * s + 1)};
#pragma unroll
      for (int term = TERMS - 1; term >= 0; --term) // small first
        mma_bf16(acc[mt][nt], af, b[term][2 * s], b[term][2 * s + 1]);
    }
}

/// The end of a skinny item: the KW warps' partial sums folded pairwise
/// through `red` (the upper half adds into the lower half, a fixed order),
/// then warp 0 stores rows [row0, row0 + rows) of features from n0. `warp`:
/// the calling warp's index among the KW; `sync()` is a barrier of the KW
/// warps (__syncthreads, or a named barrier where other warps of the block
/// do other work).
template <class S, int KW, int MT, int NT, class Sync>
__device__ __forceinline__ void
skinny_fold_store(Step a, float (&acc)[MT][NT][4], float *red, int row0,
                  int rows, int n0, int warp, Sync sync) {
  const int lane = lane_id();
  const int gid = lane >> 2, tig = lane & 3;
  constexpr int kFrag = MT * NT * 4;
#pragma unroll
  for (int half = KW / 2; half >= 1; half /= 2) {
    sync(); // red is free
    if (warp >= half && warp < 2 * half) {
      float *dst = red + (warp - half) * kFrag * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            dst[((mt * NT + nt) * 4 + c) * 32 + lane] = acc[mt][nt][c];
    }
    sync();
    if (warp < half) {
      const float *src = red + warp * kFrag * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            acc[mt][nt][c] += src[((mt * NT + nt) * 4 + c) * 32 + lane];
    }
  }
  if (warp == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int n = n0 + mt * 16 + gid + (c >> 1) * 8;
          const int r = nt * 8 + 2 * tig + (c & 1);
          if (n < S::N && r < rows)
            S::store(a, row0 + r, n, acc[mt][nt][c]);
        }
  }
}

template <class S, int KW, int MT, int NT, int STAGES, int TERMS,
          bool kWaitAfterFetch, bool kStageX, bool kX16>
__device__ __forceinline__ void skinny_item(Step a, int g, int row0, int rows,
                                            int n0, float *red, uint4 *xring) {
  constexpr int KSTEPS = S::K / 32;
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const bf16 *wbase = S::weight(a, g);
  const bf16 *wr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + mt * 16 + gid + 8 * h;
      wr[mt][h] = n < S::N ? wbase + static_cast<long long>(n) * S::K + 8 * tig
                           : nullptr;
    }
  using Rows = SkinnyRows<S, kX16>;
  using XT = typename Rows::T;
  using Ring = SkinnyXRing<XT, NT>;
  const XT *xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = nt * 8 + gid;
    xr[nt] = r < rows ? Rows::row(a, row0 + r) + 8 * tig : nullptr;
  }
  uint4 *ring = xring + warp * Ring::kPerWarp;
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        acc[mt][nt][c] = 0.0f;
  // STAGES K steps' weight loads in flight per warp: w[st] holds step
  // ks0 + st * KW (the ring index is unrolled, so it stays in
  // registers).
  uint4 w[STAGES][MT][2];
  auto fetch = [&](uint4(&wv)[MT][2], int ks) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wv[mt][h] = wr[mt][h] && ks < KSTEPS
                        ? load_stream16(wr[mt][h] + ks * 32)
                        : make_uint4(0u, 0u, 0u, 0u);
  };
#pragma unroll
  for (int st = 0; st < STAGES; ++st)
    fetch(w[st], warp + st * KW);
  if constexpr (kWaitAfterFetch)
    wait_for_previous_grids(); // activations next
  // kStageX: the activations of the warp's next K step are copied to
  // shared memory (cp.async, no registers held) while it multiplies the
  // current one. Loaded at use, each step waits for an L1 or L2 round trip
  // with its weights already there (ncu, batch-32 in_proj: two thirds of
  // the stalls on L1TEX loads); with few rows they are L1 hits, and the
  // narrow variant keeps loads at use (the ring's addresses would take it
  // past 85 registers, three blocks per SM). The generator asks for it with
  // one bf16 term only: with three, the wide variant went from 112 to 154
  // registers, one block per SM, and slower.
  auto stage_x = [&](int slot, int ks) {
    if constexpr (kStageX) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int v = 0; v < Ring::XV; ++v) {
          const bool valid = xr[nt] && ks < KSTEPS;
          copy_async16_or_zero</*kL1=*/true>(
              ring + ((slot * NT + nt) * Ring::XV + v) * 32 + lane,
              valid ? static_cast<const void *>(xr[nt] + ks * 32 +
                                                v * (16 / sizeof(XT)))
                    : static_cast<const void *>(wbase),
              valid);
        }
      copy_async_commit();
    }
  };
  stage_x(0, warp);
  int slot = 0;
  for (int ks0 = warp; ks0 < KSTEPS; ks0 += STAGES * KW) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      const int ks = ks0 + st * KW;
      if (ks >= KSTEPS)
        break;
      stage_x(slot ^ 1, ks + KW);
      if constexpr (kStageX)
        copy_async_wait<1>(); // this step's copies (own lane: no barrier)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float x[8];
        if constexpr (kStageX) {
#pragma unroll
          for (int v = 0; v < Ring::XV; ++v) {
            const uint4 u = ring[((slot * NT + nt) * Ring::XV + v) * 32 + lane];
            if constexpr (Ring::XV == 2) { // f32
              x[4 * v] = __uint_as_float(u.x);
              x[4 * v + 1] = __uint_as_float(u.y);
              x[4 * v + 2] = __uint_as_float(u.z);
              x[4 * v + 3] = __uint_as_float(u.w);
            } else { // bf16 bits
              unpack_bf16x8(u, x);
            }
          }
        } else if (xr[nt]) {
          load4_act(xr[nt] + ks * 32, x);
          load4_act(xr[nt] + ks * 32 + 4, x + 4);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            x[i] = 0.0f;
        }
        skinny_mma<MT, NT, TERMS>(acc, w[st], nt, x);
      }
      fetch(w[st], ks + STAGES * KW);
      slot ^= 1;
    }
  }
  if constexpr (kStageX)
    copy_async_wait<0>(); // the last (empty) stage, before the next item
  skinny_fold_store<S, KW>(a, acc, red, row0, rows, n0, warp,
                           [] { __syncthreads(); });
}

/// skinny_linear's fold buffer, in floats (a multiple of 4): items of up
/// to ROWS rows (ROWS / 8 8-row n-tiles).
template <int MT, int KW, int ROWS = 16>
__host__ __device__ constexpr int skinny_red_floats() {
  return (KW > 1 ? KW / 2 : 1) * MT * (ROWS / 8) * 4 * 32;
}
/// Dynamic shared memory of skinny_linear<S, MT, *, KW, *, kStageX, kX16,
/// ROWS>, bytes.
template <class S, int MT, int KW, bool kStageX, bool kX16 = false,
          int ROWS = 16>
__host__ __device__ constexpr int skinny_smem() {
  using XT = typename SkinnyRows<S, kX16>::T;
  return skinny_red_floats<MT, KW, ROWS>() * 4 +
         (kStageX ? KW * SkinnyXRing<XT, ROWS / 8>::kPerWarp * 16 : 0);
}

/// y = x . W^T for groups of few rows (see above); launch with KW warps
/// (the K split) per block and skinny_smem<...>() bytes of dynamic shared
/// memory. A group's rows past ROWS take further items. kX16: the rows'
/// bf16 copy (S::row16) instead of S::row (ShadowedRows).
/// The function waits for the launches before it itself (the generated
/// wrapper does not): with groups known early (S::kGroupsEarly: dense
/// weights, or the expert down projection's dispatch), only after its first
/// item's first K steps of weights are in flight
/// (registers), so weight streaming overlaps the previous launch's tail
/// when this one is a programmatic dependent. (An L2 bulk prefetch of the
/// rest of the first item, asked for before the wait, made the dense
/// launches slower: alone 15-27%, bench/kernels/skinny_sweep.cu with
/// NF_SWEEP_DENSE=1; Nano's batch-1 step 3.63 -> 3.55 ms without it.)
/// Otherwise it waits first and lets the next launch start after that (the
/// generated wrapper must not let it start earlier).
template <class S, int MT, int STAGES, int KW, int TERMS = 3,
          bool kStageX = false, bool kX16 = false, int ROWS = 16>
__device__ void skinny_linear(Step a) {
  static_assert(S::K % 32 == 0, "32-deep K steps");
  static_assert(ROWS == 16 || ROWS == 32, "items of 16 or 32 rows");
  constexpr int FT = 16 * MT; // features per item
  constexpr int NTILES = (S::N + FT - 1) / FT;
  constexpr bool kEarly = S::kGroupsEarly;
  __shared__ GroupItems<S> s_groups;
  // The fold's partial sums, then the activation ring: dynamic, so that the
  // two parts of a co-launch (each on its own blocks) share the bytes.
  extern __shared__ float4 nf_skinny_smem[];
  float *s_red = reinterpret_cast<float *>(nf_skinny_smem);
  uint4 *s_xring =
      reinterpret_cast<uint4 *>(s_red + skinny_red_floats<MT, KW, ROWS>());
  if constexpr (!kEarly) {
    wait_for_previous_grids(); // the groups are the previous launch's output
    // Only now may the next launch start: it may read the same groups
    // before its own wait (DispatchGroups' kEarly).
    allow_next_grid();
  }
  // Items per group: row chunks x feature tiles.
  s_groups.build(a, [](int c) { return (c + ROWS - 1) / ROWS * NTILES; });
  const int *s_begin = s_groups.begin, *s_count = s_groups.count;
  const int items = s_groups.total();
  // Item -> group, first feature, rows. Chunks of one feature tile are
  // neighbours: a weight tile read twice (more than ROWS rows) is read close
  // in time, from L2.
  struct Item {
    int g, n0, row0, rows;
  };
  auto item_at = [&](int item) {
    const int g = s_groups.group_of(item);
    const int local = item - s_groups.first[g];
    const int chunks = (s_count[g] + ROWS - 1) / ROWS;
    const int chunk = local % chunks;
    return Item{g, local / chunks * FT, s_begin[g] + chunk * ROWS,
                min(ROWS, s_count[g] - chunk * ROWS)};
  };
  for (int item = a.block(); item < items; item += a.grid()) {
    const Item it = item_at(item);
    if (it.rows <= 8)
      skinny_item<S, KW, MT, 1, STAGES, TERMS, kEarly, kStageX, kX16>(
          a, it.g, it.row0, it.rows, it.n0, s_red, s_xring);
    else if (ROWS == 16 || it.rows <= 16)
      skinny_item<S, KW, MT, 2, STAGES, TERMS, kEarly, kStageX, kX16>(
          a, it.g, it.row0, it.rows, it.n0, s_red, s_xring);
    else if constexpr (ROWS == 32)
      skinny_item<S, KW, MT, 4, STAGES, TERMS, kEarly, kStageX, kX16>(
          a, it.g, it.row0, it.rows, it.n0, s_red, s_xring);
  }
  if constexpr (kEarly)
    wait_for_previous_grids(); // a block without items
}

// ---------------------------------------------------------------------------
/// acc + the products of eight weights with the eight activations at x
/// (f32, or bf16 bits), one FMA each in element order.
template <class T>
__device__ __forceinline__ float row_fma8(const float *wf, const T *x,
                                          float acc) {
  float xv[8];
  load4_act(x, xv);
  load4_act(x + 4, xv + 4);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    acc = fmaf(wf[i], xv[i], acc);
  return acc;
}

// Decode linears of one-token steps: row_linear.
// One warp per output feature over the whole of K, on CUDA cores: each lane
// streams 16 contiguous weight bytes a chunk, U chunks in flight, and adds
// their products with the group's row (f32, read through L1, which the
// block's warps share) into its own sum; the warp's sums are added by a
// fixed butterfly (deterministic). No K split across warps, so no fold
// through shared memory and no barrier between items, and the items (one
// weight row each) spread evenly over the GPU. The products are exact: an
// FMA forms w * x exactly and rounds only the sum, as the three bf16 terms
// of the tensor-core kernels do with a rounding per term. Activations stay
// f32 with --matmul-inputs=bf16 too: rounding them here cost more than it
// saved (a cvt per two elements: the Nano expert up projection 14 -> 19 us
// alone on the H200, bench/kernels/row_linear_sweep.cu).
// On the H200, alone at 3 blocks an SM, against skinny_linear's narrow
// variant with three terms (the exact plan) and one (bf16 inputs): Nano's
// routed expert up 14.7 us against 27.7 and 18.9, in_proj 12.7 against
// 21.0 and 16.6, out_proj 5.8 against 11.4 and 9.4. With two rows the
// weights would be read twice (once from L2) and the skinny kernel wins,
// so plans run it for steps of one token (rows past R take further items).
template <class S, int U, int R = 1> __device__ void row_linear(Step a) {
  static_assert(S::K % 8 == 0, "16-byte chunks");
  constexpr int C = S::K / 8;       // chunks a weight row
  constexpr int J = (C + 31) / 32;  // chunks a lane
  constexpr int UU = U < J ? U : J; // chunks in flight a lane
  constexpr bool kEarly = S::kGroupsEarly;
  using T = RowElem<S>;
  __shared__ GroupItems<S> s_groups;
  if constexpr (!kEarly) {
    wait_for_previous_grids(); // the groups are the previous launch's output
    allow_next_grid();
  }
  // Items per group: chunks of R rows x features.
  s_groups.build(a, [](int c) { return (c + R - 1) / R * S::N; });
  const int items = s_groups.total();
  const int lane = lane_id();
  bool waited = !kEarly;
  // (Measured on the H200 and dropped, bench/results/2026-12-04: asking for
  // the next item's first chunks before this item's sums are added and
  // stored, batch-1 step 2.74 -> 2.93 ms; the results stored 32 at a time,
  // one per lane, so that a store's own loads (in_proj's conv) do not hold
  // up the next item, no change, 2.75 -> 2.74.)
  for (long long item = global_warp(a); item < items; item += grid_warps(a)) {
    const int g = s_groups.group_of(static_cast<int>(item));
    const int local = static_cast<int>(item) - s_groups.first[g];
    const int chunk = local / S::N, n = local % S::N;
    const int row0 = s_groups.begin[g] + chunk * R;
    const int rows = min(R, s_groups.count[g] - chunk * R);
    const bf16 *wrow = S::weight(a, g) + static_cast<long long>(n) * S::K;
    auto fetch = [&](int c) {
      return c < C ? load_stream16(wrow + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 w[UU]; // chunk j in slot j % UU
#pragma unroll
    for (int j = 0; j < UU; ++j)
      w[j] = fetch(lane + 32 * j);
    if (!waited) {
      wait_for_previous_grids(); // the rows next
      waited = true;
    }
    const T *xr[R];
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      xr[r] = r < rows ? S::row(a, row0 + r) : nullptr;
      acc[r] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      const uint4 wv = w[j % UU];
      if (j + UU < J)
        w[j % UU] = fetch(c + 32 * UU);
      if (c < C) {
        float wf[8];
        unpack_bf16x8(wv, wf);
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < rows)
            acc[r] = row_fma8(wf, xr[r] + 8 * c, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r]); // fixed butterfly: deterministic
      if (lane == 0 && r < rows)
        S::store(a, row0 + r, n, v);
    }
  }
  if (!waited)
    wait_for_previous_grids(); // a warp without items
}

// ---------------------------------------------------------------------------
// A one-token step's MoE layer end: row_experts_combine.
// The routed experts' down projections (S: SlotGroups, one hidden row per
// used slot), nf_moe.combine, the add of the shared expert's rows, the
// residual add and the next RMSNorm in one launch, so that neither the
// dispatch nor moe_combine_add_rms_norm runs for one token. A warp per
// output feature n streams row n of each used slot's expert in slot order,
// U 16-byte chunks a lane in flight across the slots, and sums each slot's
// products as row_linear does (same lanes, same butterfly); then
//   sum[n] = x[n] + (shared[n] + sum_g wts[g] * dot_g)   (g in slot order)
// as moe_combine_add_rms_norm adds them. The last block to finish (a
// grid-wide counter, `done`, zero between launches: it resets it)
// normalises the row: out = rms_norm(sum) with rms_norm_row_of's sums.
template <class S, int U, class W, class O>
__device__ void row_experts_combine(Step a, const float *wts,
                                    const float *shared, const float *x,
                                    float *sum, const W *norm_w, double eps,
                                    O out, unsigned *done) {
  static_assert(S::K % 8 == 0, "16-byte chunks");
  static_assert(S::kGroupsEarly, "slots read before the wait");
  constexpr int KW = S::G;
  constexpr int C = S::K / 8;      // chunks a weight row
  constexpr int J = (C + 31) / 32; // chunks a lane, a slot
  constexpr int Q = KW * J;        // chunks a lane, an item
  constexpr int UU = U < Q ? U : Q;
  const int lane = lane_id();
  // The used slots (a warp-uniform mask) and their experts' weights.
  const unsigned used =
      __ballot_sync(0xffffffffu, lane < KW && S::used(a, lane));
  const bf16 *wbase[KW];
#pragma unroll
  for (int g = 0; g < KW; ++g)
    wbase[g] = (used >> g) & 1u ? S::weight(a, g) : nullptr;
  bool waited = false;
  for (long long item = global_warp(a); item < S::N; item += grid_warps(a)) {
    const int n = static_cast<int>(item);
    auto fetch = [&](int q) {
      const int g = q / J, c = lane + 32 * (q % J);
      return ((used >> g) & 1u) && c < C
                 ? load_stream16(wbase[g] + static_cast<long long>(n) * S::K +
                                 8 * c)
                 : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 w[UU]; // chunk q in slot q % UU
#pragma unroll
    for (int q = 0; q < UU; ++q)
      w[q] = fetch(q);
    if (!waited) {
      wait_for_previous_grids(); // the hidden rows next
      waited = true;
    }
    float acc[KW];
#pragma unroll
    for (int g = 0; g < KW; ++g)
      acc[g] = 0.0f;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int g = q / J, c = lane + 32 * (q % J);
      const uint4 wv = w[q % UU];
      if (q + UU < Q)
        w[q % UU] = fetch(q + UU);
      if (((used >> g) & 1u) && c < C) {
        float wf[8];
        unpack_bf16x8(wv, wf);
        acc[g] = row_fma8(wf, S::row(a, g) + 8 * c, acc[g]);
      }
    }
    float v = 0.0f;
#pragma unroll
    for (int g = 0; g < KW; ++g) {
      const float d = warp_sum(acc[g]); // as row_linear sums each row
      if ((used >> g) & 1u)
        v += wts[g] * d;
    }
    if (lane == 0)
      sum[n] = x[n] + (shared[n] + v);
  }
  if (!waited)
    wait_for_previous_grids(); // a warp without items
  // The last block normalises: every block's sums are visible to it once
  // its counter increment comes last (fence before the increment).
  __shared__ bool s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    s_last = atomicAdd(done, 1u) == static_cast<unsigned>(a.grid()) - 1u;
  __syncthreads();
  if (!s_last)
    return;
  __threadfence();
  rms_norm_row_of<W, S::N>([&](int, int i) { return __ldcg(sum + i); }, nullptr,
                           norm_w, eps, out);
  if (threadIdx.x == 0)
    *done = 0u; // for the next launch
}

// ---------------------------------------------------------------------------
// Decode linears of wide steps with many feature tiles (the LM head; bf16
// weights, the rows' bf16 copy S::row16): feature_tile_linear.
// skinny_linear's items own 32 features and at most 16 rows, so a dense
// layer of 32 rows reads every weight byte twice (once from L2) and its
// activation rows once per 32 features. Here a block's warps each own
// MT x 16 features of one tile (FT = WARPS x MT x 16 features) and go
// through every K step, so the tile's rows (RC = 8 NT of them) are staged
// once in shared memory for all FT features (cp.async, KP K steps a phase,
// the next phase in flight) and each weight byte is read once per row
// chunk; no partial sums to fold. Weights stream into registers STAGES K
// steps ahead (the first ones before waiting for the previous launch).
// Items are (feature tile, row chunk), the chunks of a tile neighbours.
// (Layers with few tiles need K split across blocks to fill the GPU: split
// sums, and a stream-K division of all K steps, were no faster than
// skinny_linear on in_proj, out_proj and qkv; bench/results/2026-12-01d.)
template <int NT, int KP>
__host__ __device__ constexpr int feature_tile_smem() {
  return 2 * KP * 8 * NT * 64;
}

template <class S, int MT, int NT, int WARPS, int STAGES, int KP>
__device__ void feature_tile_linear(Step a) {
  static_assert(S::G == 1, "dense layers");
  static_assert(S::K % 32 == 0, "32-deep K steps");
  static_assert(KP % STAGES == 0, "phases of whole register rounds");
  constexpr int KSTEPS = S::K / 32;
  constexpr int RC = 8 * NT;          // rows per chunk
  constexpr int FT = WARPS * MT * 16; // features per tile
  constexpr int NTILES = (S::N + FT - 1) / FT;
  extern __shared__ uint4 nf_feature_tile_smem[];
  const int lane = lane_id(), warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int gid = lane >> 2, tig = lane & 3;
  int begin, count;
  S::group(a, 0, begin, count);
  const int chunks = (count + RC - 1) / RC;
  const int items = NTILES * chunks;
  bool waited = false;
  for (int item = a.block(); item < items; item += a.grid()) {
    const int chunk = item % chunks, tile = item / chunks;
    const int row0 = begin + chunk * RC, rows = min(RC, count - chunk * RC);
    const int n0 = tile * FT + warp * MT * 16;
    const bf16 *wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = n0 + mt * 16 + gid + 8 * h;
        wr[mt][h] = n < S::N ? S::weight(a, 0) +
                                   static_cast<long long>(n) * S::K + 8 * tig
                             : nullptr;
      }
    uint4 w[STAGES][MT][2];
    auto fetch = [&](uint4(&wv)[MT][2], int ks) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wv[mt][h] = wr[mt][h] && ks < KSTEPS
                          ? load_stream16(wr[mt][h] + ks * 32)
                          : make_uint4(0u, 0u, 0u, 0u);
    };
#pragma unroll
    for (int st = 0; st < STAGES; ++st)
      fetch(w[st], st);
    if (!waited) {
      wait_for_previous_grids(); // the rows are the previous launch's output
      waited = true;
    }
    // Phase p's rows in buffer p % 2: [step][row][64 bytes], 16-byte
    // pieces (a quarter warp's reads of 8 x 16 bytes are 128 contiguous
    // bytes).
    auto stage = [&](int p) {
      const int ks = p * KP;
      uint4 *dst = nf_feature_tile_smem + (p & 1) * KP * RC * 4;
      const int steps = min(KP, KSTEPS - ks);
      for (int i = tid; i < steps * RC * 4; i += WARPS * 32) {
        const int st = i / (RC * 4), r = (i / 4) % RC, piece = i % 4;
        const bool valid = r < rows;
        copy_async16_or_zero(
            dst + i,
            valid ? static_cast<const void *>(S::row16(a, row0 + r) +
                                              (ks + st) * 32 + piece * 8)
                  : static_cast<const void *>(S::weight(a, 0)),
            valid);
      }
      copy_async_commit();
    };
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          acc[mt][nt][c] = 0.0f;
    __syncthreads(); // the previous item's readers are done with its rows
    stage(0);
    const uint4 *xs = nf_feature_tile_smem;
    for (int ks0 = 0; ks0 < KSTEPS; ks0 += STAGES) {
      if (ks0 % KP == 0) { // a new phase: its rows, the next one's copies
        copy_async_wait<0>();
        __syncthreads();
        if (ks0 + KP < KSTEPS)
          stage(ks0 / KP + 1);
        xs = nf_feature_tile_smem + ((ks0 / KP) & 1) * KP * RC * 4;
      }
#pragma unroll
      for (int st = 0; st < STAGES; ++st) {
        const int ks = ks0 + st;
        if (ks >= KSTEPS)
          break;
        const uint4 *xrow = xs + (ks % KP) * RC * 4;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // Row nt * 8 + gid, K 8 tig .. 8 tig + 7 (the permuted K of
          // skinny_item: mma s takes words 2s and 2s + 1).
          const uint4 u = xrow[(nt * 8 + gid) * 4 + tig];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const unsigned af0[4] = {w[st][mt][0].x, w[st][mt][1].x,
                                     w[st][mt][0].y, w[st][mt][1].y};
            mma_bf16(acc[mt][nt], af0, u.x, u.y);
            const unsigned af1[4] = {w[st][mt][0].z, w[st][mt][1].z,
                                     w[st][mt][0].w, w[st][mt][1].w};
            mma_bf16(acc[mt][nt], af1, u.z, u.w);
          }
        }
        fetch(w[st], ks + STAGES);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int n = n0 + mt * 16 + gid + (c >> 1) * 8;
          const int r = nt * 8 + 2 * tig + (c & 1);
          if (n < S::N && r < rows)
            S::store(a, row0 + r, n, acc[mt][nt][c]);
        }
  }
  if (!waited)
    wait_for_previous_grids(); // a block without items
}

} // namespace nf

#endif // NF_KERNELS_LINEAR_CUH
