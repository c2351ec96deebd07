// Row-wise and elementwise ops: nf.embed, nf.add, nf.rms_norm (and the fused
// add + rms_norm), nf.split, nf.activation, nf.gated_rms_norm and
// nf_moe.combine. Rows are tokens; a->num_tokens of them are live.
#ifndef NF_KERNELS_ROWS_CUH
#define NF_KERNELS_ROWS_CUH

#include "nf_common.cuh"

namespace nf {

/// out[t, :] = table[ids[t], :] (ids: the step's token ids or an i32 column).
template <class W, int H>
__device__ void embed(Step a, const int32_t *ids, const W *table, float *out) {
  const long long n = static_cast<long long>(a->num_tokens) * H;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const long long t = i / H, c = i % H;
    out[i] = load(table, static_cast<long long>(ids[t]) * H + c);
  }
}

/// out = x + y over COLS columns (out may alias x or y).
template <int COLS>
__device__ void add(Step a, const float *x, const float *y, float *out) {
  const long long n = static_cast<long long>(a->num_tokens) * COLS;
  for (long long i = global_thread(); i < n; i += grid_threads())
    out[i] = x[i] + y[i];
}

/// out = act(x) over COLS columns (O: as in rms_norm_row).
template <int COLS, int A, class O = float *>
__device__ void activation(Step a, const float *x, O out) {
  const long long n = static_cast<long long>(a->num_tokens) * COLS;
  for (long long i = global_thread(); i < n; i += grid_threads())
    store_act(out + i, activate<A>(x[i]));
}

/// out[t, 0:WIDTH] = x[t, COL0:COL0+WIDTH] for an input of IN_COLS columns.
template <int IN_COLS, int COL0, int WIDTH>
__device__ void copy_columns(Step a, const float *x, float *out) {
  const long long n = static_cast<long long>(a->num_tokens) * WIDTH;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const long long t = i / WIDTH, c = i % WIDTH;
    out[i] = x[t * IN_COLS + COL0 + c];
  }
}

/// Row kernels (norms) run kRowThreads threads per block.
constexpr int kRowThreads = 256;

/// One row of an RMSNorm over a block: out = w * (v * rsqrt(mean(v^2) +
/// eps)) with v = x (+ y when y is given; v is then also stored to `sum`),
/// the sum of squares in f64 as on the CPU. A block per row keeps the chain
/// of dependent loads short (a warp per row is latency bound at small
/// batches), and each thread loads all of its elements (and weights) up
/// front: one memory latency per row instead of one per element. out may
/// alias x. O: float *, unsigned short * for rows stored as bf16, or
/// ShadowedRows (store_act).
template <class W, int H, class O, class Value>
__device__ __forceinline__ void rms_norm_row_of(Value value, float *sum,
                                                const W *w, double eps, O out) {
  constexpr int EPT = (H + kRowThreads - 1) / kRowThreads;
  const int tid = threadIdx.x;
  float v[EPT], wv[EPT];
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    const int i = tid + e * kRowThreads;
    if (i < H) {
      v[e] = value(e, i);
      wv[e] = load(w, i);
    }
  }
  double ss = 0.0;
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    const int i = tid + e * kRowThreads;
    if (i < H) {
      if (sum)
        sum[i] = v[e];
      ss += static_cast<double>(v[e]) * static_cast<double>(v[e]);
    }
  }
  ss = block_sum(ss);
  const float r =
      static_cast<float>(1.0 / sqrt(ss / static_cast<double>(H) + eps));
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    const int i = tid + e * kRowThreads;
    if (i < H)
      store_act(out + i, wv[e] * (v[e] * r));
  }
}
template <class W, int H, class O>
__device__ __forceinline__ void rms_norm_row(const float *x, const float *y,
                                             float *sum, const W *w, double eps,
                                             O out) {
  rms_norm_row_of<W, H>([&](int, int i) { return y ? x[i] + y[i] : x[i]; }, sum,
                        w, eps, out);
}

/// RMSNorm, one block per row.
template <class W, int H, class O = float *>
__device__ void rms_norm(Step a, const float *x, const W *w, double eps,
                         O out) {
  const int T = a->num_tokens;
  for (long long t = blockIdx.x; t < T; t += gridDim.x)
    rms_norm_row<W, H>(x + t * H, nullptr, nullptr, w, eps, out + t * H);
}

