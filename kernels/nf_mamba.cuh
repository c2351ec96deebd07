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
#include "nf_mma.cuh"

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
__device__ void causal_conv_out(Step a, const float *in, const W *w,
                                const B *bias, const float *window,
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
    if (tp.local + TPT <= tp.desc.count) {
      // The TPT tokens continue one sequence (the common case): their
      // inputs are loaded at once, not one memory latency per token.
      float x[TPT];
#pragma unroll
      for (int j = 0; j < TPT; ++j)
        x[j] = in[static_cast<long long>(t0 + j) * CD + c];
#pragma unroll
      for (int j = 0; j < TPT; ++j)
        out[static_cast<long long>(t0 + j) * CD + c] =
            conv_step<KW>(wc, b, win, x[j]);
      continue;
    }
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
__device__ void causal_conv_window(Step a, const float *in, float *window) {
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
__device__ void causal_conv_seq(Step a, const float *in, const W *w,
                                const B *bias, float *window, float *out) {
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

/// The decode conv of channel c of token r (one token per sequence) from
/// the GEMM epilogue that produced its input x (linear + split +
/// causal_conv): the output, and the sequence's window advanced, with the
/// same conv_step as causal_conv_seq (so the same results). Each (slot,
/// channel) window belongs to one token of the step, so the in-place update
/// races with nothing.
template <class W, class B, int CD, int KW, bool kBias>
__device__ __forceinline__ void
causal_conv_decode(Step a, int r, int c, float x, const W *w, const B *bias,
                   float *window, float *out) {
  constexpr int K1 = KW - 1;
  const int slot = a->seqs[a->token_seq[r]].slot;
  float *st = window + (static_cast<long long>(slot) * CD + c) * K1;
  float win[K1 > 0 ? K1 : 1], wc[KW];
#pragma unroll
  for (int q = 0; q < K1; ++q)
    win[q] = st[q];
#pragma unroll
  for (int q = 0; q < KW; ++q)
    wc[q] = load(w, static_cast<long long>(c) * KW + q);
  const float b = kBias ? load(bias, c) : 0.0f;
  out[static_cast<long long>(r) * CD + c] = conv_step<KW>(wc, b, win, x);
#pragma unroll
  for (int q = 0; q < K1; ++q)
    st[q] = win[q];
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
//      init_c stored over local_c (every chunk's, the last one's too);
//   3. ssm_scan with chunks: every chunk walks its tokens from its init
//      (y exactly as the plain scan computes it); a sequence's last chunk
//      writes the slot's state. The inits of a sequence of several chunks
//      are all read from scratch: chunk 0 reading the slot's state could
//      otherwise see the last chunk's result (blocks run in any order).
// Chunk c of sequence s has scratch slot (begin + c L) / L + s: distinct
// for distinct chunks (the last chunk's too), below max_tokens / L + slots.

template <int L>
__device__ __forceinline__ int ssm_chunk_slot(const nf_seq_desc &d, int s,
                                              int c) {
  return (d.begin + c * L) / L + s;
}

/// Launch 1 (see above). Block of 256 threads per (sequence, chunk, head);
/// L == 256 (a token per thread for the decay products); thread blocks of
/// 4 channels x 8 state values, RB of them per thread.
template <class WB, class WA, int NH, int P, int N, int G, int L, int CMAX>
__device__ void ssm_chunk_states(Step a, const float *xbc, const float *dt_raw,
                                 const WB *dt_bias, const WA *a_log,
                                 float dt_min, float dt_max, float *local,
                                 float *decay) {
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
__device__ void ssm_chunk_carry(Step a, const float *state, float *local,
                                const float *decay) {
  constexpr long long PER_SEQ = static_cast<long long>(NH) * P * N;
  const long long n = a->num_seqs * PER_SEQ;
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int s = static_cast<int>(i / PER_SEQ);
    const long long e = i % PER_SEQ; // (h, p, n) in the state's order
    const int h = static_cast<int>(e / (P * N));
    const nf_seq_desc d = a->seqs[s];
    if (d.count <= L)
      continue;
    // The chunks' own states and decays are loaded GRP at a time before
    // their inits are stored, so the loads are in flight together (a load
    // after a store to local could not be moved ahead of it).
    constexpr int GRP = 16;
    const int nc = (d.count + L - 1) / L; // the last has no state of its own
    float S = state[static_cast<long long>(d.slot) * PER_SEQ + e];
    for (int c0 = 0; c0 < nc; c0 += GRP) {
      float own[GRP], dec[GRP];
#pragma unroll
      for (int j = 0; j < GRP; ++j) {
        own[j] = 0.0f, dec[j] = 0.0f;
        if (c0 + j + 1 < nc) {
          const long long sl = ssm_chunk_slot<L>(d, s, c0 + j);
          own[j] = local[sl * PER_SEQ + e];
          dec[j] = decay[sl * NH + h];
        }
      }
#pragma unroll
      for (int j = 0; j < GRP; ++j)
        if (c0 + j < nc) {
          local[ssm_chunk_slot<L>(d, s, c0 + j) * PER_SEQ + e] = S; // init
          S = dec[j] * S + own[j];
        }
    }
  }
}

// ---------------------------------------------------------------------------
// The chunked scan on tensor cores (SSD's matrix form, Dao & Gu 2024): the
// same three launches as above, with launches 1 and 3 as ssd_chunk. Within
// a chunk of L tokens a block walks sub-chunks of Q tokens; with cum_t the
// inclusive sum of dt_u A over the sub-chunk's tokens u <= t and S the
// state entering it (P x N),
//   y_t  = exp(cum_t) C_t S^T + sum_{s <= t} (C_t . B_s) exp(cum_t - cum_s)
//          dt_s x_s + D x_t,
//   S'   = exp(cum_last) S + sum_s exp(cum_last - cum_s) dt_s x_s B_s^T,
// which is the recurrence of ssm_scan, summed per sub-chunk instead of per
// token: four small matrix products, on mma.sync with the activations split
// into TERMS bf16 terms as the GEMMs do (3: exact products, term pairs
// i + j < 3; 1: bf16 inputs). S stays in f32 registers (the accumulators of
// its product), warp w holding rows p in [16w, 16w + 16); the rows t of y
// and of (C B^T) are taken 16 per warp, and the masked C B^T fragments are
// reused in registers as the A operand of their product with x (as
// attention's P V).

/// Dynamic shared memory of ssd_chunk, bytes: bf16 terms of B and of the
/// weighted x (both launches), of C, x and S (launch 3 only).
template <int P, int N, int Q, int TERMS, bool kStates>
__host__ __device__ constexpr int ssd_chunk_smem() {
  return 2 * TERMS *
         (Q * (N + 8) + Q * (P + 8) +
          (kStates ? 0 : Q * (N + 8) + Q * (P + 8) + P * (N + 8)));
}

/// kStates: launch 1 (each chunk's state from zero, and its decay, into
/// local / decay; not a sequence's last chunk). Otherwise launch 3 (y, from
/// each chunk's init: the slot's state for a sequence of one chunk, the
/// carried inits in local otherwise; a sequence's last chunk writes the
/// slot's state). A block of P / 16 warps
/// per (sequence, chunk, head): launch with 32 * (P / 16) threads.
template <class WB, class WA, class WD, int NH, int P, int N, int G, int L,
          int CMAX, int Q, int TERMS, bool kStates>
__device__ void ssd_chunk(Step a, const float *xbc, const float *dt_raw,
                          const WB *dt_bias, const WA *a_log, const WD *d_skip,
                          float dt_min, float dt_max, float *state, float *y,
                          float *local, float *decay) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int I = NH * P, CD = I + 2 * G * N, HPG = NH / G;
  constexpr int WARPS = P / 16, THREADS = 32 * WARPS, NS = N + 8, XS = P + 8;
  constexpr int NTN = N / 8, NTP = P / 8, NTQ = Q / 8, R = Q / 32;
  static_assert(P % 16 == 0 && N % 16 == 0 && Q % 32 == 0 && L % Q == 0,
                "ssd tiles: P, N multiples of 16, Q of 32");
  static_assert(TERMS == 1 || TERMS == 3, "1 or 3 bf16 terms");
  using Tile = unsigned short;
  extern __shared__ float4 nf_ssd_smem[];
  Tile(*sB)[Q][NS] = reinterpret_cast<Tile(*)[Q][NS]>(nf_ssd_smem);
  Tile(*sXw)[Q][XS] =
      reinterpret_cast<Tile(*)[Q][XS]>(&sB[0][0][0] + TERMS * Q * NS);
  Tile(*sC)[Q][NS] =
      reinterpret_cast<Tile(*)[Q][NS]>(&sXw[0][0][0] + TERMS * Q * XS);
  Tile(*sX)[Q][XS] =
      reinterpret_cast<Tile(*)[Q][XS]>(&sC[0][0][0] + TERMS * Q * NS);
  Tile(*sS)[P][NS] =
      reinterpret_cast<Tile(*)[P][NS]>(&sX[0][0][0] + TERMS * Q * XS);
  __shared__ float sCum[Q], sDt[Q], sTot;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int g8 = lane >> 2, c4 = lane & 3;
  const long long items = static_cast<long long>(a->num_seqs) * CMAX * NH;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int s = static_cast<int>(item / (CMAX * NH));
    const int c = static_cast<int>(item / NH % CMAX);
    const int h = static_cast<int>(item % NH), grp = h / HPG;
    const nf_seq_desc d = a->seqs[s];
    const int t_begin = c * L, t_end = min(d.count, t_begin + L);
    if (kStates ? t_end >= d.count : t_begin >= t_end)
      continue; // uniform over the block
    const float Ah = -expf(load(a_log, h));
    const float bias = load(dt_bias, h);
    // This warp's rows of S: the init, as f32 accumulators.
    float S[NTN][4];
    {
      const float *S0 = nullptr;
      if (!kStates)
        S0 = d.count > L
                 ? local + (static_cast<long long>(ssm_chunk_slot<L>(d, s, c)) *
                                NH +
                            h) *
                               P * N
                 : state + (static_cast<long long>(d.slot) * NH + h) * P * N;
#pragma unroll
      for (int n = 0; n < NTN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int p = warp * 16 + g8 + (e >> 1) * 8, col = n * 8 + 2 * c4;
          S[n][e] = kStates ? 0.0f : S0[p * N + col + (e & 1)];
        }
    }
    // S's bf16 terms for launch 3's C S^T.
    auto store_state = [&] {
#pragma unroll
      for (int n = 0; n < NTN; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          unsigned short e0[3], e1[3];
          split_bf16<TERMS>(S[n][2 * hh], e0);
          split_bf16<TERMS>(S[n][2 * hh + 1], e1);
#pragma unroll
          for (int te = 0; te < TERMS; ++te)
            *reinterpret_cast<unsigned *>(
                &sS[te][warp * 16 + g8 + 8 * hh][n * 8 + 2 * c4]) =
                pack_bf16x2(e0[te], e1[te]);
        }
    };
    __syncthreads(); // the previous item is done with shared memory
    if (!kStates)
      store_state();
    float total = 0.0f; // sum of dt A over the chunk
    for (int q0 = t_begin; q0 < t_end; q0 += Q) {
      const int nt = min(Q, t_end - q0);
      const long long row0 = d.begin + static_cast<long long>(q0);
      __syncthreads(); // the previous sub-chunk is consumed; sS written
      if (warp == 0) {
        // dt and the inclusive sums of dt A: R tokens per lane, then a
        // scan over the lanes. Tokens past the chunk: dt = 0.
        float dts[R], cs[R], run = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int t = lane * R + r;
          dts[r] = t < nt ? mamba_dt(dt_raw[(row0 + t) * NH + h], bias, dt_min,
                                     dt_max)
                          : 0.0f;
          run += dts[r] * Ah;
          cs[r] = run;
        }
        float incl = run;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const float v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o)
            incl += v;
        }
        // The previous lane's sum itself, not incl - run (which rounds).
        float excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0)
          excl = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          sCum[lane * R + r] = excl + cs[r];
          sDt[lane * R + r] = dts[r];
        }
        if (lane == 31)
          sTot = incl;
      }
      // B (and C, x) terms; rows past the chunk are zero.
