// Attention with a paged KV cache (nf_kv.attend: causal GQA, no positional
// encoding) over the cache of nf_kv_cache.cuh, whose pointer type (KVP) the
// kernels take.
#ifndef NF_KERNELS_ATTENTION_CUH
#define NF_KERNELS_ATTENTION_CUH

#include "nf_common.cuh"
#include "nf_kv_cache.cuh"
#include "nf_mma.cuh"

namespace nf {

/// out[t, h] = softmax(q[t, h] . K[0..pos] * scale) V[0..pos], query head h
/// reading kv head h / (NQ / NKV).
///
/// One block per (tokens, kv head) with WARPS warps for the REP = NQ / NKV
/// query heads of that kv head (warp w takes heads w, w + WARPS, ...). The
/// block stages tiles of 32 positions of K and V in shared memory (coalesced
/// loads, each byte read once for all REP heads); per tile each warp scores
/// the 32 positions of its head (one per lane), updates an online softmax,
/// and accumulates V with the head dimension spread over the lanes.
/// A block takes QT consecutive tokens: when they belong to one sequence
/// (consecutive positions) each K/V tile is loaded once for all of them, and
/// every (token, head) runs exactly the operations of a one-token block
/// (tiles past its own length skipped, positions past it masked: e = 0), so
/// the results do not depend on QT. Tokens of a group that straddles
/// sequences are taken one at a time. Shared memory is dynamic:
/// 4 * (32 * (HD + 1) + 32 * HD + QT * WARPS * HPW * HD) bytes.
template <int NQ, int NKV, int HD, int PS, int WARPS, int QT, class KVP>
__device__ void kv_attend(Step a, const float *q, KVP kcache, KVP vcache,
                          float scale, float *out) {
  constexpr int REP = NQ / NKV, ROW = NKV * HD, DPL = (HD + 31) / 32;
  constexpr int HPW = (REP + WARPS - 1) / WARPS; // heads per warp
  constexpr int NH = WARPS * HPW;
  extern __shared__ float4 nf_attend_smem[];
  float(*sK)[HD + 1] = reinterpret_cast<float(*)[HD + 1]>(nf_attend_smem);
  float(*sV)[HD] = reinterpret_cast<float(*)[HD]>(
      reinterpret_cast<float *>(nf_attend_smem) + 32 * (HD + 1));
  float(*sQ)[NH][HD] = reinterpret_cast<float(*)[NH][HD]>(
      reinterpret_cast<float *>(nf_attend_smem) + 32 * (HD + 1) + 32 * HD);
  __shared__ long long s_off[32];
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int T = a->num_tokens;
  const long long items = static_cast<long long>((T + QT - 1) / QT) * NKV;
  // Tokens [t0, t0 + cnt) of one sequence, the first at position pos0.
  auto group = [&](int t0, int cnt, const TokenPos &tp0, int kvh) {
    const int32_t *pt =
        a->page_tables + static_cast<long long>(tp0.seq) * a->max_pages_per_seq;
    __syncthreads(); // the previous group is done with the shared tiles
    for (int i = tid; i < cnt * REP * HD; i += blockDim.x) {
      const int tok = i / (REP * HD), r = i % (REP * HD);
      sQ[tok][r / HD][r % HD] = q[static_cast<long long>(t0 + tok) * NQ * HD +
                                  static_cast<long long>(kvh) * REP * HD + r];
    }
    float m[QT][HPW], l[QT][HPW], acc[QT][HPW][DPL];
#pragma unroll
    for (int i = 0; i < QT; ++i)
#pragma unroll
      for (int r = 0; r < HPW; ++r) {
        m[i][r] = -f32_inf();
        l[i][r] = 0.0f;
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd)
          acc[i][r][dd] = 0.0f;
      }
    const int lenMax = tp0.pos + cnt; // the last token's causal length
    for (int p0 = 0; p0 < lenMax; p0 += 32) {
      __syncthreads(); // the previous tile is consumed
      if (tid < 32) {
        const int p = p0 + tid;
        s_off[tid] = p < lenMax ? kv_position_offset<ROW, PS>(pt, p) +
                                      static_cast<long long>(kvh) * HD
                                : -1;
      }
      __syncthreads();
      for (int i = tid; i < 32 * HD; i += blockDim.x) {
        const int j = i / HD, d = i % HD;
        const long long o = s_off[j];
        sK[j][d] = o >= 0 ? kv_get(kcache, o + d) : 0.0f;
        sV[j][d] = o >= 0 ? kv_get(vcache, o + d) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < QT; ++i) {
        const int len = tp0.pos + i + 1;
        if (i >= cnt || p0 >= len)
          continue;
        const int n = min(32, len - p0);
#pragma unroll
        for (int r = 0; r < HPW; ++r) {
          const int head = warp + WARPS * r;
          if (head >= REP)
            continue;
          float score = -f32_inf();
          if (lane < n) {
            float dot = 0.0f;
#pragma unroll 16
            for (int d = 0; d < HD; ++d)
              dot = fmaf(sQ[i][head][d], sK[lane][d], dot);
            score = dot * scale;
          }
          const float mn = fmaxf(m[i][r], warp_max(score));
          const float corr = expf(m[i][r] - mn);
          const float e = lane < n ? expf(score - mn) : 0.0f;
          l[i][r] = l[i][r] * corr + warp_sum(e);
#pragma unroll
          for (int dd = 0; dd < DPL; ++dd)
            acc[i][r][dd] *= corr;
#pragma unroll 8
          for (int j = 0; j < 32; ++j) {
            const float ej = __shfl_sync(0xffffffffu, e, j);
#pragma unroll
            for (int dd = 0; dd < DPL; ++dd) {
              const int d = lane + 32 * dd;
              if (d < HD)
                acc[i][r][dd] = fmaf(ej, sV[j][d], acc[i][r][dd]);
            }
          }
          m[i][r] = mn;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < QT; ++i) {
      if (i >= cnt)
        continue;
#pragma unroll
      for (int r = 0; r < HPW; ++r) {
        const int head = warp + WARPS * r;
        if (head >= REP)
          continue;
        const float inv = 1.0f / l[i][r];
        float *o = out + static_cast<long long>(t0 + i) * NQ * HD +
                   static_cast<long long>(kvh * REP + head) * HD;
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd) {
          const int d = lane + 32 * dd;
          if (d < HD)
            o[d] = acc[i][r][dd] * inv;
        }
      }
    }
  };
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int t0 = static_cast<int>(item / NKV) * QT,
              kvh = static_cast<int>(item % NKV);
    const int cnt = min(QT, T - t0);
    const TokenPos first = token_pos(a, t0);
    if (token_pos(a, t0 + cnt - 1).seq == first.seq) {
      group(t0, cnt, first, kvh);
    } else {
      for (int i = 0; i < cnt; ++i)
        group(t0 + i, 1, token_pos(a, t0 + i), kvh);
    }
  }
}

