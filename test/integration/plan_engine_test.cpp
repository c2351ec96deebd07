// nf::Engine (CPU backend) on plans compiled by this build's nfc from every
// fixture and examples/pydoc-moe: the exactness suite (exactness_suite.h:
// prefill and greedy-decode logits against the Hugging Face float64
// references, batched steps bit-identical to one sequence at a time) on the
// CPU backend, continuous batching, steps split over a small arena, MoE
// expert statistics and overrides, and clean errors for bad steps (broken
// plans and weights: plan_load_errors_test.cpp).
#include "backends/cpu/kernels.h"
#include "engine/engine.h"
#include "engine/plan_common.h"

#include "ReferenceUtil.h"
#include "TestUtil.h"
#include "engine_test_util.h"
#include "exactness_suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::ref;
using namespace nf::test::integration;

std::string planPath(const std::string &name) {
  return std::string(NF_PLAN_DIR) + "/" + name + ".nfb";
}

std::string modelDir(const std::string &name) {
  return name == "pydoc-moe" ? test::examplesDir() + "/pydoc-moe"
                             : test::fixtureDir(name);
}

int64_t countMoeLayers(const ModelInfo &info) {
  return std::count(info.layerKinds.begin(), info.layerKinds.end(), 'E');
}

// ---------------------------------------------------------------------------
// Fixtures

class PlanFixture : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    engine_ = loadEngine(planPath(GetParam()));
    ASSERT_NE(engine_, nullptr);
    ref_ = std::make_unique<RefFile>(modelDir(GetParam()) +
                                     "/reference.safetensors");
    prompts_ = loadPrompts(*ref_);
    ASSERT_FALSE(prompts_.empty());
    V_ = engine_->info().vocabSize;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RefFile> ref_;
  std::vector<Prompt> prompts_;
  int64_t V_ = 0;
};

// Sequences join (prefill inside a decode step of others) and leave (their
// slots and pages are reused) between steps, with 2 slots for 5 prompts.
TEST_P(PlanFixture, SequencesJoinAndLeave) {
  EngineOptions o = testOptions();
  o.maxSequences = 2;
  o.kvPages = 12;
  std::unique_ptr<Engine> engine = loadEngine(planPath(GetParam()), o);
  ASSERT_NE(engine, nullptr);
  Engine &e = *engine;
  EXPECT_EQ(e.info().maxSequences, 2);
  const int n = static_cast<int>(prompts_.size());
  struct Live {
    int prompt;
    int32_t seq;
    size_t steps = 0;  // greedy tokens consumed
    int32_t next = -1; // token to feed next (-1: needs prefill)
  };
  std::vector<Live> live;
  int nextPrompt = 0, finished = 0, steps = 0;
  double worst = 0;
  const int order[] = {3, 4, 0, 2, 1};
  while (finished < n) {
    // Admit at most one new sequence per step while a slot is free.
    if (nextPrompt < n && live.size() < 2) {
      const int pi = n == 5 ? order[nextPrompt] : nextPrompt;
      ++nextPrompt;
      StatusOr<int32_t> seq = e.addSequence();
      ASSERT_TRUE(seq.ok()) << seq.message();
      live.push_back({pi, *seq});
    }
    if (live.size() == 2) {
      StatusOr<int32_t> third = e.addSequence();
      ASSERT_FALSE(third.ok());
      EXPECT_NE(third.message().find("slots"), std::string::npos)
          << third.message();
    }
    std::vector<SequenceInput> inputs;
    for (Live &l : live) {
      SequenceInput in;
      in.sequence = l.seq;
      if (l.next < 0)
        in.tokens = prompts_[l.prompt].tokens;
      else
        in.tokens = {&l.next, 1};
      inputs.push_back(in);
    }
    std::vector<float> logits;
    Status s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ++steps;
    std::vector<Live> still;
    for (size_t i = 0; i < live.size(); ++i) {
      Live &l = live[i];
      const Prompt &p = prompts_[l.prompt];
      const float *r = logits.data() + int64_t(i) * V_;
      const float *want =
          l.next < 0
              ? p.prefillLogits.data() + int64_t(p.tokens.size() - 1) * V_
              : p.greedyLogits.data() + int64_t(l.steps++) * V_;
      worst = std::max(worst, relError(r, want, V_));
      l.next = argmax(r, V_);
      if (l.steps >= p.greedyTokens.size()) {
        ASSERT_TRUE(e.removeSequence(l.seq).ok());
        ++finished;
        continue;
      }
      ASSERT_EQ(l.next, p.greedyTokens[l.steps])
          << "p" << l.prompt << " step " << l.steps;
      still.push_back(l);
    }
    live = std::move(still);
  }
  EXPECT_LE(worst, kTol);
  std::cout << "[ plan ] " << GetParam() << " join/leave: " << steps
            << " steps, worst rel err " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PlanFixture,
                         ::testing::ValuesIn(exactnessFixtures()), ParamName());

