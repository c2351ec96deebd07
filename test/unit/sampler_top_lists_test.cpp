// Sampling from a device's top lists (runtime/src/sampling): the ranked
// top of a row, or of its logits / T plus Gumbel noise, draws what the row
// draws, and asks for the row where the list cannot decide.
#include "sampler_reference.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <utility>

using namespace nf::sampling;
using namespace nf::sampling::testing;

namespace {

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
  EXPECT_TRUE(
      fromTop.samplesFromTop(static_cast<int32_t>(k), false, skew.has_value()));
  const auto [ids, values] = topList(l, k);
  const double total = skew ? deviceTotal(l, p.temperature, *skew)
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
    const double g = -std::log(-std::log(
        uniformOpen(randomBits(n->seed, n->draw, static_cast<uint32_t>(i)))));
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
  EXPECT_EQ(
      expectNoisyDrawsMatchRows(withTemperature(1.0f, 6), l, 64, 6, 1e-15), 0);
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

} // namespace