/// sum = x + y; out = rms_norm(sum). One block per row.
template <class W, int H, class O = float *>
__device__ void add_rms_norm(Step a, const float *x, const float *y, float *sum,
                             const W *w, double eps, O out) {
  const int T = a->num_tokens;
  for (long long t = blockIdx.x; t < T; t += gridDim.x)
    rms_norm_row<W, H>(x + t * H, y + t * H, sum + t * H, w, eps, out + t * H);
}

/// Gated grouped RMSNorm (norm after gate): u = y * silu(z), normalised per
/// group of I/G features, times w. One block per (token, group); elements
/// and weights loaded up front as in rms_norm_row; O as there.
template <class W, int I, int G, class O = float *>
__device__ void gated_rms_norm(Step a, const float *y, const float *z,
                               const W *w, double eps, O out) {
  constexpr int GS = I / G, EPT = (GS + kRowThreads - 1) / kRowThreads;
  const int tid = threadIdx.x;
  const long long items = static_cast<long long>(a->num_tokens) * G;
  if constexpr (GS % 128 == 0 && GS <= 1024) {
    // Groups of whole float4s per lane: a warp per (token, group), no block
    // barriers (Nano: 512 features, 16 a lane).
    constexpr int NV = GS / 128;
    const int lane = lane_id();
    for (long long item = global_warp(); item < items; item += grid_warps()) {
      const long long t = item / G;
      const int q = static_cast<int>(item % G);
      const long long base = t * I + static_cast<long long>(q) * GS;
      float u[NV][4], wv[NV][4];
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        const int i = (v * 32 + lane) * 4;
        // The weights with the inputs: one memory latency per item.
#pragma unroll
        for (int e = 0; e < 4; ++e)
          wv[v][e] = load(w, q * GS + i + e);
        const float4 yv = *reinterpret_cast<const float4 *>(y + base + i);
        const float4 zv = *reinterpret_cast<const float4 *>(z + base + i);
        u[v][0] = yv.x * silu(zv.x);
        u[v][1] = yv.y * silu(zv.y);
        u[v][2] = yv.z * silu(zv.z);
        u[v][3] = yv.w * silu(zv.w);
      }
      double ss = 0.0;
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          ss += static_cast<double>(u[v][e]) * static_cast<double>(u[v][e]);
      ss = warp_sum(ss);
      const float r =
          static_cast<float>(1.0 / sqrt(ss / static_cast<double>(GS) + eps));
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        const int i = (v * 32 + lane) * 4;
        store_act4(out + base + i, make_float4(wv[v][0] * (u[v][0] * r),
                                               wv[v][1] * (u[v][1] * r),
                                               wv[v][2] * (u[v][2] * r),
                                               wv[v][3] * (u[v][3] * r)));
      }
    }
    return;
  }
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const long long t = item / G;
    const int q = static_cast<int>(item % G);
    const long long base = t * I + static_cast<long long>(q) * GS;
    float u[EPT], wv[EPT];
#pragma unroll
    for (int e = 0; e < EPT; ++e) {
      const int i = tid + e * kRowThreads;
      if (i < GS) {
        u[e] = y[base + i] * silu(z[base + i]);
        wv[e] = load(w, q * GS + i);
      }
    }
    double ss = 0.0;
#pragma unroll
    for (int e = 0; e < EPT; ++e)
      if (tid + e * kRowThreads < GS)
        ss += static_cast<double>(u[e]) * static_cast<double>(u[e]);
    ss = block_sum(ss);
    const float r =
        static_cast<float>(1.0 / sqrt(ss / static_cast<double>(GS) + eps));
#pragma unroll
    for (int e = 0; e < EPT; ++e) {
      const int i = tid + e * kRowThreads;
      if (i < GS)
        store_act(out + base + i, wv[e] * (u[e] * r));
    }
  }
}

/// moe_combine's value of token t at column c (its per-element form).
template <int HE, int KW, int E, int M>
__device__ __forceinline__ float
moe_combined(Step a, const float *rows, const int32_t *dispatch, const float *w,
             long long t, long long c) {
  const int32_t *slot_row =
      dispatch + E + 1 + static_cast<long long>(a->num_tokens) * M;
  float acc = 0.0f;
#pragma unroll 4
  for (int j = 0; j < KW; ++j) {
    const int32_t row = slot_row[t * M + j];
    if (row < 0)
      continue;
    acc += w[t * KW + j] * rows[static_cast<long long>(row) * HE + c];
  }
  return acc;
}

