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
#ifndef NF_KERNELS_LINEAR_FEATURE_CUH
#define NF_KERNELS_LINEAR_FEATURE_CUH

#include "nf_common.cuh"
#include "nf_mma.cuh"

namespace nf {

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
      load_weight_step<KSTEPS>(wv, wr, ks);
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
    store_mma_tiles<S>(a, acc, 0, row0, rows, n0, lane);
  }
  if (!waited)
    wait_for_previous_grids(); // a block without items
}

} // namespace nf

#endif // NF_KERNELS_LINEAR_FEATURE_CUH