/// Online softmax of one warp over positions [p_begin, p_end) of one head:
/// m (running max), l (sum of exponentials) and acc (sum of e * V, the head
/// dimension spread over the lanes). K rows: one position per lane, 16-byte
/// loads; V rows: 8 positions at a time with their loads issued together.
template <int NKV, int HD, int PS, class KVP>
__device__ __forceinline__ void
attend_range(const int32_t *pt, const float *sq, KVP kcache, KVP vcache,
             float scale, int kvh, int p_begin, int p_end, float &m, float &l,
             float (&acc)[(HD + 31) / 32]) {
  constexpr int ROW = NKV * HD, DPL = (HD + 31) / 32;
  const int lane = lane_id();
  m = -f32_inf();
  l = 0.0f;
#pragma unroll
  for (int dd = 0; dd < DPL; ++dd)
    acc[dd] = 0.0f;
  for (int p0 = p_begin; p0 < p_end; p0 += 32) {
    const int p = p0 + lane;
    long long off = 0;
    float score = -f32_inf();
    if (p < p_end) {
      off = kv_position_offset<ROW, PS>(pt, p) + kvh * HD;
      const KVP kr = kcache + off;
      float dot = 0.0f;
      if (HD % 4 == 0) {
#pragma unroll 8
        for (int d = 0; d < HD; d += 4) {
          const float4 kv = kv_get4(kr, d);
          const float4 qv = *reinterpret_cast<const float4 *>(sq + d);
          dot = fmaf(qv.x, kv.x, dot);
          dot = fmaf(qv.y, kv.y, dot);
          dot = fmaf(qv.z, kv.z, dot);
          dot = fmaf(qv.w, kv.w, dot);
        }
      } else {
        for (int d = 0; d < HD; ++d)
          dot = fmaf(sq[d], kv_get(kr, d), dot);
      }
      score = dot * scale;
    }
    const float mn = fmaxf(m, warp_max(score));
    const float corr = expf(m - mn);
    const float e = p < p_end ? expf(score - mn) : 0.0f;
    l = l * corr + warp_sum(e);
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd)
      acc[dd] *= corr;
    const int cnt = min(32, p_end - p0);
    for (int j0 = 0; j0 < cnt; j0 += 8) {
      float ev[8];
      long long ov[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        ev[u] = __shfl_sync(0xffffffffu, e, j0 + u);
        ov[u] = __shfl_sync(0xffffffffu, off, j0 + u);
      }
#pragma unroll
      for (int dd = 0; dd < DPL; ++dd) {
        const int d = lane + 32 * dd;
        if (d >= HD)
          continue;
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
          v[u] = j0 + u < cnt ? kv_get(vcache, ov[u] + d) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u)
          acc[dd] = fmaf(ev[u], v[u], acc[dd]);
      }
    }
    m = mn;
  }
}

/// The same with one warp per (token, head) and no shared tiles: for head
/// dimensions whose K/V tiles do not fit in static shared memory (> 128).
template <int NQ, int NKV, int HD, int PS, int WARPS, class KVP>
__device__ void kv_attend_warp(Step a, const float *q, KVP kcache, KVP vcache,
                               float scale, float *out) {
  constexpr int REP = NQ / NKV, DPL = (HD + 31) / 32;
  __shared__ __align__(16) float sq[WARPS][HD];
  const int lane = lane_id(), wib = threadIdx.x >> 5;
  const long long items = static_cast<long long>(a->num_tokens) * NQ;
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    const int t = static_cast<int>(item / NQ), h = static_cast<int>(item % NQ);
    const TokenPos tp = token_pos(a, t);
    const int32_t *pt =
        a->page_tables + static_cast<long long>(tp.seq) * a->max_pages_per_seq;
    const float *qh = q + static_cast<long long>(t) * NQ * HD + h * HD;
    __syncwarp();
    for (int d = lane; d < HD; d += 32)
      sq[wib][d] = qh[d];
    __syncwarp();
    float m, l, acc[DPL];
    attend_range<NKV, HD, PS>(pt, sq[wib], kcache, vcache, scale, h / REP, 0,
                              tp.pos + 1, m, l, acc);
    const float inv = 1.0f / l;
    float *o = out + static_cast<long long>(t) * NQ * HD + h * HD;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) {
      const int d = lane + 32 * dd;
      if (d < HD)
        o[d] = acc[dd] * inv;
    }
  }
}

/// Shared memory (dynamic) of kv_attend_mma, in bytes: bf16 terms of the
/// query tile, of a K tile and of a V tile (two of each with KV16).
template <int HD, int WARPS, int TERMS, int BP = 32, bool KV16 = false>
__host__ __device__ constexpr int kv_attend_mma_smem() {
  return 2 * TERMS * (16 * WARPS * (HD + 8) + (KV16 ? 4 : 2) * BP * (HD + 8));
}

/// The step's K/V rows as bf16 (rounded as split4_bf16<1> rounds them):
/// k16 / v16 [num_tokens, ROW], for kv_attend_mma<..., KV16> to stream with
/// cp.async instead of converting the f32 cache rows in every block.
template <int ROW, int PS, class KVP>
__device__ void kv_rows_to_bf16(Step a, KVP kcache, KVP vcache,
                                unsigned short *k16, unsigned short *v16) {
  static_assert(ROW % 4 == 0, "float4 rows");
  const long long n = static_cast<long long>(a->num_tokens) * (ROW / 4);
  for (long long i = global_thread(); i < n; i += grid_threads()) {
    const int t = static_cast<int>(i / (ROW / 4));
    const int c = static_cast<int>(i % (ROW / 4)) * 4;
    const long long off = kv_row_offset<ROW, PS>(a, t) + c;
    uint2 kt[3], vt[3];
    split4_bf16<1>(kv_get4(kcache, off), kt);
    split4_bf16<1>(kv_get4(vcache, off), vt);
    const long long o = static_cast<long long>(t) * ROW + c;
    *reinterpret_cast<uint2 *>(k16 + o) = kt[0];
    *reinterpret_cast<uint2 *>(v16 + o) = vt[0];
  }
}

