// Skinny linears on tensor cores (decode: a few rows per weight), bf16
// weights or FP8 codes (kept as codes in the load ring and widened to bf16
// in registers where the mma reads them, exactly; each output then scaled
// by its row's scale), K a multiple of 32. The operands are swapped: the
// weight is mma's A (16 output features per m-tile), the activation rows
// are B (8 rows per n-tile), so one row costs the same weight traffic as
// 16. Each thread loads 8 contiguous weights of a row per 32-deep K step
// (16 bytes, FP8: 8) and the activations of the same 8 K
// positions: the dot product does not care in which order K is visited, so
// the mma fragments take K permuted (physical 8*tig + 4*s + {0,1,2,3} is
// logical {2tig, 2tig+1, 2tig+8, 2tig+9} of mma s) and every load is a full
// vector. Activations are split into TERMS bf16 terms: 3 as in mma_tile
// (products exact, only the order of the f32 sums differs from the other
// paths), or 1 (--matmul-inputs=bf16).
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
#ifndef NF_KERNELS_LINEAR_SKINNY_CUH
#define NF_KERNELS_LINEAR_SKINNY_CUH

#include "nf_common.cuh"
#include "nf_linear_groups.cuh"
#include "nf_mma.cuh"

namespace nf {

__device__ __forceinline__ unsigned uint4_at(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

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
/// then warp 0 stores rows [row0, row0 + rows) of features from n0 of group
/// g. `warp`: the calling warp's index among the KW; `sync()` is a barrier
/// of the KW warps (__syncthreads, or a named barrier where other warps of
/// the block do other work).
template <class S, int KW, int MT, int NT, class Sync>
__device__ __forceinline__ void
skinny_fold_store(Step a, float (&acc)[MT][NT][4], float *red, int g, int row0,
                  int rows, int n0, int warp, Sync sync) {
  const int lane = lane_id();
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
  if (warp == 0)
    store_mma_tiles<S>(a, acc, g, row0, rows, n0, lane);
}

template <class S, int KW, int MT, int NT, int STAGES, int TERMS,
          bool kWaitAfterFetch, bool kStageX, bool kX16>
__device__ __forceinline__ void skinny_item(Step a, int g, int row0, int rows,
                                            int n0, float *red, uint4 *xring) {
  constexpr int KSTEPS = S::K / 32;
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  using W = typename S::W; // bf16, or FP8 codes widened to bf16 at load
  const W *wbase = S::weight(a, g);
  const W *wr[MT][2];
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
  using WV = typename WeightStep<W>::Vec; // codes stay codes until used
  WV w[STAGES][MT][2];
  auto fetch = [&](WV(&wv)[MT][2], int ks) {
    load_weight_step<KSTEPS>(wv, wr, ks);
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
      uint4 wb[MT][2];
      widen_weight_step<MT, W>(wb, w[st]);
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
        skinny_mma<MT, NT, TERMS>(acc, wb, nt, x);
      }
      fetch(w[st], ks + STAGES * KW);
      slot ^= 1;
    }
  }
  if constexpr (kStageX)
    copy_async_wait<0>(); // the last (empty) stage, before the next item
  skinny_fold_store<S, KW>(a, acc, red, g, row0, rows, n0, warp,
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

} // namespace nf

#endif // NF_KERNELS_LINEAR_SKINNY_CUH
