// The largest logits of each row a decode step computes, on the device: what
// a greedy or top-k sampler needs, so that a step copies back K ids and
// values per sequence instead of its whole vocabulary row (Nano: 512 KB).
// A row may instead be ranked by a temperature sampler's Gumbel-max keys,
// logit / T + G(seed, draw, token) rounded to float (the host sampler's
// definition, runtime/src/sampling/sampler.h; Philox4x32-10 as in
// runtime/src/sampling/philox.h), so that a temperature-only sampler reads
// no row either; the values are then still the logits. A row may also get
// its total, the sum of exp((x - max) / T) over its tokens (f64), which
// top-p needs beside the list.
//
// Order: value descending, then index ascending (the host sampler's order
// of equal logits); NaN is never chosen, and rows with fewer than K tokens
// end with id -1. Two launches, run by the runtime after the step when the
// caller asks for the top logits (Plan Step.top_logits):
//   top_logits_chunks: each block ranks CHUNK logits of one row (a bitonic
//     sort of 64-bit keys in shared memory) and keeps its K best;
//   top_logits_merge: one block per row ranks the chunks' K best and writes
//     the row's K ids and values.
// Rows are those the LM head computed: logit_rows[j] (or j), j <
// num_logit_rows (or num_tokens).
#ifndef NF_KERNELS_SAMPLE_CUH
#define NF_KERNELS_SAMPLE_CUH

#include "nf_common.cuh"

namespace nf {

__host__ __device__ constexpr int pow2_at_least(int n) {
  int p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

/// A logit and its index as one key whose unsigned order is the ranking
/// (larger first): the value's bits made monotone, then the inverted index.
/// NaN is 0, below every logit; -0 is +0 (equal values rank by index, as on
/// the host).
__device__ __forceinline__ unsigned long long top_logit_key(float v, int i) {
  if (v != v)
    return 0ull;
  const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
  const unsigned m = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(m) << 32) |
         (0xffffffffu - static_cast<unsigned>(i));
}

/// Per row: how to rank it and whether to sum it (the runtime writes one
/// per row before the launches).
struct top_logit_noise {
  unsigned long long seed, draw;
  float temperature;
  unsigned flags; // kTopKeys, kTopTotal
};
static_assert(sizeof(top_logit_noise) == 24, "the plan's noise rows");
/// Rank by the Gumbel-max keys of (seed, draw) at the temperature (else by
/// the logit).
constexpr unsigned kTopKeys = 1;
/// Sum exp((x - max) / temperature) over the row (TopLogits.totals_offset).
constexpr unsigned kTopTotal = 2;

/// A chunk's part of a row's total: its largest logit and the sum of
/// exp((x - max) / T) over it.
struct top_chunk_total {
  double sum;
  float max;
  unsigned pad;
};

/// Philox4x32-10; the host's copy is runtime/src/sampling/philox.h.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    const unsigned lo0 = 0xD2511F53u * c.x, hi0 = __umulhi(0xD2511F53u, c.x);
    const unsigned lo1 = 0xCD9E8D57u * c.z, hi1 = __umulhi(0xCD9E8D57u, c.z);
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

/// Standard Gumbel noise of (seed, draw, token), as the host's gumbelNoise.
__device__ __forceinline__ double gumbel_noise(unsigned long long seed,
                                               unsigned long long draw,
                                               unsigned token) {
  const uint4 r = philox4x32_10(
      make_uint4(token, 0u, static_cast<unsigned>(draw),
                 static_cast<unsigned>(draw >> 32)),
      make_uint2(static_cast<unsigned>(seed),
                 static_cast<unsigned>(seed >> 32)));
  const unsigned long long bits =
      static_cast<unsigned long long>(r.x) |
      (static_cast<unsigned long long>(r.y) << 32);
  const double u = (static_cast<double>(bits >> 12) + 0.5) * 0x1.0p-52;
  return -log(-log(u));
}

/// The value a row is ranked by: the logit, or its noisy key. A finite
/// logit's key stays finite (clamped to the float range), so that only the
/// +-inf logits have infinite keys: a list then ends at -inf only when every
/// finite logit is listed, and +inf logits come first.
__device__ __forceinline__ float top_rank_value(float v, int n,
                                                const top_logit_noise &z) {
  if ((z.flags & kTopKeys) && v == v) {
    const double key =
        __ddiv_rn(static_cast<double>(v), static_cast<double>(z.temperature)) +
        gumbel_noise(z.seed, z.draw, static_cast<unsigned>(n));
    constexpr double kMax = 3.4028234663852886e38; // FLT_MAX
    v = isinf(v) ? v
                 : static_cast<float>(key > kMax    ? kMax
                                      : key < -kMax ? -kMax
                                                    : key);
  }
  return v;
}

/// Sorts s[0, N) descending; N a power of two; call from every thread of a
/// block of T threads.
template <int N, int T>
__device__ __forceinline__ void bitonic_sort_desc(unsigned long long *s) {
  for (int k = 2; k <= N; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < N; i += T) {
        const int p = i ^ j;
        if (p > i) {
          const unsigned long long x = s[i], y = s[p];
          const bool desc = (i & k) == 0;
          if (desc ? x < y : x > y) {
            s[i] = y;
            s[p] = x;
          }
        }
      }
      __syncthreads();
    }
}

__device__ __forceinline__ int top_logit_rows(Step a) {
  return a->logit_rows ? a->num_logit_rows : a->num_tokens;
}