/// One tile of FlashAttention's online softmax on mma C fragments s (rows g
/// and g + 8 of a warp's 16; a row's columns are spread over its quad of
/// lanes): s = S * scale where keep(col, h) for column col (n * 8 + 2c +
/// (e & 1)) of row g + 8h, else -inf; the rows' running maxima m and sums l
/// move on; s becomes the exponentials (P) and the output fragments o are
/// rescaled. (The prefill and decode tensor-core kernels share it.)
template <int NTS, int NTO, class Keep>
__device__ __forceinline__ void
online_softmax_tile(float (&s)[NTS][4], float scale, Keep keep, float (&m)[2],
                    float (&l)[2], float (&o)[NTO][4]) {
  const int c = lane_id() & 3;
  float mx[2] = {-f32_inf(), -f32_inf()};
#pragma unroll
  for (int n = 0; n < NTS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v =
          keep(n * 8 + 2 * c + (e & 1), e >> 1) ? s[n][e] * scale : -f32_inf();
      s[n][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  float corr[2], base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float mn = fmaxf(m[h], mx[h]);
    base[h] = mn == -f32_inf() ? 0.0f : mn; // no row value yet
    corr[h] = expf(m[h] - base[h]);
    m[h] = mn;
  }
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < NTS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = expf(s[n][e] - base[e >> 1]);
      s[n][e] = pe;
      rs[e >> 1] += pe;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 1);
    rs[h] += __shfl_xor_sync(0xffffffffu, rs[h], 2);
    l[h] = l[h] * corr[h] + rs[h];
  }
#pragma unroll
  for (int n = 0; n < NTO; ++n) {
    o[n][0] *= corr[0];
    o[n][1] *= corr[0];
    o[n][2] *= corr[1];
    o[n][3] *= corr[1];
  }
}

/// Prefill attention on tensor cores (sm_80+; FlashAttention-2's loop with
/// mma.sync m16n8k16). The rows of a kv head's problem are its (token,
/// query head) pairs in token order, so the REP query heads that share the
/// kv head share every K/V tile. A block of WARPS warps takes 16 * WARPS
/// rows (each warp 16) and walks BP positions at a time: K and V are read
/// from the paged f32 cache into registers a tile ahead (the loads land
/// while the previous tile is multiplied), split into TERMS bf16 terms (3:
/// exact products, as the GEMMs; 1: bf16 inputs) and staged in shared
/// memory, both position-major; S = Q K^T per warp on tensor cores (term pairs
/// i + j < TERMS, small first), the causal mask and online softmax on the S
/// fragments in registers (f32), then O += P V with P's fragments reused as
/// mma's A operand and V's fragments read transposed (ldmatrix.trans). Rows of
/// several sequences in one tile are taken one sequence per pass (the other
/// rows masked). Tiles are taken longest first (from the last token), which
/// balances the causal work.
/// KV16 (one term; k16 / v16 from kv_rows_to_bf16): tiles of the step's own
/// positions stream in bf16 with cp.async, double-buffered, instead of
/// through registers; positions before the step (a prefix in the cache)
/// are converted from the f32 cache as they are needed.
template <int NQ, int NKV, int HD, int PS, int WARPS, int TERMS, int BP = 32,
          bool KV16 = false, class KVP = float *>
