// Mixture of experts: nf_moe.router, nf_moe.select (policies "topk" and
// "budget") and nf_moe.dispatch. The expert FFNs are grouped linears
// (nf_linear.cuh, DispatchGroups) and nf_moe.combine is in nf_rows.cuh.
//
// Dispatch layout (i32, at the dispatch value's arena offset; the same as the
// CPU backend's, T = a->num_tokens, M = max_per_token):
//   offsets[E + 1]   first assignment row of each expert
//   rowToken[T * M]  token of each assignment row
//   slotRow[T * M]   row of assignment (t, j), -1 when unused
// Rows are grouped by expert, and within an expert ordered by token, then by
// the token's selection order.
#ifndef NF_KERNELS_MOE_CUH
#define NF_KERNELS_MOE_CUH

#include "nf_common.cuh"

namespace nf {

/// s = sigmoid(logit) and sb = s + bias[e] in f64, stored as f32 to
/// scores[o] / sel[o] and, when pre is given, as an f64 pair to pre[2o].
template <class WB>
__device__ __forceinline__ void
router_score(double logit, const WB *bias, int e, long long o, float *scores,
             float *sel, double *pre, double &sc, double &sb) {
  sc = 1.0 / (1.0 + exp(-logit));
  sb = sc + static_cast<double>(load(bias, e));
  if (pre) {
    pre[o * 2] = sc;
    pre[o * 2 + 1] = sb;
  }
  scores[o] = static_cast<float>(sc);
  sel[o] = static_cast<float>(sb);
}

/// Router logits over the whole grid (decode: one block per token would
/// leave the GPU idle while it reads the gate): one warp per (token,
/// expert), f64 sums of f32 x bf16/f32 products, s and sb written as f64
/// pairs to `pre` for moe_route and as f32 to `scores` / `sel`.
template <class WG, class WB, int E, int H>
__device__ void moe_router_logits(Step a, const float *x, const WG *gate,
                                  const WB *bias, float *scores, float *sel,
                                  double *pre) {
  constexpr int V = Vec16<WG>::N;
  const long long items = static_cast<long long>(a->num_tokens) * E;
  const int lane = lane_id();
  for (long long item = global_warp(a); item < items; item += grid_warps(a)) {
    const int t = static_cast<int>(item / E), e = static_cast<int>(item % E);
    const float *xr = x + static_cast<long long>(t) * H;
    const WG *gr = gate + static_cast<long long>(e) * H;
    double acc = 0.0;
    if (H % V == 0) {
      // Unrolled so several 16-byte loads are in flight (not one latency
      // per step); the f64 sum keeps its order.
#pragma unroll 4
      for (int k = lane * V; k < H; k += 32 * V) {
        float wv[V], xv[V];
        load16(gr + k, wv);
#pragma unroll
        for (int v = 0; v < V; v += 4)
          load4_act(xr + k + v, xv + v);
#pragma unroll
        for (int v = 0; v < V; ++v)
          acc += static_cast<double>(xv[v]) * static_cast<double>(wv[v]);
      }
    } else {
      for (int k = lane; k < H; k += 32)
        acc += static_cast<double>(xr[k]) * static_cast<double>(load(gr, k));
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      double sc, sb;
      router_score(acc, bias, e, item, scores, sel, pre, sc, sb);
    }
  }
}

/// The same logits for many tokens (prefill): a block computes a tile of TT
/// tokens x EB experts from shared-memory slices of x and the gate (each
/// gate byte read once per TT tokens instead of once per token), 16 x 16
/// threads with TT / 16 x EB / 16 f64 sums each; launch with 256 threads.
/// The router logits tiles' register staging of K slice k0 (KC columns):
/// XN values of the tile's token rows from t0 and GN of its gate rows from
/// e0 per thread (256 threads), in f64; zeros past T, E and H.
template <int E, int H, int KC, int XN, int GN, class WG>
__device__ __forceinline__ void
router_slice(double (&rx)[XN], double (&rg)[GN], const float *x, const WG *gate,
             int tid, int t0, int T, int e0, int k0) {
#pragma unroll
  for (int u = 0; u < XN; ++u) {
    const int i = tid + 256 * u, t = t0 + i / KC, k = k0 + i % KC;
    rx[u] = t < T && k < H ? x[static_cast<long long>(t) * H + k] : 0.0;
  }
#pragma unroll
  for (int u = 0; u < GN; ++u) {
    const int i = tid + 256 * u, e = e0 + i / KC, k = k0 + i % KC;
    rg[u] =
        e < E && k < H ? load(gate, static_cast<long long>(e) * H + k) : 0.0;
  }
}

template <class WG, class WB, int E, int H, int TT, int EB>
__device__ void moe_router_logits_tiled(Step a, const float *x, const WG *gate,
                                        const WB *bias, float *scores,
                                        float *sel, double *pre) {
  constexpr int KC = 32, RT = TT / 16, RE = EB / 16;
  constexpr int XN = TT * KC / 256, GN = EB * KC / 256;
  static_assert(TT % 16 == 0 && EB % 16 == 0, "tiles of 16 x 16 threads");
  static_assert(XN * 256 == TT * KC && GN * 256 == EB * KC,
                "whole slices per 256 threads");
  // Staged as f64: each value is converted once, not by every thread that
  // multiplies it (the conversions otherwise compete with the f64 FMAs).
  __shared__ double sx[KC][TT + 1], sg[KC][EB + 1];
  const int T = a->num_tokens;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  constexpr int ETILES = (E + EB - 1) / EB;
  const long long items = static_cast<long long>((T + TT - 1) / TT) * ETILES;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int t0 = static_cast<int>(item / ETILES) * TT;
    const int e0 = static_cast<int>(item % ETILES) * EB;
    double acc[RT][RE];
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int j = 0; j < RE; ++j)
        acc[i][j] = 0.0;
    // The next slice's values are loaded into registers while the current
    // one is multiplied (256 threads: XN + GN values each).
    double rx[XN], rg[GN];
    auto fetch = [&](int k0) {
      router_slice<E, H, KC>(rx, rg, x, gate, tid, t0, T, e0, k0);
    };
    fetch(0);
    for (int k0 = 0; k0 < H; k0 += KC) {
      __syncthreads(); // the previous slice is consumed
#pragma unroll
      for (int u = 0; u < XN; ++u) {
        const int i = tid + 256 * u;
        sx[i % KC][i / KC] = rx[u];
      }
#pragma unroll
      for (int u = 0; u < GN; ++u) {
        const int i = tid + 256 * u;
        sg[i % KC][i / KC] = rg[u];
      }
      __syncthreads();
      if (k0 + KC < H)
        fetch(k0 + KC);
#pragma unroll 4
      for (int kk = 0; kk < KC; ++kk) {
        double xv[RT], gv[RE];
#pragma unroll
        for (int i = 0; i < RT; ++i)
          xv[i] = sx[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < RE; ++j)
          gv[j] = sg[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
          for (int j = 0; j < RE; ++j)
            acc[i][j] = fma(xv[i], gv[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < RT; ++i)
#pragma unroll
      for (int j = 0; j < RE; ++j) {
        const int t = t0 + ty + 16 * i, e = e0 + tx + 16 * j;
        if (t >= T || e >= E)
          continue;
        double sc, sb;
        router_score(acc[i][j], bias, e, static_cast<long long>(t) * E + e,
                     scores, sel, pre, sc, sb);
      }
  }
}

/// The prefill logits on f64 tensor cores (sm_80+: mma.sync m8n8k4 f64,
/// products of f32 x bf16/f32 values exact, sums in f64 as above, in
/// another order). A block of 8 warps takes TT tokens x all E experts (E
/// rounded up to tiles of 8): warp w the 16 tokens w % (TT / 16) and every
/// (128 / TT)-th expert tile, in slices of KC of H staged as f64 in shared
/// memory (the next slice's values loaded into registers meanwhile).
template <class WG, class WB, int E, int H, int TT, int KC = 16>
__device__ void moe_router_logits_dmma(Step a, const float *x, const WG *gate,
                                       const WB *bias, float *scores,
                                       float *sel, double *pre) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int KS = KC + 4; // row stride: conflict-free fragments
  constexpr int WT = TT / 16, WE = 8 / WT;
  constexpr int E8 = (E + 7) / 8 * 8, NT8 = E8 / 8, NT = (NT8 + WE - 1) / WE;
  // Every warp has NT expert tiles (then adjacent ones), or some fewer.
  constexpr bool kEven = NT8 % WE == 0;
  static_assert(WT * WE == 8, "8 warps over TT / 16 token rows");
  constexpr int XN = TT * KC / 256, GN = (E8 * KC + 255) / 256;
  static_assert(XN * 256 == TT * KC, "whole token slices per 256 threads");
  __shared__ double sx[TT][KS], sg[E8][KS];
  const int T = a->num_tokens;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int g8 = lane >> 2, c4 = lane & 3;
  const int wt = warp % WT, we = warp / WT;
  auto tile = [&](int j) { return kEven ? we * NT + j : we + j * WE; };
  for (int t0 = blockIdx.x * TT; t0 < T; t0 += gridDim.x * TT) {
    double acc[2][NT][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        acc[i][j][0] = acc[i][j][1] = 0.0;
    double rx[XN], rg[GN];
    auto fetch = [&](int k0) {
      router_slice<E, H, KC>(rx, rg, x, gate, tid, t0, T, 0, k0);
    };
    fetch(0);
    for (int k0 = 0; k0 < H; k0 += KC) {
      __syncthreads(); // the previous slice is consumed
#pragma unroll
      for (int u = 0; u < XN; ++u) {
        const int i = tid + 256 * u;
        sx[i / KC][i % KC] = rx[u];
      }
#pragma unroll
      for (int u = 0; u < GN; ++u) {
        const int i = tid + 256 * u;
        if (i < E8 * KC)
          sg[i / KC][i % KC] = rg[u];
      }
      __syncthreads();
      if (k0 + KC < H)
        fetch(k0 + KC);
#pragma unroll
      for (int kk = 0; kk < KC; kk += 4) {
        // A (8 x 4, row-major): a = A[g][c]; B (4 x 8, column-major):
        // b = B[c][g]; C (8 x 8): C[g][2c], C[g][2c + 1].
        double af[2], bf[NT];
#pragma unroll
        for (int i = 0; i < 2; ++i)
          af[i] = sx[wt * 16 + i * 8 + g8][kk + c4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
          bf[j] = kEven || tile(j) < NT8 ? sg[tile(j) * 8 + g8][kk + c4] : 0.0;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j)
            if (kEven || tile(j) < NT8) // uniform over the warp
              asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 "
                           "{%0,%1}, {%2}, {%3}, {%0,%1};"
                           : "+d"(acc[i][j][0]), "+d"(acc[i][j][1])
                           : "d"(af[i]), "d"(bf[j]));
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int t = t0 + wt * 16 + i * 8 + g8;
          const int e = tile(j) * 8 + 2 * c4 + r;
          if (t >= T || e >= E)
            continue;
          double sc, sb;
          router_score(acc[i][j][r], bias, e, static_cast<long long>(t) * E + e,
                       scores, sel, pre, sc, sb);
        }
    __syncthreads(); // shared memory is free for the next tile
  }
#else
  __trap(); // code generation takes this form for sm_80 and later only
#endif
}

/// f64 -> u64 with the same order.
__device__ __forceinline__ unsigned long long order_key(double v) {
  const unsigned long long b =
      static_cast<unsigned long long>(__double_as_longlong(v));
  return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

/// Whether the step's expert selection is one decision over all its tokens
/// (nf_step_args: the budget pooled over the step, or the distinct-expert
/// cap), rather than one per sequence.
__device__ __forceinline__ bool step_wide_selection(Step a) {
  return a->budget_pooled != 0 || a->distinct_expert_cap > 0.0;
}

/// The candidates a token may run: its ranked experts up to the first -1
/// (all K unless the distinct-expert cap removed some). Reads through L2:
/// rows may have been written by other blocks of the grid (moe_route).
template <int K>
__device__ __forceinline__ int candidate_limit(const int32_t *ex) {
  int l = 0;
  while (l < K && __ldcg(ex + l) >= 0)
    ++l;
  return l;
}

/// Calls f(i, c, key) for every candidate (token i of the range, count c in
/// [mk, limit_i)) that thread owns (i = threadIdx.x + k * blockDim.x). key
/// orders share(i, c) = 1 - (sum of the first c weights) / (sum of the first
/// limit_i): the routed weight token i leaves uncovered with c experts.
template <int K, class F>
__device__ __forceinline__ void
for_each_candidate(const float *w, const int32_t *ex, int n, int mk, F f) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float *wi = w + static_cast<long long>(i) * K;
    const int limit = candidate_limit<K>(ex + static_cast<long long>(i) * K);
    double total = 0.0;
    for (int r = 0; r < limit; ++r)
      total += __ldcg(wi + r);
    double covered = 0.0;
    for (int c = 0; c < limit; ++c) {
      if (c >= mk)
        f(i, c, order_key(total > 0 ? 1.0 - covered / total : 0.0));
      covered += __ldcg(wi + c);
    }
  }
}

/// Ranges of up to this many tokens keep budget_allocate's candidate keys in
/// shared memory (8 bytes a candidate).
constexpr int kBudgetCachedTokens = 128;

/// The calls a sequence of n tokens may spend at budget b
/// (cpu::expertCallsForBudget).
template <int K>
__device__ __forceinline__ long long budget_calls(float b, int n, int mk) {
  const long long calls =
      llround(static_cast<double>(b) * K * static_cast<double>(n));
  return min(max(calls, static_cast<long long>(mk) * n),
             static_cast<long long>(K) * n);
}

/// The budget policy's allocation (cpu/expert_budget.h) of the n tokens from
/// `begin` (whole block): each gets min(mk, limit) experts, then R more
/// calls go one at a time to the token whose kept experts leave the largest
/// share of its routed weight uncovered (ties: fewer experts so far, then
/// earlier token). Shares only shrink as a token gets experts, so those
/// greedy picks are exactly the R largest candidates (share desc, c asc, i
/// asc): a radix select (8 rounds of 8 bits) finds the R-th largest share,
/// then its ties are taken in (c, i) order. Writes counts[begin, begin + n).
template <int K>
__device__ void budget_allocate(const int32_t *experts, const float *weights,
                                int32_t *counts, int begin, int n, long long R,
                                int mk) {
  __shared__ int s_hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ long long s_want;
  // Up to kBudgetCachedTokens tokens (decode steps of up to that many
  // sequences; prefill sequences that short) keep their limits and keys in
  // shared memory: the radix
  // rounds then read them there instead of recomputing each key from L2
  // loads, one dependent chain per token, eight times over.
  __shared__ unsigned long long s_keys[kBudgetCachedTokens * K];
  __shared__ signed char s_limit[kBudgetCachedTokens];
  const bool cached = n <= kBudgetCachedTokens;
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const float *w = weights + static_cast<long long>(begin) * K;
  const int32_t *ex = experts + static_cast<long long>(begin) * K;
  int32_t *cnt = counts + begin;
  // Candidates beyond each token's first min(mk, limit): a budget that
  // covers them all needs no selection (B = 1 without a cap: every token
  // runs its limit).
  int local = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int limit = candidate_limit<K>(ex + static_cast<long long>(i) * K);
    if (cached)
      s_limit[i] = static_cast<signed char>(limit);
    local += max(limit - mk, 0);
  }
  const long long candidates = block_sum(local); // syncs: s_limit is written
  const bool all = R >= candidates;
  auto limitOf = [&](int i) {
    return cached ? static_cast<int>(s_limit[i])
                  : candidate_limit<K>(ex + static_cast<long long>(i) * K);
  };
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int limit = limitOf(i);
    cnt[i] = all ? limit : min(mk, limit);
  }
  if (all || R <= 0)
    return;
  if (cached)
    for_each_candidate<K>(
        w, ex, n, mk,
        [&](int i, int c, unsigned long long k) { s_keys[i * K + c] = k; });
  __syncthreads(); // cnt is counted up below by the thread owning each token
  // Radix select of v* = the R-th largest key, most significant byte first;
  // `want` ends as the number of keys equal to v* to take.
  unsigned long long prefix = 0, mask = 0;
  long long want = R;
  for (int shift = 56; shift >= 0; shift -= 8) {
    __syncthreads(); // s_hist / s_prefix of the previous round are read
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
      s_hist[i] = 0;
    __syncthreads();
    auto count = [&](int, int, unsigned long long k) {
      if ((k & mask) == prefix)
        atomicAdd(&s_hist[(k >> shift) & 255], 1);
    };
    if (cached) // every thread over every candidate
      for (int j = threadIdx.x; j < n * K; j += blockDim.x) {
        const int i = j / K, c = j - i * K;
        if (c >= mk && c < s_limit[i])
          count(i, c, s_keys[j]);
      }
    else // recomputed, a thread per token
      for_each_candidate<K>(w, ex, n, mk, count);
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins [8 * (31 - l), 8 * (31 - l) + 8): lane 0 the
      // highest. Find the digit where the count from the top reaches `want`.
      int bins[8], sum = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        bins[b] = s_hist[8 * (31 - lane) + 7 - b]; // descending digits
        sum += bins[b];
      }
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
          incl += u;
      }
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= want);
      const int first = __ffs(hit) - 1; // some lane reaches `want`
      if (lane == first) {
        long long above = incl - sum;
        int digit = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          if (above + bins[b] >= want) {
            digit = 8 * (31 - lane) + 7 - b;
            break;
          }
          above += bins[b];
        }
        s_prefix = prefix | (static_cast<unsigned long long>(digit) << shift);
        s_want = want - above;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    want = s_want;
    mask |= 255ull << shift;
  }
  const unsigned long long vstar = prefix;
  if (cached) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      int more = 0;
      for (int c = mk; c < s_limit[i]; ++c)
        more += s_keys[i * K + c] > vstar;
      cnt[i] += more;
    }
  } else {
    for_each_candidate<K>(w, ex, n, mk, [&](int i, int, unsigned long long k) {
      if (k > vstar)
        ++cnt[i];
    });
  }
  // Ties at v*, in (c, i) order.
  long long need = want;
  for (int c = mk; c < K && need > 0; ++c) {
    auto tie = [&](int i) {
      if (i >= n)
        return false;
      const float *wi = w + static_cast<long long>(i) * K;
      const int limit = candidate_limit<K>(ex + static_cast<long long>(i) * K);
      if (c >= limit)
        return false;
      double total = 0.0, covered = 0.0;
      for (int r = 0; r < limit; ++r) {
        total += __ldcg(wi + r);
        if (r < c)
          covered += __ldcg(wi + r);
      }
      return order_key(total > 0 ? 1.0 - covered / total : 0.0) == vstar;
    };
    int mine = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
      mine += tie(i);
    const int ties = block_sum(mine);
    if (ties <= need) {
      for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (tie(i))
          ++cnt[i];
      need -= ties;
    } else {
      long long carry = 0;
      for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const int is = tie(i);
        int chunk = 0;
        const int before = block_exclusive_scan(is, chunk);
        if (is && carry + before < need)
          ++cnt[i];
        carry += chunk;
      }
      need = 0;
    }
  }
}