// ---------------------------------------------------------------------------
// The exactness suite (exactness_suite.h) on the CPU backend: within kTol of
// the references, batched bit-identical to one sequence at a time (each
// decode step fed its own greedy token).

const ExactnessBackend kCpuBackend = {
    .name = "cpu",
    .tag = "[ plan ]",
    .plan = planPath,
    .options = [](const std::string &) { return testOptions(); },
    .modelDir = modelDir,
    .require = nullptr,
    .refTol = kTol,
    .batchMetric = ExactnessBackend::BatchMetric::MaxAbs,
    .batchTol = 0,
    .feed = Feed::Argmax,
};

INSTANTIATE_TEST_SUITE_P(
    Cpu, Exactness,
    ::testing::ValuesIn(exactnessCases(kCpuBackend, exactnessFixtures())),
    ExactnessName());

// ---------------------------------------------------------------------------
// Steps larger than the plan's arena: prefill in chunks of 16 tokens (a
// sequence continues from its state in the next chunk), decode in runs of 2
// sequences. Bit-identical to the plan with a large arena.

TEST(PlanChunking, SmallArenaMatchesLargeArena) {
  std::unique_ptr<Engine> small = loadEngine(planPath("tiny-hybrid-small"));
  std::unique_ptr<Engine> large = loadEngine(planPath("tiny-hybrid"));
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(small->info().maxPrefillTokens, 16);
  EXPECT_EQ(small->info().maxDecodeTokens, 2);
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const int n = static_cast<int>(prompts.size());
  const int64_t V = small->info().vocabSize;

  std::vector<float> outs[2];
  std::vector<std::vector<int32_t>> seqs(2, std::vector<int32_t>(n));
  Engine *engines[2] = {small.get(), large.get()};
  double worst = 0;
  for (int k = 0; k < 2; ++k) {
    Engine &e = *engines[k];
    std::vector<SequenceInput> inputs(n);
    for (int i = 0; i < n; ++i) {
      seqs[k][i] = *e.addSequence();
      inputs[i].sequence = seqs[k][i];
      inputs[i].tokens = prompts[i].tokens;
    }
    std::vector<float> logits;
    Status s = e.step(inputs, LogitsFor::AllTokens, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    outs[k] = logits;
    std::vector<int32_t> next(n);
    int64_t row = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t T = static_cast<int64_t>(prompts[i].tokens.size());
      worst = std::max(worst, relError(logits.data() + row * V,
                                       prompts[i].prefillLogits.data(),
                                       size_t(T * V)));
      row += T;
      next[i] = argmax(logits.data() + (row - 1) * V, V);
    }
    for (size_t st = 0; st < prompts[0].greedyTokens.size(); ++st) {
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(next[i], prompts[i].greedyTokens[st]) << "p" << i;
        inputs[i].tokens = {&next[i], 1};
      }
      s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
      ASSERT_TRUE(s.ok()) << s.message();
      for (int i = 0; i < n; ++i) {
        worst = std::max(worst,
                         relError(logits.data() + i * V,
                                  prompts[i].greedyLogits.data() + st * V, V));
        next[i] = argmax(logits.data() + i * V, V);
      }
      outs[k].insert(outs[k].end(), logits.begin(), logits.end());
    }
    // A prompt joins decoding sequences: a prefill step whose last row
    // per sequence comes from different passes.
    SequenceInput join;
    join.sequence = *e.addSequence();
    join.tokens = prompts[4].tokens;
    for (int i = 0; i < n; ++i)
      inputs[i].tokens = {&next[i], 1};
    inputs.insert(inputs.begin() + 2, join);
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), size_t((n + 1) * V));
    const int64_t T4 = static_cast<int64_t>(prompts[4].tokens.size());
    worst = std::max(
        worst, relError(logits.data() + 2 * V,
                        prompts[4].prefillLogits.data() + (T4 - 1) * V, V));
    outs[k].insert(outs[k].end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(outs[0].size(), outs[1].size());
  EXPECT_EQ(maxAbsDiff(outs[0].data(), outs[1].data(), outs[0].size()), 0.0);
  EXPECT_LE(worst, kTol);
  std::cout << "[ plan ] tiny-hybrid, 16-token arena: worst rel err " << worst
            << "\n";
}

