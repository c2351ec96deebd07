// Token sampling (runtime/src/sampling): greedy, temperature, top-k, top-p,
// min-p, their order, determinism with a seed, and the empirical distribution
// of many draws against the probabilities the filters define.
#include "sampler_reference.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

using namespace nf::sampling;
using namespace nf::sampling::testing;
using ::testing::HasSubstr;

namespace {

/// Logits whose softmax at temperature 1 is `probs`.
std::vector<float> logitsOf(const std::vector<double> &probs) {
  std::vector<float> l;
  for (double p : probs)
    l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -kInf);
  return l;
}

std::vector<double> softmax(const std::vector<float> &logits, double t) {
  double m = -INFINITY;
  for (float v : logits)
    m = std::max(m, static_cast<double>(v));
  std::vector<double> p;
  double sum = 0;
  for (float v : logits) {
    p.push_back(std::exp((v - m) / t));
    sum += p.back();
  }
  for (double &x : p)
    x /= sum;
  return p;
}

std::vector<double> distribution(Sampler &s, const std::vector<float> &l) {
  auto d = s.distribution(l);
  EXPECT_TRUE(d.ok()) << d.message();
  return d.ok() ? *d : std::vector<double>(l.size(), 0.0);
}

/// Frequencies of `n` draws.
std::vector<double> frequencies(Sampler &s, const std::vector<float> &l,
                                int n) {
  std::vector<double> f(l.size(), 0.0);
  for (int i = 0; i < n; ++i) {
    auto t = s.sample(l);
    EXPECT_TRUE(t.ok()) << t.message();
    if (!t.ok())
      break;
    f[*t] += 1.0 / n;
  }
  return f;
}

void expectNear(const std::vector<double> &got, const std::vector<double> &want,
                double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << "token " << i;
}

// --- greedy ----------------------------------------------------------------

TEST(Sampler, GreedyIsArgmax) {
  Sampler s = make(withTemperature(0));
  std::vector<float> l = {0.1f, 2.5f, -1.0f, 2.4f};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(*s.sample(l), 1);
}

TEST(Sampler, GreedyTiesGoToTheLowestIndex) {
  Sampler s = make(withTemperature(0));
  EXPECT_EQ(*s.sample(std::vector<float>{1.0f, 3.0f, 3.0f, 3.0f}), 1);
  EXPECT_EQ(*s.sample(std::vector<float>{5.0f, 5.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf, 0.0f, 0.0f}), 2);
}

TEST(Sampler, GreedyIgnoresNaNAndConsumesNoRandomness) {
  Sampler s = make(withTemperature(0, 7));
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(*s.sample(std::vector<float>{nan, 1.0f, nan, 0.5f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{nan, nan}), -1);
  EXPECT_THAT(s.sample(std::vector<float>{nan, nan}).message(),
              HasSubstr("no logit above -inf"));
  auto d = s.distribution(std::vector<float>{0.0f, 4.0f, 1.0f});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, (std::vector<double>{0, 1, 0}));
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplerParams p = withTemperature(1.5f, 3);
  p.topK = 1;
  Sampler s = make(p);
  std::vector<float> l = {0.0f, 0.3f, 0.29f, -2.0f};
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(*s.sample(l), 1);
}

// --- distribution and temperature ------------------------------------------

TEST(Sampler, TemperatureOneDrawsFromTheSoftmax) {
  std::vector<double> probs = {0.5, 0.25, 0.15, 0.07, 0.03};
  std::vector<float> l = logitsOf(probs);
  Sampler s = make(withTemperature(1.0f, 42));
  expectNear(distribution(s, l), probs, 1e-6);
  // 200k draws: standard error <= 0.0012 per token.
  expectNear(frequencies(s, l, 200000), probs, 0.006);
}

