// Token sampling from logits: greedy, temperature, top-k, top-p, min-p.
//
// The logits are divided by the temperature and turned into probabilities
// (softmax, in double); top-k, then top-p, then min-p keep a subset; the
// token is drawn from the kept probabilities, renormalised, walking them in
// index order, or most likely first once top-k or top-p has ranked them.
// Top-p's threshold is top_p times the candidates' total, summed in that
// same order. With top-k, only the tokens near the k largest logits get a
// probability computed (exactly those a full ranking would keep), and top-p
// ranks growing prefixes rather than the whole vocabulary. Temperature 0 is
// greedy: the argmax, the lowest index on ties, and no random draw. Every
// non-greedy sample consumes exactly one 64-bit draw of a std::mt19937_64, so
// equal seeds, parameters and logits give equal tokens on every platform.
// NaN logits count as -inf; -inf logits are never chosen.
#pragma once

#include "nf/status.h"

#include <cstdint>
#include <optional>
#include <random>
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
  void reseed(uint64_t seed) { rng_.seed(seed); }

  /// The next token. Errors: empty logits, no logit above -inf.
  StatusOr<int32_t> sample(std::span<const float> logits);

  /// Whether sampleTop can draw from a list of the k largest logits (it
  /// may still ask for the row): greedy, or top-k below k.
  bool samplesFromTop(int32_t k) const;
  /// The next token from the largest logits of a row of `vocab` (ids[i],
  /// values[i]: value descending, then id ascending; -1 ids past the row's
  /// tokens, NaN never listed): the token sample() would draw from the
  /// whole row, or nullopt when the list cannot decide (near-ties at its
  /// end: call sample() with the row, no draw has been consumed).
  StatusOr<std::optional<int32_t>> sampleTop(std::span<const int32_t> ids,
                                             std::span<const float> values,
                                             int64_t vocab);

  /// The probabilities the next non-greedy sample draws from (0 for
  /// filtered tokens; sums to 1), or a one-hot vector when greedy.
  StatusOr<std::vector<double>> distribution(std::span<const float> logits);

private:
  explicit Sampler(const SamplerParams &params)
      : params_(params), rng_(params.seed) {}

  struct Candidate {
    int32_t index;
    double prob; // unnormalised
  };
  /// The ranking order: more probable first, then the lower index.
  static bool moreLikely(const Candidate &a, const Candidate &b);
  /// Fills candidates_ with the kept tokens and returns the sum of their
  /// unnormalised probabilities (0: nothing to choose from).
  double filter(std::span<const float> logits);
  /// filter() from a top list; nullopt: the list cannot decide.
  std::optional<double> filterTop(std::span<const int32_t> ids,
                                  std::span<const float> values, int64_t vocab);
  /// The top-k (unless `ranked` did), top-p and min-p filters over
  /// candidates_; `sorted`: candidates_ is most likely first. The total.
  double finish(bool ranked, bool sorted);
  /// The token one draw picks from candidates_ (total: their sum).
  int32_t draw(double total);

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
  std::vector<float> heap_; // top-k: the k largest logits
};

} // namespace nf::sampling
