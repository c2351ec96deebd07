// What a request's own tokens and options do to a logits row before its
// sampler draws from it: vLLM's min_tokens, logit_bias and the repetition,
// frequency and presence penalties, applied in vLLM's order.
//
// Logprobs stay the model's (sampling/logprobs.h): the row before these.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

namespace nf::sampling {

struct Penalties {
  /// Subtracted once from every token the request generated (presence)
  /// and once per time it generated it (frequency); OpenAI's [-2, 2].
  float presence = 0.0f, frequency = 0.0f;
  /// Tokens of the prompt or the output: positive logits divided by it,
  /// negative ones multiplied (the Hugging Face / vLLM rule); 1: off.
  float repetition = 1.0f;
  /// Added to the tokens' logits (OpenAI's logit_bias).
  std::vector<std::pair<int32_t, float>> bias;
  /// Until this many tokens are generated, `stopTokens` (EOS and the stop
  /// tokens) cannot be drawn.
  int32_t minTokens = 0;
  std::vector<int32_t> stopTokens;

  bool active() const {
    return presence != 0.0f || frequency != 0.0f || repetition != 1.0f ||
           !bias.empty() || minTokens > 0;
  }
};

/// A request's penalties and the tokens they look at.
class PenaltyState {
public:
  PenaltyState() = default;
  PenaltyState(Penalties penalties, std::span<const int32_t> prompt);
  bool active() const { return penalties_.active(); }
  /// A generated token.
  void observe(int32_t token);
  /// Adjusts `row` (the vocabulary's logits) for the next draw: min_tokens,
  /// then logit_bias, then the repetition, frequency and presence
  /// penalties.
  void apply(std::span<float> row) const;

private:
  Penalties penalties_;
  std::vector<int32_t> prompt_;       // sorted, unique
  std::map<int32_t, int32_t> counts_; // generated token -> times
  int32_t generated_ = 0;
};

} // namespace nf::sampling
