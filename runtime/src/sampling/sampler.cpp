#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
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

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    float v = logits[i];
    if (std::isnan(v))
      continue;
    if (best < 0 || v > logits[best])
      best = static_cast<int32_t>(i);
  }
  return best;
}

StatusOr<Sampler> Sampler::create(const SamplerParams &params) {
  if (Status st = validate(params); !st)
    return st;
  return Sampler(params);
}

double Sampler::filter(std::span<const float> logits) {
  candidates_.clear();
  constexpr float inf = std::numeric_limits<float>::infinity();
  float maxLogit = -inf;
  for (float v : logits)
    if (v > maxLogit) // false for NaN
      maxLogit = v;
  if (maxLogit == -inf)
    return 0.0;

  const int32_t n = static_cast<int32_t>(logits.size());
  if (maxLogit == inf) {
    // Infinitely likely tokens share the whole mass.
    for (int32_t i = 0; i < n; ++i)
      if (logits[i] == inf)
        candidates_.push_back({i, 1.0});
  } else {
    const double invT = 1.0 / static_cast<double>(params_.temperature);
    for (int32_t i = 0; i < n; ++i) {
      float v = logits[i];
      if (!(v > -inf))
        continue;
      double p = std::exp((static_cast<double>(v) - maxLogit) * invT);
      if (p > 0.0)
        candidates_.push_back({i, p});
    }
  }

  auto moreLikely = [](const Candidate &a, const Candidate &b) {
    return a.prob > b.prob || (a.prob == b.prob && a.index < b.index);
  };
  bool sorted = false;
  if (params_.topK > 0 &&
      static_cast<size_t>(params_.topK) < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.topK,
                      candidates_.end(), moreLikely);
    candidates_.resize(params_.topK);
    sorted = true;
  }
  if (params_.topP < 1.0f) {
    if (!sorted)
      std::sort(candidates_.begin(), candidates_.end(), moreLikely);
    double total = 0.0;
    for (const Candidate &c : candidates_)
      total += c.prob;
    const double threshold = static_cast<double>(params_.topP) * total;
    double cum = 0.0;
    size_t keep = 0;
    for (const Candidate &c : candidates_) {
      if (keep > 0 && cum >= threshold)
        break;
      cum += c.prob;
      ++keep;
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

StatusOr<int32_t> Sampler::sample(std::span<const float> logits) {
  if (logits.empty())
    return Status::error("sampler: empty logits");
  if (params_.temperature == 0.0f) {
    int32_t best = argmax(logits);
    if (best < 0 || logits[best] == -std::numeric_limits<float>::infinity())
      return Status::error("sampler: no logit above -inf");
    return best;
  }
  const double total = filter(logits);
  if (candidates_.empty() || !(total > 0.0))
    return Status::error("sampler: no logit above -inf");
  // One draw per sample, whatever the filters keep, so that streams stay
  // aligned across parameter changes. 53 random bits: u in [0, 1).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double acc = 0.0;
  for (const Candidate &c : candidates_) {
    acc += c.prob;
    if (u < acc)
      return c.index;
  }
  return candidates_.back().index; // rounding at the very end
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
