#include "cpu/expert_budget.h"

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

void allocateExpertBudget(std::span<const float> weights, int32_t k,
                          int32_t minK, std::span<const BudgetGroup> groups,
                          std::span<int32_t> counts) {
  minK = std::clamp(minK, 0, k);
  for (const BudgetGroup &g : groups) {
    int64_t remaining = expertCallsForBudget(g.budget, k, minK, g.count) -
                        int64_t(minK) * g.count;
    // uncovered(i, c): the share of token i's routed weight that its first c
    // candidates leave out. The next call goes to the token that leaves the
    // most out: coverage is evened out across the group.
    std::vector<double> total(g.count, 0.0);
    for (int32_t i = 0; i < g.count; ++i) {
      const float *w = weights.data() + int64_t(g.begin + i) * k;
      for (int32_t r = 0; r < k; ++r)
        total[i] += w[r];
      counts[g.begin + i] = minK;
    }
    auto share = [&](int32_t i, int32_t c) {
      const float *w = weights.data() + int64_t(g.begin + i) * k;
      double covered = 0.0;
      for (int32_t r = 0; r < c; ++r)
        covered += w[r];
      return total[i] > 0 ? 1.0 - covered / total[i] : 0.0;
    };
    // Max-heap on the uncovered share; ties go to the token with fewer
    // experts so far, then to the earlier token.
    struct Entry {
      double share;
      int32_t count, token;
    };
    auto lower = [](const Entry &a, const Entry &b) {
      if (a.share != b.share)
        return a.share < b.share;
      if (a.count != b.count)
        return a.count > b.count;
      return a.token > b.token;
    };
    std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> next(lower);
    if (minK < k)
      for (int32_t i = 0; i < g.count; ++i)
        next.push({share(i, minK), minK, i});
    while (remaining > 0 && !next.empty()) {
      Entry e = next.top();
      next.pop();
      int32_t c = ++counts[g.begin + e.token];
      --remaining;
      if (c < k)
        next.push({share(e.token, c), c, e.token});
    }
  }
}

} // namespace nf::cpu
