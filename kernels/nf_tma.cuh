// Decode linears whose weights and rows stream into shared memory by TMA
// (sm_90+): cp.async.bulk.tensor loads boxes of a row-major bf16 weight
// [N, K] and of the rows' bf16 copy [rows, K] through 2D tensor maps (128-
// byte swizzle), which the runtime encodes at load from the module's
// nf_tensor_map_descs (nf_abi.h). No registers hold bytes in flight, so a
// block keeps ST stages of (16 MT features + ROWS rows) x BK x 2 bytes in
// flight, where the register-ring skinny_linear (nf_linear_skinny.cuh) keeps
// ~16 KB: layers with few feature tiles (out_proj, o_proj: 84 items of 32
// features on 132 SMs) stream near the copy rate from fewer blocks.
//
// A block is CW consumer warps and one producer warp. The producer's lane
// 0 walks the block's items (feature tile, chunk of ROWS rows) and their K
// steps of BK, one ring stage each: it waits for the stage to be free
// (mbarrier `empty`, one arrival per consumer warp), then asks for its
// weight and row boxes (mbarrier `full`, transaction bytes). The weights of
// the first ST steps go out before the launch waits for the one before it
// (programmatic dependent launch); rows only after. Consumer warp w takes
// the stage's 16-deep K slices w, w + CW, ...: A fragments (16 features x
// 16 K) and B fragments (8 rows x 16 K) by ldmatrix (conflict-free on the
// swizzled boxes), mma.sync m16n8k16 bf16 with f32 accumulation. At an
// item's end the warps' partial sums are added in a fixed order through
// shared memory and stored with S::store (deterministic).
//
// S: N, K (K % 8 == 0: TMA strides are multiples of 16 bytes), store(a, r,
// n, v), and DenseGroups (rows = a->num_tokens).
#ifndef NF_KERNELS_TMA_CUH
#define NF_KERNELS_TMA_CUH

#include "nf_common.cuh"

