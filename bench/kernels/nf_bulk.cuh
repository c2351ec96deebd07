// A decode linear of few rows whose weights stream into shared memory by
// bulk copies (sm_90+: cp.async.bulk, no tensor map): bulk_linear computes
// exactly what skinny_linear's narrow variant (kernels/nf_linear.cuh: 16
// features an item, up to 16 rows, 8 warps splitting K) computes, bit for
// bit, with the weights in a ring of shared-memory stages instead of
// registers. A benchmark's kernel (bench/kernels/bulk_linear_sweep.cu), not
// one nfc generates: alone on the H200 it did not beat skinny_linear at
// batch 1 (bench/results/2026-12-03/README.md).
//
// Why it was tried: skinny_linear keeps 4 K steps of 16 bytes a thread in
// flight, and each item's stream is a short chain (Nano's expert up
// projection: 84 K steps over 8 warps), refilled per item; the routed
// experts of a batch-1 step stream at ~2.6 TB/s in the plan where the copy
// rate is ~4.2. Here a producer warp walks the block's items ahead of the
// consumers and keeps ST stages of 16 weight rows x SK K steps in flight
// whatever the item boundaries.
//
// A block is CG groups of 8 consumer warps and one producer warp. Lane 0 of
// the producer waits for a free stage and arms its barrier; lanes 0-15 each
// copy one weight row's K steps [s0, s0 + SK) into a row of PITCH bytes (16
// more than the row's, so that the consumers' 16-byte reads of rows gid and
// tig land in different banks). Group g takes the block's items g, g + CG,
// ...; its warp w takes the K steps w, w + 8, ... of the item, as
// skinny_item's warp w, with the same fragments (K permuted), products
// (skinny_mma) and fold (skinny_fold_store, on the group's named barrier).
// NF_BULK_PROBE=1 leaves out the products (the stream alone), =2 the copies
// (the consumers alone).
//
// S: skinny_linear's spec (N, K % 32 == 0, G, group, weight, row, store,
// kGroupsEarly). With kGroupsEarly the producer streams weights before the
// consumers wait for the launches before it (programmatic launch);
// otherwise the block waits first (the groups are the previous launch's
// output) and only then lets the next launch start.
#ifndef NF_KERNELS_BULK_CUH
#define NF_KERNELS_BULK_CUH

#include "nf_linear.cuh"
#include "nf_tma.cuh"