/// Keeps the first counts[t] candidates of the n tokens from `begin`,
/// renormalised as in moe_route, and writes the step's expert statistics.
template <int K>
__device__ void budget_finish(int32_t *experts, float *weights,
                              const int32_t *counts, int begin, int n,
                              bool norm_topk, float rsf, int32_t *stat_counts,
                              int32_t *stat_experts) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int kt = counts[begin + i];
    const long long row = static_cast<long long>(begin + i) * K;
    double sum = 0.0;
    for (int j = 0; j < kt; ++j)
      sum += __ldcg(weights + row + j);
    const double nrm = norm_topk ? 1.0 / (sum + 1e-20) : 1.0;
    for (int j = 0; j < K; ++j) {
      if (j < kt) {
        weights[row + j] = static_cast<float>(
            static_cast<double>(__ldcg(weights + row + j)) * nrm * rsf);
      } else {
        experts[row + j] = -1;
        weights[row + j] = 0.0f;
      }
      if (stat_experts)
        stat_experts[row + j] = j < kt ? __ldcg(experts + row + j) : -1;
    }
    if (stat_counts)
      stat_counts[begin + i] = kt;
  }
}

/// The distinct-expert cap (cpu::capDistinctExperts), one block over the
/// step's T tokens: of the experts the candidates name, keeps the `cap` with
/// the most routed weight over the step (each token's candidates weighted by
/// their share of its candidate weight; ties: lower id), and compacts each
/// token's row to its candidates among them, in rank order (a token with
/// none keeps its best). The cap is a number of experts (>= 1) or a
/// fraction of the experts named (rounded up, at least one).
template <int K, int E>
__device__ void budget_cap_distinct(Step a, int32_t *experts, float *weights) {
  __shared__ double s_w[E];
  __shared__ unsigned char s_named[E], s_kept[E];
  __shared__ int s_cap;
  // Steps of up to kBudgetCachedTokens tokens are staged in shared memory
  // first (rows and each row's candidate weight): every expert's pass over
  // the tokens then reads them there, not from L2.
  __shared__ int32_t s_ex[kBudgetCachedTokens * K];
  __shared__ float s_wt[kBudgetCachedTokens * K];
  __shared__ double s_sum[kBudgetCachedTokens];
  const int T = a->num_tokens;
  const bool staged = T <= kBudgetCachedTokens;
  if (staged) {
    for (int j = threadIdx.x; j < T * K; j += blockDim.x) {
      s_ex[j] = __ldcg(experts + j);
      s_wt[j] = __ldcg(weights + j);
    }
    __syncthreads();
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
      double sum = 0.0;
      for (int r = 0; r < K; ++r)
        if (s_ex[t * K + r] >= 0)
          sum += s_wt[t * K + r];
      s_sum[t] = sum;
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double acc = 0.0;
    bool named = false;
    for (int t = 0; t < T; ++t) {
      double sum = 0.0;
      bool names = false; // the token names e, with weight `at`
      float at = 0.0f;
      if (staged) {
        sum = s_sum[t];
        for (int r = 0; r < K; ++r)
          if (s_ex[t * K + r] == e) {
            names = true;
            at = s_wt[t * K + r];
          }
      } else {
        const int32_t *ex = experts + static_cast<long long>(t) * K;
        const float *w = weights + static_cast<long long>(t) * K;
        for (int r = 0; r < K; ++r) {
          const int x = __ldcg(ex + r);
          if (x >= 0)
            sum += __ldcg(w + r);
          if (x == e) {
            names = true;
            at = __ldcg(w + r);
          }
        }
      }
      if (names) {
        named = true;
        acc += sum > 0 ? static_cast<double>(at) / sum : 0.0;
      }
    }
    s_w[e] = acc;
    s_named[e] = named;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int named = 0;
    for (int e = 0; e < E; ++e)
      named += s_named[e];
    const double c = a->distinct_expert_cap;
    int cap = c >= 1.0 ? static_cast<int>(c)
                       : max(1, static_cast<int>(ceil(c * named)));
    s_cap = cap >= named ? -1 : cap; // -1: nothing to cut
  }
  __syncthreads();
  const int cap = s_cap;
  if (cap < 0)
    return;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int rank = 0;
    for (int o = 0; o < E; ++o)
      rank += s_named[o] && (s_w[o] > s_w[e] || (s_w[o] == s_w[e] && o < e));
    s_kept[e] = s_named[e] && rank < cap;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < T; t += blockDim.x) {
    const long long row = static_cast<long long>(t) * K;
    int n = 0;
    for (int r = 0; r < K; ++r) {
      const int x = __ldcg(experts + row + r);
      const float v = __ldcg(weights + row + r);
      if (x >= 0 && s_kept[x]) {
        experts[row + n] = x;
        weights[row + n] = v;
        ++n;
      }
    }
    if (n == 0)
      n = 1; // experts[row] is still its best candidate
    for (int r = n; r < K; ++r) {
      experts[row + r] = -1;
      weights[row + r] = 0.0f;
    }
  }
}