__device__ void kv_attend_mma(Step a, const float *q, KVP kcache, KVP vcache,
                              float scale, float *out,
                              const unsigned short *k16 = nullptr,
                              const unsigned short *v16 = nullptr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int REP = NQ / NKV, ROW = NKV * HD;
  constexpr int BQ = 16 * WARPS, QS = HD + 8, THREADS = 32 * WARPS;
  // K/V values per thread and tile: loaded into registers a tile ahead.
  constexpr int KVE = BP * (HD / 4), KVN = (KVE + THREADS - 1) / THREADS;
  constexpr int NTS = BP / 8, NTO = HD / 8;
  static_assert(HD % 16 == 0, "head_dim must be a multiple of 16");
  static_assert(NTO % 2 == 0, "V fragments two dimension tiles at a time");
  static_assert(TERMS == 1 || TERMS == 3, "1 or 3 bf16 terms");
  static_assert(!KV16 || TERMS == 1, "bf16 K/V rows are one term");
  constexpr int KVB = KV16 ? 2 : 1; // K/V tile buffers
  extern __shared__ float4 nf_attend_smem[];
  using Tile = unsigned short;
  Tile(*sQ)[BQ][QS] = reinterpret_cast<Tile(*)[BQ][QS]>(nf_attend_smem);
  Tile(*sKb)[BP][QS] =
      reinterpret_cast<Tile(*)[BP][QS]>(&sQ[0][0][0] + TERMS * BQ * QS);
  Tile(*sVb)[BP][QS] =
      reinterpret_cast<Tile(*)[BP][QS]>(&sKb[0][0][0] + KVB * TERMS * BP * QS);
  __shared__ int rowSeq[BQ], rowPos[BQ];
  __shared__ int passLo, passHi;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int T = a->num_tokens, rowsTotal = T * REP;
  const int tiles = (rowsTotal + BQ - 1) / BQ;
  const long long items = static_cast<long long>(tiles) * NKV;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = tiles - 1 - static_cast<int>(item / NKV);
    const int kvh = static_cast<int>(item % NKV), r0 = tile * BQ;
    __syncthreads(); // the previous item is done with shared memory
    for (int i = tid; i < BQ; i += blockDim.x) {
      const int rr = r0 + i;
      if (rr < rowsTotal) {
        const TokenPos tp = token_pos(a, rr / REP);
        rowSeq[i] = tp.seq;
        rowPos[i] = tp.pos;
      } else {
        rowSeq[i] = -1;
        rowPos[i] = -1;
      }
    }
    __syncthreads();
    const int seqFirst = rowSeq[0];
    const int seqLast = rowSeq[min(BQ, rowsTotal - r0) - 1];
    for (int sq = seqFirst; sq <= seqLast; ++sq) {
      __syncthreads(); // the previous pass is done with shared memory
      if (tid == 0) {
        int lo = 0x7fffffff, hi = -1;
        for (int i = 0; i < BQ; ++i)
          if (rowSeq[i] == sq) {
            lo = min(lo, rowPos[i]);
            hi = max(hi, rowPos[i]);
          }
        passLo = lo;
        passHi = hi;
      }
      // Query terms; rows of other sequences are zero (and masked).
      for (int i = tid; i < BQ * (HD / 4); i += blockDim.x) {
        const int r = i / (HD / 4), d = (i % (HD / 4)) * 4, rr = r0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rowSeq[r] == sq)
          v = *reinterpret_cast<const float4 *>(
              q + static_cast<long long>(rr / REP) * NQ * HD +
              static_cast<long long>(kvh * REP + rr % REP) * HD + d);
        uint2 t[3];
        split4_bf16<TERMS>(v, t);
#pragma unroll
        for (int te = 0; te < TERMS; ++te)
          *reinterpret_cast<uint2 *>(&sQ[te][r][d]) = t[te];
      }
      __syncthreads();
      const int hi = passHi;
      if (hi < 0)
        continue; // no row of this tile belongs to sequence sq
      const int lo = passLo, len = hi + 1;
      const int32_t *pt =
          a->page_tables + static_cast<long long>(sq) * a->max_pages_per_seq;
      const int wr = warp * 16 + g;
      const int pos0 = rowSeq[wr] == sq ? rowPos[wr] : -1;
      const int pos1 = rowSeq[wr + 8] == sq ? rowPos[wr + 8] : -1;
      float m[2] = {-f32_inf(), -f32_inf()}, l[2] = {0.0f, 0.0f};
      float o[NTO][4];
#pragma unroll
      for (int n = 0; n < NTO; ++n)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
      // The K/V rows of the tile at p0 into registers (zero past len).
      float4 rk[KV16 ? 1 : KVN], rv[KV16 ? 1 : KVN];
      auto fetch = [&](int p0) {
#pragma unroll
        for (int u = 0; u < (KV16 ? 1 : KVN); ++u) {
          const int i = tid + THREADS * u, j = i / (HD / 4);
          const int d = (i % (HD / 4)) * 4, p = p0 + j;
          rk[u] = rv[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (i < KVE && p < len) {
            const long long off = kv_position_offset<ROW, PS>(pt, p) +
                                  static_cast<long long>(kvh) * HD + d;
            rk[u] = kv_get4(kcache, off);
            rv[u] = kv_get4(vcache, off);
          }
        }
      };
      // KV16: the tile at p0 into buffer b, with cp.async (positions of
      // this step) or converted from the cache (earlier ones); one
      // cp.async group either way.
      const nf_seq_desc sd = a->seqs[sq];
      auto stage = [&](int p0, int b) {
        if (p0 >= sd.start_pos) {
          for (int i = tid; i < BP * (HD / 8); i += THREADS) {
            const int j = i / (HD / 8), d = (i % (HD / 8)) * 8, p = p0 + j;
            const long long o =
                static_cast<long long>(sd.begin + p - sd.start_pos) * ROW +
                static_cast<long long>(kvh) * HD + d;
            copy_async16_or_zero(&sKb[b][j][d], k16 + (p < len ? o : 0),
                                 p < len);
            copy_async16_or_zero(&sVb[b][j][d], v16 + (p < len ? o : 0),
                                 p < len);
          }
        } else {
          for (int i = tid; i < KVE; i += THREADS) {
            const int j = i / (HD / 4), d = (i % (HD / 4)) * 4, p = p0 + j;
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (p < len) {
              const long long off = kv_position_offset<ROW, PS>(pt, p) +
                                    static_cast<long long>(kvh) * HD + d;
              kv = kv_get4(kcache, off);
              vv = kv_get4(vcache, off);
            }
            uint2 kt[3], vt[3];
            split4_bf16<1>(kv, kt);
            split4_bf16<1>(vv, vt);
            *reinterpret_cast<uint2 *>(&sKb[b][j][d]) = kt[0];
            *reinterpret_cast<uint2 *>(&sVb[b][j][d]) = vt[0];
          }
        }
        copy_async_commit();
      };
      if constexpr (KV16)
        stage(0, 0);
      else
        fetch(0);
      for (int p0 = 0, tileNo = 0; p0 < len; p0 += BP, ++tileNo) {
        const int buf = KV16 ? tileNo & 1 : 0;
        Tile(*sK)[BP][QS] = sKb + buf * TERMS;
        Tile(*sV)[BP][QS] = sVb + buf * TERMS;
        if constexpr (KV16) {
          // The next tile lands in the other buffer while this one is
          // multiplied, once every warp is done with the previous tile.
          if (tileNo > 0)
            __syncthreads();
          if (p0 + BP < len)
            stage(p0 + BP, buf ^ 1);
          else
            copy_async_commit();
          copy_async_wait<1>();
          __syncthreads();
        } else {
          __syncthreads(); // the previous K/V tile is consumed
#pragma unroll
          for (int u = 0; u < KVN; ++u) {
            const int i = tid + THREADS * u, j = i / (HD / 4);
            const int d = (i % (HD / 4)) * 4;
            if (KVE % THREADS != 0 && i >= KVE)
              break;
            uint2 kt[3], vt[3];
            split4_bf16<TERMS>(rk[u], kt);
            split4_bf16<TERMS>(rv[u], vt);
#pragma unroll
            for (int te = 0; te < TERMS; ++te) {
              *reinterpret_cast<uint2 *>(&sKb[te][j][d]) = kt[te];
              *reinterpret_cast<uint2 *>(&sVb[te][j][d]) = vt[te];
            }
          }
          __syncthreads();
          if (p0 + BP < len)
            fetch(p0 + BP); // lands while this tile is multiplied
        }
        // mma.sync and the shuffles need the whole warp: skip the tile only
        // when it is past every row of the warp.
        if (__all_sync(0xffffffffu, pos0 < p0 && pos1 < p0))
          continue;
        // S = Q K^T (16 rows x BP positions per warp).
        float s[NTS][4];
#pragma unroll
        for (int n = 0; n < NTS; ++n)
          s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < HD; k0 += 16) {
          unsigned af[TERMS][4];
#pragma unroll
          for (int te = 0; te < TERMS; ++te)
            load_a_frag<QS>(af[te], &sQ[te][warp * 16 + g][k0 + 2 * c]);
#pragma unroll
          for (int n = 0; n < NTS; ++n) {
            unsigned bf[TERMS][2];
#pragma unroll
            for (int te = 0; te < TERMS; ++te)
              load_b_frag(bf[te], &sK[te][n * 8 + g][k0 + 2 * c]);
            mma_bf16_terms<TERMS>(s[n], af,
                                  [&](int t, int r) { return bf[t][r]; });
          }
        }
        // Causal mask, scale and online softmax (rows g and g + 8).
        const bool full = p0 + BP - 1 <= lo;
        online_softmax_tile(
            s, scale,
            [&](int col, int h) {
              return full || p0 + col <= (h == 0 ? pos0 : pos1);
            },
            m, l, o);
        // O += P V: P's C fragments of position tiles 2kk, 2kk + 1 are the
        // A fragment of k-step kk.
#pragma unroll
        for (int kk = 0; kk < BP / 16; ++kk) {
          unsigned pf[TERMS][4];
          c_pair_to_a<TERMS>(s[2 * kk], s[2 * kk + 1], pf);
          // V fragments of dimension tiles n, n + 1: lane l addresses
          // position kk * 16 + l % 16, dimensions (n + l / 16) * 8.
#pragma unroll
          for (int n = 0; n < NTO; n += 2) {
            unsigned bf[TERMS][4];
#pragma unroll
            for (int te = 0; te < TERMS; ++te)
              ldmatrix_x4_trans(
                  bf[te],
                  &sV[te][kk * 16 + (lane & 15)][(n + (lane >> 4)) * 8]);
#pragma unroll
            for (int h = 0; h < 2; ++h)
              mma_bf16_terms<TERMS>(
                  o[n + h], pf, [&](int t, int r) { return bf[t][2 * h + r]; });
          }
        }
      }
      // Rows of this sequence: O / l.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wr + 8 * h, rr = r0 + r;
        if ((h == 0 ? pos0 : pos1) < 0)
          continue;
        const float inv = 1.0f / l[h];
        float *orow = out + static_cast<long long>(rr / REP) * NQ * HD +
                      static_cast<long long>(kvh * REP + rr % REP) * HD;
#pragma unroll
        for (int n = 0; n < NTO; ++n)
          *reinterpret_cast<float2 *>(orow + n * 8 + 2 * c) =
              make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      }
    }
  }