// ---------------------------------------------------------------------------
// Threads: every kernel and interpreter loop forced parallel, 1 vs 2 threads,
// bit-identical.

TEST(PlanThreads, ResultsIndependentOfThreadCount) {
  const int64_t saved = cpu::parallelThreshold();
  cpu::setParallelThreshold(0);
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  std::vector<float> out[2];
  for (int k = 0; k < 2; ++k) {
    EngineOptions o = testOptions();
    o.numThreads = k + 1;
    std::unique_ptr<Engine> e = loadEngine(planPath("tiny-hybrid"), o);
    ASSERT_NE(e, nullptr);
    const int64_t V = e->info().vocabSize;
    std::vector<SequenceInput> inputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      inputs[i].sequence = *e->addSequence();
      inputs[i].tokens = prompts[i].tokens;
    }
    std::vector<float> logits;
    ASSERT_TRUE(e->step(inputs, LogitsFor::AllTokens, logits).ok());
    out[k] = logits;
    std::vector<int32_t> next(prompts.size());
    int64_t row = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      row += static_cast<int64_t>(prompts[i].tokens.size());
      next[i] = argmax(logits.data() + (row - 1) * V, V);
      inputs[i].tokens = {&next[i], 1};
    }
    ASSERT_TRUE(e->step(inputs, LogitsFor::LastTokenPerSequence, logits).ok());
    out[k].insert(out[k].end(), logits.begin(), logits.end());
  }
  cpu::setParallelThreshold(saved);
  ASSERT_EQ(out[0].size(), out[1].size());
  EXPECT_EQ(maxAbsDiff(out[0].data(), out[1].data(), out[0].size()), 0.0);
}

// OpenMP crashes when asked for more threads than it can create: absurd
// counts are refused at load, naming the value and the limit.
TEST(PlanThreads, AbsurdCountsAreRefused) {
  const std::string plan = planPath("tiny-hybrid");
  for (int n : {kMaxThreads + 1, 100000, -1}) {
    EngineOptions o = testOptions();
    o.numThreads = n;
    StatusOr<std::unique_ptr<Engine>> e = Engine::load(plan, o);
    ASSERT_FALSE(e.ok()) << n;
    EXPECT_EQ(e.message(), plan + ": CPU threads must be in [0, 1024], got " +
                               std::to_string(n));
  }
  EngineOptions o = testOptions();
  o.numThreads = kMaxThreads;
  EXPECT_TRUE(Engine::load(plan, o).ok());
}

// ---------------------------------------------------------------------------
// pydoc-moe: the trained demo model (bf16 weights)