TEST(Sampler, TemperatureScalesTheLogits) {
  std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f};
  for (float t : {0.25f, 0.5f, 2.0f, 10.0f}) {
    Sampler s = make(withTemperature(t, 9));
    expectNear(distribution(s, l), softmax(l, t), 1e-9);
  }
  // Low temperatures sharpen, high ones flatten.
  Sampler cold = make(withTemperature(0.1f));
  Sampler hot = make(withTemperature(100.0f));
  EXPECT_GT(distribution(cold, l)[3], 0.99);
  for (double p : distribution(hot, l))
    EXPECT_NEAR(p, 0.25, 0.02);
  Sampler s = make(withTemperature(0.5f, 11));
  expectNear(frequencies(s, l, 100000), softmax(l, 0.5), 0.008);
}

TEST(Sampler, NeverDrawsMinusInfOrNaN) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> l = {-kInf, 0.0f, nan, 0.0f, -kInf};
  Sampler s = make(withTemperature(1.0f, 5));
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i)
    seen.insert(*s.sample(l));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
  EXPECT_THAT(s.sample(std::vector<float>{-kInf, -kInf}).message(),
              HasSubstr("no logit above -inf"));
  EXPECT_THAT(s.sample(std::vector<float>{}).message(), HasSubstr("empty"));
}

TEST(Sampler, InfiniteLogitsShareTheMass) {
  std::vector<float> l = {0.0f, kInf, 3.0f, kInf};
  Sampler s = make(withTemperature(1.0f, 5));
  expectNear(distribution(s, l), {0, 0.5, 0, 0.5}, 0);
}

