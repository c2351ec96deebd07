// What the sampler tests share (sampler_test.cpp, sampler_top_lists_test.cpp):
// samplers from parameters, and the sampling definition of sampler.h
// computed the plain way, over logits like a language model's.
#pragma once

#include "sampling/philox.h"
#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace nf::sampling::testing {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline Sampler make(SamplerParams p) {
  auto s = Sampler::create(p);
  EXPECT_TRUE(s.ok()) << s.message();
  return std::move(*s);
}

inline SamplerParams withTemperature(float t, uint64_t seed = 1) {
  SamplerParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

/// The definition (sampler.h) computed the plain way: every token's
/// probability in index order, a full ranking wherever top-k or top-p
/// ranks, top-p's total summed in the candidates' order, then the kept
/// token with the largest logit / T plus Gumbel noise of (seed, draw,
/// token).
inline int32_t referenceSample(const SamplerParams &p, uint64_t &draw,
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
    const double u =
        uniformOpen(randomBits(p.seed, draw, static_cast<uint32_t>(x.i)));
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
inline std::vector<float> vocabularyLogits(int n, uint32_t seed) {
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

} // namespace nf::sampling::testing
