// What a server reads and does between steps through the C API, on the
// pydoc-moe plan (CPU backend): the storage counts (live sequences, KV
// pages) follow the sequences, and a prompt fed in chunks whose first
// chunk has no sampler draws what the same chunks run with nf_decode then
// nf_sample draw (a NULL sampler consumes no draw).
#include "nf/nf.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

std::string planPath() { return std::string(NF_PLAN_DIR) + "/pydoc-moe.nfb"; }

/// A model loaded through the C API, freed at scope end.
struct Loaded {
  nf_model *m = nullptr;
  explicit Loaded(int32_t kvPages, const char *scope = nullptr,
                  double cap = 0.0) {
    nf_model_params p = nf_model_default_params();
    p.backend = "cpu";
    p.kv_pages = kvPages;
    p.budget_scope = scope;
    p.distinct_expert_cap = cap;
    EXPECT_EQ(nf_model_load(planPath().c_str(), &p, &m), NF_OK)
        << nf_last_error();
  }
  ~Loaded() { nf_model_free(m); }
};

nf_seq_input input(int32_t seq, const std::vector<int32_t> &tokens) {
  nf_seq_input in = {};
  in.seq_id = seq;
  in.tokens = tokens.data();
  in.n_tokens = static_cast<int32_t>(tokens.size());
  return in;
}

TEST(ServingCApi, StorageCountsFollowTheSequences) {
  Loaded a(16);
  ASSERT_NE(a.m, nullptr);
  const int32_t page = nf_model_kv_page_size(a.m);
  ASSERT_GT(page, 0); // pydoc-moe has attention layers
  EXPECT_EQ(nf_model_kv_pages(a.m), 16);
  EXPECT_EQ(nf_model_kv_free_pages(a.m), 16);
  EXPECT_EQ(nf_model_live_sequences(a.m), 0);
  EXPECT_EQ(nf_model_max_context(a.m), 16 * page);

  int32_t s1 = -1, s2 = -1;
  ASSERT_EQ(nf_seq_add(a.m, &s1), NF_OK);
  ASSERT_EQ(nf_seq_add(a.m, &s2), NF_OK);
  EXPECT_EQ(nf_model_live_sequences(a.m), 2);
  // A new sequence holds no page until it has tokens.
  EXPECT_EQ(nf_model_kv_free_pages(a.m), 16);
  const std::vector<int32_t> t1(page + 1, 7), t2(3, 9);
  const nf_seq_input in[2] = {input(s1, t1), input(s2, t2)};
  const nf_batch b = {in, 2, nullptr};
  ASSERT_EQ(nf_decode(a.m, &b, nullptr, 0, 0), NF_OK) << nf_last_error();
  EXPECT_EQ(nf_model_kv_free_pages(a.m), 16 - 2 - 1);
  ASSERT_EQ(nf_seq_remove(a.m, s1), NF_OK);
  EXPECT_EQ(nf_model_kv_free_pages(a.m), 16 - 1);
  EXPECT_EQ(nf_model_live_sequences(a.m), 1);
  ASSERT_EQ(nf_seq_remove(a.m, s2), NF_OK);
  EXPECT_EQ(nf_model_kv_free_pages(a.m), 16);
  EXPECT_EQ(nf_model_live_sequences(a.m), 0);
  EXPECT_EQ(nf_model_kv_pages(nullptr), 0);
}

