#include "backends/cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace nf::cpu {

namespace {

// Below this many multiply-adds (or elements) a parallel region costs more
// than it saves: ~100 us of work against a few us of fork/join when cores are
// idle (much more when they are oversubscribed).
std::atomic<int64_t> gParallelWork{1 << 18};

} // namespace

int maxThreads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int threadId() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

bool worthParallel(int64_t work) {
  return work > gParallelWork.load(std::memory_order_relaxed);
}

double dotF64(const float *a, const float *b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j)
      acc[j] += static_cast<double>(a[i + j]) * static_cast<double>(b[i + j]);
  double tail = 0.0;
  for (; i < n; ++i)
    tail += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail;
}

namespace {

// Eight independent partial sums: vectorisable without reassociation (no
// -ffast-math), and more accurate than one running sum.
inline float dotF32(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i)
    tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// Output features per block of the linear kernel: one block of converted
// weight rows is reused across all tokens of the call.
constexpr int64_t kRowBlock = 8;

size_t linearScratch(const WeightView &W) {
  return W.dtype == DType::F32 ? 0 : static_cast<size_t>(kRowBlock * W.cols());
}

// Rows [n0, n0 + nr) of W for tokens [0, T).
inline void linearBlock(const float *x, int64_t T, int64_t ldx,
                        const WeightView &W, int64_t n0, int64_t nr, float *y,
                        int64_t ldy, Accum acc, float *scratch) {
  const int64_t K = W.cols();
  const float *w;
  if (W.dtype == DType::F32) {
    w = static_cast<const float *>(W.data) + n0 * K;
  } else {
    convertToF32(W, n0 * K, nr * K, scratch);
    w = scratch;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float *xr = x + t * ldx;
    float *yr = y + t * ldy + n0;
    if (acc == Accum::F64)
      for (int64_t r = 0; r < nr; ++r)
        yr[r] = static_cast<float>(dotF64(xr, w + r * K, K));
    else
      for (int64_t r = 0; r < nr; ++r)
        yr[r] = dotF32(xr, w + r * K, K);
  }
}

// linear() on the calling thread; `scratch` holds linearScratch(W) floats.
void linearSerial(const float *x, int64_t T, int64_t ldx, const WeightView &W,
                  float *y, int64_t ldy, Accum acc, float *scratch) {
  const int64_t N = W.rows();
  for (int64_t n0 = 0; n0 < N; n0 += kRowBlock)
    linearBlock(x, T, ldx, W, n0, std::min(kRowBlock, N - n0), y, ldy, acc,
                scratch);
}

} // namespace

void setParallelThreshold(int64_t work) {
  gParallelWork.store(std::max<int64_t>(work, 0), std::memory_order_relaxed);
}

int64_t parallelThreshold() {
  return gParallelWork.load(std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------

void embedding(const WeightView &table, std::span<const int32_t> tokens,
               float *out) {
  const int64_t H = table.cols();
  const int64_t T = static_cast<int64_t>(tokens.size());
#pragma omp parallel for schedule(static) if (worthParallel(T * H))
  for (int64_t t = 0; t < T; ++t)
    convertToF32(table, static_cast<int64_t>(tokens[t]) * H, H, out + t * H);
}

void rmsNorm(const float *x, int64_t T, int64_t H, const WeightView &weight,
             double eps, float *out) {
  std::vector<float> w(static_cast<size_t>(H));
  convertToF32(weight, 0, H, w.data());
#pragma omp parallel for schedule(static) if (worthParallel(T * H))
  for (int64_t t = 0; t < T; ++t) {
    const float *xr = x + t * H;
    float *o = out + t * H;
    double ss = 0.0;
    for (int64_t i = 0; i < H; ++i)
      ss += static_cast<double>(xr[i]) * xr[i];
    const float r =
        static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(H) + eps));
    for (int64_t i = 0; i < H; ++i)
      o[i] = w[i] * (xr[i] * r);
  }
}

void addInPlace(float *h, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (worthParallel(n / 4))
  for (int64_t i = 0; i < n; ++i)
    h[i] += x[i];
}