#ifndef NF_BULK_PROBE
#define NF_BULK_PROBE 0
#endif
namespace nf {

/// Bytes of weights from global memory to shared memory at `dst`,
/// completing on mbarrier `bar` (16-byte aligned, a multiple of 16 bytes).
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src,
                                          unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::"
               "bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

/// Sizes of bulk_linear<S, ST, SK, TERMS> for a K of K elements: ST stages
/// of SK 32-deep K steps (a multiple of 8: SK / 8 a consumer warp; at most
/// the K steps of a row).
template <int K, int ST, int SK, int CG> struct BulkLinearShape {
  static_assert(SK % 8 == 0, "whole rounds of the consumer warps");
  static constexpr int KW = 8; // consumer warps
  static constexpr int KSTEPS = K / 32;
  static constexpr int STEPS = SK < KSTEPS ? SK : KSTEPS; // a stage's most
  static constexpr int PITCH = STEPS * 64 + 16;
  static constexpr int STAGE = 16 * PITCH;
  static constexpr int SPI = (KSTEPS + SK - 1) / SK; // stages an item
  static constexpr int RED = skinny_red_floats<1, KW, 16>() * 4; // a group's
  static constexpr int SMEM = ST * STAGE + CG * RED + 16 * ST;
};
/// Dynamic shared memory of bulk_linear, bytes.
template <int K, int ST, int SK, int CG>
__host__ __device__ constexpr int bulk_linear_smem() {
  return BulkLinearShape<K, ST, SK, CG>::SMEM;
}

/// One item of bulk_linear (NT n-tiles of rows) on its consumer warps:
/// stages `it`, `it + 1`, ... of the ring, as they fill.
template <class S, int NT, int ST, int SK, int CG, int TERMS>
__device__ __forceinline__ void
bulk_item(Step a, int row0, int rows, int n0, int it, int group,
          const unsigned char *stages, unsigned full0, unsigned empty0,
          float *red) {
  using C = BulkLinearShape<S::K, ST, SK, CG>;
  constexpr int KSTEPS = S::K / 32;
  const int lane = lane_id(), warp = (threadIdx.x >> 5) % C::KW;
  const int gid = lane >> 2, tig = lane & 3;
  const RowElem<S> *xr[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int r = nt * 8 + gid;
    xr[nt] = r < rows ? S::row(a, row0 + r) + 8 * tig : nullptr;
  }
  const bool live[2] = {n0 + gid < S::N, n0 + gid + 8 < S::N};
  float acc[1][NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      acc[0][nt][c] = 0.0f;
  for (int s0 = 0; s0 < KSTEPS; s0 += SK, ++it) {
    const int slot = it % ST;
    mbarrier_wait(full0 + 8 * slot, (it / ST) & 1);
    const unsigned char *stage = stages + slot * C::STAGE;
#pragma unroll
    for (int j = 0; j < (NF_BULK_PROBE == 1 ? 0 : SK / 8); ++j) {
      const int ks = s0 + warp + 8 * j;
      if (ks >= KSTEPS)
        break;
      uint4 w[1][2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        w[0][h] = live[h] ? *reinterpret_cast<const uint4 *>(
                                stage + (gid + 8 * h) * C::PITCH +
                                (ks - s0) * 64 + tig * 16)
                          : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float x[8];
        if (xr[nt]) {
          load4_act(xr[nt] + ks * 32, x);
          load4_act(xr[nt] + ks * 32 + 4, x + 4);
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            x[i] = 0.0f;
        }
        skinny_mma<1, NT, TERMS>(acc, w, nt, x);
      }
    }
    __syncwarp();
    if (lane == 0)
      mbarrier_arrive(empty0 + 8 * slot);
  }
  skinny_fold_store<S, C::KW>(a, acc, red, row0, rows, n0, warp, [group] {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(C::KW * 32)
                 : "memory");
  });
}

/// y = x . W^T as skinny_linear<S, 1, *, 8, TERMS> (see above); launch with
/// 9 warps and bulk_linear_smem<S::K, ST, SK>() bytes of dynamic shared
/// memory.
template <class S, int ST, int SK, int CG, int TERMS>
__device__ void bulk_linear(Step a) {
  using C = BulkLinearShape<S::K, ST, SK, CG>;
  static_assert(S::K % 32 == 0, "32-deep K steps");
  static_assert(C::PITCH % 16 == 0, "bulk alignment");
  // A consumer waits for a stage by its barrier's parity, which tells the
  // stage from the one ST stages earlier only if that one has filled: the
  // groups' current items (CG x SPI stages) must fit in the ring together.
  static_assert(ST >= CG * C::SPI, "a ring of every group's item");
  constexpr int KW = C::KW, FT = 16;
  constexpr int KSTEPS = S::K / 32;
  constexpr int NTILES = (S::N + FT - 1) / FT;
  constexpr bool kEarly = S::kGroupsEarly;
  __shared__ GroupItems<S> s_groups;
  extern __shared__ __align__(128) unsigned char nf_bulk_smem[];
  unsigned char *stages = nf_bulk_smem;
  float *red = reinterpret_cast<float *>(stages + ST * C::STAGE);
  const unsigned full0 = tma_smem_u32(stages + ST * C::STAGE + CG * C::RED);
  const unsigned empty0 = full0 + 8 * ST;
  const int warp = threadIdx.x >> 5, lane = lane_id();
  if constexpr (!kEarly) {
    wait_for_previous_grids(); // the groups are the previous launch's output
    allow_next_grid();
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; ++s) {
      mbarrier_init(full0 + 8 * s, 1);
      mbarrier_init(empty0 + 8 * s, KW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // (build's barriers also publish the mbarriers' initialisation.)
  s_groups.build(a, [](int c) { return (c + FT - 1) / FT * NTILES; });
  const int items = s_groups.total();
  struct Item {
    int g, n0, row0, rows;
  };
  // skinny_linear's item order (the same items, for the same bits).
  auto item_at = [&](int item) {
    const int g = s_groups.group_of(item);
    const int local = item - s_groups.first[g];
    const int chunks = (s_groups.count[g] + FT - 1) / FT;
    const int chunk = local % chunks;
    return Item{g, local / chunks * FT, s_groups.begin[g] + chunk * FT,
                min(FT, s_groups.count[g] - chunk * FT)};
  };
  if (warp == CG * KW) {
    // Lane 0 waits for a free stage and arms its barrier; lanes 0-15 then
    // ask for a weight row each (one thread issuing every copy was the
    // limit: ~170 cycles a copy).
    int it = 0;
    for (int item = a.block(); item < items; item += a.grid()) {
      const Item t = item_at(item);
      const int wrows = min(FT, S::N - t.n0);
      const bf16 *wrow =
          S::weight(a, t.g) +
          static_cast<long long>(t.n0 + min(lane, wrows - 1)) * S::K;
      for (int s0 = 0; s0 < KSTEPS; s0 += SK, ++it) {
        const int slot = it % ST;
        const unsigned bytes = min(SK, KSTEPS - s0) * 64;
        if (lane == 0) {
          mbarrier_wait(empty0 + 8 * slot, ((it / ST) & 1) ^ 1);
          mbarrier_expect_tx(full0 + 8 * slot,
                             NF_BULK_PROBE == 2 ? 0 : wrows * bytes);
        }
        __syncwarp();
        if (NF_BULK_PROBE != 2 && lane < wrows)
          bulk_load(tma_smem_u32(stages + slot * C::STAGE) + lane * C::PITCH,
                    wrow + s0 * 32, bytes, full0 + 8 * slot);
      }
    }
    return; // (it reads no earlier launch's output)
  }
  // Consumers: the rows (and, kEarly, the outputs' earlier readers) are the
  // launches' before.
  if constexpr (kEarly)
    wait_for_previous_grids();
  // Consumer group `group` (warps 8 group ... 8 group + 7) takes the
  // block's items group, group + CG, ...: one group's item ends (its fold,
  // its next rows' first loads) while the others multiply.
  const int group = warp / KW;
  float *gred = red + group * (C::RED / 4);
  for (int k = group;; k += CG) {
    const int item = a.block() + k * a.grid();
    if (item >= items)
      break;
    const Item t = item_at(item);
    if (t.rows <= 8)
      bulk_item<S, 1, ST, SK, CG, TERMS>(a, t.row0, t.rows, t.n0, k * C::SPI,
                                         group, stages, full0, empty0, gred);
    else
      bulk_item<S, 2, ST, SK, CG, TERMS>(a, t.row0, t.rows, t.n0, k * C::SPI,
                                         group, stages, full0, empty0, gred);
  }
}

} // namespace nf

#endif // NF_KERNELS_BULK_CUH
