// Mamba2 ops: nf_kv.causal_conv (depthwise causal conv + SiLU, with the
// per-sequence conv window) and nf_kv.ssm_scan / nf_kv.ssm_update (the SSM
// recurrence, reference 3.4, over each sequence's tokens in order).
//
// State storage (runtime-allocated, f32): conv window [slots, CD, KW - 1]
// (oldest input first) and SSM state [slots, NH, P, N]; sequence s uses slot
// a->seqs[s].slot.
#ifndef NF_KERNELS_MAMBA_CUH
#define NF_KERNELS_MAMBA_CUH

#include "nf_common.cuh"

namespace nf {

/// One output of the depthwise conv: silu(b + w . (window, x)), then x
/// joins the window (oldest input first). Both conv forms use it, so their
/// sums are the same in the same order.
template <int KW>
__device__ __forceinline__ float conv_step(const float (&wc)[KW], float b,
                                           float (&win)[KW > 1 ? KW - 1 : 1],
                                           float x) {
  constexpr int K1 = KW - 1;
  float acc = b;
#pragma unroll
  for (int q = 0; q < K1; ++q)
    acc += wc[q] * win[q];
  acc += wc[K1] * x;
#pragma unroll
  for (int q = 0; q + 1 < K1; ++q)
    win[q] = win[q + 1];
  if (K1 > 0)
    win[K1 - 1] = x;
  return silu(acc);
}

/// Conv outputs, parallel over (group of TPT tokens, channel): a thread
/// walks its tokens with the last KW - 1 inputs in registers, so each input
/// and weight is read once per group (same sums, same order as one thread
/// per output). Inputs before the sequence's first token of the step come
/// from the conv window, which is left untouched (causal_conv_window
/// advances it in a later launch). w is [CD, KW] (w[c, KW-1] multiplies the
/// current token).
template <class W, class B, int CD, int KW, bool kBias>
__device__ void causal_conv_out(const nf_step_args *a, const float *in,
                                const W *w, const B *bias, const float *window,
                                float *out) {
  constexpr int K1 = KW - 1, TPT = 8;
  const int T = a->num_tokens;
  const long long n = static_cast<long long>((T + TPT - 1) / TPT) * CD;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int t0 = static_cast<int>(i / CD) * TPT, c = static_cast<int>(i % CD);
    float wc[KW];
#pragma unroll
    for (int q = 0; q < KW; ++q)
      wc[q] = load(w, static_cast<long long>(c) * KW + q);
    const float b = kBias ? load(bias, c) : 0.0f;
    TokenPos tp = token_pos(a, t0);
    // The K1 inputs before token tp (its sequence's, or the window's).
    float win[K1 > 0 ? K1 : 1];
    auto fill = [&]() {
      const float *st =
          window + (static_cast<long long>(tp.desc.slot) * CD + c) * K1;
#pragma unroll
      for (int q = 0; q < K1; ++q) {
        const int src = tp.local - K1 + q;
        win[q] = src < 0
                     ? st[K1 + src]
                     : in[static_cast<long long>(tp.desc.begin + src) * CD + c];
      }
    };
    fill();
    for (int j = 0; j < TPT && t0 + j < T; ++j) {
      if (j > 0) {
        if (tp.local + 1 < tp.desc.count) {
          ++tp.local;
        } else { // the next token starts another sequence
          tp = token_pos(a, t0 + j);
          fill();
        }
      }
      const long long row = static_cast<long long>(t0 + j) * CD + c;
      out[row] = conv_step<KW>(wc, b, win, in[row]);
    }
  }
}

/// Advances each sequence's conv window to its last KW-1 inputs (after
/// causal_conv_out of the same step has read the old window).
template <int CD, int KW>
__device__ void causal_conv_window(const nf_step_args *a, const float *in,
                                   float *window) {
  constexpr int K1 = KW - 1;
  const long long n = static_cast<long long>(a->num_seqs) * CD;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int s = static_cast<int>(i / CD), c = static_cast<int>(i % CD);
    const nf_seq_desc d = a->seqs[s];
    if (d.count <= 0)
      continue;
    float *st = window + (static_cast<long long>(d.slot) * CD + c) * K1;
    float old[K1 > 0 ? K1 : 1];
#pragma unroll
    for (int q = 0; q < K1; ++q)
      old[q] = st[q];
#pragma unroll
    for (int q = 0; q < K1; ++q) {
      const int src = d.count - K1 + q;
      st[q] = src < 0 ? old[K1 + src]
                      : in[static_cast<long long>(d.begin + src) * CD + c];
    }
  }
}

