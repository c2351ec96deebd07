// Token sampling from logits: greedy, temperature, top-k, top-p, min-p.
//
// The logits are divided by the temperature and turned into probabilities
// (softmax, in double); top-k, then top-p, then min-p keep a subset; the
// token is drawn from the kept probabilities, renormalised, by the
// Gumbel-max rule: the kept token with the largest x / T + G, where x is its
// logit, T the temperature and G standard Gumbel noise of (seed, draw,
// token) from a counter-based generator (philox.h; draw counts the
// sampler's non-greedy samples), the lowest index on ties. Tokens whose
// logit is +inf share the mass: their key is G alone. Because the noise of
// a token needs no other token's, a device can rank x / T + G for a
// temperature-only sampler and return the best few (sampleTop's noisy
// lists). Top-p ranks the tokens most likely first; its threshold is top_p
// times the candidates' total (summed in index order, or most likely first
// after top-k), so a device's list of the largest logits with the row's
// total decides it where the nucleus ends inside the list. With top-k, only
// the tokens near the k largest logits get a probability computed (exactly
// those a full ranking would keep), and top-p ranks growing prefixes rather
// than the whole vocabulary. Temperature 0 is greedy: the argmax, the lowest
// index on ties, and no draw. Equal seeds, parameters and logits give equal
// tokens on every platform. NaN logits count as -inf; -inf logits are never
// chosen.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace nf::sampling {

struct SamplerParams {
  float temperature = 0.0f; // 0: greedy
  int32_t topK = 0;         // 0: off
  float topP = 1.0f;        // 1: off
  float minP = 0.0f;        // 0: off
  uint64_t seed = 0;
};

/// Errors for parameters out of range (temperature < 0 or not finite,
/// top-k < 0, top-p outside (0, 1], min-p outside [0, 1]).
Status validate(const SamplerParams &params);

/// The index of the largest logit, the lowest one on ties (NaN ignored);
/// -1 when there is none (empty, or every logit NaN).
int32_t argmax(std::span<const float> logits);

class Sampler {
public:
  static StatusOr<Sampler> create(const SamplerParams &params);

  const SamplerParams &params() const { return params_; }
  /// Restarts the random stream.
  void reseed(uint64_t seed) {
    params_.seed = seed;
    draws_ = 0;
  }
  /// Non-greedy samples drawn since the last (re)seed.
  uint64_t draws() const { return draws_; }

  /// The next token. Errors: empty logits, no logit above -inf.
  StatusOr<int32_t> sample(std::span<const float> logits);

  /// The next draw's noise, for a device that ranks a row by x / T + G
  /// (a noisy top list): the temperature-only samplers (no top-k, top-p or
  /// min-p); nullopt for the others, which rank by the logit.
  struct NoiseDraw {
    float temperature;
    uint64_t seed, draw;
  };
  std::optional<NoiseDraw> noiseDraw() const;

  /// Whether the next draw's top-p needs the row's total (top-p without
  /// top-k): sum over every token of exp((x - max) / T), which a device
  /// can compute beside its list (sampleTop's `total`).
  bool needsRowTotal() const;

  /// Whether sampleTop can draw from a list of the k largest logits (it
  /// may still ask for the row): greedy, top-k below k, or min-p alone;
  /// where the lists can be noisy, every sampler with a noiseDraw; where
  /// they come with the row's total, top-p.
  bool samplesFromTop(int32_t k, bool noisyLists = false,
                      bool rowTotals = false) const;
  /// The next token from the top of a row of `vocab` (ids[i], values[i]:
  /// the logits, ranked by value descending, then id ascending, or, when
  /// `noisy`, by this sampler's x / T + G for its noiseDraw (rounded to
  /// float); -1 ids past the row's tokens, NaN never listed): the token
  /// sample() would draw from the whole row, or nullopt when the list
  /// cannot decide (near-ties at its end: call sample() with the row, no
  /// draw has been consumed). `total`: the row's total (needsRowTotal),
  /// as a device sums it (any order; within 2^-30 relative of the host's
  /// sum), NaN when there is none.
  StatusOr<std::optional<int32_t>>
  sampleTop(std::span<const int32_t> ids, std::span<const float> values,
            int64_t vocab, bool noisy = false,
            double total = std::numeric_limits<double>::quiet_NaN());

  /// The probabilities the next non-greedy sample draws from (0 for
  /// filtered tokens; sums to 1), or a one-hot vector when greedy.
  StatusOr<std::vector<double>> distribution(std::span<const float> logits);

private:
  explicit Sampler(const SamplerParams &params) : params_(params) {}

  struct Candidate {
    int32_t index;
    double prob; // unnormalised
    float logit;
  };
  /// The ranking order: more probable first, then the lower index.
  static bool moreLikely(const Candidate &a, const Candidate &b);
  /// Fills candidates_ with the kept tokens and returns the sum of their
  /// unnormalised probabilities (0: nothing to choose from).
  double filter(std::span<const float> logits);
  /// filter() from a top list; nullopt: the list cannot decide.
  std::optional<double> filterTop(std::span<const int32_t> ids,
                                  std::span<const float> values, int64_t vocab,
                                  double rowTotal);
  /// The top-k (unless `ranked` did), top-p and min-p filters over
  /// candidates_; `sorted`: candidates_ is most likely first. The total.
  double finish(bool ranked, bool sorted);
  /// The key a draw ranks: x / T + G (G alone for x = +inf).
  double noisyKey(float logit, int32_t index) const;
  /// The token one draw picks from candidates_.
  int32_t draw();
  /// sample() of a temperature-only sampler: every finite logit's key.
  int32_t drawFromRow(std::span<const float> logits);
  /// sampleTop() from a noisy list; nullopt: the list cannot decide.
  StatusOr<std::optional<int32_t>>
  drawFromNoisyTop(std::span<const int32_t> ids, std::span<const float> values);

  SamplerParams params_;
  uint64_t draws_ = 0;
  std::vector<Candidate> candidates_;
  std::vector<float> heap_; // top-k: the k largest logits
};

} // namespace nf::sampling