/// A chunk's top_chunk_total (kTopTotal), from every thread of the block;
/// red: T / 32 doubles of shared memory.
template <int V, int CHUNK, int T>
__device__ __forceinline__ void top_chunk_sum(const float *row, int c,
                                              float temperature, double *red,
                                              top_chunk_total *out) {
  constexpr int W = T / 32;
  float m = -f32_inf();
  for (int i = threadIdx.x; i < CHUNK; i += T) {
    const int n = c * CHUNK + i;
    if (n < V)
      m = row[n] > m ? row[n] : m; // NaN: false
  }
  for (int o = 16; o > 0; o >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0)
    red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = static_cast<float>(red[0]);
  for (int w = 1; w < W; ++w)
    m = fmaxf(m, static_cast<float>(red[w]));
  __syncthreads(); // red is rewritten below
  double sum = 0.0;
  if (m > -f32_inf() && m < f32_inf()) {
    const double invT = 1.0 / static_cast<double>(temperature);
    for (int i = threadIdx.x; i < CHUNK; i += T) {
      const int n = c * CHUNK + i;
      if (n < V && row[n] > -f32_inf())
        sum += exp((static_cast<double>(row[n]) - m) * invT);
    }
  }
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0)
    red[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < W; ++w)
      s += red[w];
    out->sum = s;
    out->max = m;
    out->pad = 0;
  }
  __syncthreads();
}

/// Launch with T threads; partial: [rows][CHUNKS][K] keys; noise: [rows];
/// sums: [rows][CHUNKS] (rows with kTopTotal).
template <int V, int CHUNK, int K, int T>
__device__ void top_logits_chunks(Step a, const float *logits,
                                  const top_logit_noise *noise,
                                  unsigned long long *partial,
                                  top_chunk_total *sums) {
  static_assert(K <= CHUNK && (CHUNK & (CHUNK - 1)) == 0, "chunk size");
  constexpr int CHUNKS = (V + CHUNK - 1) / CHUNK;
  __shared__ unsigned long long s[CHUNK];
  __shared__ double red[T / 32];
  const int rows = top_logit_rows(a);
  for (int w = blockIdx.x; w < rows * CHUNKS; w += gridDim.x) {
    const int j = w / CHUNKS, c = w % CHUNKS;
    const float *row = logits + static_cast<long long>(logit_row(a, j)) * V;
    const top_logit_noise z = noise[j];
    if (z.flags & kTopTotal)
      top_chunk_sum<V, CHUNK, T>(row, c, z.temperature, red, sums + w);
    for (int i = threadIdx.x; i < CHUNK; i += T) {
      const int n = c * CHUNK + i;
      s[i] = n < V ? top_logit_key(top_rank_value(row[n], n, z), n) : 0ull;
    }
    __syncthreads();
    bitonic_sort_desc<CHUNK, T>(s);
    for (int i = threadIdx.x; i < K; i += T)
      partial[static_cast<long long>(w) * K + i] = s[i];
    __syncthreads(); // s is rewritten by the next chunk
  }
}

/// Launch with T threads; ids and values: [rows][K]; the values are the
/// logits also where the noisy keys ranked them; totals: [rows] (rows with
/// kTopTotal: the chunks' sums, each scaled to the row's largest logit;
/// NaN where that is +inf).
template <int V, int CHUNK, int K, int T>
__device__ void top_logits_merge(Step a, const float *logits,
                                 const top_logit_noise *noise,
                                 const unsigned long long *partial,
                                 const top_chunk_total *sums, int *ids,
                                 float *values, double *totals) {
  constexpr int CHUNKS = (V + CHUNK - 1) / CHUNK;
  constexpr int M = pow2_at_least(CHUNKS * K);
  __shared__ unsigned long long s[M];
  const int rows = top_logit_rows(a);
  for (int j = blockIdx.x; j < rows; j += gridDim.x) {
    for (int i = threadIdx.x; i < M; i += T)
      s[i] = i < CHUNKS * K
                 ? partial[static_cast<long long>(j) * CHUNKS * K + i]
                 : 0ull;
    __syncthreads();
    bitonic_sort_desc<M, T>(s);
    const bool noisy = (noise[j].flags & kTopKeys) != 0;
    if ((noise[j].flags & kTopTotal) && threadIdx.x == 0) {
      const top_chunk_total *t = sums + static_cast<long long>(j) * CHUNKS;
      float m = -f32_inf();
      for (int c = 0; c < CHUNKS; ++c)
        m = fmaxf(m, t[c].max);
      double total = m == f32_inf() ? __longlong_as_double(0x7ff8000000000000ll)
                                   : 0.0;
      if (m > -f32_inf() && m < f32_inf()) {
        const double invT = 1.0 / static_cast<double>(noise[j].temperature);
        for (int c = 0; c < CHUNKS; ++c)
          if (t[c].max > -f32_inf())
            total += t[c].sum * exp((static_cast<double>(t[c].max) - m) * invT);
      }
      totals[j] = total;
    }
    const float *row = logits + static_cast<long long>(logit_row(a, j)) * V;
    for (int i = threadIdx.x; i < K; i += T) {
      const unsigned long long key = s[i];
      const unsigned m = static_cast<unsigned>(key >> 32);
      const unsigned u = (m & 0x80000000u) ? (m & 0x7fffffffu) : ~m;
      const long long o = static_cast<long long>(j) * K + i;
      const int id =
          key ? static_cast<int>(0xffffffffu -
                                 static_cast<unsigned>(key & 0xffffffffu))
              : -1;
      ids[o] = id;
      values[o] = noisy && id >= 0 ? row[id] : __uint_as_float(u);
    }
    __syncthreads();
  }
}

} // namespace nf

#endif // NF_KERNELS_SAMPLE_CUH