TEST(PlanPydoc, GreedyTokensAndDecodeTime) {
  EngineOptions o = testOptions();
  std::unique_ptr<Engine> engine = loadEngine(planPath("pydoc-moe"), o);
  ASSERT_NE(engine, nullptr);
  Engine &e = *engine;
  RefFile ref(modelDir("pydoc-moe") + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_EQ(prompts.size(), 4u);
  const int n = 4;
  const int64_t V = e.info().vocabSize;
  const int64_t moeLayers = countMoeLayers(e.info());
  EXPECT_GT(moeLayers, 0) << "layer kinds '" << e.info().layerKinds << "'";
  EXPECT_EQ(e.info().topK, 4);

  std::vector<SequenceInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    inputs[i].sequence = *e.addSequence();
    inputs[i].tokens = prompts[i].tokens;
  }
  std::vector<float> logits;
  StepStats stats;
  Status s = e.step(inputs, LogitsFor::AllTokens, logits, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(stats.expertCalls.size(), size_t(n));
  double worst = 0;
  std::vector<int32_t> next(n);
  int64_t row = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(prompts[i].tokens.size());
    const double err = relError(logits.data() + row * V,
                                prompts[i].prefillLogits.data(), size_t(T * V));
    worst = std::max(worst, err);
    EXPECT_LE(err, kTol) << "p" << i;
    EXPECT_EQ(stats.expertCalls[i], T * moeLayers * 4) << "p" << i;
    row += T;
    next[i] = argmax(logits.data() + (row - 1) * V, V);
  }
  const size_t S = prompts[0].greedyTokens.size();
  std::vector<std::vector<int64_t>> got(n);
  double decodeMs = 0;
  for (size_t st = 0; st < S; ++st) {
    for (int i = 0; i < n; ++i) {
      got[i].push_back(next[i]);
      inputs[i].tokens = {&next[i], 1};
    }
    const auto t0 = std::chrono::steady_clock::now();
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits, &stats);
    decodeMs += std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    ASSERT_TRUE(s.ok()) << s.message();
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(stats.expertCalls[i], moeLayers * 4);
      next[i] = argmax(logits.data() + i * V, V);
    }
  }
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(got[i], prompts[i].greedyTokens) << "p" << i;

  // One sequence alone: the latency of a single-token decode step.
  const int32_t solo = inputs[0].sequence;
  int32_t tok = next[0];
  constexpr int kSolo = 20;
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSolo; ++i) {
    s = stepOne(e, solo, {&tok, 1}, LogitsFor::LastTokenPerSequence, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    tok = argmax(logits.data(), V);
  }
  const double soloMs = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t1)
                            .count() /
                        kSolo;
  std::cout << "[ plan ] pydoc-moe: worst rel err prefill " << worst
            << "; decode step (1 thread): " << decodeMs / double(S)
            << " ms for 4 sequences, " << soloMs << " ms for 1 sequence\n";
}

// ---------------------------------------------------------------------------
// MoE: expertsPerToken (static top-k override) and expert statistics

TEST(PlanMoe, ExpertsPerTokenOverride) {
  std::unique_ptr<Engine> engine = loadEngine(planPath("tiny-hybrid"));
  ASSERT_NE(engine, nullptr);
  Engine &e = *engine;
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const Prompt &p = prompts.at(2);
  const int64_t T = static_cast<int64_t>(p.tokens.size());
  const int32_t k = e.info().topK;
  const int64_t moe = countMoeLayers(e.info());
  ASSERT_EQ(k, 4);
  ASSERT_EQ(moe, 3) << e.info().layerKinds;
  EXPECT_EQ(e.info().expertPolicy,
            "budget"); // nfc's default; the override wins

  auto run = [&](int32_t experts, std::vector<float> &logits,
                 StepStats &stats) {
    const int32_t seq = *e.addSequence();
    Status s = stepOne(e, seq, p.tokens, LogitsFor::AllTokens, logits, &stats,
                       experts);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(e.removeSequence(seq).ok());
  };
  std::vector<float> dflt, same, one;
  StepStats st0, st1, st2;
  run(0, dflt, st0);
  run(k, same, st1);
  run(1, one, st2);
  EXPECT_EQ(st0.expertCalls, std::vector<int64_t>{T * moe * k});
  EXPECT_EQ(st1.expertCalls, std::vector<int64_t>{T * moe * k});
  EXPECT_EQ(st2.expertCalls, std::vector<int64_t>{T * moe});
  EXPECT_EQ(maxAbsDiff(dflt.data(), same.data(), dflt.size()), 0.0);
  EXPECT_LE(relError(dflt.data(), p.prefillLogits.data(), dflt.size()), kTol);
  EXPECT_GT(maxAbsDiff(dflt.data(), one.data(), dflt.size()), 1e-3);

  // Mixed in one step: each sequence keeps its own k.
  const int32_t a = *e.addSequence(), b = *e.addSequence();
  SequenceInput in[2];
  in[0].sequence = a;
  in[0].tokens = p.tokens;
  in[0].expertsPerToken = 1;
  in[1].sequence = b;
  in[1].tokens = p.tokens;
  std::vector<float> mixed;
  StepStats st;
  ASSERT_TRUE(e.step(in, LogitsFor::AllTokens, mixed, &st).ok());
  EXPECT_EQ(st.expertCalls, (std::vector<int64_t>{T * moe, T * moe * k}));
  EXPECT_EQ(maxAbsDiff(mixed.data(), one.data(), one.size()), 0.0);
  EXPECT_EQ(maxAbsDiff(mixed.data() + one.size(), dflt.data(), dflt.size()),
            0.0);

  // More experts than the model's k: refused, nothing changes.
  in[0].expertsPerToken = k + 1;
  in[0].tokens = {&p.tokens[0], 1};
  in[1].tokens = {&p.tokens[0], 1};
  Status s = e.step(in, LogitsFor::AllTokens, mixed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("experts per token"), std::string::npos)
      << s.message();
  EXPECT_EQ(e.sequenceLength(a), T);
}