/// Decode form: one thread per (sequence, channel) walks the sequence's
/// tokens with the window in registers: outputs and window in one launch.
template <class W, class B, int CD, int KW, bool kBias>
__device__ void causal_conv_seq(const nf_step_args *a, const float *in,
                                const W *w, const B *bias, float *window,
                                float *out) {
  constexpr int K1 = KW - 1;
  const long long n = static_cast<long long>(a->num_seqs) * CD;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int s = static_cast<int>(i / CD), c = static_cast<int>(i % CD);
    const nf_seq_desc d = a->seqs[s];
    if (d.count <= 0)
      continue;
    float *st = window + (static_cast<long long>(d.slot) * CD + c) * K1;
    float win[K1 > 0 ? K1 : 1], wc[KW];
#pragma unroll
    for (int q = 0; q < K1; ++q)
      win[q] = st[q];
#pragma unroll
    for (int q = 0; q < KW; ++q)
      wc[q] = load(w, static_cast<long long>(c) * KW + q);
    const float b = kBias ? load(bias, c) : 0.0f;
    for (int j = 0; j < d.count; ++j) {
      const long long row = static_cast<long long>(d.begin + j) * CD + c;
      out[row] = conv_step<KW>(wc, b, win, in[row]);
    }
#pragma unroll
    for (int q = 0; q < K1; ++q)
      st[q] = win[q];
  }
}

/// dt = clamp(softplus(raw + bias), lo, hi); softplus(v) = v for v > 20.
__device__ __forceinline__ float mamba_dt(float raw, float bias, float lo,
                                          float hi) {
  const float v = raw + bias;
  float sp = v > 20.0f ? v : log1pf(expf(v));
  return fminf(fmaxf(sp, lo), hi);
}

// ---------------------------------------------------------------------------
// Chunked prefill scan: a long sequence is cut into chunks of L tokens so
// that its chunks run in parallel (the plain scan has only heads x channel
// tiles of parallelism per sequence: 256 blocks for Nano, whatever the
// prompt length). Three launches:
//   1. ssm_chunk_states: for every chunk but a sequence's last, the state
//      the chunk leaves when started from zero,
//        local[p][n] = sum_t (prod_{u > t} dA_u) dt_t x_t[p] B_t[n],
//      and its decay prod_t dA_t (a product over the chunk's tokens instead
//      of a walk: all tokens in parallel);
//   2. ssm_chunk_carry: per state element, walks the chunks in order:
//      init_{c+1} = decay_c init_c + local_c (init_0 = the slot's state),
//      stored over local_c;
//   3. ssm_scan with chunks: every chunk walks its tokens from its init
//      (y exactly as the plain scan computes it); a sequence's last chunk
//      writes the slot's state.
// Chunk c of sequence s has scratch slot (begin + c L) / L + s: distinct
// for distinct chunks, below max_tokens / L + slots.

template <int L>
__device__ __forceinline__ int ssm_chunk_slot(const nf_seq_desc &d, int s,
                                              int c) {
  return (d.begin + c * L) / L + s;
}

