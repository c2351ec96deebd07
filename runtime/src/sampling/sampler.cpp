#include "sampling/sampler.h"

#include "sampling/philox.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>

namespace nf::sampling {

namespace {

std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

} // namespace

Status validate(const SamplerParams &p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f)
    return Status::error("sampler: temperature " + show(p.temperature) +
                         " must be finite and >= 0");
  if (p.topK < 0)
    return Status::error("sampler: top-k " + std::to_string(p.topK) +
                         " must be >= 0");
  if (!(p.topP > 0.0f && p.topP <= 1.0f))
    return Status::error("sampler: top-p " + show(p.topP) +
                         " must be in (0, 1]");
  if (!(p.minP >= 0.0f && p.minP <= 1.0f))
    return Status::error("sampler: min-p " + show(p.minP) +
                         " must be in [0, 1]");
  return Status::success();
}

namespace {

/// The largest logit, NaN ignored (-inf when there is none). Eight running
/// maxima: one would make every comparison wait for the one before.
float largest(std::span<const float> logits) {
  constexpr int kLanes = 8;
  float m[kLanes];
  for (float &x : m)
    x = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size(), body = n - n % kLanes;
  for (size_t i = 0; i < body; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j]; // false for NaN
  for (size_t i = body; i < n; ++i)
    m[0] = logits[i] > m[0] ? logits[i] : m[0];
  for (int j = 1; j < kLanes; ++j)
    m[0] = m[j] > m[0] ? m[j] : m[0];
  return m[0];
}

} // namespace

int32_t argmax(std::span<const float> logits) {
  // The largest value, then its first index; when every logit is NaN no
  // value equals -inf and the result is -1.
  const float m = largest(logits);
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] == m)
      return static_cast<int32_t>(i);
  return -1;
}

StatusOr<Sampler> Sampler::create(const SamplerParams &params) {
  if (Status st = validate(params); !st)
    return st;
  return Sampler(params);
}

namespace {

/// The k-th largest of the logits above -inf (NaN ignored), or -inf when
/// there are fewer than k of them. One pass: a min-heap of the k best, which
/// most logits leave at one comparison.
float kthLargest(std::span<const float> logits, int32_t k,
                 std::vector<float> &heap) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  heap.clear();
  const auto greater = std::greater<float>();
  for (float v : logits) {
    if (!(v > -inf))
      continue;
    if (static_cast<int32_t>(heap.size()) < k) {
      heap.push_back(v);
      std::push_heap(heap.begin(), heap.end(), greater);
    } else if (v > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), greater);
      heap.back() = v;
      std::push_heap(heap.begin(), heap.end(), greater);
    }
  }
  return static_cast<int32_t>(heap.size()) < k ? -inf : heap.front();
}

/// The top-k fast path's cut: scaled logits below it cannot tie with the
/// k-th largest's probability (far above exp's rounding).
double topKCut(double xk) { return xk - (std::fabs(xk) + 1.0) * 0x1.0p-30; }

} // namespace

bool Sampler::moreLikely(const Candidate &a, const Candidate &b) {
  return a.prob > b.prob || (a.prob == b.prob && a.index < b.index);
}

