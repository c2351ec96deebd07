// Linear layers: y[r, n] = sum_k x[r, k] * W[n, k] for one weight (nf.linear,
// nf.lm_head, nf_moe.latent_proj, the shared expert) or one weight per group
// of rows (routed experts: the rows of expert g are a contiguous range of the
// dispatch, W = weights[g]). What every strategy (nf_linear_*.cuh, all
// included by nf_linear.cuh) shares: the groups of rows and the numbering
// of work items over them.
//
// A spec struct S, generated per op, describes the problem:
//   using W = float | nf::bf16 | nf::f16;  static constexpr int N, K, G;
//   static void group(a, g, int &begin, int &count);    // rows of group g
//   static const W *weight(a, g);                        // [N, K] row-major
//   static const float *row(a, r);                       // input row r, K f32
//   static void store(a, r, n, float v);                 // epilogue
// (DenseGroups / DispatchGroups below provide `group`).
#ifndef NF_KERNELS_LINEAR_GROUPS_CUH
#define NF_KERNELS_LINEAR_GROUPS_CUH

#include "nf_common.cuh"

namespace nf {

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

template <class P> struct PointeeOf;
template <class T> struct PointeeOf<const T *> { using type = T; };
/// The element type of a spec's activation rows (f32, or bf16 bits).
template <class S>
using RowElem = typename PointeeOf<decltype(S::row(Step{}, 0))>::type;

} // namespace nf

#endif // NF_KERNELS_LINEAR_GROUPS_CUH