#else
  kv_attend_warp<NQ, NKV, HD, PS, WARPS>(a, q, kcache, vcache, scale, out);
#endif
}

/// Context splits of a decode step of T tokens. A step of fewer than
/// GQA_TOKENS tokens runs a warp per (token, head, split) (kv_attend_split)
/// and takes as many splits as give about WARPS_TARGET warps; a larger one
/// runs a warp per (token, kv head, split) (kv_attend_split_gqa), whose
/// warps each carry NQ / NKV heads' sums (registers for about 16 warps an
/// SM, where the per-head form targets 64), so it aims at WARPS_TARGET / 4
/// warps. Splits are at least 1 and at most NSPLIT. Few tokens need many
/// splits to fill the GPU; many tokens fill it with few, and each warp then
/// walks more positions for its fixed costs (queries, partial softmax,
/// combine).
template <int NQ, int NKV, int NSPLIT, int WARPS_TARGET, int GQA_TOKENS>
__device__ __forceinline__ int decode_splits(int T) {
  const bool grouped = T >= GQA_TOKENS;
  const int units = T * (grouped ? NKV : NQ);
  const int target = grouped ? WARPS_TARGET / 4 : WARPS_TARGET;
  return max(1, min(NSPLIT, target / max(1, units)));
}

/// The positions [p_begin, p_end) that split sp of nsplit takes of token
/// t's context (shares of whole 32-position slices), and its page table.
struct DecodeSlice {
  int p_begin, p_end;
  const int32_t *pt;
};
__device__ __forceinline__ DecodeSlice decode_slice(Step a, int t, int sp,
                                                    int nsplit) {
  const TokenPos tp = token_pos(a, t);
  const int len = tp.pos + 1;
  const int per = ((len + nsplit - 1) / nsplit + 31) / 32 * 32;
  DecodeSlice s;
  s.p_begin = min(len, sp * per);
  s.p_end = min(len, s.p_begin + per);
  s.pt = a->page_tables + static_cast<long long>(tp.seq) * a->max_pages_per_seq;
  return s;
}

/// Item `item` of a split decode launch over (token, split, head of HEADS),
/// heads fastest, and the split's slice of the token's context.
struct DecodeItem {
  int head, t, sp;
  DecodeSlice sl;
};
template <int HEADS>
__device__ __forceinline__ DecodeItem decode_item(Step a, long long item,
                                                  int nsplit) {
  DecodeItem it;
  it.head = static_cast<int>(item % HEADS);
  const long long ts = item / HEADS;
  it.sp = static_cast<int>(ts % nsplit);
  it.t = static_cast<int>(ts / nsplit);
  it.sl = decode_slice(a, it.t, it.sp, nsplit);
  return it;
}

/// Writes one warp's partial softmax (m, l, acc[HD] with the head dimension
/// spread over the lanes) of (token t, head h, split sp), where
/// kv_attend_combine reads it.
template <int NQ, int HD, int NSPLIT>
__device__ __forceinline__ void
store_partial(float *part, int t, int h, int sp, float m, float l,
              const float (&acc)[(HD + 31) / 32]) {
  float *o =
      part + ((static_cast<long long>(t) * NQ + h) * NSPLIT + sp) * (HD + 2);
  const int lane = lane_id();
  if (lane == 0) {
    o[0] = m;
    o[1] = l;
  }
#pragma unroll
  for (int dd = 0; dd < (HD + 31) / 32; ++dd) {
    const int d = lane + 32 * dd;
    if (d < HD)
      o[2 + d] = acc[dd];
  }
}

/// Decode attention split over the context (flash decoding): one warp per
/// (token, head, split), split s of decode_splits() takes its share of the
/// positions (multiples of 32) and writes (m, l, acc[HD]) to `part`;
/// kv_attend_combine merges the partial softmaxes. A long context then
/// keeps the GPU busy at batch 1 instead of one block walking it.
template <int NQ, int NKV, int HD, int PS, int WARPS, int NSPLIT,
          int WARPS_TARGET, int GQA_TOKENS, class KVP>