/// The step-wide selection (step_wide_selection), one block over the whole
/// step after every token's K candidates and raw weights are written: the
/// distinct-expert cap, then the budget, pooled over the step's sequences
/// (each spending round(b K n) calls into one pool) or sequence by
/// sequence, then the renormalisation. The CPU backend makes the same
/// decision (CpuEngine::opSelect).
template <int K, int E>
__device__ void budget_step(Step a, const float *budget, int32_t *experts,
                            float *weights, int32_t *counts, int min_k,
                            bool norm_topk, float rsf, int32_t *stat_counts,
                            int32_t *stat_experts) {
  __shared__ unsigned long long s_pool;
  const int mk = min(max(min_k, 0), K);
  const int T = a->num_tokens;
  if (a->distinct_expert_cap > 0.0) {
    budget_cap_distinct<K, E>(a, experts, weights);
    __syncthreads();
  }
  if (a->budget_pooled) {
    if (threadIdx.x == 0)
      s_pool = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < a->num_seqs; s += blockDim.x) {
      const nf_seq_desc d = a->seqs[s];
      if (d.count > 0)
        atomicAdd(&s_pool, static_cast<unsigned long long>(
                               budget_calls<K>(budget[d.begin], d.count, mk) -
                               static_cast<long long>(mk) * d.count));
    }
    __syncthreads();
    budget_allocate<K>(experts, weights, counts, 0, T,
                       static_cast<long long>(s_pool), mk);
  } else {
    for (int s = 0; s < a->num_seqs; ++s) {
      const nf_seq_desc d = a->seqs[s];
      if (d.count <= 0)
        continue;
      budget_allocate<K>(experts, weights, counts, d.begin, d.count,
                         budget_calls<K>(budget[d.begin], d.count, mk) -
                             static_cast<long long>(mk) * d.count,
                         mk);
      __syncthreads(); // before the next sequence reuses the shared state
    }
  }
  __syncthreads();
  budget_finish<K>(experts, weights, counts, 0, T, norm_topk, rsf, stat_counts,
                   stat_experts);
}