double Sampler::filter(std::span<const float> logits) {
  candidates_.clear();
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float maxLogit = largest(logits);
  if (maxLogit == -inf)
    return 0.0;

  const int32_t n = static_cast<int32_t>(logits.size());
  const double invT = 1.0 / static_cast<double>(params_.temperature);
  auto scaled = [&](float v) {
    return (static_cast<double>(v) - maxLogit) * invT;
  };
  bool sorted = false, ranked = false;
  if (maxLogit == inf) {
    // Infinitely likely tokens share the whole mass.
    for (int32_t i = 0; i < n; ++i)
      if (logits[i] == inf)
        candidates_.push_back({i, 1.0, inf});
  } else if (params_.topK > 0 && params_.topK < n) {
    // Top-k without a probability for every token: the tokens whose scaled
    // logit is at least that of the k-th largest logit, less a margin far
    // above exp's rounding (no token left out can tie with one kept), hold
    // the k most likely. The result is that of ranking every candidate: the
    // same tokens, in the same order. Not where the k-th probability is
    // subnormal (ties there are of a coarser grain): every token then.
    const float kth = kthLargest(logits, params_.topK, heap_);
    const double xk = scaled(kth);
    if (kth > -inf && xk > -700.0) {
      const double cut = topKCut(xk);
      bool likelyBelow = false; // a token below the cut with p > 0
      for (int32_t i = 0; i < n; ++i) {
        const float v = logits[i];
        if (!(v > -inf))
          continue;
        const double x = scaled(v);
        if (x >= cut)
          candidates_.push_back({i, std::exp(x), v}); // > 0: x > -700
        else if (!likelyBelow)
          likelyBelow = std::exp(x) > 0.0;
      }
      // More than k candidates in all: rank them, keep k.
      if (static_cast<size_t>(params_.topK) < candidates_.size() ||
          likelyBelow) {
        std::partial_sort(candidates_.begin(),
                          candidates_.begin() + params_.topK, candidates_.end(),
                          moreLikely);
        candidates_.resize(params_.topK);
        sorted = true;
      }
      ranked = true;
    }
  }
  if (maxLogit != inf && !ranked)
    for (int32_t i = 0; i < n; ++i) {
      const float v = logits[i];
      if (!(v > -inf))
        continue;
      if (const double p = std::exp(scaled(v)); p > 0.0)
        candidates_.push_back({i, p, v});
    }
  return finish(ranked, sorted);
}

double Sampler::finish(bool ranked, bool sorted) {
  if (!ranked && params_.topK > 0 &&
      static_cast<size_t>(params_.topK) < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.topK,
                      candidates_.end(), moreLikely);
    candidates_.resize(params_.topK);
    sorted = true;
  }

  if (params_.topP < 1.0f) {
    // The smallest prefix of the most-likely-first order whose mass reaches
    // top_p of the total (summed in the candidates' order). The nucleus is
    // usually a small part of the vocabulary: the 64 most likely first,
    // then blocks 8 times larger (selected by nth_element, then sorted), and
    // once the ranked mass is under half the threshold (a flat distribution)
    // the rest at once.
    double total = 0.0;
    for (const Candidate &c : candidates_)
      total += c.prob;
    const double threshold = static_cast<double>(params_.topP) * total;
    const size_t size = candidates_.size();
    size_t ranked = sorted ? size : 0;
    double cum = 0.0;
    size_t keep = 0;
    for (;;) {
      bool done = false;
      for (; keep < ranked; ++keep) {
        if (keep > 0 && cum >= threshold) {
          done = true;
          break;
        }
        cum += candidates_[keep].prob;
      }
      if (done || ranked == size)
        break;
      size_t m = std::max<size_t>(64, ranked * 8);
      if (m >= size || (ranked > 0 && cum < 0.5 * threshold))
        m = size;
      auto first = candidates_.begin() + static_cast<ptrdiff_t>(ranked);
      auto last = candidates_.begin() + static_cast<ptrdiff_t>(m);
      if (ranked == 0 && m < size) { // a heap of 64: one comparison per token
        std::partial_sort(first, last, candidates_.end(), moreLikely);
      } else {
        if (m < size)
          std::nth_element(first, last - 1, candidates_.end(), moreLikely);
        std::sort(first, last, moreLikely);
      }
      ranked = m;
    }
    candidates_.resize(keep);
  }
  if (params_.minP > 0.0f) {
    double maxProb = 0.0;
    for (const Candidate &c : candidates_)
      maxProb = std::max(maxProb, c.prob);
    const double threshold = static_cast<double>(params_.minP) * maxProb;
    std::erase_if(candidates_,
                  [&](const Candidate &c) { return c.prob < threshold; });
  }
  double total = 0.0;
  for (const Candidate &c : candidates_)
    total += c.prob;
  return total;
}

