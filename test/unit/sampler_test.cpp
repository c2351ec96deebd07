// Token sampling (runtime/src/sampling): greedy, temperature, top-k, top-p,
// min-p, their order, determinism with a seed, and the empirical distribution
// of many draws against the probabilities the filters define.
#include "sampling/sampler.h"

#include "sampling/philox.h"

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
using ::testing::HasSubstr;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Sampler make(SamplerParams p) {
  auto s = Sampler::create(p);
  EXPECT_TRUE(s.ok()) << s.message();
  return std::move(*s);
}

SamplerParams withTemperature(float t, uint64_t seed = 1) {
  SamplerParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

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

/// The definition (sampler.h) computed the plain way: every token's
/// probability in index order, a full ranking wherever top-k or top-p
/// ranks, top-p's total summed in the candidates' order, then the kept
/// token with the largest logit / T plus Gumbel noise of (seed, draw,
/// token).
int32_t referenceSample(const SamplerParams &p, uint64_t &draw,
                        const std::vector<float> &l) {
  if (p.temperature == 0.0f) {
    int32_t best = -1;
    for (size_t i = 0; i < l.size(); ++i)
      if (!std::isnan(l[i]) && (best < 0 || l[i] > l[best]))
        best = static_cast<int32_t>(i);
    return best;
  }
  struct C {
    int32_t i;
    double p;
  };
  float m = -kInf;
  for (float v : l)
    if (v > m)
      m = v;
  std::vector<C> c;
  for (size_t i = 0; i < l.size(); ++i)
    if (l[i] > -kInf) {
      const double q = std::exp((static_cast<double>(l[i]) - m) *
                                (1.0 / static_cast<double>(p.temperature)));
      if (q > 0.0)
        c.push_back({static_cast<int32_t>(i), q});
    }
  auto more = [](const C &a, const C &b) {
    return a.p > b.p || (a.p == b.p && a.i < b.i);
  };
  if (p.topK > 0 && static_cast<size_t>(p.topK) < c.size()) {
    std::stable_sort(c.begin(), c.end(), more);
    c.resize(p.topK);
  }
  if (p.topP < 1.0f) {
    double total = 0.0;
    for (const C &x : c)
      total += x.p; // in the candidates' order
    std::stable_sort(c.begin(), c.end(), more);
    const double threshold = static_cast<double>(p.topP) * total;
    double cum = 0.0;
    size_t keep = 0;
    while (keep < c.size() && !(keep > 0 && cum >= threshold))
      cum += c[keep++].p;
    c.resize(keep);
  }
  if (p.minP > 0.0f) {
    double mp = 0.0;
    for (const C &x : c)
      mp = std::max(mp, x.p);
    std::erase_if(
        c, [&](const C &x) { return x.p < static_cast<double>(p.minP) * mp; });
  }
  int32_t best = -1;
  double bestKey = 0.0;
  for (const C &x : c) {
    const double u = uniformOpen(
        randomBits(p.seed, draw, static_cast<uint32_t>(x.i)));
    const double key =
        (l[x.i] == kInf ? 0.0 : l[x.i] / static_cast<double>(p.temperature)) -
        std::log(-std::log(u));
    if (best < 0 || key > bestKey || (key == bestKey && x.i < best)) {
      best = x.i;
      bestKey = key;
    }
  }
  ++draw;
  return best;
}

/// Logits like a language model's: a normal body, a few far above it,
/// exact ties, and neighbours one float step apart (near-ties of the
/// probabilities).
std::vector<float> vocabularyLogits(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> body(0.0f, 2.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (float &v : l)
    v = body(g);
  std::uniform_int_distribution<int> at(0, n - 1);
  for (int i = 0; i < 24; ++i)
    l[at(g)] = 9.0f + 0.25f * static_cast<float>(i % 6);
  for (int i = 0; i < 24; ++i) {
    const int a = at(g);
    l[at(g)] = std::nextafter(l[a], kInf);
  }
  l[at(g)] = std::numeric_limits<float>::quiet_NaN();
  l[at(g)] = -kInf;
  return l;
}

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

// --- top lists (a device ranks the row, the sampler reads its top) ----------

/// The first k of the row ranked by value descending, then id ascending, NaN
/// left out, -1 ids past the row's tokens: what the CUDA backend's
/// top-logits launches return.
std::pair<std::vector<int32_t>, std::vector<float>>
topList(const std::vector<float> &l, size_t k) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i]))
      order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  });
  std::vector<int32_t> ids(k, -1);
  std::vector<float> values(k, 0.0f);
  for (size_t i = 0; i < k && i < order.size(); ++i) {
    ids[i] = order[i];
    values[i] = l[order[i]];
  }
  return {ids, values};
}

