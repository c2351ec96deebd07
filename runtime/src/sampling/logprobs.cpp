#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace nf::sampling {

void LogprobList::clear() {
  tokens.clear();
  logprobs.clear();
  topTokens.clear();
  topLogprobs.clear();
}

void LogprobList::append(const LogprobList &other) {
  tokens.insert(tokens.end(), other.tokens.begin(), other.tokens.end());
  logprobs.insert(logprobs.end(), other.logprobs.begin(), other.logprobs.end());
  topTokens.insert(topTokens.end(), other.topTokens.begin(),
                   other.topTokens.end());
  topLogprobs.insert(topLogprobs.end(), other.topLogprobs.begin(),
                     other.topLogprobs.end());
}

void LogprobList::add(std::span<const float> row, int32_t token) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto value = [&](size_t i) { return std::isnan(row[i]) ? kNegInf : row[i]; };
  // log-sum-exp in double, around the largest logit.
  float max = kNegInf;
  for (size_t i = 0; i < row.size(); ++i)
    max = std::max(max, value(i));
  double sum = 0.0;
  if (std::isfinite(max))
    for (size_t i = 0; i < row.size(); ++i)
      sum += std::exp(static_cast<double>(value(i)) - max);
  const double lse = std::isfinite(max) ? max + std::log(sum) : 0.0;
  auto logprob = [&](size_t i) -> float {
    const float x = value(i);
    if (!std::isfinite(max) || x == kNegInf)
      return kNegInf;
    return static_cast<float>(static_cast<double>(x) - lse);
  };
  tokens.push_back(token);
  logprobs.push_back(token >= 0 && static_cast<size_t>(token) < row.size()
                         ? logprob(static_cast<size_t>(token))
                         : kNegInf);
  if (top <= 0)
    return;
  const size_t k = std::min(static_cast<size_t>(top), row.size());
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k),
                    ids.end(), [&](int32_t a, int32_t b) {
                      const float va = value(static_cast<size_t>(a));
                      const float vb = value(static_cast<size_t>(b));
                      return va > vb || (va == vb && a < b);
                    });
  for (size_t j = 0; j < static_cast<size_t>(top); ++j) {
    // A vocabulary smaller than `top` repeats nothing: -1 and -inf.
    const int32_t id = j < k ? ids[j] : -1;
    topTokens.push_back(id);
    topLogprobs.push_back(id >= 0 ? logprob(static_cast<size_t>(id)) : kNegInf);
  }
}

} // namespace nf::sampling