std::optional<double> Sampler::filterTop(std::span<const int32_t> ids,
                                         std::span<const float> values,
                                         int64_t vocab, double rowTotal) {
  candidates_.clear();
  constexpr float inf = std::numeric_limits<float>::infinity();
  const size_t k = std::min(ids.size(), values.size());
  size_t c = 0; // listed tokens (the rest of the list is -1)
  while (c < k && ids[c] >= 0)
    ++c;
  if (c == 0)
    return c < k ? std::optional<double>(0.0) : std::nullopt;
  const float maxLogit = values[0];
  if (maxLogit == -inf)
    return 0.0;
  // Every token above -inf is listed: the list ended early, or reached -inf.
  const bool allFinite = c < k || values[c - 1] == -inf;
  const double invT = 1.0 / static_cast<double>(params_.temperature);
  auto scaled = [&](float v) {
    return (static_cast<double>(v) - maxLogit) * invT;
  };
  auto byIndex = [](const Candidate &a, const Candidate &b) {
    return a.index < b.index;
  };
  bool sorted = false, ranked = false;
  if (maxLogit == inf) {
    if (!allFinite && values[c - 1] == inf)
      return std::nullopt; // more infinite logits than listed
    for (size_t i = 0; i < c && values[i] == inf; ++i)
      candidates_.push_back({ids[i], 1.0, inf});
    std::sort(candidates_.begin(), candidates_.end(), byIndex);
    return finish(false, false);
  }
  // As filter's top-k path, from the list: the tokens at or above the cut
  // must all be listed, and the first one listed below it says whether any
  // token below has a probability.
  if (params_.topK > 0 && params_.topK < vocab) {
    const size_t kk = static_cast<size_t>(params_.topK);
    const float kth = kk <= c && values[kk - 1] > -inf ? values[kk - 1] : -inf;
    const double xk = scaled(kth);
    if (kth > -inf && xk > -700.0) {
      const double cut = topKCut(xk);
      size_t below = 0;
      while (below < c && scaled(values[below]) >= cut)
        ++below;
      if (below == c && !allFinite)
        return std::nullopt; // the list ends above the cut
      for (size_t i = 0; i < below; ++i)
        candidates_.push_back(
            {ids[i], std::exp(scaled(values[i])), values[i]});
      std::sort(candidates_.begin(), candidates_.end(), byIndex);
      const bool likelyBelow = below < c && values[below] > -inf &&
                               std::exp(scaled(values[below])) > 0.0;
      if (kk < candidates_.size() || likelyBelow) {
        std::partial_sort(candidates_.begin(), candidates_.begin() + kk,
                          candidates_.end(), moreLikely);
        candidates_.resize(kk);
        sorted = true;
      }
      ranked = true;
      return finish(ranked, sorted);
    }
  }
  // Top-p and min-p without top-k: the kept tokens are the most likely,
  // which the list holds when it reaches past them.
  if ((params_.topK == 0 || params_.topK >= vocab) &&
      (params_.topP < 1.0f || params_.minP > 0.0f)) {
    std::vector<double> p(c, 0.0);
    size_t positive = 0; // listed tokens with a probability
    while (positive < c && values[positive] > -inf &&
           (p[positive] = std::exp(scaled(values[positive]))) > 0.0)
      ++positive;
    // Every token with a probability is listed.
    const bool complete = allFinite || positive < c;
    size_t keep = positive;
    if (params_.topP < 1.0f) {
      // The smallest prefix whose mass reaches top_p of the total: the
      // device's total and this order's sums differ from the definition's
      // by rounding only, so the prefix must clear the threshold by a
      // margin on both sides, and must not split equal probabilities
      // (ranked by index in the definition, by value in the list).
      if (!(rowTotal > 0.0) || !std::isfinite(rowTotal))
        return std::nullopt;
      constexpr double kMargin = 0x1.0p-30;
      const double threshold = static_cast<double>(params_.topP) * rowTotal;
      double cum = 0.0, before = 0.0; // the mass of keep, keep - 1 tokens
      keep = 0;
      while (keep < positive && cum < threshold * (1.0 + kMargin)) {
        before = cum;
        cum += p[keep++];
      }
      if (cum < threshold * (1.0 + kMargin) && !complete) {
        // The list ends first: it must hold every candidate, or the
        // nucleus must reach past it while min-p's cut lies inside it
        // (checked below: the kept tokens are the listed ones above it).
        if (!(params_.minP > 0.0f && cum < threshold * (1.0 - kMargin)))
          return std::nullopt;
        keep = positive;
      } else if (keep > 1 && !(before < threshold * (1.0 - kMargin))) {
        return std::nullopt;
      } else if (keep == positive && !complete) {
        return std::nullopt;
      } else if (keep < positive && !(p[keep] < p[keep - 1])) {
        // Equal probabilities across the end: both orders agree where
        // they are equal logits (ranked by id in both); the whole group
        // must be listed.
        size_t first = keep - 1, end = keep;
        while (first > 0 && p[first - 1] == p[keep - 1])
          --first;
        while (end < positive && p[end] == p[keep - 1])
          ++end;
        if (end == positive && !complete)
          return std::nullopt;
        for (size_t i = first; i < end; ++i)
          if (values[i] != values[keep - 1])
            return std::nullopt;
      }
    }
    if (params_.minP > 0.0f) {
      // Relative to the most likely (the first: probability 1); the
      // unlisted tokens must fall below it.
      const double cut = static_cast<double>(params_.minP) * p[0];
      if (keep == positive && !complete && !(p[positive - 1] < cut))
        return std::nullopt;
      while (keep > 0 && p[keep - 1] < cut)
        --keep;
    }
    for (size_t i = 0; i < keep; ++i)
      candidates_.push_back({ids[i], p[i], values[i]});
    double total = 0.0;
    for (const Candidate &x : candidates_)
      total += x.prob;
    return total;
  }
  // Every token's probability: the unlisted ones must have none.
  if (!allFinite && std::exp(scaled(values[c - 1])) > 0.0)
    return std::nullopt;
  for (size_t i = 0; i < c; ++i)
    if (values[i] > -inf)
      if (const double p = std::exp(scaled(values[i])); p > 0.0)
        candidates_.push_back({ids[i], p, values[i]});
  std::sort(candidates_.begin(), candidates_.end(), byIndex);
  return finish(false, false);
}