TEST(ServingCApi, NullSamplerDrawsNothing) {
  Loaded a(0), b(0);
  ASSERT_NE(a.m, nullptr);
  ASSERT_NE(b.m, nullptr);
  const int32_t V = nf_model_vocab_size(a.m);
  nf_sampler_params sp = nf_sampler_default_params();
  sp.temperature = 1.0f;
  sp.seed = 9;
  nf_sampler *sa = nullptr, *sb = nullptr;
  ASSERT_EQ(nf_sampler_create(&sp, &sa), NF_OK);
  ASSERT_EQ(nf_sampler_create(&sp, &sb), NF_OK);
  int32_t qa = -1, qb = -1;
  ASSERT_EQ(nf_seq_add(a.m, &qa), NF_OK);
  ASSERT_EQ(nf_seq_add(b.m, &qb), NF_OK);

  // The prompt's first chunk draws nothing: token -1.
  const std::vector<int32_t> first = {1, 412, 95, 1033, 7, 18, 220};
  nf_seq_input ia = input(qa, first);
  const nf_batch ba = {&ia, 1, nullptr};
  nf_sampler *none[1] = {nullptr};
  int32_t got = 0;
  ASSERT_EQ(nf_decode_sample(a.m, &ba, none, &got), NF_OK) << nf_last_error();
  EXPECT_EQ(got, -1);
  nf_seq_input ib = input(qb, first);
  const nf_batch bb = {&ib, 1, nullptr};
  std::vector<float> logits(V);
  ASSERT_EQ(nf_decode(b.m, &bb, logits.data(), logits.size(), 0), NF_OK);

  // Then the last chunk and eight decode steps draw the same tokens as
  // nf_decode + nf_sample with a sampler that drew nothing for the first.
  std::vector<int32_t> ta = {31, 1800, 5}, tb = ta;
  for (int step = 0; step < 9; ++step) {
    nf_sampler *one[1] = {sa};
    ia = input(qa, ta);
    ASSERT_EQ(nf_decode_sample(a.m, &ba, one, &got), NF_OK) << nf_last_error();
    ib = input(qb, tb);
    ASSERT_EQ(nf_decode(b.m, &bb, logits.data(), logits.size(), 0), NF_OK);
    const int32_t want = nf_sample(sb, logits.data(), V);
    ASSERT_GE(want, 0) << nf_last_error();
    ASSERT_EQ(got, want) << "step " << step;
    ta = {got};
    tb = {want};
  }
  nf_sampler_free(sa);
  nf_sampler_free(sb);
}

// The budget account (pydoc-moe's plan runs the budget policy, k = 4): a
// sequence decoded one token a step at budget 0.375 (1.5 experts a token)
// runs 2 and 1 experts in turn, 12 calls a MoE layer over 8 steps, not 2
// each step as rounding alone would; a batch-mate at another budget does
// not change that (the account is the sequence's own).
TEST(ServingCApi, BudgetAccountHoldsTheBudgetInDecode) {
  Loaded a(0);
  ASSERT_NE(a.m, nullptr);
  const int32_t L = nf_model_n_moe_layers(a.m);
  ASSERT_EQ(nf_model_experts_per_token(a.m), 4);
  auto run = [&](bool withMate) {
    int32_t s = -1, mate = -1;
    EXPECT_EQ(nf_seq_add(a.m, &s), NF_OK);
    if (withMate)
      EXPECT_EQ(nf_seq_add(a.m, &mate), NF_OK);
    std::vector<int64_t> perStep;
    for (int step = 0; step < 8; ++step) {
      const std::vector<int32_t> t = {static_cast<int32_t>(100 + step)};
      nf_seq_input in[2] = {input(s, t), input(mate, t)};
      in[0].expert_budget = 0.375f;
      in[1].expert_budget = 0.6f;
      std::vector<int64_t> calls(2), perLayer(2 * L);
      nf_batch b = {in, withMate ? 2 : 1, calls.data(), perLayer.data()};
      EXPECT_EQ(nf_decode(a.m, &b, nullptr, 0, 0), NF_OK) << nf_last_error();
      perStep.push_back(perLayer[0]);
      int64_t sum = 0;
      for (int32_t l = 0; l < L; ++l)
        sum += perLayer[l];
      EXPECT_EQ(sum, calls[0]);
    }
    EXPECT_EQ(nf_seq_remove(a.m, s), NF_OK);
    if (withMate)
      EXPECT_EQ(nf_seq_remove(a.m, mate), NF_OK);
    return perStep;
  };
  const std::vector<int64_t> alone = run(false);
  EXPECT_EQ(alone, (std::vector<int64_t>{2, 1, 2, 1, 2, 1, 2, 1}));
  EXPECT_EQ(run(true), alone);
}

