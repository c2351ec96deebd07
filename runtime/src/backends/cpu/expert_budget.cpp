#include "backends/cpu/expert_budget.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <vector>

namespace nf::cpu {

int64_t expertCallsForBudget(float budget, int32_t k, int32_t minK,
                             int64_t tokens) {
  double calls = std::llround(static_cast<double>(budget) * k * tokens);
  return std::clamp<int64_t>(static_cast<int64_t>(calls),
                             int64_t(minK) * tokens, int64_t(k) * tokens);
}

namespace {

/// The greedy of one pool: `tokens` (with their weights' rows and limits)
/// get minK each, then `remaining` calls one at a time to the token whose
/// kept experts leave the largest share of its routed weight out (times
/// its priority).
void allocatePool(std::span<const float> weights, int32_t k, int32_t minK,
                  const std::vector<int32_t> &tokens,
                  const std::vector<double> &priority, int64_t remaining,
                  std::span<const int32_t> limits, std::span<int32_t> counts) {
  const size_t n = tokens.size();
  // uncovered(i, c): the share of token i's routed weight that its first c
  // candidates leave out. The next call goes to the token that leaves the
  // most out (times its priority): coverage is evened out across the pool.
  std::vector<double> total(n, 0.0);
  std::vector<int32_t> limit(n, k);
  for (size_t i = 0; i < n; ++i) {
    const float *w = weights.data() + int64_t(tokens[i]) * k;
    if (!limits.empty())
      limit[i] = std::clamp(limits[tokens[i]], 0, k);
    for (int32_t r = 0; r < limit[i]; ++r)
      total[i] += w[r];
    counts[tokens[i]] = std::min(minK, limit[i]);
  }
  auto share = [&](size_t i, int32_t c) {
    const float *w = weights.data() + int64_t(tokens[i]) * k;
    double covered = 0.0;
    for (int32_t r = 0; r < c; ++r)
      covered += w[r];
    return total[i] > 0 ? (1.0 - covered / total[i]) * priority[i] : 0.0;
  };
  // Max-heap on the uncovered share; ties go to the token with fewer
  // experts so far, then to the earlier token.
  struct Entry {
    double share;
    int32_t count;
    size_t token;
  };
  auto lower = [](const Entry &a, const Entry &b) {
    if (a.share != b.share)
      return a.share < b.share;
    if (a.count != b.count)
      return a.count > b.count;
    return a.token > b.token;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> next(lower);
  for (size_t i = 0; i < n; ++i)
    if (counts[tokens[i]] < limit[i])
      next.push({share(i, counts[tokens[i]]), counts[tokens[i]], i});
  while (remaining > 0 && !next.empty()) {
    Entry e = next.top();
    next.pop();
    int32_t c = ++counts[tokens[e.token]];
    --remaining;
    if (c < limit[e.token])
      next.push({share(e.token, c), c, e.token});
  }
}

} // namespace

void allocateExpertBudget(std::span<const float> weights, int32_t k,
                          int32_t minK, std::span<const BudgetGroup> groups,
                          std::span<int32_t> counts, bool pooled,
                          std::span<const int32_t> limits) {
  minK = std::clamp(minK, 0, k);
  std::vector<int32_t> tokens;
  std::vector<double> priority;
  int64_t remaining = 0;
  for (const BudgetGroup &g : groups) {
    if (!pooled) {
      tokens.clear();
      priority.clear();
      remaining = 0;
    }
    for (int32_t i = 0; i < g.count; ++i) {
      tokens.push_back(g.begin + i);
      priority.push_back(1.0);
    }
    remaining += expertCallsForBudget(g.budget, k, minK, g.count) -
                 int64_t(minK) * g.count;
    if (!pooled)
      allocatePool(weights, k, minK, tokens, priority, remaining, limits,
                   counts);
  }
  if (pooled)
    allocatePool(weights, k, minK, tokens, priority, remaining, limits, counts);
}

int32_t capDistinctExperts(std::span<int32_t> ranked, std::span<double> scores,
                           int32_t k, int64_t tokens, int32_t cap,
                           std::span<int32_t> limits) {
  // Each expert's routed weight over the step: every token's candidates'
  // shares of its own candidate weight, so that each token counts once. The
  // weights are taken at f32, as the CUDA kernels hold them (budget_cap_
  // distinct in kernels/nf_moe.cuh), so both backends cut the same experts.
  std::vector<std::pair<double, int32_t>> weight; // (weight, expert)
  std::vector<double> byExpert;
  auto f32 = [](double v) {
    return static_cast<double>(static_cast<float>(v));
  };
  for (int64_t t = 0; t < tokens; ++t) {
    double sum = 0.0;
    for (int32_t r = 0; r < k; ++r)
      sum += ranked[t * k + r] >= 0 ? f32(scores[t * k + r]) : 0.0;
    for (int32_t r = 0; r < k; ++r) {
      const int32_t e = ranked[t * k + r];
      if (e < 0)
        continue;
      if (static_cast<size_t>(e) >= byExpert.size())
        byExpert.resize(static_cast<size_t>(e) + 1, -1.0);
      if (byExpert[e] < 0)
        byExpert[e] = 0.0;
      byExpert[e] += sum > 0 ? f32(scores[t * k + r]) / sum : 0.0;
    }
  }
  for (size_t e = 0; e < byExpert.size(); ++e)
    if (byExpert[e] >= 0)
      weight.push_back({byExpert[e], static_cast<int32_t>(e)});
  const int32_t distinct = static_cast<int32_t>(weight.size());
  if (cap <= 0 || cap >= distinct)
    return distinct;
  // The cap's experts: the most weight first, the lower id on ties.
  std::sort(weight.begin(), weight.end(), [](const auto &a, const auto &b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<char> kept(byExpert.size(), 0);
  for (int32_t i = 0; i < cap; ++i)
    kept[weight[i].second] = 1;
  // Each token keeps its candidates among them, in rank order; one with
  // none keeps its best candidate (it must route somewhere), so a step may
  // pass the cap by the tokens that need it.
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t n = 0;
    for (int32_t r = 0; r < k; ++r) {
      const int32_t e = ranked[t * k + r];
      if (e >= 0 && kept[e]) {
        ranked[t * k + n] = e;
        scores[t * k + n] = scores[t * k + r];
        ++n;
      }
    }
    if (n == 0)
      n = 1; // ranked[t * k] is still its best candidate
    for (int32_t r = n; r < k; ++r) {
      ranked[t * k + r] = -1;
      scores[t * k + r] = 0.0;
    }
    limits[t] = std::min(limits[t], n);
  }
  return cap;
}

} // namespace nf::cpu
