// Logprobs of a logits row (runtime/src/sampling/logprobs.h) against
// log-softmax computed here in long double.
#include "sampling/logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using nf::sampling::LogprobList;

long double logSoftmax(const std::vector<float> &row, size_t i) {
  long double max = -INFINITY, sum = 0;
  for (float x : row)
    if (!std::isnan(x))
      max = std::max<long double>(max, x);
  for (float x : row)
    if (!std::isnan(x))
      sum += std::exp(static_cast<long double>(x) - max);
  return row[i] - max - std::log(sum);
}

TEST(Logprobs, TokenAndAlternativesUnderTheRow) {
  // Large logits: a naive exp would overflow.
  const std::vector<float> row = {1000.0f, 1002.5f, 999.0f, 1002.5f, -3.0f};
  LogprobList l;
  l.top = 3;
  l.add(row, 2);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l.tokens[0], 2);
  EXPECT_NEAR(l.logprobs[0], static_cast<double>(logSoftmax(row, 2)), 1e-6);
  // Most probable first, the lower id first among equals.
  ASSERT_EQ(l.topTokens, (std::vector<int32_t>{1, 3, 0}));
  for (size_t j = 0; j < 3; ++j)
    EXPECT_NEAR(l.topLogprobs[j],
                static_cast<double>(logSoftmax(row, l.topTokens[j])), 1e-6);
  // Probabilities sum to one.
  double total = 0;
  for (size_t i = 0; i < row.size(); ++i)
    total += std::exp(static_cast<double>(logSoftmax(row, i)));
  EXPECT_NEAR(total, 1.0, 1e-9);
}

TEST(Logprobs, NanAndInfinityAndShortVocabularies) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {std::nanf(""), 0.0f, -inf};
  LogprobList l;
  l.top = 5; // more than the vocabulary
  l.add(row, 0);
  EXPECT_EQ(l.logprobs[0], -inf); // NaN counts as -inf
  ASSERT_EQ(l.topTokens.size(), 5u);
  EXPECT_EQ(l.topTokens[0], 1);
  EXPECT_FLOAT_EQ(l.topLogprobs[0], 0.0f);
  EXPECT_EQ(l.topTokens[3], -1);
  EXPECT_EQ(l.topLogprobs[4], -inf);
  // A row without a finite logit: -inf everywhere, no NaN.
  LogprobList none;
  none.top = 5;
  none.add(std::vector<float>{-inf, std::nanf("")}, 1);
  EXPECT_EQ(none.logprobs[0], -inf);
  // Appending keeps positions in order.
  l.append(none);
  EXPECT_EQ(l.tokens, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(l.topTokens.size(), 10u);
}

} // namespace