__device__ void kv_attend_split(Step a, const float *q, KVP kcache, KVP vcache,
                                float scale, float *part) {
  constexpr int REP = NQ / NKV, DPL = (HD + 31) / 32;
  __shared__ __align__(16) float sq[WARPS][HD];
  const int lane = lane_id(), wib = threadIdx.x >> 5;
  const int nsplit =
      decode_splits<NQ, NKV, NSPLIT, WARPS_TARGET, GQA_TOKENS>(a->num_tokens);
  const long long items = static_cast<long long>(a->num_tokens) * NQ * nsplit;
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    // Neighbouring warps take neighbouring heads of one (token, split): the
    // query heads of a kv head then read the same K/V rows at about the
    // same time, from L1.
    const DecodeItem it = decode_item<NQ>(a, item, nsplit);
    const int h = it.head, sp = it.sp, t = it.t;
    const DecodeSlice sl = it.sl;
    const int p_begin = sl.p_begin, p_end = sl.p_end;
    const int32_t *pt = sl.pt;
    const float *qh = q + static_cast<long long>(t) * NQ * HD + h * HD;
    __syncwarp();
    for (int d = lane; d < HD; d += 32)
      sq[wib][d] = qh[d];
    __syncwarp();
    float m, l, acc[DPL];
    attend_range<NKV, HD, PS>(pt, sq[wib], kcache, vcache, scale, h / REP,
                              p_begin, p_end, m, l, acc);
    store_partial<NQ, HD, NSPLIT>(part, t, h, sp, m, l, acc);
  }
}

/// Shared memory (static) of kv_attend_split_gqa, in bytes: each warp's
/// query rows and the exponentials of its 32 positions.
template <int NQ, int NKV, int HD, int WARPS>
__host__ __device__ constexpr int kv_attend_split_gqa_smem() {
  return WARPS * (NQ / NKV) * (HD + 32) * 4;
}

/// kv_attend_split for grouped queries: one warp per (token, kv head,
/// split) for all REP = NQ / NKV query heads of the kv head, so each K/V row
/// is read once for all of them instead of once per head (with REP = 16 the
/// per-head form spends most of a batch-32 step re-reading rows and paying
/// each warp's fixed costs). The same splits and partial results (m, l,
/// acc) per (token, head, split), merged by kv_attend_combine. Lane p of a
/// 32-position slice scores its position for every head (the queries in
/// shared memory); the lanes then own head dimensions and add each
/// position's V row with the heads' exponentials (also from shared memory).
template <int NQ, int NKV, int HD, int PS, int WARPS, int NSPLIT,
          int WARPS_TARGET, int GQA_TOKENS, class KVP>
__device__ void kv_attend_split_gqa(Step a, const float *q, KVP kcache,
                                    KVP vcache, float scale, float *part) {
  constexpr int REP = NQ / NKV, ROW = NKV * HD, DPL = (HD + 31) / 32;
  static_assert(HD % 4 == 0, "float4 K rows");
  static_assert(kv_attend_split_gqa_smem<NQ, NKV, HD, WARPS>() <= 48 * 1024,
                "static shared memory");
  __shared__ __align__(16) float sq[WARPS][REP][HD];
  __shared__ __align__(16) float se[WARPS][32][REP];
  const int lane = lane_id(), wib = threadIdx.x >> 5;
  const int nsplit =
      decode_splits<NQ, NKV, NSPLIT, WARPS_TARGET, GQA_TOKENS>(a->num_tokens);
  const long long items = static_cast<long long>(a->num_tokens) * NKV * nsplit;
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    const DecodeItem it = decode_item<NKV>(a, item, nsplit);
    const int kvh = it.head, sp = it.sp, t = it.t;
    const DecodeSlice sl = it.sl;
    const int p_begin = sl.p_begin, p_end = sl.p_end;
    const int32_t *pt = sl.pt;
    const float *qk = q + static_cast<long long>(t) * NQ * HD + kvh * REP * HD;
    __syncwarp();
#pragma unroll 4
    for (int i = lane; i < REP * HD / 4; i += 32) // HD % 4 == 0: 16 bytes
      reinterpret_cast<float4 *>(&sq[wib][0][0])[i] =
          reinterpret_cast<const float4 *>(qk)[i];
    __syncwarp();
    float m[REP], l[REP], acc[REP][DPL];
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      m[h] = -f32_inf();
      l[h] = 0.0f;
#pragma unroll
      for (int dd = 0; dd < DPL; ++dd)
        acc[h][dd] = 0.0f;
    }
    for (int p0 = p_begin; p0 < p_end; p0 += 32) {
      const int p = p0 + lane;
      const bool valid = p < p_end;
      const long long off =
          valid ? kv_position_offset<ROW, PS>(pt, p) + kvh * HD : 0;
      float dot[REP];
#pragma unroll
      for (int h = 0; h < REP; ++h)
        dot[h] = 0.0f;
      if (valid) {
        const KVP kr = kcache + off;
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
          const float4 kv = kv_get4(kr, d);
#pragma unroll
          for (int h = 0; h < REP; ++h) {
            const float4 qv = *reinterpret_cast<const float4 *>(&sq[wib][h][d]);
            dot[h] = fmaf(qv.x, kv.x, dot[h]);
            dot[h] = fmaf(qv.y, kv.y, dot[h]);
            dot[h] = fmaf(qv.z, kv.z, dot[h]);
            dot[h] = fmaf(qv.w, kv.w, dot[h]);
          }
        }
      }
#pragma unroll
      for (int h = 0; h < REP; ++h) {
        const float score = valid ? dot[h] * scale : -f32_inf();
        const float mn = fmaxf(m[h], warp_max(score));
        const float corr = expf(m[h] - mn);
        const float e = valid ? expf(score - mn) : 0.0f;
        l[h] = l[h] * corr + warp_sum(e);
        m[h] = mn;
        se[wib][lane][h] = e;
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd)
          acc[h][dd] *= corr;
      }
      __syncwarp();
      const int cnt = min(32, p_end - p0);
#pragma unroll 4
      for (int j = 0; j < cnt; ++j) {
        const long long vo = __shfl_sync(0xffffffffu, off, j);
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd) {
          const int d = lane + 32 * dd;
          if (d >= HD)
            continue;
          const float v = kv_get(vcache, vo + d);
#pragma unroll
          for (int h = 0; h < REP; ++h)
            acc[h][dd] = fmaf(se[wib][j][h], v, acc[h][dd]);
        }
      }
      __syncwarp();
    }
#pragma unroll
    for (int h = 0; h < REP; ++h)
      store_partial<NQ, HD, NSPLIT>(part, t, kvh * REP + h, sp, m[h], l[h],
                                    acc[h]);
  }
}

