// CPU kernels of the Nemotron-H forward pass (docs: nemotron-h-reference.md).
//
// Conventions: activations are f32, row-major [tokens, features], with an
// explicit leading dimension (`ld*`, in elements) where a kernel may read or
// write a column slice of a wider matrix. Weights are WeightViews of any of
// f32/bf16/f16, converted to f32 on the fly. Accumulation is f32 unless a
// kernel says otherwise (Accum::F64 widens the dot products of linear layers).
//
// Determinism: every output element is computed in an order that depends only
// on its own inputs, never on how many tokens or sequences share the call or
// on the thread count, so a sequence gives bit-identical results alone or in
// any batch.
//
// Threading: kernels parallelise with OpenMP over rows, output features,
// heads or experts, and fall back to the calling thread for small work.
// Scratch memory is allocated before any parallel region; std::bad_alloc may
// leave a kernel (the Executor turns it into a Status).
#pragma once

#include "engine/caches.h" // MambaShape, PagedKvLayer
#include "weights.h"

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace nf::cpu {

using nf::WeightView;

/// Accumulator of dot products in linear layers.
enum class Accum { F32, F64 };

/// One sequence's tokens inside a step: rows [begin, begin + count) of the
/// step's activations, at absolute positions startPos, startPos + 1, ...;
/// `slot` names its recurrent state (and page table) in the caches.
struct SeqSpan {
  int32_t begin = 0;
  int32_t count = 0;
  int64_t startPos = 0;
  int32_t slot = 0;
};

/// Work (multiply-adds or elements) below which kernels stay on the calling
/// thread; process-wide. 0 parallelises everything (tests of threading).
void setParallelThreshold(int64_t work);
int64_t parallelThreshold();

// Helpers of the kernels that the CPU engine's own ops (cpu_ops_moe.cpp) use
// too, so that both thread and sum the same way.

/// OpenMP's thread count for a parallel region, and the calling thread's
/// number in it (1 and 0 without OpenMP).
int maxThreads();
int threadId();

/// Whether `work` is above parallelThreshold().
bool worthParallel(int64_t work);

/// Σ a[i] · b[i] in f64, in four interleaved partial sums plus a tail.
double dotF64(const float *a, const float *b, int64_t n);

// ---------------------------------------------------------------------------
// Dense building blocks

/// out[t, :] = table[tokens[t], :]; tokens must be < table.rows().
void embedding(const WeightView &table, std::span<const int32_t> tokens,
               float *out);

/// out = weight ⊙ x · rsqrt(mean(x²) + eps) per row of H features (sum of
/// squares in f64). `out` may alias `x`.
void rmsNorm(const float *x, int64_t T, int64_t H, const WeightView &weight,
             double eps, float *out);

/// h += x (n elements).
void addInPlace(float *h, const float *x, int64_t n);

/// y[t, n] = Σ_k x[t, k] · W[n, k] for W [N, K] (any weight dtype).
void linear(const float *x, int64_t T, int64_t ldx, const WeightView &W,
            float *y, int64_t ldy, Accum acc = Accum::F32);

/// The fp8 E4M3 quantisation of a quantised linear's input, as values:
/// out[t, k] = e4m3(clamp(x[t, k] / s, ±448)) · s, with s = `scale` (static
/// per tensor) or, when `scale` is 0, max_k |x[t, k]| / 448 per row (dynamic
/// per token; 1 for a row of zeros). x has row stride ldx, out is [T, K].
void fakeQuantE4M3(const float *x, int64_t T, int64_t K, int64_t ldx,
                   float scale, float *out);

/// x = relu(x)².
void relu2InPlace(float *x, int64_t n);

/// out = down · relu(up · x)² for up [I, H], down [H, I]; out [T, H].
void mlpRelu2(const float *x, int64_t T, const WeightView &up,
              const WeightView &down, float *out, Accum acc = Accum::F32);

// ---------------------------------------------------------------------------
// Mamba2

/// Causal depthwise conv + SiLU per sequence. in: [T, ldIn] (CD channels from
/// column 0); w [CD, 1, K] (w[c, K-1] multiplies the current token); bias
/// [CD] or invalid for none. convStates[i] ([CD, K-1] f32, oldest column
/// first) of spans[i] supplies the inputs before the span and is advanced to
/// hold the span's last K-1 inputs.
void causalConvSilu(const float *in, int64_t ldIn,
                    std::span<const SeqSpan> spans,
                    std::span<float *const> convStates, const MambaShape &s,
                    const WeightView &w, const WeightView &bias, float *out,
                    int64_t ldOut);

/// dt[t, h] = clamp(softplus(dtRaw[t, h] + dtBias[h]), dtMin, dtMax).
/// softplus(v) = v for v > 20 (as torch), log1p(exp(v)) otherwise.
void mambaDt(const float *dtRaw, int64_t ldRaw, int64_t T, int64_t nh,
             const WeightView &dtBias, float dtMin, float dtMax, float *dt);

/// The SSM recurrence (reference §3.4) over each span's tokens in order.
/// xBC: conv outputs [T, ldX] = x (I) | B (G·N) | C (G·N); dt [T, nh];
/// ssmStates[i] = [nh, P, N] f32 state of spans[i], updated in place;
/// y[t, h·P + p] = Σ_n S[h,p,n] C[g,n] + D[h] x[h,p].
void ssmScan(const float *xBC, int64_t ldX, const float *dt,
             std::span<const SeqSpan> spans, std::span<float *const> ssmStates,
             const MambaShape &s, const WeightView &aLog, const WeightView &D,
             float *y, int64_t ldY);

/// Gated grouped RMSNorm (norm after gate): u = y ⊙ silu(z), normalised per
/// group of I/G contiguous features, times weight [I]. out [T, I].
void gatedRmsNorm(const float *y, int64_t ldY, const float *z, int64_t ldZ,
                  int64_t T, int64_t I, int64_t G, const WeightView &weight,
                  double eps, float *out);

// ---------------------------------------------------------------------------
// Attention with a paged KV cache

/// Writes K/V rows of each span's tokens ([T, ldK] / [T, ldV], nkv·hd
/// features) at positions startPos... of its pages. pageTables[i] must cover
/// positions < startPos + count of spans[i].
void kvAppend(const float *k, int64_t ldK, const float *v, int64_t ldV,
              std::span<const SeqSpan> spans,
              std::span<const std::span<const int32_t>> pageTables,
              const PagedKvLayer &cache);

/// Causal GQA attention, no positional encoding: token at position i of a
/// span attends to cached positions [0, i] of its sequence; query head h uses
/// kv head h / (nq / nkv); scale 1/sqrt(hd); softmax in f32 with an f64
/// normaliser. q [T, ldQ] (nq·hd), out [T, ldOut] (nq·hd, head-major).
/// `scale` multiplies q.k (0: the usual 1/sqrt(head dim)).
void pagedAttention(const float *q, int64_t ldQ, int64_t numHeads,
                    std::span<const SeqSpan> spans,
                    std::span<const std::span<const int32_t>> pageTables,
                    const PagedKvLayer &cache, float *out, int64_t ldOut,
                    float scale = 0.0f);

// ---------------------------------------------------------------------------
// Mixture of experts

struct RouterConfig {
  int64_t numExperts = 0;
  int64_t nGroup = 1;    // expert groups
  int64_t topkGroup = 1; // groups kept per token
  bool normTopkProb = true;
  float routedScalingFactor = 1.0f;
};

/// Per-token routing decision: token t uses count[t] experts,
/// experts[t·maxK + j] with weight weights[t·maxK + j] for j < count[t]
/// (descending selection score; unused entries are -1 / 0).
struct RouterOutput {
  int32_t maxK = 0;
  std::vector<int32_t> count;
  std::vector<int32_t> experts;
  std::vector<float> weights;
  int64_t numTokens() const { return static_cast<int64_t>(count.size()); }
};

/// Largest k a router config allows (experts in the kept groups).
int64_t maxExpertsPerToken(const RouterConfig &c);

/// Group-limited routing: experts outside the `topkGroup` best of `nGroup`
/// groups (ranked by the sum of their two best selection scores, ties to the
/// lower group) get -inf in `selection`. No-op when every group is kept.
void maskExpertGroups(std::span<double> selection, int64_t nGroup,
                      int64_t topkGroup);

/// Sets the calling thread's OpenMP thread count for a scope (n > 0).
class ThreadCountScope {
public:
  explicit ThreadCountScope(int n);
  ~ThreadCountScope();
  ThreadCountScope(const ThreadCountScope &) = delete;
  ThreadCountScope &operator=(const ThreadCountScope &) = delete;

private:
  int saved_ = 0;
};

/// Router (reference §5): logits = x · gate^T in f64, s = sigmoid(logits),
/// selection on s + correctionBias (bias may be invalid: zero), group-limited
/// (groups scored by the sum of their top-2), weights s[idx] renormalised
/// w/(Σw + 1e-20) when normTopkProb, times routedScalingFactor. Token t
/// selects kPerToken[t] experts when kPerToken is non-empty, else `k`
/// (0 <= k <= maxExpertsPerToken).
void moeRoute(const float *x, int64_t T, int64_t H, const WeightView &gate,
              const WeightView &correctionBias, const RouterConfig &c,
              int32_t k, std::span<const int32_t> kPerToken, RouterOutput &out);

/// Routed experts: out[t] = Σ_j w_j · down_e · relu(up_e · xe[t])² over the
/// token's experts e = experts[t, j], accumulated in f32 in j order.
/// up[e] [Ie, He], down[e] [He, Ie]; xe, out [T, He].
void moeExperts(const float *xe, int64_t T, int64_t He,
                const RouterOutput &routes, std::span<const WeightView> up,
                std::span<const WeightView> down, float *out,
                Accum acc = Accum::F32);

} // namespace nf::cpu
