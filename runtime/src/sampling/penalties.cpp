#include "sampling/penalties.h"

#include <algorithm>
#include <limits>

namespace nf::sampling {

PenaltyState::PenaltyState(Penalties penalties, std::span<const int32_t> prompt)
    : penalties_(std::move(penalties)), prompt_(prompt.begin(), prompt.end()) {
  std::sort(prompt_.begin(), prompt_.end());
  prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
}

void PenaltyState::observe(int32_t token) {
  ++generated_;
  if (penalties_.presence != 0.0f || penalties_.frequency != 0.0f ||
      penalties_.repetition != 1.0f)
    ++counts_[token];
}

void PenaltyState::apply(std::span<float> row) const {
  const auto in = [&](int32_t t) {
    return t >= 0 && static_cast<size_t>(t) < row.size();
  };
  if (generated_ < penalties_.minTokens)
    for (int32_t t : penalties_.stopTokens)
      if (in(t))
        row[t] = -std::numeric_limits<float>::infinity();
  for (const auto &[t, b] : penalties_.bias)
    if (in(t))
      row[t] += b;
  const float rep = penalties_.repetition;
  auto repeat = [&](int32_t t) {
    if (in(t))
      row[t] = row[t] > 0.0f ? row[t] / rep : row[t] * rep;
  };
  if (rep != 1.0f) {
    // Each token of the prompt or the output once.
    for (int32_t t : prompt_)
      repeat(t);
    for (const auto &[t, n] : counts_)
      if (!std::binary_search(prompt_.begin(), prompt_.end(), t))
        repeat(t);
  }
  for (const auto &[t, n] : counts_)
    if (in(t)) { // as vLLM: frequency, then presence
      row[t] -= penalties_.frequency * static_cast<float>(n);
      row[t] -= penalties_.presence;
    }
}

} // namespace nf::sampling