void linear(const float *x, int64_t T, int64_t ldx, const WeightView &W,
            float *y, int64_t ldy, Accum acc) {
  const int64_t N = W.rows(), K = W.cols();
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  const bool parallel = worthParallel(T * N * K) && blocks > 1;
  const int nt = parallel ? maxThreads() : 1;
  const size_t per = linearScratch(W);
  std::vector<float> scratch(per * static_cast<size_t>(nt));
#pragma omp parallel num_threads(nt) if (parallel)
  {
    float *mine = scratch.data() + per * static_cast<size_t>(threadId());
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n0 = b * kRowBlock;
      linearBlock(x, T, ldx, W, n0, std::min(kRowBlock, N - n0), y, ldy, acc,
                  mine);
    }
  }
}

void fakeQuantE4M3(const float *x, int64_t T, int64_t K, int64_t ldx,
                   float scale, float *out) {
  for (int64_t t = 0; t < T; ++t) {
    const float *xr = x + t * ldx;
    double s = scale;
    if (scale == 0.0f) {
      double amax = 0.0;
      for (int64_t k = 0; k < K; ++k)
        amax = std::max(amax, static_cast<double>(std::fabs(xr[k])));
      s = amax == 0.0 ? 1.0 : amax / 448.0;
    }
    for (int64_t k = 0; k < K; ++k) {
      const double v = std::clamp(xr[k] / s, -448.0, 448.0);
      out[t * K + k] = static_cast<float>(
          static_cast<double>(roundToE4M3(static_cast<float>(v))) * s);
    }
  }
}

void relu2InPlace(float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    x[i] = r * r;
  }
}

void mlpRelu2(const float *x, int64_t T, const WeightView &up,
              const WeightView &down, float *out, Accum acc) {
  const int64_t I = up.rows(), H = up.cols();
  std::vector<float> hidden(static_cast<size_t>(T * I));
  linear(x, T, H, up, hidden.data(), I, acc);
  relu2InPlace(hidden.data(), T * I);
  linear(hidden.data(), T, I, down, out, down.rows(), acc);
}

// ---------------------------------------------------------------------------
// Mamba2

void causalConvSilu(const float *in, int64_t ldIn,
                    std::span<const SeqSpan> spans,
                    std::span<float *const> convStates, const MambaShape &s,
                    const WeightView &w, const WeightView &bias, float *out,
                    int64_t ldOut) {
  const int64_t CD = s.convDim(), K = s.convKernel, K1 = K - 1;
  std::vector<float> wf(static_cast<size_t>(CD * K)), bf(CD, 0.0f);
  convertToF32(w, 0, CD * K, wf.data());
  if (bias.valid())
    convertToF32(bias, 0, CD, bf.data());
  const int64_t nspans = static_cast<int64_t>(spans.size());
  int64_t tokens = 0;
  for (const SeqSpan &sp : spans)
    tokens += sp.count;
#pragma omp parallel for schedule(static) if (worthParallel(tokens * CD * K))
  for (int64_t item = 0; item < nspans * CD; ++item) {
    const SeqSpan &sp = spans[item / CD];
    const int64_t c = item % CD;
    float *st = convStates[item / CD] + c * K1;
    const float *wc = wf.data() + c * K;
    const float *col = in + static_cast<int64_t>(sp.begin) * ldIn + c;
    float *oc = out + static_cast<int64_t>(sp.begin) * ldOut + c;
    const int64_t T = sp.count;
    for (int64_t t = 0; t < T; ++t) {
      // Window: inputs t-K1 .. t; negative indices come from the state.
      float a = bf[c];
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - K1 + j;
        const float v = src < 0 ? st[K1 + src] : col[src * ldIn];
        a += wc[j] * v;
      }
      oc[t * ldOut] = silu(a);
    }
    // New state: the last K1 inputs of [state | span inputs].
    for (int64_t i = 0; i < K1; ++i) {
      const int64_t src = T - K1 + i;
      st[i] = src < 0 ? st[K1 + src] : col[src * ldIn];
    }
  }
}

