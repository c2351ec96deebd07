// Decode linears of one-token steps on CUDA cores, a warp per output
// feature (or few) over the whole of K: row_linear, and row_experts_combine (a
// one-token step's routed expert down projections with the MoE combine,
// the residual add and the next RMSNorm in one launch). The spec S:
// nf_linear_groups.cuh.
#ifndef NF_KERNELS_LINEAR_ROW_CUH
#define NF_KERNELS_LINEAR_ROW_CUH

#include "nf_common.cuh"
#include "nf_linear_groups.cuh"
#include "nf_rows.cuh"

namespace nf {

/// A 16-byte chunk of a weight row: E elements, as floats (bf16, or FP8
/// codes; a quantised weight's row scale is applied to the sum).
template <class W> struct RowChunk;
template <> struct RowChunk<bf16> {
  static constexpr int E = 8;
  __device__ static __forceinline__ void unpack(uint4 v, float *out) {
    unpack_bf16x8(v, out);
  }
};
template <> struct RowChunk<fp8e4m3> {
  static constexpr int E = 16;
  __device__ static __forceinline__ void unpack(uint4 v, float *out) {
    fp8x4_to_f32x4(v.x, out);
    fp8x4_to_f32x4(v.y, out + 4);
    fp8x4_to_f32x4(v.z, out + 8);
    fp8x4_to_f32x4(v.w, out + 12);
  }
};
// Decode linears of one-token steps: row_linear.
// One warp per F output features over the whole of K, on CUDA cores: each
// lane streams 16 contiguous weight bytes a chunk of each feature, U chunks
// of each in flight, and adds their products with the group's row (f32,
// read through L1, which the block's warps share; a lane reads its chunk
// of the row once for the F features) into its own sums; each sum's lanes
// are added by a fixed butterfly (deterministic). No K split across warps,
// so no fold through shared memory and no barrier between items, and the
// items spread evenly over the GPU. F > 1 suits weights of few bytes a row
// (FP8: a Nano expert row is 2,688 bytes, 5.25 chunks a lane at F = 1): an
// item keeps more bytes in flight and reads the activations once for F
// rows of weights (at F = 1 the f32 activations, 4 bytes an FP8 code, cost
// the L1 more than the codes cost DRAM). H100, Nano batch 1 with FP8
// weights at F = 2: 1.08x the bf16 plan's tok/s, against 0.90x with half a
// warp a feature (bench/results/2026-12-07d). The products are exact: an FMA
// forms w * x exactly and rounds only the sum, as the three bf16 terms of the
// tensor-core kernels do with a rounding per term. Activations stay f32 with
// --matmul-inputs=bf16 too: rounding them here cost more than it saved (a
// cvt per two elements: the Nano expert up projection 14 -> 19 us alone on
// the H200, bench/kernels/row_linear_sweep.cu).
// On the H200, alone at 3 blocks an SM, against skinny_linear's narrow
// variant with three terms (the exact plan) and one (bf16 inputs): Nano's
// routed expert up 14.7 us against 27.7 and 18.9, in_proj 12.7 against
// 21.0 and 16.6, out_proj 5.8 against 11.4 and 9.4. With two rows the
// weights would be read twice (once from L2) and the skinny kernel wins,
// so plans run it for steps of one token (rows past R take further items).
template <class S, int U, int R = 1, int F = 1>
__device__ void row_linear(Step a) {
  using W = typename S::W;
  static_assert(F >= 1 && F <= 4, "1 to 4 features a warp");
  constexpr int E = RowChunk<W>::E; // elements a chunk
  static_assert(S::K % E == 0, "16-byte chunks");
  constexpr int C = S::K / E;            // chunks a weight row
  constexpr int J = (C + 31) / 32;       // chunks a lane, a feature
  constexpr int UU = U < J ? U : J;      // chunks in flight a lane, a feature
  constexpr int NF = (S::N + F - 1) / F; // items a row chunk
  constexpr bool kEarly = S::kGroupsEarly;
  using T = RowElem<S>;
  __shared__ GroupItems<S> s_groups;
  if constexpr (!kEarly) {
    wait_for_previous_grids(); // the groups are the previous launch's output
    allow_next_grid();
  }
  // Items per group: chunks of R rows x features in F's.
  s_groups.build(a, [](int c) { return (c + R - 1) / R * NF; });
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
    const int chunk = local / NF;
    const int n0 = local % NF * F;
    const int row0 = s_groups.begin[g] + chunk * R;
    const int rows = min(R, s_groups.count[g] - chunk * R);
    const W *wrow[F];
#pragma unroll
    for (int f = 0; f < F; ++f)
      wrow[f] = S::weight(a, g) +
                static_cast<long long>(min(n0 + f, S::N - 1)) * S::K;
    auto fetch = [&](int f, int c) {
      return (F == 1 || n0 + f < S::N) && c < C ? load_stream16(wrow[f] + E * c)
                                                : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 w[UU][F]; // chunk j of feature f in slot [j % UU][f]
#pragma unroll
    for (int j = 0; j < UU; ++j)
#pragma unroll
      for (int f = 0; f < F; ++f)
        w[j][f] = fetch(f, lane + 32 * j);
    if (!waited) {
      wait_for_previous_grids(); // the rows next
      waited = true;
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
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      uint4 wv[F];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        wv[f] = w[j % UU][f];
        if (j + UU < J)
          w[j % UU][f] = fetch(f, c + 32 * UU);
      }
      if (c < C) {
        float wf[F][E];
#pragma unroll
        for (int f = 0; f < F; ++f)
          RowChunk<W>::unpack(wv[f], wf[f]);
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < rows) {
            float xv[E];
#pragma unroll
            for (int i = 0; i < E; i += 4)
              load4_act(xr[r] + E * c + i, xv + i);
#pragma unroll
            for (int f = 0; f < F; ++f)
#pragma unroll
              for (int i = 0; i < E; ++i)
                acc[r][f] = fmaf(wf[f][i], xv[i], acc[r][f]);
          }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const float v = warp_sum(acc[r][f]); // a fixed butterfly
        if (lane == 0 && n0 + f < S::N && r < rows)
          S::store(a, row0 + r, n0 + f, scaled_output<S>(a, g, n0 + f, v));
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
// F output features n streams rows n of each used slot's expert in slot
// order, U 16-byte chunks a lane of each feature in flight across the
// slots, and sums each slot's products as row_linear does (same lanes, same
// butterfly; a lane reads a slot's activation chunk once for its F
// features); then
//   sum[n] = x[n] + (shared[n] + sum_g wts[g] * dot_g)   (g in slot order)
// as moe_combine_add_rms_norm adds them. The last block to finish (a
// grid-wide counter, `done`, zero between launches: it resets it)
// normalises the row: out = rms_norm(sum) with rms_norm_row_of's sums.
template <class S, int U, int F = 1, class W, class O>
__device__ void row_experts_combine(Step a, const float *wts,
                                    const float *shared, const float *x,
                                    float *sum, const W *norm_w, double eps,
                                    O out, unsigned *done) {
  static_assert(S::kGroupsEarly, "slots read before the wait");
  static_assert(F >= 1 && F <= 4, "1 to 4 features a warp");
  using SW = typename S::W;
  constexpr int E = RowChunk<SW>::E; // elements a chunk
  static_assert(S::K % E == 0, "16-byte chunks");
  constexpr int KW = S::G;
  constexpr int C = S::K / E;            // chunks a weight row
  constexpr int J = (C + 31) / 32;       // chunks a lane, a slot
  constexpr int Q = KW * J;              // chunks a lane, a feature
  constexpr int UU = U < Q ? U : Q;      // in flight a lane, a feature
  constexpr int NF = (S::N + F - 1) / F; // items
  const int lane = lane_id();
  // The used slots (a warp-uniform mask) and their experts' weights.
  const unsigned used =
      __ballot_sync(0xffffffffu, lane < KW && S::used(a, lane));
  const SW *wbase[KW];
#pragma unroll
  for (int g = 0; g < KW; ++g)
    wbase[g] = (used >> g) & 1u ? S::weight(a, g) : nullptr;
  bool waited = false;
  for (long long item = global_warp(a); item < NF; item += grid_warps(a)) {
    const int n0 = static_cast<int>(item) * F;
    auto fetch = [&](int f, int q) {
      const int g = q / J, c = lane + 32 * (q % J);
      return ((used >> g) & 1u) && (F == 1 || n0 + f < S::N) && c < C
                 ? load_stream16(wbase[g] +
                                 static_cast<long long>(n0 + f) * S::K + E * c)
                 : make_uint4(0u, 0u, 0u, 0u);
    };
    uint4 w[UU][F]; // chunk q of feature f in slot [q % UU][f]
#pragma unroll
    for (int q = 0; q < UU; ++q)
#pragma unroll
      for (int f = 0; f < F; ++f)
        w[q][f] = fetch(f, q);
    if (!waited) {
      wait_for_previous_grids(); // the hidden rows next
      waited = true;
    }
    float acc[KW][F];
#pragma unroll
    for (int g = 0; g < KW; ++g)
#pragma unroll
      for (int f = 0; f < F; ++f)
        acc[g][f] = 0.0f;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int g = q / J, c = lane + 32 * (q % J);
      uint4 wv[F];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        wv[f] = w[q % UU][f];
        if (q + UU < Q)
          w[q % UU][f] = fetch(f, q + UU);
      }
      if (((used >> g) & 1u) && c < C) {
        // The slot's activation chunk once, then each feature's weights
        // decoded and multiplied in turn, in element order.
        float xv[E];
#pragma unroll
        for (int i = 0; i < E; i += 4)
          load4_act(S::row(a, g) + E * c + i, xv + i);
#pragma unroll
        for (int f = 0; f < F; ++f) {
          float wf[E];
          RowChunk<SW>::unpack(wv[f], wf);
#pragma unroll
          for (int i = 0; i < E; ++i)
            acc[g][f] = fmaf(wf[i], xv[i], acc[g][f]);
        }
      }
    }
#pragma unroll
    for (int f = 0; f < F; ++f) {
      const int n = n0 + f;
      if (F > 1 && n >= S::N)
        continue; // warp-uniform
      float v = 0.0f;
#pragma unroll
      for (int g = 0; g < KW; ++g) {
        const float d = warp_sum(acc[g][f]); // as row_linear sums each row
        if ((used >> g) & 1u)
          v += wts[g] * scaled_output<S>(a, g, n, d);
      }
      if (lane == 0)
        sum[n] = x[n] + (shared[n] + v);
    }
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

} // namespace nf

#endif // NF_KERNELS_LINEAR_ROW_CUH