// Policy "budget" runs as static top-k until the scheduler lands (issue 6).
// The budget policy (issue 6): a budget of 1.0 is exactly static top-k; a
// smaller budget spends round(budget * k * tokens) expert calls per MoE layer
// (at least min_k per token), deterministically, and requests with different
// budgets can share a step without changing each other's results.
TEST(PlanMoe, BudgetOfOneIsStaticTopK) {
  std::unique_ptr<Engine> budget = loadEngine(planPath("tiny-hybrid-budget"));
  std::unique_ptr<Engine> topk = loadEngine(planPath("tiny-hybrid-topk"));
  ASSERT_NE(budget, nullptr);
  ASSERT_NE(topk, nullptr);
  EXPECT_EQ(budget->info().expertPolicy, "budget");
  EXPECT_EQ(topk->info().expertPolicy, "topk");
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const Prompt p = loadPrompts(ref).at(3);
  std::vector<float> a, b;
  StepStats sa, sb;
  SequenceInput in;
  in.tokens = p.tokens;
  in.expertBudget = 1.0f;
  in.sequence = *budget->addSequence();
  ASSERT_TRUE(budget->step({&in, 1}, LogitsFor::AllTokens, a, &sa).ok());
  in.sequence = *topk->addSequence();
  ASSERT_TRUE(topk->step({&in, 1}, LogitsFor::AllTokens, b, &sb).ok());
  EXPECT_EQ(sa.expertCalls, sb.expertCalls);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(maxAbsDiff(a.data(), b.data(), a.size()), 0.0);
}

TEST(PlanMoe, BudgetSpendsItsShareDeterministically) {
  std::unique_ptr<Engine> e = loadEngine(planPath("tiny-hybrid-budget"));
  ASSERT_NE(e, nullptr);
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const Prompt p = loadPrompts(ref).at(3);
  const int64_t T = static_cast<int64_t>(p.tokens.size());
  const int64_t k = e->info().topK,
                moeLayers = std::count(e->info().layerKinds.begin(),
                                       e->info().layerKinds.end(), 'E');
  auto run = [&](float budget, std::vector<float> &logits) {
    SequenceInput in;
    in.tokens = p.tokens;
    in.expertBudget = budget;
    in.sequence = *e->addSequence();
    StepStats stats;
    EXPECT_TRUE(e->step({&in, 1}, LogitsFor::AllTokens, logits, &stats).ok());
    EXPECT_TRUE(e->removeSequence(in.sequence).ok());
    return stats.expertCalls.at(0);
  };
  std::vector<float> a, b, full;
  EXPECT_EQ(run(0.5f, a), moeLayers * std::llround(0.5 * k * T));
  EXPECT_EQ(run(0.5f, b), moeLayers * std::llround(0.5 * k * T));
  EXPECT_EQ(maxAbsDiff(a.data(), b.data(), a.size()), 0.0);
  // At least one expert per token even at a tiny budget.
  EXPECT_EQ(run(0.01f, b), moeLayers * T);
  run(1.0f, full);
  EXPECT_GT(maxAbsDiff(a.data(), full.data(), a.size()), 0.0);
}