void mambaDt(const float *dtRaw, int64_t ldRaw, int64_t T, int64_t nh,
             const WeightView &dtBias, float dtMin, float dtMax, float *dt) {
  std::vector<float> b(static_cast<size_t>(nh));
  convertToF32(dtBias, 0, nh, b.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float v = dtRaw[t * ldRaw + h] + b[h];
      float sp = v > 20.0f ? v : std::log1p(std::exp(v));
      sp = std::min(std::max(sp, dtMin), dtMax);
      dt[t * nh + h] = sp;
    }
}

void ssmScan(const float *xBC, int64_t ldX, const float *dt,
             std::span<const SeqSpan> spans, std::span<float *const> ssmStates,
             const MambaShape &s, const WeightView &aLog, const WeightView &D,
             float *y, int64_t ldY) {
  const int64_t nh = s.numHeads, P = s.headDim, N = s.stateSize, G = s.nGroups,
                I = s.inner();
  const int64_t headsPerGroup = nh / G;
  std::vector<float> A(static_cast<size_t>(nh)), Dv(static_cast<size_t>(nh));
  convertToF32(aLog, 0, nh, A.data());
  convertToF32(D, 0, nh, Dv.data());
  for (float &a : A)
    a = -std::exp(a);
  const int64_t nspans = static_cast<int64_t>(spans.size());
  int64_t tokens = 0;
  for (const SeqSpan &sp : spans)
    tokens += sp.count;
#pragma omp parallel for schedule(                                             \
    static) if (worthParallel(tokens * nh * P * N))
  for (int64_t item = 0; item < nspans * nh; ++item) {
    const SeqSpan &sp = spans[item / nh];
    const int64_t h = item % nh, g = h / headsPerGroup;
    float *S = ssmStates[item / nh] + h * P * N;
    const float Ah = A[h], Dh = Dv[h];
    for (int64_t i = 0; i < sp.count; ++i) {
      const int64_t t = sp.begin + i;
      const float *row = xBC + t * ldX;
      const float *xh = row + h * P;
      const float *B = row + I + g * N;
      const float *C = row + I + G * N + g * N;
      const float d = dt[t * nh + h];
      const float dA = std::exp(d * Ah);
      float *yr = y + t * ldY + h * P;
      for (int64_t p = 0; p < P; ++p) {
        const float xd = xh[p] * d;
        float *Sp = S + p * N;
        float acc[4] = {0, 0, 0, 0};
        int64_t n = 0;
        for (; n + 4 <= N; n += 4)
          for (int j = 0; j < 4; ++j) {
            Sp[n + j] = dA * Sp[n + j] + xd * B[n + j];
            acc[j] += Sp[n + j] * C[n + j];
          }
        float tail = 0.0f;
        for (; n < N; ++n) {
          Sp[n] = dA * Sp[n] + xd * B[n];
          tail += Sp[n] * C[n];
        }
        yr[p] = ((acc[0] + acc[2]) + (acc[1] + acc[3])) + tail + Dh * xh[p];
      }
    }
  }
}

void gatedRmsNorm(const float *y, int64_t ldY, const float *z, int64_t ldZ,
                  int64_t T, int64_t I, int64_t G, const WeightView &weight,
                  double eps, float *out) {
  const int64_t gs = I / G;
  std::vector<float> w(static_cast<size_t>(I));
  convertToF32(weight, 0, I, w.data());
#pragma omp parallel for schedule(static) if (worthParallel(T * I))
  for (int64_t t = 0; t < T; ++t) {
    const float *yr = y + t * ldY;
    const float *zr = z + t * ldZ;
    float *o = out + t * I;
    for (int64_t i = 0; i < I; ++i)
      o[i] = yr[i] * silu(zr[i]);
    for (int64_t q = 0; q < G; ++q) {
      float *u = o + q * gs;
      double ss = 0.0;
      for (int64_t i = 0; i < gs; ++i)
        ss += static_cast<double>(u[i]) * u[i];
      const float r = static_cast<float>(
          1.0 / std::sqrt(ss / static_cast<double>(gs) + eps));
      for (int64_t i = 0; i < gs; ++i)
        u[i] = w[q * gs + i] * (u[i] * r);
    }
  }
}