/// Counts the blocks of a moe_route grid that have written their tokens'
/// candidates (atomicInc wraps it to 0 at the grid's last block): the last
/// block then makes the step-wide selection (one counter per module; a
/// module's launches run one after another).
static __device__ unsigned int nf_moe_route_blocks_done;

/// Router (logits x . gate^T in f64, s = sigmoid, sb = s + bias) and/or the
/// per-token part of select (group-limited top-K on sb, by descending sb then
/// ascending expert). One block per token.
///   kRouter: compute s / sb and write them (f32) to `scores` / `sel`;
///            otherwise read them from there.
///   kSelect: rank and write experts / weights / counts. With kDefer (the
///            budget policy, unless a->experts_per_token overrides it) the K
///            candidates and their raw scores are written for moe_budget,
///            which decides the counts and normalises.
///   pre:     when not null (with kRouter), s and sb were computed by
///            moe_router_logits (f64 pairs per token and expert): read them.
///   kOneTokenBudget (with kDefer): every sequence of the step has one token
///            (decode), so the budget decision of moe_budget reduces to
///            count = clamp(round(B * K), min_k, K) per token; made here, and
///            moe_budget is not launched. The same arithmetic as moe_budget.
///            Where the selection is step-wide (step_wide_selection), the
///            candidates are written as with kDefer and the grid's last
///            block makes the step's decision (budget_step).
template <class WG, class WB, int E, int H, int K, int NGROUP, int TOPKG,
          bool kRouter, bool kSelect, bool kDefer, bool kNorm,
          bool kOneTokenBudget = false>