double Sampler::noisyKey(float logit, int32_t index) const {
  const double x =
      logit == std::numeric_limits<float>::infinity()
          ? 0.0
          : static_cast<double>(logit) / static_cast<double>(params_.temperature);
  return x + gumbelNoise(params_.seed, draws_, static_cast<uint32_t>(index));
}

namespace {

/// Gumbel-max over n entries (logitAt(i), indexAt(i)); entries at or below
/// -inf (and NaN) are skipped; -1 when none is left. The result is that of
/// computing every key (noisyKey's arithmetic), but most entries are
/// settled by bounds: an entry whose logit / T plus the largest noise
/// (36.74) is below the best key so far needs no noise, and one whose
/// random bits put its noise below the next integer under the gap to the
/// best key needs no logarithm (a table of thresholds per integer, with
/// slack far beyond log's rounding). `first` (an entry with the largest
/// logit, or any) is keyed first, so the best key is high from the start.
template <class LogitAt, class IndexAt>
int32_t gumbelArgmax(uint64_t seed, uint64_t draw, float temperature,
                     size_t n, size_t first, LogitAt logitAt,
                     IndexAt indexAt) {
  constexpr int kLevels = 37;
  // q < below[L] (q: the draw's top 52 bits) means noise < L.
  static const std::array<uint64_t, kLevels + 1> below = [] {
    std::array<uint64_t, kLevels + 1> b{};
    for (int L = 0; L <= kLevels; ++L) {
      const double q = std::exp(-std::exp(-static_cast<double>(L))) *
                           0x1.0p52 * (1.0 - 0x1.0p-40) -
                       2.0;
      b[static_cast<size_t>(L)] = q > 0.0 ? static_cast<uint64_t>(q) : 0;
    }
    return b;
  }();
  constexpr double kMaxNoise = 36.75; // > -log(-log(1 - 2^-53)) = 36.74
  constexpr float inf = std::numeric_limits<float>::infinity();
  const double T = static_cast<double>(temperature);
  auto scaled = [&](float v) {
    return v == inf ? 0.0 : static_cast<double>(v) / T;
  };
  int32_t best = -1;
  double bestKey = 0.0;
  auto consider = [&](size_t i) {
    const float v = logitAt(i);
    if (!(v > -inf))
      return;
    const double x = scaled(v);
    const int32_t index = indexAt(i);
    if (best >= 0) {
      // Bounds in the keys' own arithmetic: noise G < b gives x + G rounded
      // <= x + b rounded (rounding is monotone), so x + b < bestKey rules
      // the entry out, ties included.
      if (x + kMaxNoise < bestKey)
        return;
      const double gap = bestKey - x;
      int L = gap >= kLevels ? kLevels : gap >= 1.0 ? static_cast<int>(gap) : 0;
      while (L > 0 && !(x + L < bestKey))
        --L;
      if (L > 0) {
        const uint64_t bits =
            randomBits(seed, draw, static_cast<uint32_t>(index));
        if ((bits >> 12) < below[static_cast<size_t>(L)])
          return;
      }
    }
    const double key =
        x + gumbelNoise(seed, draw, static_cast<uint32_t>(index));
    if (best < 0 || key > bestKey || (key == bestKey && index < best)) {
      best = index;
      bestKey = key;
    }
  };
  if (first < n)
    consider(first);
  for (size_t i = 0; i < n; ++i)
    if (i != first)
      consider(i);
  return best;
}

} // namespace