TEST(Sampler, DistributionSumsToOne) {
  std::vector<float> l;
  for (int i = 0; i < 1000; ++i)
    l.push_back(std::sin(i * 0.37f) * 6.0f);
  SamplerParams p = withTemperature(0.8f);
  p.topK = 300;
  p.topP = 0.9f;
  p.minP = 0.01f;
  Sampler s = make(p);
  double sum = 0;
  for (double x : distribution(s, l))
    sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

// --- filters -----------------------------------------------------------------

TEST(Sampler, TopKKeepsTheKMostLikely) {
  std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  SamplerParams p = withTemperature(1.0f, 8);
  p.topK = 3;
  Sampler s = make(p);
  // Kept: 1 (0.4), 3 (0.3), 4 (0.15); renormalised over 0.85.
  std::vector<double> want = {0, 0.4 / 0.85, 0, 0.3 / 0.85, 0.15 / 0.85};
  expectNear(distribution(s, logitsOf(probs)), want, 1e-6);
  expectNear(frequencies(s, logitsOf(probs), 100000), want, 0.008);
}

TEST(Sampler, TopKTiesKeepLowerIndices) {
  SamplerParams p = withTemperature(1.0f);
  p.topK = 2;
  Sampler s = make(p);
  auto d = distribution(s, {1.0f, 2.0f, 2.0f, 2.0f});
  expectNear(d, {0, 0.5, 0.5, 0}, 1e-12);
}

TEST(Sampler, TopKLargerThanVocabKeepsEverything) {
  SamplerParams p = withTemperature(1.0f);
  p.topK = 100;
  Sampler s = make(p);
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  expectNear(distribution(s, l), softmax(l, 1.0), 1e-9);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  std::vector<float> l = logitsOf({0.05, 0.5, 0.15, 0.3});
  auto kept = [&](float topP) {
    SamplerParams p = withTemperature(1.0f);
    p.topP = topP;
    Sampler s = make(p);
    std::set<int> k;
    auto d = distribution(s, l);
    for (size_t i = 0; i < d.size(); ++i)
      if (d[i] > 0)
        k.insert(static_cast<int>(i));
    return k;
  };
  EXPECT_EQ(kept(0.3f), (std::set<int>{1}));
  EXPECT_EQ(kept(0.5f), (std::set<int>{1}));
  EXPECT_EQ(kept(0.79f), (std::set<int>{1, 3}));
  EXPECT_EQ(kept(0.81f), (std::set<int>{1, 3, 2}));
  EXPECT_EQ(kept(0.96f), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(kept(1.0f), (std::set<int>{0, 1, 2, 3}));

  SamplerParams p = withTemperature(1.0f, 21);
  p.topP = 0.7f;
  Sampler s = make(p);
  std::vector<double> want = {0, 0.5 / 0.8, 0, 0.3 / 0.8};
  expectNear(distribution(s, l), want, 1e-6);
  expectNear(frequencies(s, l, 100000), want, 0.008);
}

TEST(Sampler, MinPIsRelativeToTheLargestProbability) {
  std::vector<float> l = logitsOf({0.05, 0.5, 0.15, 0.3});
  SamplerParams p = withTemperature(1.0f, 4);
  p.minP = 0.35f; // threshold 0.175
  Sampler s = make(p);
  std::vector<double> want = {0, 0.5 / 0.8, 0, 0.3 / 0.8};
  expectNear(distribution(s, l), want, 1e-6);
  expectNear(frequencies(s, l, 100000), want, 0.008);

  p.minP = 0.29f; // threshold 0.145: keeps 0.15 too
  Sampler s2 = make(p);
  expectNear(distribution(s2, l), {0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95},
             1e-6);
  p.minP = 1.0f; // only the most likely token
  Sampler s3 = make(p);
  expectNear(distribution(s3, l), {0, 1, 0, 0}, 1e-12);
}

TEST(Sampler, FiltersApplyToTheTemperedDistribution) {
  // At temperature 2 the probabilities flatten: min-p keeps more tokens.
  std::vector<float> l = logitsOf({0.05, 0.5, 0.15, 0.3});
  SamplerParams p = withTemperature(2.0f);
  p.minP = 0.5f;
  Sampler s = make(p);
  auto want = softmax(l, 2.0); // sqrt of the probabilities, renormalised
  // Kept: p >= 0.5 * max: 0.5 -> sqrt .707, .3 -> .548, .15 -> .387 (>= .354)
  double kept = want[1] + want[2] + want[3];
  expectNear(distribution(s, l),
             {0, want[1] / kept, want[2] / kept, want[3] / kept}, 1e-6);
}

TEST(Sampler, FiltersApplyInOrderTopKTopPMinP) {
  std::vector<float> l = logitsOf({0.35, 0.25, 0.2, 0.12, 0.08});
  SamplerParams p = withTemperature(1.0f);
  p.topK = 3;    // {0, 1, 2}, renormalised over 0.8: .4375 .3125 .25
  p.topP = 0.7f; // .4375 + .3125 = .75 >= .7: {0, 1}
  p.minP = 0.5f; // .3125 >= .5 * .4375: {0, 1}
  Sampler s = make(p);
  expectNear(distribution(s, l), {0.35 / 0.6, 0.25 / 0.6, 0, 0, 0}, 1e-6);
  p.minP = 0.75f; // .3125 < .328: {0}
  Sampler s2 = make(p);
  expectNear(distribution(s2, l), {1, 0, 0, 0, 0}, 1e-12);
}

// --- determinism -------------------------------------------------------------

std::vector<int32_t> draws(SamplerParams p, const std::vector<float> &l,
                           int n) {
  Sampler s = make(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i)
    out.push_back(*s.sample(l));
  return out;
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> l;
  for (int i = 0; i < 64; ++i)
    l.push_back(std::cos(i * 1.3f) * 3.0f);
  SamplerParams p = withTemperature(0.9f, 1234);
  p.topK = 40;
  p.topP = 0.95f;
  p.minP = 0.02f;
  auto a = draws(p, l, 500);
  EXPECT_EQ(a, draws(p, l, 500));
  p.seed = 1235;
  EXPECT_NE(a, draws(p, l, 500));
}

TEST(Sampler, ReseedRestartsTheStream) {
  std::vector<float> l = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Sampler s = make(withTemperature(1.0f, 77));
  std::vector<int32_t> first, second;
  for (int i = 0; i < 100; ++i)
    first.push_back(*s.sample(l));
  s.reseed(77);
  for (int i = 0; i < 100; ++i)
    second.push_back(*s.sample(l));
  EXPECT_EQ(first, second);
}

TEST(Sampler, OneDrawPerSampleWhateverIsKept) {
  // A sample with a single candidate still consumes its draw, so streams
  // stay aligned: after one sample of anything, two samplers of one seed
  // continue identically.
  std::vector<float> l = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  SamplerParams p = withTemperature(1.0f, 99);
  Sampler a = make(p), b = make(p);
  (void)*a.sample(l);
  EXPECT_EQ(*b.sample(std::vector<float>{-kInf, 0.0f, -kInf}), 1);
  std::vector<int32_t> ra, rb;
  for (int i = 0; i < 50; ++i) {
    ra.push_back(*a.sample(l));
    rb.push_back(*b.sample(l));
  }
  EXPECT_EQ(ra, rb);
}

// --- large vocabularies: against a plain implementation of the definition --

TEST(Sampler, LargeVocabulariesDrawWhatTheDefinitionDraws) {
  const std::vector<float> l = vocabularyLogits(131072, 5);
  struct Case {
    float t;
    int32_t k;
    float p, minP;
  };
  const Case cases[] = {{0.0f, 0, 1.0f, 0.0f},     {1.0f, 0, 1.0f, 0.0f},
                        {0.7f, 0, 0.9f, 0.0f},     {0.7f, 40, 1.0f, 0.0f},
                        {1.3f, 1000, 0.95f, 0.0f}, {0.8f, 5, 1.0f, 0.1f},
                        {2.0f, 0, 0.5f, 0.05f},    {1e-3f, 64, 1.0f, 0.0f},
                        {50.0f, 3, 1.0f, 0.0f},    {0.9f, 131071, 0.99f, 0.0f}};
  for (const Case &c : cases) {
    SamplerParams p = withTemperature(c.t, 4242);
    p.topK = c.k;
    p.topP = c.p;
    p.minP = c.minP;
    Sampler s = make(p);
    uint64_t draw = 0;
    for (int i = 0; i < 8; ++i) {
      auto t = s.sample(l);
      ASSERT_TRUE(t.ok()) << t.message();
      EXPECT_EQ(*t, referenceSample(p, draw, l))
          << "temperature " << c.t << " top-k " << c.k << " top-p " << c.p
          << " min-p " << c.minP << " draw " << i;
    }
  }
}

TEST(Sampler, TopKKeepsTiesOfTheKthLogitByIndex) {
  // 300 tokens share the k-th largest logit: the lowest indices stay, and
  // with a temperature so large that distinct logits get equal
  // probabilities, ties of the probability decide by index too.
  std::vector<float> l(4096, 0.0f);
  for (int i = 0; i < 300; ++i)
    l[static_cast<size_t>(i) * 13] = 1.0f;
  l[7] = 2.0f;
  for (float t : {1.0f, 1e30f}) {
    SamplerParams p = withTemperature(t, 9);
    p.topK = 50;
    Sampler s = make(p);
    uint64_t draw = 0;
    for (int i = 0; i < 200; ++i)
      EXPECT_EQ(*s.sample(l), referenceSample(p, draw, l)) << "t " << t;
  }
}

// --- parameters --------------------------------------------------------------

TEST(Sampler, RejectsParametersOutOfRange) {
  auto bad = [](SamplerParams p) {
    auto s = Sampler::create(p);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.message();
  };
  SamplerParams p;
  p.temperature = -1.0f;
  EXPECT_THAT(bad(p), HasSubstr("temperature"));
  p = {};
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(bad(p), HasSubstr("temperature"));
  p = {};
  p.topK = -2;
  EXPECT_THAT(bad(p), HasSubstr("top-k"));
  p = {};
  p.topP = 0.0f;
  EXPECT_THAT(bad(p), HasSubstr("top-p"));
  p.topP = 1.5f;
  EXPECT_THAT(bad(p), HasSubstr("top-p"));
  p = {};
  p.minP = -0.1f;
  EXPECT_THAT(bad(p), HasSubstr("min-p"));
  p.minP = 1.1f;
  EXPECT_THAT(bad(p), HasSubstr("min-p"));
  EXPECT_TRUE(Sampler::create(SamplerParams{}).ok());
}

} // namespace