__device__ void
moe_route(Step a, const float *x, const WG *gate, const WB *bias, float *scores,
          float *sel, int32_t *experts, float *weights, int32_t *counts,
          float rsf, const double *pre = nullptr, const float *budget = nullptr,
          int min_k = 0, int32_t *stat_counts = nullptr,
          int32_t *stat_experts = nullptr) {
  constexpr int CPL = (E + 31) / 32; // candidates per lane
  static_assert(CPL <= 32, "at most 1024 experts");
  __shared__ double s_s[E], s_sb[E], s_rs[K], s_g[NGROUP];
  __shared__ int s_rank[K];
  const int T = a->num_tokens;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5,
            nwarps = blockDim.x >> 5;
  for (int t = a.block(); t < T; t += a.grid()) {
    __syncthreads(); // shared state of the previous token is consumed
    if (kRouter && pre) {
      for (int e = tid; e < E; e += blockDim.x) {
        s_s[e] = pre[(static_cast<long long>(t) * E + e) * 2];
        s_sb[e] = pre[(static_cast<long long>(t) * E + e) * 2 + 1];
      }
    } else if (kRouter) {
      const float *xr = x + static_cast<long long>(t) * H;
      for (int e = warp; e < E; e += nwarps) {
        const WG *gr = gate + static_cast<long long>(e) * H;
        double acc = 0.0;
        for (int k = lane; k < H; k += 32)
          acc += static_cast<double>(xr[k]) * static_cast<double>(load(gr, k));
        acc = warp_sum(acc);
        if (lane == 0)
          router_score(acc, bias, e, static_cast<long long>(t) * E + e, scores,
                       sel, static_cast<double *>(nullptr), s_s[e], s_sb[e]);
      }
    } else {
      for (int e = tid; e < E; e += blockDim.x) {
        s_s[e] = scores[static_cast<long long>(t) * E + e];
        s_sb[e] = sel[static_cast<long long>(t) * E + e];
      }
    }
    if (!kSelect)
      continue;
    __syncthreads();
    if (warp != 0)
      continue;
    if (NGROUP > 1 && TOPKG < NGROUP) {
      // Groups ranked by the sum of their top-2 (ties: lower group first);
      // experts outside the TOPKG best groups are masked.
      constexpr int GS = E / NGROUP;
      for (int g = lane; g < NGROUP; g += 32) {
        double b1 = -f64_inf(), b2 = -f64_inf();
        for (int e = g * GS; e < (g + 1) * GS; ++e) {
          const double v = s_sb[e];
          if (v > b1) {
            b2 = b1;
            b1 = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        s_g[g] = GS >= 2 ? b1 + b2 : b1;
      }
      __syncwarp();
      for (int e = lane; e < E; e += 32) {
        const int g = e / GS;
        int rank = 0;
        for (int o = 0; o < NGROUP; ++o)
          rank += s_g[o] > s_g[g] || (s_g[o] == s_g[g] && o < g);
        if (rank >= TOPKG)
          s_sb[e] = -f64_inf();
      }
      __syncwarp();
    }
    double v[CPL];
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
      const int e = lane + 32 * i;
      v[i] = e < E ? s_sb[e] : -f64_inf();
    }
    unsigned taken = 0;
    for (int j = 0; j < K; ++j) {
      double bv = -f64_inf();
      int bi = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < CPL; ++i) {
        const int e = lane + 32 * i;
        if (e < E && !((taken >> i) & 1u) &&
            (v[i] > bv || (v[i] == bv && e < bi))) {
          bv = v[i];
          bi = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const double ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
          bv = ov;
          bi = oi;
        }
      }
      if ((bi & 31) == lane)
        taken |= 1u << (bi >> 5);
      if (lane == 0) {
        s_rank[j] = bi;
        s_rs[j] = s_s[bi];
      }
    }
    __syncwarp();
    if (lane == 0) {
      const int ept = a->experts_per_token;
      const long long row = static_cast<long long>(t) * K;
      if (kDefer && kOneTokenBudget && ept <= 0 && !step_wide_selection(a)) {
        const int mk = min(max(min_k, 0), K);
        long long calls = llround(static_cast<double>(budget[t]) * K);
        calls = min(max(calls, static_cast<long long>(mk)),
                    static_cast<long long>(K));
        const int kt = static_cast<int>(calls);
        double sum = 0.0; // of the f32 candidate weights, as moe_budget
        for (int j = 0; j < kt; ++j)
          sum += static_cast<double>(static_cast<float>(s_rs[j]));
        const double nrm = kNorm ? 1.0 / (sum + 1e-20) : 1.0;
        for (int j = 0; j < K; ++j) {
          experts[row + j] = j < kt ? s_rank[j] : -1;
          weights[row + j] =
              j < kt ? static_cast<float>(
                           static_cast<double>(static_cast<float>(s_rs[j])) *
                           nrm * rsf)
                     : 0.0f;
        }
        counts[t] = kt;
      } else if (kDefer && ept <= 0) {
        for (int j = 0; j < K; ++j) {
          experts[row + j] = s_rank[j];
          weights[row + j] = static_cast<float>(s_rs[j]);
        }
        counts[t] = K;
      } else {
        const int kt = ept > 0 ? min(ept, K) : K;
        double sum = 0.0;
        for (int j = 0; j < kt; ++j)
          sum += s_rs[j];
        const double norm = kNorm ? 1.0 / (sum + 1e-20) : 1.0;
        for (int j = 0; j < K; ++j) {
          experts[row + j] = j < kt ? s_rank[j] : -1;
          weights[row + j] =
              j < kt ? static_cast<float>(s_rs[j] * norm * rsf) : 0.0f;
        }
        counts[t] = kt;
      }
      // The step's expert statistics (their own arena region, read by the
      // runtime after the step; moe_budget, where it runs, rewrites them).
      if (stat_counts) {
        for (int j = 0; j < K; ++j)
          stat_experts[row + j] = experts[row + j];
        stat_counts[t] = counts[t];
      }
    }
  }
  // Step-wide selection in decode: the grid's last block to finish its
  // tokens decides for the whole step (no launch of moe_budget there).
  if constexpr (kDefer && kOneTokenBudget) {
    if (a->experts_per_token <= 0 && step_wide_selection(a)) {
      __shared__ bool s_last;
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence(); // this block's rows before its count
        const unsigned last = static_cast<unsigned>(a.grid()) - 1u;
        s_last = atomicInc(&nf_moe_route_blocks_done, last) == last;
      }
      __syncthreads();
      if (s_last) {
        __threadfence();
        budget_step<K, E>(a, budget, experts, weights, counts, min_k, kNorm,
                          rsf, stat_counts, stat_experts);
      }
    }
  }
}