int32_t Sampler::draw() {
  // Gumbel-max: the largest key is a draw from the candidates'
  // renormalised probabilities.
  size_t first = 0;
  for (size_t i = 1; i < candidates_.size(); ++i)
    if (candidates_[i].prob > candidates_[first].prob)
      first = i;
  const int32_t best = gumbelArgmax(
      params_.seed, draws_, params_.temperature, candidates_.size(), first,
      [&](size_t i) { return candidates_[i].logit; },
      [&](size_t i) { return candidates_[i].index; });
  ++draws_;
  return best;
}

int32_t Sampler::drawFromRow(std::span<const float> logits) {
  // Every token above -inf is a candidate: one whose probability underflows
  // (x / T more than 745 below the largest) cannot win either, its noise
  // being at most 36.74 above the largest one's least (-3.61).
  const int32_t first = argmax(logits);
  const int32_t best = gumbelArgmax(
      params_.seed, draws_, params_.temperature, logits.size(),
      first < 0 ? logits.size() : static_cast<size_t>(first),
      [&](size_t i) { return logits[i]; },
      [](size_t i) { return static_cast<int32_t>(i); });
  if (best >= 0)
    ++draws_;
  return best;
}

std::optional<Sampler::NoiseDraw> Sampler::noiseDraw() const {
  if (params_.temperature > 0.0f && params_.topK == 0 &&
      params_.topP >= 1.0f && params_.minP == 0.0f)
    return NoiseDraw{params_.temperature, params_.seed, draws_};
  return std::nullopt;
}

StatusOr<std::optional<int32_t>>
Sampler::drawFromNoisyTop(std::span<const int32_t> ids,
                          std::span<const float> values) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const size_t k = std::min(ids.size(), values.size());
  size_t c = 0; // listed tokens (the rest of the list is -1)
  while (c < k && ids[c] >= 0)
    ++c;
  // +inf logits rank first (key +inf) and share the mass: the row decides.
  for (size_t i = 0; i < c; ++i)
    if (values[i] == inf)
      return std::optional<int32_t>();
  int32_t best = -1;
  double bestKey = 0.0;
  for (size_t i = 0; i < c; ++i) {
    if (!(values[i] > -inf))
      continue;
    const double key = noisyKey(values[i], ids[i]);
    if (best < 0 || key > bestKey || (key == bestKey && ids[i] < best)) {
      best = ids[i];
      bestKey = key;
    }
  }
  // -inf keys rank last (a finite logit's device key is at least
  // -FLT_MAX): a list that ends early or at -inf holds every finite logit.
  const bool complete = c < k || (c > 0 && !(values[c - 1] > -inf));
  if (best < 0)
    return complete ? StatusOr<std::optional<int32_t>>(
                          Status::error("sampler: no logit above -inf"))
                    : std::optional<int32_t>();
  if (!complete) {
    // An unlisted token's device key is at most the last listed one's; the
    // device's keys are these keys rounded to float (its logarithms may
    // differ in the last bit): an unlisted token beats none listed when the
    // best key clears the last one's by more than both roundings.
    const double last = noisyKey(values[c - 1], ids[c - 1]);
    const double margin =
        (std::fabs(last) + std::fabs(bestKey) + 1.0) * 0x1.0p-20;
    if (!(bestKey > last + margin) || std::fabs(bestKey) >= 1e38 ||
        std::fabs(last) >= 1e38)
      return std::optional<int32_t>();
  }
  ++draws_;
  return std::optional<int32_t>(best);
}