TEST(PlanMoe, MixedBudgetsShareAStep) {
  std::unique_ptr<Engine> e = loadEngine(planPath("tiny-hybrid-budget"));
  ASSERT_NE(e, nullptr);
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const std::vector<Prompt> prompts = loadPrompts(ref);
  const Prompt &p = prompts.at(3), &q = prompts.at(2);
  auto alone = [&](const Prompt &pr, float budget) {
    SequenceInput in;
    in.tokens = pr.tokens;
    in.expertBudget = budget;
    in.sequence = *e->addSequence();
    std::vector<float> logits;
    EXPECT_TRUE(e->step({&in, 1}, LogitsFor::AllTokens, logits).ok());
    EXPECT_TRUE(e->removeSequence(in.sequence).ok());
    return logits;
  };
  const std::vector<float> a = alone(p, 1.0f), b = alone(q, 0.5f);
  SequenceInput in[2];
  in[0].tokens = p.tokens;
  in[0].expertBudget = 1.0f;
  in[0].sequence = *e->addSequence();
  in[1].tokens = q.tokens;
  in[1].expertBudget = 0.5f;
  in[1].sequence = *e->addSequence();
  std::vector<float> both;
  ASSERT_TRUE(e->step(in, LogitsFor::AllTokens, both).ok());
  ASSERT_EQ(both.size(), a.size() + b.size());
  EXPECT_EQ(maxAbsDiff(both.data(), a.data(), a.size()), 0.0);
  EXPECT_EQ(maxAbsDiff(both.data() + a.size(), b.data(), b.size()), 0.0);
}

// Observability: per-process utilisation counters equal the histogram of the
// experts Hugging Face selected (reference routes), and per-request stats
// break expert calls down by MoE layer.
TEST(PlanMoe, UtilizationMatchesReferenceRoutes) {
  std::unique_ptr<Engine> e = loadEngine(planPath("tiny-hybrid"));
  ASSERT_NE(e, nullptr);
  RefFile ref(test::fixtureDir("tiny-hybrid") + "/reference.safetensors");
  const Prompt p = loadPrompts(ref).at(3);
  const ModelInfo &info = e->info();
  SequenceInput in;
  in.tokens = p.tokens;
  in.sequence = *e->addSequence();
  std::vector<float> logits;
  StepStats stats;
  ASSERT_TRUE(e->step({&in, 1}, LogitsFor::AllTokens, logits, &stats).ok());
  const auto &used = e->expertUtilization();
  ASSERT_EQ(static_cast<int32_t>(used.size()), info.numMoeLayers);
  int32_t moe = 0;
  for (size_t layer = 0; layer < info.layerKinds.size(); ++layer) {
    if (info.layerKinds[layer] != 'E')
      continue;
    const std::vector<int64_t> routes =
        ref.i64("p3.routes.layer" + std::to_string(layer));
    std::vector<int64_t> histogram(static_cast<size_t>(info.numExperts), 0);
    for (int64_t expert : routes)
      ++histogram.at(static_cast<size_t>(expert));
    EXPECT_EQ(used.at(moe), histogram) << "MoE layer " << layer;
    EXPECT_EQ(stats.expertCallsPerLayer.at(0).at(moe),
              static_cast<int64_t>(routes.size()));
    ++moe;
  }
  EXPECT_EQ(moe, info.numMoeLayers);
  EXPECT_DOUBLE_EQ(stats.budgetSpent.at(0), 1.0);
  e->resetExpertUtilization();
  for (const auto &layer : e->expertUtilization())
    for (int64_t c : layer)
      EXPECT_EQ(c, 0);
}

// ---------------------------------------------------------------------------
// Step errors: clean Status, nothing changed