#pragma unroll 4
      for (int i = tid; i < Q * (N / 4); i += THREADS) {
        const int t = i / (N / 4), n = (i % (N / 4)) * 4;
        const float *row = xbc + (row0 + t) * CD + I + grp * N + n;
        const bool in = t < nt;
        uint2 bt[3];
        split4_bf16<TERMS>(in ? *reinterpret_cast<const float4 *>(row)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f),
                           bt);
#pragma unroll
        for (int te = 0; te < TERMS; ++te)
          *reinterpret_cast<uint2 *>(&sB[te][t][n]) = bt[te];
        if (!kStates) {
          uint2 ct[3];
          split4_bf16<TERMS>(in ? *reinterpret_cast<const float4 *>(row + G * N)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f),
                             ct);
#pragma unroll
          for (int te = 0; te < TERMS; ++te)
            *reinterpret_cast<uint2 *>(&sC[te][t][n]) = ct[te];
        }
      }
      if (!kStates)
#pragma unroll 4
        for (int i = tid; i < Q * (P / 4); i += THREADS) {
          const int t = i / (P / 4), p = (i % (P / 4)) * 4;
          uint2 xt[3];
          split4_bf16<TERMS>(t < nt ? *reinterpret_cast<const float4 *>(
                                          xbc + (row0 + t) * CD + h * P + p)
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f),
                             xt);