/// Launch 1 (see above). Block of 256 threads per (sequence, chunk, head);
/// L == 256 (a token per thread for the decay products); thread blocks of
/// 4 channels x 8 state values, RB of them per thread.
template <class WB, class WA, int NH, int P, int N, int G, int L, int CMAX>
__device__ void ssm_chunk_states(const nf_step_args *a, const float *xbc,
                                 const float *dt_raw, const WB *dt_bias,
                                 const WA *a_log, float dt_min, float dt_max,
                                 float *local, float *decay) {
  static_assert(L == 256, "a token per thread");
  static_assert(P % 4 == 0 && N % 8 == 0, "4 x 8 output blocks");
  constexpr int I = NH * P, CD = I + 2 * G * N, HPG = NH / G;
  constexpr int BLOCKS = (P / 4) * (N / 8), RB = (BLOCKS + 255) / 256;
  constexpr int TK = 16;    // tokens per staged tile
  __shared__ float sPre[L]; // suffix products of dA, then the token weights
  __shared__ __align__(16) float sX[TK][P];
  __shared__ __align__(16) float sB[TK][N];
  const int tid = threadIdx.x;
  const long long items = static_cast<long long>(a->num_seqs) * CMAX * NH;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int s = static_cast<int>(item / (CMAX * NH));
    const int c = static_cast<int>(item / NH % CMAX);
    const int h = static_cast<int>(item % NH), g = h / HPG;
    const nf_seq_desc d = a->seqs[s];
    if ((c + 1) * L >= d.count)
      continue; // the last chunk (or none): launch 3 walks it
    const long long row0 = d.begin + static_cast<long long>(c) * L;
    const float Ah = -expf(load(a_log, h));
    const float dt = mamba_dt(dt_raw[(row0 + tid) * NH + h], load(dt_bias, h),
                              dt_min, dt_max);
    const float dA = expf(dt * Ah);
    __syncthreads(); // the previous item is done with sPre
    sPre[tid] = dA;
    __syncthreads();
    // Inclusive suffix products: sPre[t] = prod_{u >= t} dA_u.
#pragma unroll
    for (int o = 1; o < L; o <<= 1) {
      const float v = tid + o < L ? sPre[tid + o] : 1.0f;
      __syncthreads();
      sPre[tid] *= v;
      __syncthreads();
    }
    const float after = tid + 1 < L ? sPre[tid + 1] : 1.0f;
    if (tid == 0)
      decay[static_cast<long long>(ssm_chunk_slot<L>(d, s, c)) * NH + h] =
          sPre[0];
    __syncthreads();
    sPre[tid] = dt * after; // weight of token tid's input
    float acc[RB][4][8] = {};
    for (int t0 = 0; t0 < L; t0 += TK) {
      __syncthreads(); // sPre written / the previous tile consumed
      for (int i = tid; i < TK * P; i += blockDim.x) {
        const int tt = i / P, pp = i % P;
        sX[tt][pp] = xbc[(row0 + t0 + tt) * CD + h * P + pp] * sPre[t0 + tt];
      }
      for (int i = tid; i < TK * N; i += blockDim.x) {
        const int tt = i / N, nn = i % N;
        sB[tt][nn] = xbc[(row0 + t0 + tt) * CD + I + g * N + nn];
      }
      __syncthreads();
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) {
        const int blk = tid + 256 * rb;
        if (blk >= BLOCKS)
          break;
        const int p0 = blk / (N / 8) * 4, n0 = blk % (N / 8) * 8;
#pragma unroll 4
        for (int tt = 0; tt < TK; ++tt) {
          const float4 x4 = *reinterpret_cast<const float4 *>(&sX[tt][p0]);
          const float4 b0 = *reinterpret_cast<const float4 *>(&sB[tt][n0]);
          const float4 b1 = *reinterpret_cast<const float4 *>(&sB[tt][n0 + 4]);
          const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
          const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              acc[rb][i][j] = fmaf(xv[i], bv[j], acc[rb][i][j]);
        }
      }
    }
    float *out =
        local +
        (static_cast<long long>(ssm_chunk_slot<L>(d, s, c)) * NH + h) * P * N;
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) {
      const int blk = tid + 256 * rb;
      if (blk >= BLOCKS)
        break;
      const int p0 = blk / (N / 8) * 4, n0 = blk % (N / 8) * 8;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 *o = reinterpret_cast<float4 *>(out + (p0 + i) * N + n0);
        o[0] = make_float4(acc[rb][i][0], acc[rb][i][1], acc[rb][i][2],
                           acc[rb][i][3]);
        o[1] = make_float4(acc[rb][i][4], acc[rb][i][5], acc[rb][i][6],
                           acc[rb][i][7]);
      }
    }
  }
}

/// Launch 2 (see above): a thread per (sequence, head, p, n).
template <int NH, int P, int N, int L>
__device__ void ssm_chunk_carry(const nf_step_args *a, const float *state,
                                float *local, const float *decay) {
  constexpr long long PER_SEQ = static_cast<long long>(NH) * P * N;
  const long long n = a->num_seqs * PER_SEQ;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int s = static_cast<int>(i / PER_SEQ);
    const long long e = i % PER_SEQ; // (h, p, n) in the state's order
    const int h = static_cast<int>(e / (P * N));
    const nf_seq_desc d = a->seqs[s];
    if (d.count <= L)
      continue;
    float S = state[static_cast<long long>(d.slot) * PER_SEQ + e];
    for (int c = 0; (c + 1) * L < d.count; ++c) {
      const long long sl = ssm_chunk_slot<L>(d, s, c);
      float *l = local + sl * PER_SEQ + e;
      S = decay[sl * NH + h] * S + *l;
      *l = S; // the init of chunk c + 1
    }
  }
}