TEST(PlanSteps, BadStepsAreRefused) {
  EngineOptions o = testOptions();
  o.kvPages = 4; // 64 positions with the plan's 16-token pages
  o.maxSequences = 3;
  std::unique_ptr<Engine> engine = loadEngine(planPath("tiny-hybrid"), o);
  ASSERT_NE(engine, nullptr);
  Engine &e = *engine;
  EXPECT_EQ(e.info().maxContext, 64);
  const int32_t a = *e.addSequence(), b = *e.addSequence();
  std::vector<float> logits;
  std::vector<int32_t> toks(40, 7);
  auto expectError = [&](std::span<const SequenceInput> in,
                         const std::string &what) {
    Status s = e.step(in, LogitsFor::AllTokens, logits);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
    EXPECT_EQ(e.sequenceLength(a), 0);
    EXPECT_EQ(e.sequenceLength(b), 0);
  };
  SequenceInput in[2];
  in[0].sequence = a;
  in[0].tokens = toks;
  in[1].sequence = b;
  in[1].tokens = toks;
  // 2 x 40 tokens need 6 pages; 4 exist.
  expectError(in, "KV pages");
  in[1].sequence = a;
  expectError(in, "appears twice");
  in[1].sequence = 12345;
  expectError(in, "no such sequence");
  in[1].sequence = b;
  in[1].tokens = {};
  expectError(in, "no tokens");
  std::vector<int32_t> oov = {1, 2, 512};
  in[1].tokens = oov;
  expectError(in, "outside the vocabulary");
  in[1].tokens = toks;
  in[1].expertBudget = -1.0f;
  expectError({&in[1], 1}, "budget");
  in[1].expertBudget = 1.0f;
  std::vector<int32_t> many(65, 7);
  in[0].tokens = many;
  expectError({&in[0], 1}, "context");

  // A step that fits still works, and so does the next one.
  in[0].tokens = toks;
  ASSERT_TRUE(e.step({&in[0], 1}, LogitsFor::AllTokens, logits).ok());
  EXPECT_EQ(e.sequenceLength(a), 40);
  EXPECT_EQ(logits.size(), size_t(40 * e.info().vocabSize));
  std::vector<int32_t> more(30, 5);
  in[0].tokens = more;
  Status s = e.step({&in[0], 1}, LogitsFor::AllTokens, logits);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("context"), std::string::npos) << s.message();
  // Pages are returned when a sequence leaves.
  ASSERT_TRUE(e.removeSequence(a).ok());
  EXPECT_FALSE(e.removeSequence(a).ok());
  in[1].tokens = std::span<const int32_t>(many).first(64);
  ASSERT_TRUE(
      e.step({&in[1], 1}, LogitsFor::LastTokenPerSequence, logits).ok());
  EXPECT_EQ(logits.size(), size_t(e.info().vocabSize));
  // Slots.
  ASSERT_TRUE(e.addSequence().ok());
  ASSERT_TRUE(e.addSequence().ok());
  StatusOr<int32_t> full = e.addSequence();
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("slots"), std::string::npos);
  // An empty step is fine.
  ASSERT_TRUE(e.step({}, LogitsFor::LastTokenPerSequence, logits).ok());
  EXPECT_TRUE(logits.empty());
}

} // namespace

// ---------------------------------------------------------------------------
// SequenceTable (engine/plan_common.h): the sequence ids both engines hand out.

TEST(SequenceTable, IdsAreNeverReusedAndSlotsAreFreedWithThem) {
  cpu::MambaShape mamba;
  mamba.numHeads = 2;
  mamba.headDim = 4;
  mamba.stateSize = 4;
  mamba.nGroups = 1;
  mamba.convKernel = 4;
  cpu::CacheConfig cfg;
  cfg.numSlots = 2;
  StatusOr<cpu::Caches> caches =
      cpu::Caches::create(std::span(&mamba, 1), {}, cfg);
  ASSERT_TRUE(caches.ok()) << caches.message();
  engine::SequenceTable table(*caches);

  StatusOr<int32_t> a = table.add(2), b = table.add(2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*table.slot(*a), *table.slot(*b));
  EXPECT_EQ(table.length(*a), 0);
  // Both slots taken: a third sequence is refused with a clear message.
  StatusOr<int32_t> c = table.add(2);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("all 2 sequence slots are in use"),
            std::string::npos);
  // Removing one frees its slot; the new sequence gets a new id.
  const int32_t freed = *table.slot(*a);
  ASSERT_TRUE(table.remove(*a).ok());
  EXPECT_FALSE(table.slot(*a).has_value());
  EXPECT_EQ(table.length(*a), -1);
  EXPECT_FALSE(table.remove(*a).ok());
  StatusOr<int32_t> d = table.add(2);
  ASSERT_TRUE(d.ok());
  EXPECT_GT(*d, *b);
  EXPECT_EQ(*table.slot(*d), freed);
  // A failing prepare step frees the slot it was given and hands out no id.
  ASSERT_TRUE(table.remove(*d).ok());
  int32_t prepared = -1;
  StatusOr<int32_t> e = table.add(2, [&](int32_t slot) {
    prepared = slot;
    return Status::error("device state could not be cleared");
  });
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.message(), "device state could not be cleared");
  EXPECT_EQ(prepared, freed);
  StatusOr<int32_t> f = table.add(2);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*table.slot(*f), freed);
  EXPECT_EQ(*f, *d + 1); // the failed add consumed no id
}
