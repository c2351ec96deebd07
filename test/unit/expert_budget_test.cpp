// Budget scheduler: counts per token from ranked candidate weights.
#include "cpu/expert_budget.h"

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