namespace nf {

__device__ __forceinline__ unsigned tma_smem_u32(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
/// One arrival that also expects `bytes` of transactions (TMA loads).
__device__ __forceinline__ void mbarrier_expect_tx(unsigned bar,
                                                   unsigned bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
      "r"(bytes)
      : "memory");
}
/// The box at (c0, c1) of tensor map `map` to shared memory at `dst`,
/// completing `bytes` on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void *map,
                                            int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::"
               "complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
               "l"(map), "r"(c0), "r"(c1), "r"(bar)
               : "memory");
}
/// The runtime wrote the map (generic proxy) before the launch; TMA reads
/// it through the tensormap proxy.
__device__ __forceinline__ void tma_map_acquire(const void *map) {
  asm volatile(
      "fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map)
      : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4],
                                                  const unsigned (&a)[4],
                                                  unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/// Byte offset of 16-byte chunk c of row r in a box of 128-byte rows
/// loaded with CU_TENSOR_MAP_SWIZZLE_128B (box base 1024-byte aligned).
__device__ __forceinline__ unsigned swizzle128(int r, int c) {
  return static_cast<unsigned>(r * 128 + ((c ^ (r & 7)) << 4));
}

/// Sizes of tma_linear<S, MT, BK, ST, CW, ROWS>.
template <int MT, int BK, int ST, int CW, int ROWS> struct TmaLinearShape {
  static_assert(BK % 64 == 0 && (BK / 16) % CW == 0, "K slices per warp");
  static_assert(ROWS % 16 == 0 && ROWS <= 256, "rows a box");
  static constexpr int BF = 16 * MT, NT = ROWS / 8, BOXES = BK / 64;
  static constexpr int WBYTES = BF * BK * 2, XBYTES = ROWS * BK * 2;
  static constexpr int STAGE = WBYTES + XBYTES;
  static constexpr int RED = CW * MT * NT * 128 * 4; // partial sums, bytes
  static constexpr int SMEM = 1024 + ST * STAGE + RED + 16 * ST;
};
/// Dynamic shared memory of tma_linear, bytes (1024 of it for alignment).
template <int MT, int BK, int ST, int CW, int ROWS>
__host__ __device__ constexpr int tma_linear_smem() {
  return TmaLinearShape<MT, BK, ST, CW, ROWS>::SMEM;
}

/// y = x . W^T for one bf16 weight (see above); launch with CW + 1 warps
/// and tma_linear_smem<...>() bytes of dynamic shared memory. `wmap`: the
/// weight [N, K], box 64 x 16 MT; `xmap`: the rows' bf16 copy, box 64 x
/// ROWS. Waits for the launches before it itself.
template <class S, int MT, int BK, int ST, int CW, int ROWS>
__device__ void tma_linear(Step a, const void *wmap, const void *xmap) {
  using C = TmaLinearShape<MT, BK, ST, CW, ROWS>;
  constexpr int KSTEPS = (S::K + BK - 1) / BK; // TMA zero-fills past K
  constexpr int TILES = (S::N + C::BF - 1) / C::BF;
  extern __shared__ unsigned char nf_tma_smem_raw[];
  unsigned char *smem = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<unsigned long long>(nf_tma_smem_raw) + 1023) &
      ~1023ull);
  float *red = reinterpret_cast<float *>(smem + ST * C::STAGE);
  const unsigned full0 = tma_smem_u32(smem + ST * C::STAGE + C::RED);
  const unsigned empty0 = full0 + 8 * ST;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; ++s) {
      mbarrier_init(full0 + 8 * s, 1);
      mbarrier_init(empty0 + 8 * s, CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int rows = a->num_tokens;
  const int chunks = (rows + ROWS - 1) / ROWS;
  const int items = TILES * chunks;
  if (warp == CW) {
    if (lane == 0) {
      tma_map_acquire(wmap);
      tma_map_acquire(xmap);
      // The weights of the first ST steps go out before the wait; their
      // rows (the previous launches' output) after it.
      int firstK[ST], firstRow[ST];
      int it = 0;
      bool waited = false;
      auto rowsOf = [&](int slot, int kstep, int row0) {
        const unsigned d = tma_smem_u32(smem + slot * C::STAGE) + C::WBYTES;
        for (int b = 0; b < C::BOXES; ++b)
          tma_load_2d(d + b * (ROWS * 128), xmap, kstep * BK + b * 64, row0,
                      full0 + 8 * slot);
      };
      auto release = [&](int n) {
        wait_for_previous_grids();
        for (int j = 0; j < n; ++j)
          rowsOf(j, firstK[j], firstRow[j]);
        waited = true;
      };
      for (int item = a.block(); item < items; item += a.grid()) {
        const int tile = item / chunks, row0 = item % chunks * ROWS;
        for (int kstep = 0; kstep < KSTEPS; ++kstep, ++it) {
          const int slot = it % ST;
          mbarrier_wait(empty0 + 8 * slot, ((it / ST) & 1) ^ 1);
          mbarrier_expect_tx(full0 + 8 * slot, C::STAGE);
          const unsigned dst = tma_smem_u32(smem + slot * C::STAGE);
          for (int b = 0; b < C::BOXES; ++b)
            tma_load_2d(dst + b * (C::BF * 128), wmap, kstep * BK + b * 64,
                        tile * C::BF, full0 + 8 * slot);
          if (waited) {
            rowsOf(slot, kstep, row0);
          } else {
            firstK[it] = kstep;
            firstRow[it] = row0;
            if (it == ST - 1)
              release(ST);
          }
        }
      }
      if (!waited)
        release(it);
    }
    return;
  }
  // Consumers: the outputs may be read by the launches before (WAR).
  wait_for_previous_grids();
  const int m = lane >> 3, rr = lane & 7;
  int it = 0;
  for (int item = a.block(); item < items; item += a.grid()) {
    const int tile = item / chunks, row0 = item % chunks * ROWS;
    const int itemRows = min(ROWS, rows - row0);
    float acc[MT][C::NT][4] = {};
    for (int kstep = 0; kstep < KSTEPS; ++kstep, ++it) {
      const int slot = it % ST;
      mbarrier_wait(full0 + 8 * slot, (it / ST) & 1);
      const unsigned wbase = tma_smem_u32(smem + slot * C::STAGE);
      const unsigned xbase = wbase + C::WBYTES;
#pragma unroll
      for (int j = 0; j < BK / 16 / CW; ++j) {
        const int q = warp + j * CW, box = q >> 2, kk = q & 3;
        unsigned af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(
              wbase + box * (C::BF * 128) +
                  swizzle128(mt * 16 + (m & 1) * 8 + rr, 2 * kk + (m >> 1)),
              af[mt]);
#pragma unroll
        for (int np = 0; np < C::NT / 2; ++np) {
          // Every n-tile, also past the item's rows (not stored): a branch
          // on the row count here made the loop slower than the products
          // it saves (the Nano out_proj at 64 rows, 11.8 -> 19.0 us).
          unsigned bf[4];
          ldmatrix_x4(
              xbase + box * (ROWS * 128) +
                  swizzle128(np * 16 + (m >> 1) * 8 + rr, 2 * kk + (m & 1)),
              bf);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16_bf16(acc[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_m16n8k16_bf16(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
      __syncwarp();
      if (lane == 0)
        mbarrier_arrive(empty0 + 8 * slot);
    }
    // The warps' partial sums, added in warp order.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt)
        *reinterpret_cast<float4 *>(
            red + (((warp * MT + mt) * C::NT + nt) * 32 + lane) * 4) =
            make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2],
                        acc[mt][nt][3]);
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
    for (int o = threadIdx.x; o < MT * C::NT * 128; o += CW * 32) {
      // o: (mt, nt, lane, c) of a fragment; c's feature and row as mma's D.
      const int c = o & 3, ln = (o >> 2) & 31, nt = (o >> 7) % C::NT,
                mt = (o >> 7) / C::NT;
      const int n = tile * C::BF + mt * 16 + (ln >> 2) + (c >> 1) * 8;
      const int r = nt * 8 + (ln & 3) * 2 + (c & 1);
      if (r >= itemRows || n >= S::N)
        continue;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < CW; ++w)
        s += red[w * MT * C::NT * 128 + o];
      S::store(a, row0 + r, n, s);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory"); // red free
  }
}

} // namespace nf

#endif // NF_KERNELS_TMA_CUH