/// The row's total as a device may sum it: sum of exp((x - max) / T) over
/// the tokens above -inf, in reverse order, off by `skew` (relative).
double deviceTotal(const std::vector<float> &l, float temperature,
                   double skew) {
  float m = -kInf;
  for (float v : l)
    if (v > m)
      m = v;
  double s = 0.0;
  for (size_t i = l.size(); i-- > 0;)
    if (l[i] > -kInf)
      s += std::exp((static_cast<double>(l[i]) - m) /
                    static_cast<double>(temperature));
  return s * (1.0 + skew);
}

/// Draws `n` tokens through `fromList(fromTop)` (sampleTop on a list; the
/// row where the list cannot decide) and through fromRow's sample; both
/// streams must agree. Returns how many draws needed the row.
template <class FromList>
int expectDrawsMatchRows(const SamplerParams &p, Sampler &fromTop,
                         Sampler &fromRow, const std::vector<float> &l, int n,
                         FromList fromList) {
  int rows = 0;
  for (int i = 0; i < n; ++i) {
    auto t = fromList(fromTop);
    auto want = fromRow.sample(l);
    EXPECT_EQ(t.ok(), want.ok()) << t.message() << want.message();
    if (!t.ok() || !want.ok())
      continue;
    int32_t got = -1;
    if (*t) {
      got = **t;
    } else {
      ++rows;
      got = *fromTop.sample(l);
    }
    EXPECT_EQ(got, *want) << "temperature " << p.temperature << " top-k "
                          << p.topK << " draw " << i;
  }
  return rows;
}

/// expectDrawsMatchRows from the row's top list. `skew`: the list comes with
/// the row's total (top-p), off by that much.
int expectTopDrawsMatchRows(SamplerParams p, const std::vector<float> &l,
                            size_t k, int n,
                            std::optional<double> skew = std::nullopt) {
  Sampler fromTop = make(p), fromRow = make(p);
  EXPECT_TRUE(fromTop.samplesFromTop(static_cast<int32_t>(k), false,
                                     skew.has_value()));
  const auto [ids, values] = topList(l, k);
  const double total =
      skew ? deviceTotal(l, p.temperature, *skew)
           : std::numeric_limits<double>::quiet_NaN();
  return expectDrawsMatchRows(p, fromTop, fromRow, l, n, [&](Sampler &s) {
    return s.sampleTop(ids, values, static_cast<int64_t>(l.size()), false,
                       total);
  });
}

TEST(Sampler, TopListsDrawWhatTheRowDraws) {
  const std::vector<float> l = vocabularyLogits(131072, 11);
  for (SamplerParams p : {withTemperature(0.0f, 1), withTemperature(0.8f, 2),
                          withTemperature(1.5f, 3), withTemperature(1e-3f, 4),
                          withTemperature(30.0f, 5)})
    for (int32_t k : {1, 5, 40, 63}) {
      p.topK = k;
      for (float topP : {1.0f, 0.9f})
        for (float minP : {0.0f, 0.05f}) {
          p.topP = topP;
          p.minP = minP;
          EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 4), 0)
              << "a typical row needed its full logits";
        }
    }
}