/// The SSM recurrence. Work item = (sequence, head, tile of PT head
/// channels); a block of PT * NS threads takes one item at a time: thread
/// (p, sub) keeps S[h, p, n] for N / NS values of n in registers for the
/// whole sequence. B, C, x and dt of TC tokens at a time are staged in
/// shared memory, three chunks in a ring: the copies (cp.async) of the next
/// two are in flight while the block walks the current one, so the
/// sequential walk does not wait on memory. Each thread's share of y goes
/// to shared memory, and the NS shares of a channel are summed after the
/// chunk: only the state update chains from token to token. xbc rows:
/// x (I) | B (G*N) | C (G*N); dt_raw rows: NH.
/// With L > 0 (the chunked scan's launch 3, above) the items are
/// (sequence, chunk of L tokens, head, channel tile) for up to CMAX chunks
/// per sequence, each starting from its init in chunk_init.
template <class WB, class WA, class WD, int NH, int P, int N, int G, int PT,
          int NS, int TC, int L = 0, int CMAX = 1>
__device__ void ssm_scan(const nf_step_args *a, const float *xbc,
                         const float *dt_raw, const WB *dt_bias,
                         const WA *a_log, const WD *d_skip, float dt_min,
                         float dt_max, float *state, float *y,
                         const float *chunk_init = nullptr) {
  constexpr int I = NH * P, CD = I + 2 * G * N, NPER = N / NS;
  constexpr int HPG = NH / G, NPT = P / PT;
  static_assert(NPER * NS == N && PT * NPT == P, "bad ssm tiling");
  static_assert((NS & (NS - 1)) == 0 && NS <= 32, "NS: power of two <= 32");
  // 16-byte copies when every staged row segment starts 16-byte aligned.
  constexpr bool kVec =
      CD % 4 == 0 && I % 4 == 0 && N % 4 == 0 && P % 4 == 0 && PT % 4 == 0;
  constexpr int VW = kVec ? 4 : 1; // floats per copy
  // Thread `sub` of a channel holds state n = state_n(q, sub), q < NPER:
  // runs of VEC consecutive n, so B and C come out of shared memory as
  // float4s (a warp's NS threads read NS * 16 consecutive bytes).
  constexpr int VEC = NPER % 4 == 0 ? 4 : 1;
  auto state_n = [](int q, int sub) {
    return (q / VEC) * NS * VEC + sub * VEC + q % VEC;
  };
  // NBUF chunks: the copies of the next two are in flight while the block
  // walks the current one.
  constexpr int NBUF = 3;
  __shared__ __align__(16) float sB[NBUF][TC][N];
  __shared__ __align__(16) float sC[NBUF][TC][N];
  __shared__ __align__(16) float sX[NBUF][TC][PT];
  __shared__ float sRaw[NBUF][TC], sDt[TC], sDA[TC];
  // Each thread's share of y for every token of the chunk; summed over the
  // NS threads of a channel after the walk, so no reduction sits on the
  // token-to-token path.
  __shared__ float sPart[TC][PT][NS];
  const int tid = threadIdx.x, pl = tid / NS, sub = tid % NS;
  constexpr int CH = L > 0 ? CMAX : 1; // chunks per sequence
  const long long items = static_cast<long long>(a->num_seqs) * CH * NH * NPT;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int s = static_cast<int>(item / (CH * NH * NPT));
    const int c = static_cast<int>(item / (NH * NPT) % CH);
    const int rem = static_cast<int>(item % (NH * NPT));
    const int h = rem / NPT, p0 = (rem % NPT) * PT, p = p0 + pl;
    const nf_seq_desc d = a->seqs[s];
    // Tokens [t_begin, t_end) of the sequence.
    const int t_begin = L > 0 ? c * L : 0;
    const int t_end = L > 0 ? min(d.count, t_begin + L) : d.count;
    if (t_begin >= t_end)
      continue; // uniform over the block
    const int g = h / HPG;
    const float Ah = -expf(load(a_log, h));
    const float Dh = load(d_skip, h);
    const float bias = load(dt_bias, h);
    // Issues the copies of the chunk starting at token t0 into buffer buf
    // (none past the sequence) and commits them as one group.
    auto stage = [&](int t0, int buf) {
      const int nt = max(0, min(TC, t_end - t0));
      for (int i = tid; i < nt * (N / VW); i += blockDim.x) {
        const int tt = i / (N / VW), nn = (i % (N / VW)) * VW;
        const float *row = xbc + static_cast<long long>(d.begin + t0 + tt) * CD;
        copy_async<4 * VW>(&sB[buf][tt][nn], row + I + g * N + nn);
        copy_async<4 * VW>(&sC[buf][tt][nn], row + I + G * N + g * N + nn);
      }
      for (int i = tid; i < nt * (PT / VW); i += blockDim.x) {
        const int tt = i / (PT / VW), pp = (i % (PT / VW)) * VW;
        copy_async<4 * VW>(&sX[buf][tt][pp],
                           xbc +
                               static_cast<long long>(d.begin + t0 + tt) * CD +
                               h * P + p0 + pp);
      }
      for (int i = tid; i < nt; i += blockDim.x)
        copy_async<4>(&sRaw[buf][i],
                      dt_raw + static_cast<long long>(d.begin + t0 + i) * NH +
                          h);
      copy_async_commit();
    };
    float *S = state + ((static_cast<long long>(d.slot) * NH + h) * P + p) * N;
    const float *S0 =
        L > 0 && c > 0
            ? chunk_init + ((static_cast<long long>(
                                 ssm_chunk_slot<(L > 0 ? L : 1)>(d, s, c - 1)) *
                                 NH +
                             h) *
                                P +
                            p) *
                               N
            : S;
    float st[NPER];
#pragma unroll
    for (int q = 0; q < NPER; ++q)
      st[q] = S0[state_n(q, sub)];
    __syncthreads(); // the previous item is done with the buffers
#pragma unroll
    for (int b = 0; b < NBUF - 1; ++b)
      stage(t_begin + b * TC, b);
    for (int t0 = t_begin, buf = 0; t0 < t_end;
         t0 += TC, buf = buf + 1 == NBUF ? 0 : buf + 1) {
      const int nt = min(TC, t_end - t0);
      copy_async_wait<NBUF - 2>(); // this chunk's group has landed
      __syncthreads(); // for every thread; the oldest buffer and sPart are free
      stage(t0 + (NBUF - 1) * TC, buf == 0 ? NBUF - 1 : buf - 1);
      for (int i = tid; i < nt; i += blockDim.x) {
        const float dt = mamba_dt(sRaw[buf][i], bias, dt_min, dt_max);
        sDt[i] = dt;
        sDA[i] = expf(dt * Ah);
      }
      __syncthreads();
#pragma unroll 4
      for (int tt = 0; tt < nt; ++tt) {
        const float dt = sDt[tt], dA = sDA[tt];
        const float xd = sX[buf][tt][pl] * dt;
        float part0 = 0.0f, part1 = 0.0f;
#pragma unroll
        for (int q4 = 0; q4 < NPER / VEC; ++q4) {
          float bv[VEC], cv[VEC];
          const int n0 = q4 * NS * VEC + sub * VEC;
          if constexpr (VEC == 4) {
            const float4 b4 =
                *reinterpret_cast<const float4 *>(&sB[buf][tt][n0]);
            const float4 c4 =
                *reinterpret_cast<const float4 *>(&sC[buf][tt][n0]);
            bv[0] = b4.x, bv[1] = b4.y, bv[2] = b4.z, bv[3] = b4.w;
            cv[0] = c4.x, cv[1] = c4.y, cv[2] = c4.z, cv[3] = c4.w;
          } else {
            bv[0] = sB[buf][tt][n0];
            cv[0] = sC[buf][tt][n0];
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const int q = q4 * VEC + j;
            st[q] = dA * st[q] + xd * bv[j];
            if (q & 1)
              part1 = fmaf(st[q], cv[j], part1);
            else
              part0 = fmaf(st[q], cv[j], part0);
          }
        }
        sPart[tt][pl][sub] = part0 + part1;
      }
      __syncthreads();
      for (int i = tid; i < nt * PT; i += blockDim.x) {
        const int tt = i / PT, pp = i % PT;
        float yv = 0.0f;
#pragma unroll
        for (int u = 0; u < NS; ++u)
          yv += sPart[tt][pp][u];
        y[static_cast<long long>(d.begin + t0 + tt) * I + h * P + p0 + pp] =
            yv + Dh * sX[buf][tt][pp];
      }
    }
    copy_async_wait<0>();   // the empty trailing groups
    if (t_end == d.count) { // the sequence's last chunk
#pragma unroll
      for (int q = 0; q < NPER; ++q)
        S[state_n(q, sub)] = st[q];
    }
  }
}

} // namespace nf

#endif // NF_KERNELS_MAMBA_CUH
