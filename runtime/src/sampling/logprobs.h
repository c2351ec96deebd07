// Log-probabilities of tokens under a logits row: what the serving engine
// returns for `logprobs` and `prompt_logprobs` (OpenAI's logprobs, echo and
// top_logprobs).
//
// They are the model's: log-softmax of the row the sampler draws from,
// before temperature and the top-k / top-p / min-p filters, as vLLM's
// default `raw_logprobs` mode returns them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace nf::sampling {

/// Positions' log-probabilities, appended position after position: each
/// position's token and its logprob, and `top` most probable tokens of its
/// row with theirs (most probable first, lower ids first among equals).
struct LogprobList {
  int32_t top = 0; // alternatives per position
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> topTokens; // [position][top]
  std::vector<float> topLogprobs; // [position][top]

  size_t size() const { return tokens.size(); }
  bool empty() const { return tokens.empty(); }
  void clear();
  /// Appends `other`'s positions (its `top` must equal this one's).
  void append(const LogprobList &other);
  /// Appends the position of `token` under `row` (NaN counts as -inf; a row
  /// without a finite logit gives -inf for every token).
  void add(std::span<const float> row, int32_t token);
};

} // namespace nf::sampling