TEST(Sampler, TopPAndMinPDrawFromListsWithTheRowTotal) {
  // A language model's row: a few tokens far above a normal body (lower
  // and narrower than vocabularyLogits'), so that the nucleus lies within
  // the list.
  std::vector<float> l = vocabularyLogits(131072, 13);
  for (float &v : l)
    if (v < 8.5f)
      v = v * 0.75f - 5.0f;
  int rows = 0;
  for (float t : {0.6f, 0.8f, 1.0f})
    for (float topP : {0.5f, 0.9f, 0.95f})
      for (double skew : {0.0, 1e-12, -1e-12}) {
        SamplerParams p = withTemperature(t, 7);
        p.topP = topP;
        rows += expectTopDrawsMatchRows(p, l, 64, 4, skew);
        p.minP = 0.05f;
        rows += expectTopDrawsMatchRows(p, l, 64, 4, skew);
      }
  EXPECT_LE(rows, 8) << "typical rows needed their full logits";
  // Min-p alone needs no total: the list reaches below its cut.
  SamplerParams p = withTemperature(0.7f, 8);
  p.minP = 0.1f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 10), 0);
  // A flat row: the nucleus is most of the vocabulary, beyond any list.
  std::vector<float> flat(4096);
  for (size_t i = 0; i < flat.size(); ++i)
    flat[i] = std::sin(static_cast<float>(i)) * 0.1f;
  p = withTemperature(1.0f, 9);
  p.topP = 0.9f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, flat, 64, 5, 0.0), 5);
  // Top-p with min-p: the nucleus reaches far past the list, but min-p's
  // cut lies inside it: the listed tokens above the cut.
  std::vector<float> body(100000, 0.0f);
  for (size_t i = 0; i < 10; ++i)
    body[i * 977] = 5.0f;
  p = withTemperature(1.0f, 10);
  p.topP = 0.95f;
  p.minP = 0.1f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, body, 64, 10, 0.0), 0);
  p.minP = 0.001f; // the cut below the list: the row
  EXPECT_EQ(expectTopDrawsMatchRows(p, body, 64, 3, 0.0), 3);
  p.minP = 0.0f;
  p.topP = 0.9f;
  // Without a total (a device that does not sum), top-p reads the row.
  EXPECT_FALSE(make(p).samplesFromTop(64));
  EXPECT_TRUE(make(p).needsRowTotal());
}

TEST(Sampler, TopPListsAtTheThresholdAskForTheRow) {
  // Four equally likely tokens far above the rest: top-p 0.5 of them is
  // two tokens exactly at the threshold, where the total's rounding
  // decides.
  std::vector<float> l(1000, -40.0f);
  for (int i : {3, 9, 27, 81})
    l[static_cast<size_t>(i)] = 5.0f;
  SamplerParams p = withTemperature(1.0f, 3);
  p.topP = 0.5f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 5, 0.0), 5);
  // Three of them: the end splits equal logits, ranked by id in the list
  // as in the definition.
  p.topP = 0.6f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 5, 0.0), 0);
  // 100 equal logits: the nucleus ends inside a group the list cannot
  // hold whole.
  for (size_t i = 100; i < 200; ++i)
    l[i] = 5.0f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 5, 0.0), 5);
}

TEST(Sampler, TopListsThatCannotDecideAskForTheRow) {
  // Ties at the k-th largest logit rank by id. 40 ties fit in a list of 64,
  // which then shows the first value below them: it decides.
  auto row = [](int ties) {
    std::vector<float> l(4096, -5.0f);
    for (int i = 0; i < ties; ++i)
      l[static_cast<size_t>(i) * 7 + 3] = 1.0f;
    return l;
  };
  SamplerParams p = withTemperature(1.0f, 8);
  p.topK = 10;
  EXPECT_EQ(expectTopDrawsMatchRows(p, row(40), 64, 20), 0);
  // 100 ties fill the list: whatever lies beyond it could tie too (a
  // probability that rounds to the k-th's), so every draw needs the row.
  EXPECT_EQ(expectTopDrawsMatchRows(p, row(100), 64, 20), 20);
  // A temperature so large that every probability rounds to 1.
  p.temperature = 1e30f;
  EXPECT_EQ(expectTopDrawsMatchRows(p, row(40), 64, 20), 20);
}

TEST(Sampler, TopListsOfShortRowsAreComplete) {
  // Fewer non-NaN tokens than the list holds: the list is the whole row, so
  // even a sampler that needs every token's probability is exact.
  std::vector<float> l(40, std::numeric_limits<float>::quiet_NaN());
  for (int i = 0; i < 40; i += 2)
    l[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 4.0f;
  l[6] = -kInf;
  SamplerParams p = withTemperature(0.7f, 3);
  p.topK = 30; // more than the 19 finite tokens: no truncation, index order
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 50), 0);
  p.topK = 7;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 50), 0);
  p.topK = 19; // every finite token: kept unranked, drawn in id order
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 50), 0);
}