/// Shared memory (dynamic) of kv_attend_split_mma, in bytes: per warp one
/// K tile and one V tile of 32 positions as the cache stores them (KVB
/// bytes a value), rows padded by 8 values (the fragment reads of a
/// half-warp then hit distinct banks).
template <int HD, int WARPS, int KVB = 4>
__host__ __device__ constexpr int kv_attend_split_mma_smem() {
  return WARPS * 2 * 32 * (HD + 8) * KVB;
}

/// kv_attend_split_gqa on tensor cores: one warp per (token, kv head,
/// split) whose REP <= 16 query heads are
/// the 16 rows of mma's A, so S = Q K^T and O += P V of a 32-position tile
/// are 2 * HD / 4 mma.sync m16n8k16 (FlashAttention-2's loop, as
/// kv_attend_mma, with one query position per row and no causal mask
/// within a split). Each K/V tile is copied into the warp's shared memory
/// with cp.async (no registers held; the warps of an SM overlap each
/// other's copies and products), its bf16 fragments built from the f32
/// rows, in TERMS bf16 terms as kv_attend_mma: 3 (exact products, only
/// the order of the f32 sums differs from the SIMT form) or 1 (bf16
/// inputs: Q, K, V and P rounded to bf16 as prefill attention rounds
/// them). The same splits (decode_splits with grouped queries from the
/// first token) and partial results as kv_attend_split_gqa, merged by
/// kv_attend_combine. (The SIMT form spent 65 us per Nano layer at batch
/// 32 and 23 us at batch 1 walking 1K positions.)
template <int NQ, int NKV, int HD, int PS, int WARPS, int NSPLIT,
          int WARPS_TARGET, int TERMS = 1, class KVP = float *>
__device__ void kv_attend_split_mma(Step a, const float *q, KVP kcache,
                                    KVP vcache, float scale, float *part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int REP = NQ / NKV, ROW = NKV * HD, BP = 32, RS = HD + 8;
  constexpr int NTS = BP / 8, NTO = HD / 8, KS = HD / 16;
  static_assert(REP <= 16, "a kv head's query heads are one m16 tile");
  static_assert(HD % 16 == 0, "head_dim must be a multiple of 16");
  static_assert(TERMS == 1 || TERMS == 3, "1 or 3 bf16 terms");
  extern __shared__ float4 nf_attend_smem[];
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  using Tile = typename KvTraits<KVP>::Tile;
  Tile *sK = reinterpret_cast<Tile *>(nf_attend_smem) + warp * 2 * BP * RS;
  Tile *sV = sK + BP * RS;
  constexpr int CE = 16 / static_cast<int>(sizeof(Tile)); // values a copy
  static_assert(HD % CE == 0, "16-byte copies of K/V rows");
  const int nsplit =
      decode_splits<NQ, NKV, NSPLIT, WARPS_TARGET, 0>(a->num_tokens);
  const long long items = static_cast<long long>(a->num_tokens) * NKV * nsplit;
  // The TERMS bf16 terms of (x, y) as packed pairs.
  auto terms2 = [](float x, float y, unsigned(&t)[TERMS]) {
    unsigned short tx[3], ty[3];
    split_bf16<TERMS>(x, tx);
    split_bf16<TERMS>(y, ty);
#pragma unroll
    for (int te = 0; te < TERMS; ++te)
      t[te] = pack_bf16x2(tx[te], ty[te]);
  };
  for (long long item = global_warp(); item < items; item += grid_warps()) {
    const DecodeItem it = decode_item<NKV>(a, item, nsplit);
    const int kvh = it.head, sp = it.sp, t = it.t;
    const DecodeSlice sl = it.sl;
    // Q's A fragments (rows: the kv head's query heads; past REP zero).
    const float *qk = q + static_cast<long long>(t) * NQ * HD + kvh * REP * HD;
    unsigned qf[KS][TERMS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int head = g + 8 * (r & 1), d = ks * 16 + 2 * c + 8 * (r >> 1);
        const float2 v =
            head < REP ? *reinterpret_cast<const float2 *>(qk + head * HD + d)
                       : make_float2(0.0f, 0.0f);
        unsigned t[TERMS];
        terms2(v.x, v.y, t);
#pragma unroll
        for (int te = 0; te < TERMS; ++te)
          qf[ks][te][r] = t[te];
      }
    float m[2] = {-f32_inf(), -f32_inf()}, l[2] = {0.0f, 0.0f};
    float o[NTO][4];
#pragma unroll
    for (int n = 0; n < NTO; ++n)
      o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // The K and V tiles of the 32 positions from p0 into sK / sV (row j:
    // lanes copy its 16-byte pieces; zero past the split's end), one
    // cp.async group each. K of the next tile is copied while this tile's
    // O += P V runs, V of the next while its S = Q K^T runs: one tile of
    // each in shared memory, the copies overlapping the products.
    // (An fp8 cache's values are widened to f32 tiles by the lanes
    // themselves, synchronously; the group is empty.)
    auto copy_tile = [&](Tile *dst, KVP cache, int p0) {
      if (p0 < sl.p_end)
        for (int j = 0; j < BP; ++j) {
          const int p = p0 + j;
          const bool valid = p < sl.p_end;
          const long long off =
              valid ? kv_position_offset<ROW, PS>(sl.pt, p) + kvh * HD : 0;
          for (int d = CE * lane; d < HD; d += 32 * CE) {
            if constexpr (KvTraits<KVP>::kBytes)
              copy_async16_or_zero</*kL1=*/false>(dst + j * RS + d,
                                                  cache + off + d, valid);
            else
              *reinterpret_cast<float4 *>(dst + j * RS + d) =
                  valid ? kv_get4(cache, off + d)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          }
        }
      copy_async_commit(); // (empty past the last tile: the counts stay)
    };
    __syncwarp(); // the previous item's fragments are read
    copy_tile(sK, kcache, sl.p_begin);
    copy_tile(sV, vcache, sl.p_begin);
    for (int p0 = sl.p_begin; p0 < sl.p_end; p0 += BP) {
      copy_async_wait<1>(); // this tile's K (its V may still be in flight)
      __syncwarp();
      // S = Q K^T: B fragments are K rows (n = position g of the n-tile).
      float s[NTS][4];
#pragma unroll
      for (int n = 0; n < NTS; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        const Tile *kr = sK + (n * 8 + g) * RS + 2 * c;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          const float2 k0 = kv_get2(kr, ks * 16);
          const float2 k1 = kv_get2(kr, ks * 16 + 8);
          unsigned b[2][TERMS];
          terms2(k0.x, k0.y, b[0]);
          terms2(k1.x, k1.y, b[1]);
          mma_bf16_terms<TERMS>(s[n], qf[ks],
                                [&](int t, int r) { return b[r][t]; });
        }
      }
      __syncwarp(); // every lane's K fragments are read
      copy_tile(sK, kcache, p0 + BP);
      // Scale, mask past the split's end, online softmax (rows g, g + 8).
      online_softmax_tile(
          s, scale, [&](int col, int) { return p0 + col < sl.p_end; }, m, l, o);
      copy_async_wait<1>(); // this tile's V (the next K may be in flight)
      __syncwarp();
      // O += P V: B fragments are V columns (k = positions 2c, 2c + 1 and
      // 2c + 8, 2c + 9 of the k-step, n = dimension g of the n-tile).
#pragma unroll
      for (int kk = 0; kk < BP / 16; ++kk) {
        unsigned pf[TERMS][4];
        c_pair_to_a<TERMS>(s[2 * kk], s[2 * kk + 1], pf);
        const Tile *vr = sV + (kk * 16 + 2 * c) * RS + g;
#pragma unroll
        for (int n = 0; n < NTO; ++n) {
          const Tile *v = vr + n * 8;
          unsigned b[2][TERMS];
          terms2(kv_get(v, 0), kv_get(v, RS), b[0]);
          terms2(kv_get(v, 8 * RS), kv_get(v, 9 * RS), b[1]);
          mma_bf16_terms<TERMS>(o[n], pf,
                                [&](int t, int r) { return b[r][t]; });
        }
      }
      __syncwarp(); // every lane's V fragments are read
      copy_tile(sV, vcache, p0 + BP);
    }
    copy_async_wait<0>(); // (the empty groups past the last tile)
    // The partial softmax of each query head (rows g, g + 8).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int head = g + 8 * h;
      if (head >= REP)
        continue;
      float *po =
          part +
          ((static_cast<long long>(t) * NQ + kvh * REP + head) * NSPLIT + sp) *
              (HD + 2);
      if (c == 0) {
        po[0] = m[h];
        po[1] = l[h];
      }
#pragma unroll
      for (int n = 0; n < NTO; ++n)
        *reinterpret_cast<float2 *>(po + 2 + n * 8 + 2 * c) =
            make_float2(o[n][2 * h], o[n][2 * h + 1]);
    }
  }
