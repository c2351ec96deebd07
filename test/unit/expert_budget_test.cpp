// Budget scheduler: counts per token from ranked candidate weights.
#include "backends/cpu/expert_budget.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

using nf::cpu::allocateExpertBudget;
using nf::cpu::BudgetGroup;

TEST(ExpertBudget, FullBudgetIsStaticTopK) {
  std::vector<float> w = {0.9f, 0.1f, 0.05f, 0.01f, 0.3f, 0.3f, 0.2f, 0.2f};
  std::vector<int32_t> counts(2);
  BudgetGroup g{0, 2, 1.0f};
  allocateExpertBudget(w, 4, 1, {&g, 1}, counts);
  EXPECT_EQ(counts, (std::vector<int32_t>{4, 4}));
}

TEST(ExpertBudget, SpendsWhereTheRouterIsUncertain) {
  // Token 0 is confident, token 1 is flat: half the budget (4 of 8 calls)
  // leaves token 0 with one expert and gives token 1 three.
  std::vector<float> w = {0.9f, 0.05f, 0.03f, 0.02f, 0.3f, 0.3f, 0.2f, 0.2f};
  std::vector<int32_t> counts(2);
  BudgetGroup g{0, 2, 0.5f};
  allocateExpertBudget(w, 4, 1, {&g, 1}, counts);
  EXPECT_EQ(counts, (std::vector<int32_t>{1, 3}));
}

TEST(ExpertBudget, RespectsMinimumAndTotal) {
  std::vector<float> w(4 * 6);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = 1.0f / (1 + i % 4);
  std::vector<int32_t> counts(6);
  BudgetGroup g{0, 6, 0.25f};
  allocateExpertBudget(w, 4, 2, {&g, 1}, counts);
  for (int32_t c : counts)
    EXPECT_GE(c, 2); // minK wins over a smaller budget
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), 12);
  g.budget = 0.75f;
  allocateExpertBudget(w, 4, 1, {&g, 1}, counts);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), 18);
}

TEST(ExpertBudget, GroupsDoNotShareBudgets) {
  std::vector<float> w = {0.9f, 0.05f, 0.03f, 0.02f, 0.3f, 0.3f, 0.2f, 0.2f};
  std::vector<int32_t> counts(2);
  BudgetGroup gs[] = {{0, 1, 1.0f}, {1, 1, 0.25f}};
  allocateExpertBudget(w, 4, 1, gs, counts);
  EXPECT_EQ(counts, (std::vector<int32_t>{4, 1}));
}

TEST(ExpertBudget, DeterministicTies) {
  std::vector<float> w(4 * 3, 0.25f);
  std::vector<int32_t> a(3), b(3);
  BudgetGroup g{0, 3, 0.5f}; // 6 calls: 2 each
  allocateExpertBudget(w, 4, 1, {&g, 1}, a);
  allocateExpertBudget(w, 4, 1, {&g, 1}, b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, (std::vector<int32_t>{2, 2, 2}));
}

// Step scope: the groups' calls form one pool. Two one-token requests at
// 0.5 (2 calls each, 4 in all): alone each runs 2; pooled, the confident
// token runs 1 and the flat one 3, the same total.
TEST(ExpertBudget, PooledStepScopeMovesCallsAcrossRequests) {
  std::vector<float> w = {0.9f, 0.05f, 0.03f, 0.02f, 0.3f, 0.3f, 0.2f, 0.2f};
  BudgetGroup gs[] = {{0, 1, 0.5f}, {1, 1, 0.5f}};
  std::vector<int32_t> alone(2), pooled(2);
  allocateExpertBudget(w, 4, 1, gs, alone);
  EXPECT_EQ(alone, (std::vector<int32_t>{2, 2}));
  allocateExpertBudget(w, 4, 1, gs, pooled, /*pooled=*/true);
  EXPECT_EQ(pooled, (std::vector<int32_t>{1, 3}));
  // Budgets 1.0 and 0.25 pool 4 + 1 calls, handed out by coverage alone:
  // the flat token of the low-budget request takes all four it can run
  // (its account pays them back in later steps).
  BudgetGroup uneven[] = {{0, 1, 1.0f}, {1, 1, 0.25f}};
  allocateExpertBudget(w, 4, 1, uneven, pooled, true);
  EXPECT_EQ(pooled, (std::vector<int32_t>{1, 4}));
}

TEST(ExpertBudget, LimitsBoundWhatATokenRuns) {
  std::vector<float> w = {0.3f, 0.3f, 0.2f, 0.2f, 0.3f, 0.3f, 0.2f, 0.2f};
  BudgetGroup g{0, 2, 1.0f};
  std::vector<int32_t> counts(2), limits = {2, 4};
  allocateExpertBudget(w, 4, 1, {&g, 1}, counts, false, limits);
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 4}));
}

// The distinct-expert cap keeps the experts of most routed weight over
// the step; each token keeps its candidates among them in rank order, and
// a token with none keeps its best.
TEST(ExpertBudget, DistinctCapKeepsTheHeaviestExperts) {
  // Three tokens, k = 2: experts 5 and 7 carry most weight.
  std::vector<int32_t> ranked = {5, 7, 7, 5, 9, 2};
  std::vector<double> scores = {0.6, 0.4, 0.7, 0.3, 0.8, 0.2};
  std::vector<int32_t> limits(3, 2);
  EXPECT_EQ(nf::cpu::capDistinctExperts(ranked, scores, 2, 3, 0, limits), 4);
  EXPECT_EQ(limits, (std::vector<int32_t>{2, 2, 2})); // no cap: unchanged
  EXPECT_EQ(nf::cpu::capDistinctExperts(ranked, scores, 2, 3, 2, limits), 2);
  EXPECT_EQ(ranked, (std::vector<int32_t>{5, 7, 7, 5, 9, -1}));
  EXPECT_EQ(limits, (std::vector<int32_t>{2, 2, 1}));
  EXPECT_DOUBLE_EQ(scores[4], 0.8); // its best, though not in the cap
}