#pragma unroll
          for (int te = 0; te < TERMS; ++te)
            *reinterpret_cast<uint2 *>(&sX[te][t][p]) = xt[te];
        }
      __syncthreads(); // sCum, sDt, sTot
      const float tot = sTot;
      total += tot;
      // x weighted by exp(cum_last - cum_s) dt_s, for the state.
#pragma unroll 4
      for (int i = tid; i < Q * (P / 4); i += THREADS) {
        const int t = i / (P / 4), p = (i % (P / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < nt) {
          v = *reinterpret_cast<const float4 *>(xbc + (row0 + t) * CD + h * P +
                                                p);
          const float w = expf(tot - sCum[t]) * sDt[t];
          v.x *= w, v.y *= w, v.z *= w, v.w *= w;
        }
        uint2 xt[3];
        split4_bf16<TERMS>(v, xt);
#pragma unroll
        for (int te = 0; te < TERMS; ++te)
          *reinterpret_cast<uint2 *>(&sXw[te][t][p]) = xt[te];
      }
      __syncthreads();
      if (!kStates) {
        const float Dh = load(d_skip, h);
        for (int tt = warp; tt * 16 < nt; tt += WARPS) {
          // Rows t of this tile: r0 = 16 tt + g8 and r0 + 8; (C B^T) is
          // needed for s < 16 (tt + 1) only (causal).
          const int r0 = tt * 16 + g8;
          float Y[NTP][4], M[NTQ][4];
#pragma unroll
          for (int n = 0; n < NTP; ++n)
            Y[n][0] = Y[n][1] = Y[n][2] = Y[n][3] = 0.0f;
#pragma unroll
          for (int n = 0; n < NTQ; ++n)
            M[n][0] = M[n][1] = M[n][2] = M[n][3] = 0.0f;
#pragma unroll 2
          for (int k0 = 0; k0 < N; k0 += 16) {
            unsigned af[TERMS][4];
#pragma unroll
            for (int te = 0; te < TERMS; ++te)
              load_a_frag<NS>(af[te], &sC[te][r0][k0 + 2 * c4]);
              // C S^T: B operand (n, p) = S[p][n].
#pragma unroll
            for (int n = 0; n < NTP; ++n) {
              unsigned bf[TERMS][2];
#pragma unroll
              for (int te = 0; te < TERMS; ++te)
                load_b_frag(bf[te], &sS[te][n * 8 + g8][k0 + 2 * c4]);
              mma_bf16_terms<TERMS>(Y[n], af,
                                    [&](int t, int r) { return bf[t][r]; });
            }
            // C B^T: B operand (n, s) = B[s][n].
#pragma unroll
            for (int n = 0; n < NTQ; ++n) {
              if (n >= 2 * (tt + 1))
                break;
              unsigned bf[TERMS][2];
#pragma unroll
              for (int te = 0; te < TERMS; ++te)
                load_b_frag(bf[te], &sB[te][n * 8 + g8][k0 + 2 * c4]);
              mma_bf16_terms<TERMS>(M[n], af,
                                    [&](int t, int r) { return bf[t][r]; });
            }
          }
          const float cum0 = sCum[r0], cum1 = sCum[r0 + 8];
          const float e0 = expf(cum0), e1 = expf(cum1);
#pragma unroll
          for (int n = 0; n < NTP; ++n) {
            Y[n][0] *= e0, Y[n][1] *= e0, Y[n][2] *= e1, Y[n][3] *= e1;
          }
          // The causal mask and the decay and dt of each s.
#pragma unroll
          for (int n = 0; n < NTQ; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int t = r0 + (e >> 1) * 8, sc = n * 8 + 2 * c4 + (e & 1);
              M[n][e] = sc <= t ? M[n][e] *
                                      expf((e >> 1 ? cum1 : cum0) - sCum[sc]) *
                                      sDt[sc]
                                : 0.0f;
            }
            // y += M x: M's fragments of s tiles 2kk, 2kk + 1 are the A
            // fragment of k-step kk; x's read transposed.
#pragma unroll
          for (int kk = 0; kk < Q / 16; ++kk) {
            if (kk > tt)
              break;
            unsigned pf[TERMS][4];
            c_pair_to_a<TERMS>(M[2 * kk], M[2 * kk + 1], pf);
#pragma unroll
            for (int n = 0; n < NTP; n += 2) {
              unsigned bf[TERMS][4];
#pragma unroll
              for (int te = 0; te < TERMS; ++te)
                ldmatrix_x4_trans(
                    bf[te],
                    &sX[te][kk * 16 + (lane & 15)][(n + (lane >> 4)) * 8]);
#pragma unroll
              for (int hh = 0; hh < 2; ++hh)
                mma_bf16_terms<TERMS>(Y[n + hh], pf, [&](int t, int r) {
                  return bf[t][2 * hh + r];
                });
            }
          }
          // y = Y + D x for the rows inside the chunk.
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int t = r0 + 8 * hh;
            if (t >= nt)
              continue;
            const float *xr = xbc + (row0 + t) * CD + h * P;
            float *yr = y + (row0 + t) * I + h * P;
#pragma unroll
            for (int n = 0; n < NTP; ++n) {
              const int p = n * 8 + 2 * c4;
              const float2 xv = *reinterpret_cast<const float2 *>(xr + p);
              *reinterpret_cast<float2 *>(yr + p) = make_float2(
                  Y[n][2 * hh] + Dh * xv.x, Y[n][2 * hh + 1] + Dh * xv.y);
            }
          }
        }
      }
      // S = exp(tot) S + (weighted x)^T B: A (p, s) from sXw[s][p] and B
      // (s, n) from sB[s][n], both read transposed.
      const float decay_q = expf(tot);