bool Sampler::needsRowTotal() const {
  return params_.temperature > 0.0f && params_.topK == 0 &&
         params_.topP < 1.0f;
}

bool Sampler::samplesFromTop(int32_t k, bool noisyLists,
                             bool rowTotals) const {
  return k > 0 && (params_.temperature == 0.0f ||
                   (params_.topK > 0 && params_.topK < k) ||
                   (noisyLists && noiseDraw()) ||
                   (params_.topK == 0 && params_.topP >= 1.0f &&
                    params_.minP > 0.0f) ||
                   (rowTotals && needsRowTotal()));
}

StatusOr<std::optional<int32_t>>
Sampler::sampleTop(std::span<const int32_t> ids, std::span<const float> values,
                   int64_t vocab, bool noisy, double total) {
  if (ids.empty() || values.size() < ids.size() || vocab <= 0)
    return Status::error("sampler: empty top logits");
  if (noisy) {
    if (!noiseDraw())
      return Status::error("sampler: a noisy top list for a sampler that "
                           "ranks by the logit");
    return drawFromNoisyTop(ids, values);
  }
  if (params_.temperature == 0.0f) {
    // The list's order is argmax's: the largest value, lowest id on ties.
    if (ids[0] < 0 || values[0] == -std::numeric_limits<float>::infinity())
      return Status::error("sampler: no logit above -inf");
    return std::optional<int32_t>(ids[0]);
  }
  const std::optional<double> kept = filterTop(ids, values, vocab, total);
  if (!kept)
    return std::optional<int32_t>(); // the row decides
  if (candidates_.empty() || !(*kept > 0.0))
    return Status::error("sampler: no logit above -inf");
  return std::optional<int32_t>(draw());
}

StatusOr<int32_t> Sampler::sample(std::span<const float> logits) {
  if (logits.empty())
    return Status::error("sampler: empty logits");
  if (params_.temperature == 0.0f) {
    int32_t best = argmax(logits);
    if (best < 0 || logits[best] == -std::numeric_limits<float>::infinity())
      return Status::error("sampler: no logit above -inf");
    return best;
  }
  if (noiseDraw() &&
      largest(logits) < std::numeric_limits<float>::infinity()) {
    const int32_t t = drawFromRow(logits);
    if (t < 0)
      return Status::error("sampler: no logit above -inf");
    return t;
  }
  const double total = filter(logits);
  if (candidates_.empty() || !(total > 0.0))
    return Status::error("sampler: no logit above -inf");
  return draw();
}

StatusOr<std::vector<double>>
Sampler::distribution(std::span<const float> logits) {
  if (logits.empty())
    return Status::error("sampler: empty logits");
  std::vector<double> probs(logits.size(), 0.0);
  if (params_.temperature == 0.0f) {
    int32_t best = argmax(logits);
    if (best < 0 || logits[best] == -std::numeric_limits<float>::infinity())
      return Status::error("sampler: no logit above -inf");
    probs[best] = 1.0;
    return probs;
  }
  const double total = filter(logits);
  if (candidates_.empty() || !(total > 0.0))
    return Status::error("sampler: no logit above -inf");
  for (const Candidate &c : candidates_)
    probs[c.index] = c.prob / total;
  return probs;
}

} // namespace nf::sampling