// Step scope: a step's sequences pool their budgets. Two prompts at 0.5
// spend their calls together (exactly the sum a MoE layer), though not
// each its own; over 16 decode steps each sequence's account brings it
// back to its budget.
TEST(ServingCApi, StepScopePoolsBudgetsAndAccountsHoldThem) {
  Loaded a(0, "step");
  ASSERT_NE(a.m, nullptr);
  const int32_t L = nf_model_n_moe_layers(a.m);
  const int64_t k = nf_model_experts_per_token(a.m);
  int32_t s[2];
  ASSERT_EQ(nf_seq_add(a.m, &s[0]), NF_OK);
  ASSERT_EQ(nf_seq_add(a.m, &s[1]), NF_OK);
  const std::vector<int32_t> p0 = {1, 412, 95, 1033, 7, 18, 220, 31},
                             p1 = {1, 9, 9, 9, 9, 9};
  nf_seq_input in[2] = {input(s[0], p0), input(s[1], p1)};
  in[0].expert_budget = in[1].expert_budget = 0.5f;
  std::vector<int64_t> calls(2), perLayer(2 * L), total(2, 0);
  nf_batch b = {in, 2, calls.data(), perLayer.data()};
  ASSERT_EQ(nf_decode(a.m, &b, nullptr, 0, 0), NF_OK) << nf_last_error();
  for (int32_t l = 0; l < L; ++l)
    EXPECT_EQ(perLayer[l] + perLayer[L + l],
              static_cast<int64_t>(p0.size() + p1.size()) * k / 2);
  int64_t tokens[2] = {static_cast<int64_t>(p0.size()),
                       static_cast<int64_t>(p1.size())};
  total[0] = calls[0];
  total[1] = calls[1];
  for (int step = 0; step < 16; ++step) {
    const std::vector<int32_t> t0 = {static_cast<int32_t>(200 + step)},
                               t1 = {static_cast<int32_t>(300 + 7 * step)};
    in[0] = input(s[0], t0);
    in[1] = input(s[1], t1);
    in[0].expert_budget = in[1].expert_budget = 0.5f;
    ASSERT_EQ(nf_decode(a.m, &b, nullptr, 0, 0), NF_OK) << nf_last_error();
    for (int i = 0; i < 2; ++i) {
      total[i] += calls[i];
      ++tokens[i];
    }
  }
  for (int i = 0; i < 2; ++i) {
    const double spent =
        static_cast<double>(total[i]) / static_cast<double>(tokens[i] * k * L);
    EXPECT_NEAR(spent, 0.5, 1.0 / static_cast<double>(tokens[i]))
        << "sequence " << i;
  }
  EXPECT_EQ(nf_seq_remove(a.m, s[0]), NF_OK);
  EXPECT_EQ(nf_seq_remove(a.m, s[1]), NF_OK);
}

// A distinct-expert cap of 1: a MoE layer runs one expert for the step's
// tokens (those whose candidates miss it run their best one), so every
// token runs exactly one expert, whatever its budget.
TEST(ServingCApi, DistinctExpertCapBoundsTheExpertsAStepRuns) {
  Loaded a(0, nullptr, 1.0);
  ASSERT_NE(a.m, nullptr);
  const int32_t L = nf_model_n_moe_layers(a.m);
  const std::vector<int32_t> p = {1, 412, 95, 1033, 7, 18, 220, 31};
  int32_t s = -1;
  ASSERT_EQ(nf_seq_add(a.m, &s), NF_OK);
  nf_seq_input in = input(s, p);
  int64_t calls = 0;
  nf_batch b = {&in, 1, &calls, nullptr};
  ASSERT_EQ(nf_decode(a.m, &b, nullptr, 0, 0), NF_OK) << nf_last_error();
  EXPECT_EQ(calls, static_cast<int64_t>(p.size()) * L);
  EXPECT_EQ(nf_seq_remove(a.m, s), NF_OK);
  // Out of range: refused at load, naming the problem.
  nf_model_params bad = nf_model_default_params();
  bad.backend = "cpu";
  bad.distinct_expert_cap = -1.0;
  nf_model *m = nullptr;
  const std::string plan = planPath();
  EXPECT_EQ(nf_model_load(plan.c_str(), &bad, &m), NF_ERR_LOAD);
  EXPECT_NE(std::string(nf_last_error()).find("distinct-expert cap"),
            std::string::npos);
  bad.distinct_expert_cap = 0.0;
  bad.budget_scope = "batch";
  EXPECT_EQ(nf_model_load(plan.c_str(), &bad, &m), NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nf_last_error()).find("budget scope"),
            std::string::npos);
}

} // namespace