#pragma unroll
      for (int n = 0; n < NTN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          S[n][e] *= decay_q;
#pragma unroll 1
      for (int k0 = 0; k0 < Q; k0 += 16) {
        if (k0 >= nt)
          break;
        unsigned af[TERMS][4];
#pragma unroll
        for (int te = 0; te < TERMS; ++te)
          ldmatrix_x4_trans(af[te],
                            &sXw[te][k0 + (lane & 7) + ((lane >> 4) << 3)]
                                [warp * 16 + (((lane >> 3) & 1) << 3)]);
#pragma unroll
        for (int n = 0; n < NTN; n += 2) {
          unsigned bf[TERMS][4];
#pragma unroll
          for (int te = 0; te < TERMS; ++te)
            ldmatrix_x4_trans(bf[te],
                              &sB[te][k0 + (lane & 15)][(n + (lane >> 4)) * 8]);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            mma_bf16_terms<TERMS>(
                S[n + hh], af, [&](int t, int r) { return bf[t][2 * hh + r]; });
        }
      }
      if (!kStates && q0 + Q < t_end) {
        __syncthreads(); // every warp is done reading sS
        store_state();
      }
    }
    // Launch 1: the chunk's state and decay; launch 3: a sequence's last
    // chunk leaves the slot's state.
    float *out = nullptr;
    if (kStates) {
      const long long sl = ssm_chunk_slot<L>(d, s, c);
      out = local + (sl * NH + h) * P * N;
      if (tid == 0)
        decay[sl * NH + h] = expf(total);
    } else if (t_end == d.count) {
      out = state + (static_cast<long long>(d.slot) * NH + h) * P * N;
    }
    if (out)