// ---------------------------------------------------------------------------
// Attention

void kvAppend(const float *k, int64_t ldK, const float *v, int64_t ldV,
              std::span<const SeqSpan> spans,
              std::span<const std::span<const int32_t>> pageTables,
              const PagedKvLayer &cache) {
  const int64_t row = cache.numKvHeads * cache.headDim;
  const int64_t ps = cache.pageSize;
  for (size_t i = 0; i < spans.size(); ++i) {
    const SeqSpan &sp = spans[i];
    for (int64_t j = 0; j < sp.count; ++j) {
      const int64_t pos = sp.startPos + j;
      const int64_t page = pageTables[i][static_cast<size_t>(pos / ps)];
      const int64_t off = (page * ps + pos % ps) * row;
      const int64_t t = sp.begin + j;
      std::copy(k + t * ldK, k + t * ldK + row, cache.k + off);
      std::copy(v + t * ldV, v + t * ldV + row, cache.v + off);
      if (cache.storage != KvStorage::F32)
        for (int64_t h = 0; h < cache.numKvHeads; ++h) {
          roundKvRow(cache.k + off + h * cache.headDim, cache.headDim,
                     cache.storage);
          roundKvRow(cache.v + off + h * cache.headDim, cache.headDim,
                     cache.storage);
        }
    }
  }
}

void pagedAttention(const float *q, int64_t ldQ, int64_t numHeads,
                    std::span<const SeqSpan> spans,
                    std::span<const std::span<const int32_t>> pageTables,
                    const PagedKvLayer &cache, float *out, int64_t ldOut,
                    float scale) {
  const int64_t nkv = cache.numKvHeads, hd = cache.headDim;
  const int64_t ps = cache.pageSize, row = nkv * hd;
  const int64_t rep = numHeads / nkv;
  if (scale == 0.0f)
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  // (span, token) pairs, flattened so that threads share all work.
  std::vector<std::pair<int32_t, int32_t>> toks;
  int64_t maxLen = 0, work = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    for (int32_t j = 0; j < spans[i].count; ++j)
      toks.push_back({static_cast<int32_t>(i), j});
    const int64_t len = spans[i].startPos + spans[i].count;
    maxLen = std::max(maxLen, len);
    work += spans[i].count * len;
  }
  const int64_t items = static_cast<int64_t>(toks.size()) * numHeads;
  const bool parallel = worthParallel(work * numHeads * hd);
  const int nt = parallel ? maxThreads() : 1;
  const size_t per = static_cast<size_t>(maxLen + hd);
  std::vector<float> scratch(per * static_cast<size_t>(nt));
#pragma omp parallel num_threads(nt) if (parallel)
  {
    float *score = scratch.data() + per * static_cast<size_t>(threadId());
    float *acc = score + maxLen;
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      const auto [si, j] = toks[static_cast<size_t>(item / numHeads)];
      const int64_t h = item % numHeads, kvh = h / rep;
      const SeqSpan &sp = spans[static_cast<size_t>(si)];
      const std::span<const int32_t> pt = pageTables[static_cast<size_t>(si)];
      const int64_t t = sp.begin + j;
      const int64_t len = sp.startPos + j + 1; // causal: positions [0, pos]
      const float *qh = q + t * ldQ + h * hd;
      // Where position p's K and V rows of this KV head are (paged).
      auto kvOffset = [&](int64_t p) {
        const int64_t page = pt[static_cast<size_t>(p / ps)];
        return (page * ps + p % ps) * row + kvh * hd;
      };
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < len; ++p) {
        score[p] = dotF32(qh, cache.k + kvOffset(p), hd) * scale;
        mx = std::max(mx, score[p]);
      }
      double denom = 0.0;
      for (int64_t p = 0; p < len; ++p) {
        score[p] = std::exp(score[p] - mx);
        denom += score[p];
      }
      std::fill(acc, acc + hd, 0.0f);
      for (int64_t p = 0; p < len; ++p) {
        const float *vp = cache.v + kvOffset(p);
        const float sc = score[p];
        for (int64_t d = 0; d < hd; ++d)
          acc[d] += sc * vp[d];
      }
      const float inv = static_cast<float>(1.0 / denom);
      float *o = out + t * ldOut + h * hd;
      for (int64_t d = 0; d < hd; ++d)
        o[d] = acc[d] * inv;
    }
  }
}