/// A decode MoE layer's end and the next norm in one launch: sum = x +
/// (shared + the token's routed rows combined as moe_combine combines
/// them), out = rms_norm(sum): the same f32 operations as moe_combine, the
/// add of the shared expert's rows, and add_rms_norm. One block per token;
/// each thread reads the token's slots and weights once, then streams its
/// elements of the KW rows (independent loads).
template <class W, int H, int KW, int E, int M, class O = float *>
__device__ void
moe_combine_add_rms_norm(Step a, const float *x, const float *rows,
                         const int32_t *dispatch, const float *wts,
                         const float *shared, float *sum, const W *w,
                         double eps, O out) {
  const int T = a->num_tokens;
  const int32_t *slot_row = dispatch + E + 1 + static_cast<long long>(T) * M;
  constexpr int EPT = (H + kRowThreads - 1) / kRowThreads;
  const int tid = threadIdx.x;
  for (long long t = blockIdx.x; t < T; t += gridDim.x) {
    // Every row element this thread needs, loaded unconditionally (an
    // unused slot reads row 0, and its value is not added) so that the
    // loads of all KW rows are in flight together (with the loads under
    // each slot's test, Nano's batch-1 step spent 13.9 us on this launch
    // against 3.1 for add_rms_norm alone: the block waited on them one
    // slot at a time).
    float acc[EPT];
#pragma unroll
    for (int e = 0; e < EPT; ++e)
      acc[e] = 0.0f;
#pragma unroll
    for (int j = 0; j < KW; ++j) {
      const int32_t row = slot_row[t * M + j];
      const float wt = wts[t * KW + j];
      const float *rj = rows + static_cast<long long>(max(row, 0)) * H;
      float r[EPT];
#pragma unroll
      for (int e = 0; e < EPT; ++e) {
        const int i = tid + e * kRowThreads;
        r[e] = i < H ? rj[i] : 0.0f;
      }
      if (row >= 0)
#pragma unroll
        for (int e = 0; e < EPT; ++e)
          acc[e] += wt * r[e];
    }
    const float *xt = x + t * H, *st = shared + t * H;
    rms_norm_row_of<W, H>(
        [&](int e, int i) { return xt[i] + (st[i] + acc[e]); }, sum + t * H, w,
        eps, out + t * H);
  }
}

/// nf_moe.combine: out[t] = sum_j w[t, j] * rows[slotRow[t, j]] in j order
/// (f32), skipping unused slots. The dispatch layout is that of nf_moe.cuh.
template <int HE, int KW, int E, int M>
__device__ void moe_combine(Step a, const float *rows, const int32_t *dispatch,
                            const float *w, float *out) {
  const int T = a->num_tokens;
  if constexpr (HE % 4 == 0) {
    // Four columns a thread (float4): the same sums, a quarter of the
    // loads of the slots and weights.
    const int32_t *slot_row = dispatch + E + 1 + static_cast<long long>(T) * M;
    constexpr int HV = HE / 4;
    const long long n = static_cast<long long>(T) * HV;
    for (long long i = global_thread(); i < n; i += grid_threads()) {
      const long long t = i / HV, c = i % HV;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
      for (int j = 0; j < KW; ++j) {
        const int32_t row = slot_row[t * M + j];
        if (row < 0)
          continue;
        const float wj = w[t * KW + j];
        const float4 v = reinterpret_cast<const float4 *>(
            rows + static_cast<long long>(row) * HE)[c];
        acc.x += wj * v.x;
        acc.y += wj * v.y;
        acc.z += wj * v.z;
        acc.w += wj * v.w;
      }
      reinterpret_cast<float4 *>(out)[i] = acc;
    }
    return;
  }
  const long long n = static_cast<long long>(T) * HE;
  for (long long i = global_thread(); i < n; i += grid_threads())
    out[i] = moe_combined<HE, KW, E, M>(a, rows, dispatch, w, i / HE, i % HE);
}

} // namespace nf

#endif // NF_KERNELS_ROWS_CUH