#pragma unroll
      for (int n = 0; n < NTN; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int p = warp * 16 + g8 + 8 * hh;
          *reinterpret_cast<float2 *>(out + p * N + n * 8 + 2 * c4) =
              make_float2(S[n][2 * hh], S[n][2 * hh + 1]);
        }
  }
#else
  __trap(); // code generation takes this form for sm_80 and later only
#endif
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
__device__ void ssm_scan(Step a, const float *xbc, const float *dt_raw,
                         const WB *dt_bias, const WA *a_log, const WD *d_skip,
                         float dt_min, float dt_max, float *state, float *y,
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
        L > 0 && d.count > L
            ? chunk_init + ((static_cast<long long>(
                                 ssm_chunk_slot<(L > 0 ? L : 1)>(d, s, c)) *
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

/// A decode lane's share of channel p of head h's state in slot `slot`
/// (state [slots, NH, P, N] f32): its NV float4 runs, lane sub of the
/// channel's NS taking runs sub, sub + NS, ... (state_n of ssm_scan with VEC
/// 4). ssm_decode and ssm_gated_decode share these helpers, so their states
/// and y are the same.
template <int NH, int P, int N, int NS> struct SsmDecodeLane {
  static constexpr int NV = N / (4 * NS); // float4s a lane
  float4 *row;
  int sub;
  __device__ __forceinline__ SsmDecodeLane(float *state, int slot, int h, int p,
                                           int sub_)
      : row(reinterpret_cast<float4 *>(
            state + ((static_cast<long long>(slot) * NH + h) * P + p) * N)),
        sub(sub_) {}
  __device__ __forceinline__ void load(float4 (&st)[NV]) const {
#pragma unroll
    for (int q = 0; q < NV; ++q)
      st[q] = row[q * NS + sub];
  }
  __device__ __forceinline__ void store(const float4 (&st)[NV]) const {
#pragma unroll
    for (int q = 0; q < NV; ++q)
      row[q * NS + sub] = st[q];
  }
};

/// One token (row `row` of xbc [T, I + 2 G N] and dt_raw [T, NH]) of the
/// decode recurrence for a lane's share st of channel p of head h (lane sub
/// of the channel's NS, channel cw of the warp): S = dA S + x dt B, and the
/// channel's S . C, its lanes' shares added in lane order (every lane of the
/// channel gets it); x is the channel's input.
template <int NH, int P, int N, int G, int NS>
__device__ __forceinline__ float
ssm_decode_token(float4 (&st)[N / (4 * NS)], const float *xbc,
                 const float *dt_raw, long long row, int h, int p, float bias,
                 float Ah, float dt_min, float dt_max, int sub, int cw,
                 float &x) {
  constexpr int I = NH * P, CD = I + 2 * G * N, NV = N / (4 * NS);
  const int g = h / (NH / G);
  const float *xr = xbc + row * CD;
  const float4 *B4 = reinterpret_cast<const float4 *>(xr + I + g * N);
  const float4 *C4 = reinterpret_cast<const float4 *>(xr + I + G * N + g * N);
  const float dt = mamba_dt(dt_raw[row * NH + h], bias, dt_min, dt_max);
  const float dA = expf(dt * Ah);
  x = xr[h * P + p];
  const float xd = x * dt;
  float part0 = 0.0f, part1 = 0.0f;
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    const float4 b = B4[q * NS + sub], c = C4[q * NS + sub];
    st[q].x = dA * st[q].x + xd * b.x;
    part0 = fmaf(st[q].x, c.x, part0);
    st[q].y = dA * st[q].y + xd * b.y;
    part1 = fmaf(st[q].y, c.y, part1);
    st[q].z = dA * st[q].z + xd * b.z;
    part0 = fmaf(st[q].z, c.z, part0);
    st[q].w = dA * st[q].w + xd * b.w;
    part1 = fmaf(st[q].w, c.w, part1);
  }
  const float part = part0 + part1;
  float yv = 0.0f;
#pragma unroll
  for (int u = 0; u < NS; ++u)
    yv += __shfl_sync(0xffffffffu, part, cw * NS + u);
  return yv;
}

/// The SSM recurrence of decode steps (nf_kv.ssm_update): a warp per
/// (sequence, head, 32 / NS channels), NS lanes a channel, each holding
/// N / NS state values as float4 runs (state_n of ssm_scan with VEC 4: a
/// channel's lanes read its state row as consecutive 16-byte pieces). B, C,
/// x and dt are read where they are (the warps of a head read the same B
/// and C, from L1 or L2), and the channel's y is its lanes' shares added in
/// lane order (as ssm_scan adds sPart): no shared memory and no block
/// barriers, where ssm_scan's staging and three barriers a token made each
/// decode item a chain of memory and barrier latencies. The first item's
/// state (the previous step's) is loaded before waiting for the previous
/// launch. A sequence's tokens are walked in order. Same arithmetic as
/// ssm_scan, so the same results.
template <class WB, class WA, class WD, int NH, int P, int N, int G, int NS>
__device__ void ssm_decode(Step a, const float *xbc, const float *dt_raw,
                           const WB *dt_bias, const WA *a_log, const WD *d_skip,
                           float dt_min, float dt_max, float *state, float *y) {
  constexpr int I = NH * P, CD = I + 2 * G * N;
  constexpr int CPW = 32 / NS;     // channels a warp
  constexpr int NV = N / (4 * NS); // float4s a lane
  static_assert(32 % NS == 0 && N % (4 * NS) == 0 && P % CPW == 0,
                "ssm_decode tiling");
  static_assert(I % 4 == 0 && CD % 4 == 0, "B and C rows of whole float4s");
  const int lane = lane_id(), sub = lane % NS, cw = lane / NS;
  const long long items = static_cast<long long>(a->num_seqs) * NH * (P / CPW);
  bool waited = false;
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    const int s = static_cast<int>(item / (NH * (P / CPW)));
    const int rem = static_cast<int>(item % (NH * (P / CPW)));
    const int h = rem / (P / CPW), p = (rem % (P / CPW)) * CPW + cw;
    const nf_seq_desc d = a->seqs[s];
    const SsmDecodeLane<NH, P, N, NS> lane_state(state, d.slot, h, p, sub);
    float4 st[NV];
    lane_state.load(st);
    if (!waited) {
      wait_for_previous_grids(); // xbc and dt are the previous launches'
      waited = true;
    }
    const float Ah = -expf(load(a_log, h));
    const float Dh = load(d_skip, h);
    const float bias = load(dt_bias, h);
    for (int t = 0; t < d.count; ++t) {
      const long long row = d.begin + t;
      float x;
      const float yv = ssm_decode_token<NH, P, N, G, NS>(
          st, xbc, dt_raw, row, h, p, bias, Ah, dt_min, dt_max, sub, cw, x);
      if (sub == 0)
        y[row * I + h * P + p] = yv + Dh * x;
    }
    lane_state.store(st);
  }
  if (!waited)
    wait_for_previous_grids(); // a warp without items
}

/// nf_kv.ssm_update and the nf.gated_rms_norm of its result in one launch
/// (decode steps of few tokens, where the norm's own launch is a latency on
/// the step's critical path): a cluster of HPG = NH / G blocks per
/// (sequence, group), block r the group's head r, its P / CPW warps each
/// ssm_decode's warp for CPW channels (same arithmetic). Each channel's
/// u = y * silu(z) goes to its block's shared memory; after a cluster
/// barrier, warp 0 of every block reads the group's u (distributed shared
/// memory) and sums the squares in gated_rms_norm's order (its warp form:
/// GS = HPG * P a multiple of 128, at most 1024), so the outputs equal the
/// two launches'. u and the norm's factor are double-buffered by token
/// parity: a block writes buffer b again only after the next barrier, which
/// every block reaches after reading it. Launch with 32 * (P / CPW) threads,
/// __cluster_dims__(HPG), a multiple of HPG blocks.
template <class WB, class WA, class WD, class W, int NH, int P, int N, int G,
          int NS, class O>
__device__ void ssm_gated_decode(Step a, const float *xbc, const float *dt_raw,
                                 const WB *dt_bias, const WA *a_log,
                                 const WD *d_skip, float dt_min, float dt_max,
                                 float *state, const float *z, const W *w,
                                 double eps, O out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int I = NH * P, CD = I + 2 * G * N, HPG = NH / G, GS = HPG * P;
  constexpr int CPW = 32 / NS, NV = N / (4 * NS), NW = GS / 128;
  static_assert(32 % NS == 0 && N % (4 * NS) == 0 && P % CPW == 0 &&
                    P % 4 == 0 && NH % G == 0,
                "ssm_gated_decode tiling");
  static_assert(GS % 128 == 0 && GS <= 1024, "gated_rms_norm's warp form");
  static_assert(I % 4 == 0 && CD % 4 == 0, "B and C rows of whole float4s");
  __shared__ __align__(16) float s_u[2][P];
  __shared__ float s_r[2];
  const int lane = lane_id(), sub = lane % NS, cw = lane / NS;
  const int p = (threadIdx.x >> 5) * CPW + cw;
  const int hr = static_cast<int>(cluster_rank());
  const long long items = static_cast<long long>(a->num_seqs) * G;
  int buf = 0;
  bool waited = false;
  for (long long item = cluster_index(); item < items;
       item += cluster_count()) {
    const int s = static_cast<int>(item / G), g = static_cast<int>(item % G);
    const int h = g * HPG + hr;
    const nf_seq_desc d = a->seqs[s];
    const SsmDecodeLane<NH, P, N, NS> lane_state(state, d.slot, h, p, sub);
    float4 st[NV];
    lane_state.load(st);
    if (!waited) {
      wait_for_previous_grids(); // xbc, dt and z are the previous launches'
      waited = true;
    }
    const float Ah = -expf(load(a_log, h));
    const float Dh = load(d_skip, h);
    const float bias = load(dt_bias, h);
    const float wp = load(w, h * P + p);
    for (int t = 0; t < d.count; ++t, buf ^= 1) {
      const long long row = d.begin + t;
      const float zv = z[row * I + h * P + p];
      float x;
      const float yv = ssm_decode_token<NH, P, N, G, NS>(
          st, xbc, dt_raw, row, h, p, bias, Ah, dt_min, dt_max, sub, cw, x);
      // y as ssm_decode stores it, then gated_rms_norm's u.
      const float u = (yv + Dh * x) * silu(zv);
      if (sub == 0)
        s_u[buf][p] = u;
      cluster_sync();
      if (threadIdx.x < 32) {
        // Element i of the group (lane's i = (v * 32 + lane) * 4 + e, as
        // gated_rms_norm's lanes hold them) is channel i % P of head i / P.
        double ss = 0.0;
#pragma unroll
        for (int v = 0; v < NW; ++v) {
          const int i = (v * 32 + lane) * 4;
          const float4 q = cluster_load4(&s_u[buf][i % P], i / P);
          ss += static_cast<double>(q.x) * static_cast<double>(q.x);
          ss += static_cast<double>(q.y) * static_cast<double>(q.y);
          ss += static_cast<double>(q.z) * static_cast<double>(q.z);
          ss += static_cast<double>(q.w) * static_cast<double>(q.w);
        }
        ss = warp_sum(ss);
        if (lane == 0)
          s_r[buf] = static_cast<float>(
              1.0 / sqrt(ss / static_cast<double>(GS) + eps));
      }
      __syncthreads();
      if (sub == 0)
        store_act(out + (row * I + h * P + p), wp * (u * s_r[buf]));
    }
    lane_state.store(st);
  }
  if (!waited)
    wait_for_previous_grids(); // a cluster without items
  cluster_sync();              // no block leaves while another reads its s_u
#endif
}

} // namespace nf

#endif // NF_KERNELS_MAMBA_CUH