/// The budget policy's decision (cpu/expert_budget.h), made on the device
/// after moe_route wrote every token's K candidates and raw weights: one
/// block per sequence (budget_allocate, then budget_finish), or block 0 for
/// the whole step where the selection is step-wide (budget_step).
template <int K, int E>
__device__ void
moe_budget(Step a, const float *budget, int32_t *experts, float *weights,
           int32_t *counts, int min_k, bool norm_topk, float rsf,
           int32_t *stat_counts = nullptr, int32_t *stat_experts = nullptr) {
  if (a->experts_per_token > 0)
    return; // moe_route applied the static override
  if (step_wide_selection(a)) {
    if (a.block() == 0)
      budget_step<K, E>(a, budget, experts, weights, counts, min_k, norm_topk,
                        rsf, stat_counts, stat_experts);
    return;
  }
  const int mk = min(max(min_k, 0), K);
  for (int s = a.block(); s < a->num_seqs; s += a.grid()) {
    const nf_seq_desc d = a->seqs[s];
    if (d.count <= 0)
      continue;
    budget_allocate<K>(experts, weights, counts, d.begin, d.count,
                       budget_calls<K>(budget[d.begin], d.count, mk) -
                           static_cast<long long>(mk) * d.count,
                       mk);
    __syncthreads();
    budget_finish<K>(experts, weights, counts, d.begin, d.count, norm_topk, rsf,
                     stat_counts, stat_experts);
    __syncthreads(); // before the next sequence reuses the shared state
  }
}