TEST(Sampler, TopListsRankSignedZerosAsEqual) {
  // -0 and +0 are one value: the lowest index first, as argmax takes it
  // (the device's keys map -0 to +0).
  std::vector<float> l(300, -1.0f);
  l[40] = -0.0f;
  l[7] = 0.0f;
  l[3] = -0.0f;
  EXPECT_EQ(topList(l, 64).first[0], 3);
  EXPECT_EQ(expectTopDrawsMatchRows(withTemperature(0.0f), l, 64, 1), 0);
  SamplerParams p = withTemperature(0.5f, 4);
  p.topK = 2;
  EXPECT_EQ(expectTopDrawsMatchRows(p, l, 64, 30), 0);
}

TEST(Sampler, TopListsWithoutAFiniteLogitFail) {
  std::vector<float> l(100, std::numeric_limits<float>::quiet_NaN());
  Sampler s = make(withTemperature(0.0f));
  const auto [ids, values] = topList(l, 64);
  EXPECT_FALSE(s.sampleTop(ids, values, 100).ok());
  std::vector<float> m(100, -kInf);
  const auto [ids2, values2] = topList(m, 64);
  EXPECT_FALSE(s.sampleTop(ids2, values2, 100).ok());
}

// --- noisy top lists (a device ranks logit / T + Gumbel noise) --------------

TEST(Sampler, PhiloxMatchesRandom123KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

/// The list a device returns for a temperature-only sampler's next draw:
/// the row ranked by float(logit / T + G), then id, a finite logit's key
/// clamped to the float range; values are the logits. `skew` perturbs the
/// noise as a device's logarithm may (relative).
std::pair<std::vector<int32_t>, std::vector<float>>
noisyTopList(const std::vector<float> &l, const Sampler &s, size_t k,
             double skew = 0.0) {
  const auto n = s.noiseDraw();
  EXPECT_TRUE(n.has_value());
  std::vector<float> keys(l.size());
  for (size_t i = 0; i < l.size(); ++i) {
    const double g = -std::log(-std::log(uniformOpen(
        randomBits(n->seed, n->draw, static_cast<uint32_t>(i)))));
    const double key =
        static_cast<double>(l[i]) / static_cast<double>(n->temperature) +
        g * (1.0 + skew);
    const double fmax = std::numeric_limits<float>::max();
    keys[i] = std::isinf(l[i]) || std::isnan(l[i])
                  ? l[i]
                  : static_cast<float>(std::clamp(key, -fmax, fmax));
  }
  auto [ids, ranked] = topList(keys, k);
  std::vector<float> values(k, 0.0f);
  for (size_t i = 0; i < k; ++i)
    values[i] = ids[i] >= 0 ? l[static_cast<size_t>(ids[i])] : 0.0f;
  return {ids, values};
}

/// expectDrawsMatchRows from noisy lists (one per draw); the draw counters
/// end equal.
int expectNoisyDrawsMatchRows(SamplerParams p, const std::vector<float> &l,
                              size_t k, int n, double skew = 0.0) {
  Sampler fromTop = make(p), fromRow = make(p);
  EXPECT_TRUE(fromTop.samplesFromTop(static_cast<int32_t>(k), true));
  const int rows =
      expectDrawsMatchRows(p, fromTop, fromRow, l, n, [&](Sampler &s) {
        const auto [ids, values] = noisyTopList(l, s, k, skew);
        return s.sampleTop(ids, values, static_cast<int64_t>(l.size()),
                           /*noisy=*/true);
      });
  EXPECT_EQ(fromTop.draws(), fromRow.draws());
  return rows;
}

TEST(Sampler, NoisyTopListsDrawWhatTheRowDraws) {
  const std::vector<float> l = vocabularyLogits(131072, 17);
  for (float t : {1.0f, 0.7f, 1e-3f, 30.0f, 1e4f})
    EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(t, 5), l, 64, 6), 0)
        << "temperature " << t;
  // A device whose noise is off in the 15th digit draws the same tokens.
  EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(1.0f, 6), l, 64, 6,
                                      1e-15),
            0);
}