// ---------------------------------------------------------------------------
// Mixture of experts

void maskExpertGroups(std::span<double> sb, int64_t nGroup, int64_t topkGroup) {
  const int64_t E = static_cast<int64_t>(sb.size());
  const int64_t groups = std::max<int64_t>(nGroup, 1);
  if (groups <= 1 || topkGroup >= groups)
    return;
  const int64_t gsize = E / groups;
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> gscore(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    double b1 = ninf, b2 = ninf;
    for (int64_t e = g * gsize; e < (g + 1) * gsize; ++e) {
      if (sb[e] > b1) {
        b2 = b1;
        b1 = sb[e];
      } else if (sb[e] > b2) {
        b2 = sb[e];
      }
    }
    gscore[g] = gsize >= 2 ? b1 + b2 : b1;
  }
  std::vector<int64_t> order(static_cast<size_t>(groups));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return gscore[a] > gscore[b]; });
  std::vector<bool> keep(static_cast<size_t>(groups), false);
  for (int64_t i = 0; i < topkGroup; ++i)
    keep[order[i]] = true;
  for (int64_t e = 0; e < E; ++e)
    if (!keep[e / gsize])
      sb[e] = ninf;
}

ThreadCountScope::ThreadCountScope(int n) {
#ifdef _OPENMP
  if (n > 0) {
    saved_ = omp_get_max_threads();
    omp_set_num_threads(n);
  }
#else
  (void)n;
#endif
}

ThreadCountScope::~ThreadCountScope() {
#ifdef _OPENMP
  if (saved_ > 0)
    omp_set_num_threads(saved_);
#endif
}

int64_t maxExpertsPerToken(const RouterConfig &c) {
  if (c.nGroup <= 1)
    return c.numExperts;
  return (c.numExperts / c.nGroup) * std::min(c.topkGroup, c.nGroup);
}

void moeRoute(const float *x, int64_t T, int64_t H, const WeightView &gate,
              const WeightView &correctionBias, const RouterConfig &c,
              int32_t k, std::span<const int32_t> kPerToken,
              RouterOutput &out) {
  const int64_t E = c.numExperts;
  // Router logits in f64: expert choice is discontinuous, so the more exact
  // the scores, the more often we agree with an f64 reference on near ties.
  std::vector<float> gw(static_cast<size_t>(E * H));
  convertToF32(gate, 0, E * H, gw.data());
  std::vector<double> logits(static_cast<size_t>(T * E));
#pragma omp parallel for schedule(static) if (worthParallel(T * E * H))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      logits[t * E + e] = dotF64(x + t * H, gw.data() + e * H, H);

  std::vector<double> bias(static_cast<size_t>(E), 0.0);
  if (correctionBias.valid())
    for (int64_t e = 0; e < E; ++e)
      bias[e] = loadF32(correctionBias, e);

  // Out-of-range k is clamped: a kernel has no way to report it (the
  // Executor validates k before calling).
  const int32_t kLimit = static_cast<int32_t>(maxExpertsPerToken(c));
  auto clampK = [&](int32_t v) { return std::min(std::max(v, 0), kLimit); };
  int32_t maxK = kPerToken.empty() ? clampK(k) : 0;
  for (int32_t kt : kPerToken)
    maxK = std::max(maxK, clampK(kt));
  out.maxK = maxK;
  out.count.assign(static_cast<size_t>(T), 0);
  out.experts.assign(static_cast<size_t>(T * maxK), -1);
  out.weights.assign(static_cast<size_t>(T * maxK), 0.0f);

  std::vector<double> s(static_cast<size_t>(E)), sb(static_cast<size_t>(E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t kt = clampK(kPerToken.empty() ? k : kPerToken[t]);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
      sb[e] = s[e] + bias[e];
    }
    maskExpertGroups(sb, c.nGroup, c.topkGroup);
    std::iota(order.begin(), order.begin() + E, 0);
    std::partial_sort(order.begin(), order.begin() + kt, order.begin() + E,
                      [&](int64_t a, int64_t b) {
                        return sb[a] > sb[b] || (sb[a] == sb[b] && a < b);
                      });
    double sum = 0.0;
    for (int32_t j = 0; j < kt; ++j)
      sum += s[order[j]];
    const double norm = c.normTopkProb ? 1.0 / (sum + 1e-20) : 1.0;
    for (int32_t j = 0; j < kt; ++j) {
      out.experts[t * maxK + j] = static_cast<int32_t>(order[j]);
      out.weights[t * maxK + j] =
          static_cast<float>(s[order[j]] * norm * c.routedScalingFactor);
    }
    out.count[t] = kt;
  }
}