#endif
}

/// out[t, h] = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M): one block
/// of WARPS warps per (token, head). Warp 0 takes the (m, l) of every split
/// (lanes: splits lane, lane + 32, ...; M and the sum of l by warp
/// reductions) and leaves each split's factor in shared memory; then warp
/// w adds the acc of splits w, w + WARPS, ... with all of their loads in
/// flight at once (the lanes own head dimensions), and warp 0 adds the
/// warps' sums in order (a fixed order: deterministic). (A warp per (token,
/// head) walking the splits in order took 7.5 us a layer at batch 1, its
/// loads in several round trips.)
template <int NQ, int NKV, int HD, int NSPLIT, int WARPS_TARGET, int GQA_TOKENS,
          int WARPS = 8, class O = float *>
__device__ void kv_attend_combine(Step a, const float *part, O out) {
  constexpr int DPL = (HD + 31) / 32, SPL = (NSPLIT + 31) / 32;
  constexpr int SPW = (NSPLIT + WARPS - 1) / WARPS; // splits per warp
  __shared__ float s_c[SPL * 32];
  __shared__ float s_acc[WARPS][DPL * 32];
  __shared__ float s_inv;
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  const int nsplit =
      decode_splits<NQ, NKV, NSPLIT, WARPS_TARGET, GQA_TOKENS>(a->num_tokens);
  const long long items = static_cast<long long>(a->num_tokens) * NQ;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const float *p = part + item * NSPLIT * (HD + 2);
    if (warp == 0) {
      float ms[SPL], ls[SPL], M = -f32_inf();
#pragma unroll
      for (int u = 0; u < SPL; ++u) {
        const int sp = lane + 32 * u;
        ms[u] = sp < nsplit ? p[sp * (HD + 2)] : -f32_inf();
        ls[u] = sp < nsplit ? p[sp * (HD + 2) + 1] : 0.0f;
        M = fmaxf(M, ms[u]);
      }
      M = warp_max(M);
      float l = 0.0f;
#pragma unroll
      for (int u = 0; u < SPL; ++u) {
        const float c = ls[u] == 0.0f ? 0.0f : expf(ms[u] - M); // empty: 0
        s_c[lane + 32 * u] = c;
        l += ls[u] * c;
      }
      l = warp_sum(l);
      if (lane == 0)
        s_inv = 1.0f / l;
    }
    __syncthreads();
    float v[SPW][DPL];
#pragma unroll
    for (int k = 0; k < SPW; ++k) {
      const int sp = warp + k * WARPS;
      const float *ps = p + sp * (HD + 2) + 2;
#pragma unroll
      for (int dd = 0; dd < DPL; ++dd) {
        const int d = lane + 32 * dd;
        v[k][dd] = sp < nsplit && d < HD ? ps[d] : 0.0f;
      }
    }
    float acc[DPL];
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd)
      acc[dd] = 0.0f;
#pragma unroll
    for (int k = 0; k < SPW; ++k) {
      const int sp = warp + k * WARPS;
      const float c = sp < nsplit ? s_c[sp] : 0.0f;
      if (c != 0.0f) // uniform over the warp; empty splits add nothing
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd)
          acc[dd] = fmaf(v[k][dd], c, acc[dd]);
    }
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd)
      s_acc[warp][lane + 32 * dd] = acc[dd];
    __syncthreads();
    if (warp == 0) {
      const float inv = s_inv;
      const O o = out + item * HD; // f32 rows, or with a copy (store_act)
#pragma unroll
      for (int dd = 0; dd < DPL; ++dd) {
        const int d = lane + 32 * dd;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w)
          sum += s_acc[w][d];
        if (d < HD)
          store_act(o + d, sum * inv);
      }
    }
    __syncthreads(); // s_c, s_acc and s_inv are free for the next item
  }
}

} // namespace nf

#endif // NF_KERNELS_ATTENTION_CUH