TEST(Sampler, NoisyTopListsThatCannotDecideAskForTheRow) {
  // Every token has the same logit at a temperature that makes the noise
  // vanish in float: the device's keys tie, so the list cannot tell.
  std::vector<float> flat(4096, 1e30f);
  EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(1e-9f, 2), flat, 64, 5),
            5);
  // +inf logits share the mass by their noise alone: the row decides.
  std::vector<float> l(1000, 0.0f);
  l[10] = kInf;
  l[500] = kInf;
  EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(1.0f, 3), l, 64, 5), 5);
}

TEST(Sampler, NoisyTopListsOfKeysBeyondTheFloatRange) {
  // A finite logit whose key overflows float ranks as +-FLT_MAX, below a
  // +inf logit and above a -inf one.
  EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(0.5f, 4),
                                      {3e38f, kInf, 1.0f}, 64, 5),
            5);
  // Masked tokens first, then finite ones whose keys overflow to -inf.
  std::vector<float> l(100, -kInf);
  for (size_t i = 64; i < 100; ++i)
    l[i] = -3e38f + static_cast<float>(i) * 1e31f;
  expectNoisyDrawsMatchRows(withTemperature(0.5f, 5), l, 64, 5);
  std::vector<float> m(100, -kInf);
  for (size_t i = 64; i < 100; ++i)
    m[i] = -104.0f - static_cast<float>(i % 7);
  expectNoisyDrawsMatchRows(withTemperature(1e-37f, 6), m, 64, 5);
}

TEST(Sampler, NoisyTopListsOfShortRowsAreComplete) {
  std::vector<float> l(40, std::numeric_limits<float>::quiet_NaN());
  for (int i = 0; i < 40; i += 2)
    l[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 4.0f;
  l[6] = -kInf;
  EXPECT_EQ(expectNoisyDrawsMatchRows(withTemperature(0.7f, 3), l, 64, 50), 0);
  // Only -inf and NaN: no token, from the list as from the row.
  std::vector<float> none(100, -kInf);
  none[3] = std::numeric_limits<float>::quiet_NaN();
  Sampler s = make(withTemperature(1.0f));
  const auto [ids, values] = noisyTopList(none, s, 64);
  EXPECT_FALSE(s.sampleTop(ids, values, 100, true).ok());
  EXPECT_EQ(s.draws(), 0u);
}

TEST(Sampler, OnlyTemperatureOnlySamplersDrawFromNoise) {
  EXPECT_FALSE(make(withTemperature(0.0f)).noiseDraw());
  SamplerParams p = withTemperature(0.8f, 12);
  Sampler s = make(p);
  ASSERT_TRUE(s.noiseDraw());
  EXPECT_EQ(s.noiseDraw()->seed, 12u);
  EXPECT_EQ(s.noiseDraw()->draw, 0u);
  EXPECT_FALSE(s.samplesFromTop(64));
  EXPECT_TRUE(s.samplesFromTop(64, true));
  (void)*s.sample(std::vector<float>{0.0f, 1.0f});
  EXPECT_EQ(s.noiseDraw()->draw, 1u);
  for (auto set : {+[](SamplerParams &q) { q.topK = 100; },
                   +[](SamplerParams &q) { q.topP = 0.9f; },
                   +[](SamplerParams &q) { q.minP = 0.1f; }}) {
    SamplerParams q = p;
    set(q);
    EXPECT_FALSE(make(q).noiseDraw());
    // By the logit: min-p alone from any list, top-p with the row's total.
    EXPECT_EQ(make(q).samplesFromTop(64, true), q.minP > 0.0f);
  }
}

TEST(Sampler, OnlyGreedyAndSmallTopKSampleFromTopLists) {
  EXPECT_TRUE(make(withTemperature(0.0f)).samplesFromTop(64));
  SamplerParams p = withTemperature(0.8f);
  EXPECT_FALSE(make(p).samplesFromTop(64)); // every token's probability
  EXPECT_FALSE(make(p).samplesFromTop(64, false, true));
  p.topK = 63;
  EXPECT_TRUE(make(p).samplesFromTop(64));
  p.topK = 64; // the list must show what lies below the k-th
  EXPECT_FALSE(make(p).samplesFromTop(64));
  EXPECT_FALSE(make(withTemperature(0.0f)).samplesFromTop(0));
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