void moeExperts(const float *xe, int64_t T, int64_t He,
                const RouterOutput &routes, std::span<const WeightView> up,
                std::span<const WeightView> down, float *out, Accum acc) {
  const int64_t E = static_cast<int64_t>(up.size());
  const int64_t maxK = routes.maxK;
  // Assignments (token, j) grouped by expert: counting sort.
  std::vector<int64_t> start(static_cast<size_t>(E + 1), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int32_t j = 0; j < routes.count[t]; ++j)
      ++start[routes.experts[t * maxK + j] + 1];
  for (int64_t e = 0; e < E; ++e)
    start[e + 1] += start[e];
  std::vector<int64_t> assign(static_cast<size_t>(start[E]));
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int32_t j = 0; j < routes.count[t]; ++j)
        assign[fill[routes.experts[t * maxK + j]]++] = t * maxK + j;
  }
  // Per-assignment expert outputs, combined per token afterwards in j order
  // so the sum does not depend on which tokens share the call.
  std::vector<float> eo(static_cast<size_t>(T * maxK * He));
  int64_t Ie = 0;
  size_t wscratch = 0;
  for (int64_t e = 0; e < E; ++e) {
    Ie = std::max(Ie, up[e].rows());
    wscratch =
        std::max({wscratch, linearScratch(up[e]), linearScratch(down[e])});
  }
  constexpr int64_t kChunk = 16;
  const size_t per = static_cast<size_t>(kChunk * (He + Ie)) + wscratch;
  const bool parallel = worthParallel(start[E] * Ie * He * 2);
  const int nt = parallel ? maxThreads() : 1;
  std::vector<float> scratch(per * static_cast<size_t>(nt));
#pragma omp parallel num_threads(nt) if (parallel)
  {
    float *xg = scratch.data() + per * static_cast<size_t>(threadId());
    float *hid = xg + kChunk * He;
    float *ws = hid + kChunk * Ie;
#pragma omp for schedule(dynamic, 1)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t ie = up[e].rows();
      for (int64_t a0 = start[e]; a0 < start[e + 1]; a0 += kChunk) {
        const int64_t n = std::min(kChunk, start[e + 1] - a0);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t t = assign[a0 + i] / maxK;
          std::copy(xe + t * He, xe + (t + 1) * He, xg + i * He);
        }
        linearSerial(xg, n, He, up[e], hid, ie, acc, ws);
        relu2InPlace(hid, n * ie);
        linearSerial(hid, n, ie, down[e], xg, He, acc, ws);
        for (int64_t i = 0; i < n; ++i)
          std::copy(xg + i * He, xg + (i + 1) * He,
                    eo.data() + assign[a0 + i] * He);
      }
    }
  }
#pragma omp parallel for schedule(static) if (worthParallel(T * maxK * He))
  for (int64_t t = 0; t < T; ++t) {
    float *o = out + t * He;
    std::fill(o, o + He, 0.0f);
    for (int32_t j = 0; j < routes.count[t]; ++j) {
      const float w = routes.weights[t * maxK + j];
      const float *r = eo.data() + (t * maxK + j) * He;
      for (int64_t i = 0; i < He; ++i)
        o[i] += w * r[i];
    }
  }
}

} // namespace nf::cpu