/// nf_moe.dispatch: counting sort of the (token, j < counts[t]) assignments
/// by expert (layout above), in one block of DW warps. Warp w owns a
/// contiguous range of tokens and walks its assignments in (token, j) order,
/// 32 a step (lane i on the i-th), CH steps' loads in flight: once to count
/// per (warp, expert), then, after a scan that turns the counts into each
/// warp's first row per expert, again to place the rows. Lanes of a step
/// with the same expert (different tokens) take consecutive rows in lane
/// order (__match_any_sync), so rows of an expert follow token order.
template <int E, int K, int M, int DW>
__device__ void moe_dispatch(Step a, const int32_t *experts,
                             const int32_t *counts, int32_t *dispatch) {
  static_assert(K <= 32 && K <= M, "at most 32 experts per token");
  constexpr int CH = 4;
  __shared__ int s_hist[DW][E], s_off[E];
  if (blockIdx.x != 0)
    return;
  const int T = a->num_tokens, tid = threadIdx.x, lane = lane_id(),
            warp = tid >> 5;
  int32_t *offsets = dispatch, *row_token = dispatch + E + 1;
  int32_t *slot_row = row_token + static_cast<long long>(T) * M;
  const int per = (T + DW - 1) / DW;
  const int t0 = min(T, warp * per), t1 = min(T, t0 + per);
  const long long f1 = static_cast<long long>(t1) * K;
  for (int i = tid; i < DW * E; i += blockDim.x)
    (&s_hist[0][0])[i] = 0;
  __syncthreads();
  // Expert of assignment f0 + 32 c + lane (-1: none) for c < CH.
  auto fetch = [&](long long f0, int *e) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const long long f = f0 + 32 * c + lane;
      e[c] = -1;
      if (f < f1) {
        const int x = experts[f];
        if (static_cast<int>(f % K) < counts[f / K] && x >= 0 && x < E)
          e[c] = x;
      }
    }
  };
  // Walks this warp's assignments in order, 32 a step: counts them per
  // expert, or (place) gives each its row. Lanes of a step with the same
  // expert (peers) are handled by the first of them.
  const unsigned below = (1u << lane) - 1u;
  auto walk = [&](bool place) {
    if (warp >= DW)
      return;
    for (long long f0 = static_cast<long long>(t0) * K; f0 < f1;
         f0 += 32 * CH) {
      int e[CH];
      fetch(f0, e);
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const long long f = f0 + 32 * c + lane;
        const unsigned peers = __match_any_sync(0xffffffffu, e[c]);
        const int leader = __ffs(peers) - 1;
        if (!place) {
          if (e[c] >= 0 && lane == leader)
            s_hist[warp][e[c]] += __popc(peers);
        } else {
          int base = 0;
          if (e[c] >= 0 && lane == leader) {
            base = s_hist[warp][e[c]];
            s_hist[warp][e[c]] = base + __popc(peers);
          }
          base = __shfl_sync(0xffffffffu, base, leader);
          if (f < f1) {
            const int row = e[c] >= 0 ? base + __popc(peers & below) : -1;
            const long long t = f / K;
            if (row >= 0)
              row_token[row] = static_cast<int32_t>(t);
            slot_row[t * M + f % K] = row;
          }
        }
        __syncwarp();
      }
    }
  };
  walk(false);
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    int total = 0;
    for (int w = 0; w < DW; ++w)
      total += s_hist[w][e];
    s_off[e] = total;
  }
  __syncthreads();
  if (warp == 0) {
    int carry = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < E ? s_off[e] : 0;
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o)
          incl += u;
      }
      if (e < E) {
        s_off[e] = carry + incl - c;
        offsets[e] = carry + incl - c;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
      offsets[E] = carry;
  }
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) {
    int base = s_off[e];
    for (int w = 0; w < DW; ++w) {
      const int c = s_hist[w][e];
      s_hist[w][e] = base;
      base += c;
    }
  }
  __syncthreads();
  walk(true);
  // Slots past K (a dispatch sized for more experts per token) are unused.
  if (M > K && warp < DW)
    for (long long i = static_cast<long long>(t0) * (M - K) + lane;
         i < static_cast<long long>(t1) * (M - K); i += 32)
      slot_row[(i / (M - K)) * M + K + i % (M - K)] = -1;
}

} // namespace nf

#endif // NF_KERNELS_MOE_CUH
