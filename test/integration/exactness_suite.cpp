// The exactness suite's tests, once for every backend (exactness_suite.h
// says which binary instantiates which backend).
#include "exactness_suite.h"

#include <algorithm>
#include <chrono>
#include <iostream>

namespace nf::test::integration {

using namespace nf::test::ref;

void PrintTo(const ExactnessCase &c, std::ostream *os) {
  *os << (c.backend ? c.backend->name : "?") << " " << c.fixture;
}

const std::vector<std::string> &exactnessFixtures() {
  static const std::vector<std::string> fixtures = {
      "tiny-hybrid", "tiny-hybrid-bf16", "tiny-nano", "tiny-dense",
      "tiny-latent"};
  return fixtures;
}

std::vector<ExactnessCase>
exactnessCases(const ExactnessBackend &backend,
               const std::vector<std::string> &fixtures) {
  std::vector<ExactnessCase> out;
  for (const std::string &f : fixtures)
    out.push_back({&backend, f, f == "pydoc-moe"});
  return out;
}

void Exactness::SetUp() {
  const ExactnessBackend &b = backend();
  plan_ = b.plan(fixture());
  if (b.require) {
    b.require(plan_);
    if (IsSkipped() || HasFatalFailure())
      return;
  }
  engine_ = loadEngine(plan_, b.options(fixture()));
  ASSERT_NE(engine_, nullptr);
  ASSERT_EQ(engine_->info().backend, b.name);
  ref_ = std::make_unique<RefFile>(b.modelDir(fixture()) +
                                   "/reference.safetensors");
  prompts_ = loadPrompts(*ref_);
  ASSERT_FALSE(prompts_.empty());
  V_ = engine_->info().vocabSize;
}

double Exactness::batchDiff(const float *batched, const float *single,
                            size_t n) const {
  return backend().batchMetric == ExactnessBackend::BatchMetric::MaxAbs
             ? maxAbsDiff(batched, single, n)
             : relError(batched, single, n);
}

namespace {

// ---------------------------------------------------------------------------
// Each prompt alone: prefill logits, then greedy decode (each step fed its
// own argmax, which must be the reference's greedy token), against the
// reference.

TEST_P(Exactness, PrefillAndGreedyMatchReference) {
  const ExactnessBackend &b = backend();
  const std::string &name = fixture();
  Engine &e = *engine_;
  double worstPrefill = 0, worstDecode = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const Prompt &p = prompts_[i];
    StatusOr<int32_t> seq = e.addSequence();
    ASSERT_TRUE(seq.ok()) << seq.message();
    const int64_t T = static_cast<int64_t>(p.tokens.size());
    std::vector<float> logits;
    Status s = stepOne(e, *seq, p.tokens, LogitsFor::AllTokens, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), p.prefillLogits.size());
    ASSERT_EQ(e.sequenceLength(*seq), T);
    const double pe =
        relError(logits.data(), p.prefillLogits.data(), logits.size());
    worstPrefill = std::max(worstPrefill, pe);
    EXPECT_LE(pe, b.refTol) << name << " p" << i << " prefill";

    int32_t tok = argmax(logits.data() + (T - 1) * V_, V_);
    double de = 0;
    for (size_t st = 0; st < p.greedyTokens.size(); ++st) {
      ASSERT_EQ(tok, p.greedyTokens[st])
          << name << " p" << i << " greedy step " << st;
      s = stepOne(e, *seq, {&tok, 1}, LogitsFor::LastTokenPerSequence, logits);
      ASSERT_TRUE(s.ok()) << s.message();
      ASSERT_EQ(logits.size(), size_t(V_));
      if (p.greedyLogits.empty()) {
        ASSERT_TRUE(GetParam().greedyLogitsOptional)
            << name << " p" << i << ": the reference has no greedy logits";
      } else {
        de = std::max(
            de, relError(logits.data(), p.greedyLogits.data() + st * V_, V_));
      }
      tok = argmax(logits.data(), V_);
    }
    worstDecode = std::max(worstDecode, de);
    EXPECT_LE(de, b.refTol) << name << " p" << i << " greedy logits";
    ASSERT_TRUE(e.removeSequence(*seq).ok());
    EXPECT_EQ(e.sequenceLength(*seq), -1);
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  RecordProperty("worst_prefill", std::to_string(worstPrefill));
  RecordProperty("worst_decode", std::to_string(worstDecode));
  std::cout << b.tag << " " << name << ": worst rel err prefill "
            << worstPrefill << ", decode " << worstDecode << " ("
            << prompts_.size() << " prompts, " << ms << " ms; "
            << engine_->info().device << ")\n";
}

// ---------------------------------------------------------------------------
// All prompts (different lengths) in one prefill step (scattered slots and
// pages), then decoded in lockstep: equal to one sequence at a time within
// the backend's batch tolerance (CPU: bit-identical), and to the reference.

TEST_P(Exactness, BatchedStepsEqualOneAtATime) {
  const ExactnessBackend &b = backend();
  const bool argmaxFeed = b.feed == Feed::Argmax;
  Engine &e = *engine_;
  const std::vector<SingleRun> single = runOneAtATime(e, prompts_, b.feed);
  ASSERT_EQ(single.size(), prompts_.size());
  const int n = static_cast<int>(prompts_.size());

  // A placeholder takes the first slot and some pages, then leaves.
  StatusOr<int32_t> dummy = e.addSequence();
  ASSERT_TRUE(dummy.ok());
  std::vector<int32_t> filler(37, 3);
  std::vector<float> logits;
  ASSERT_TRUE(
      stepOne(e, *dummy, filler, LogitsFor::LastTokenPerSequence, logits).ok());
  std::vector<int32_t> seqs(n);
  for (int i = n - 1; i >= 0; --i) {
    StatusOr<int32_t> s = e.addSequence();
    ASSERT_TRUE(s.ok()) << s.message();
    seqs[i] = *s;
  }
  ASSERT_TRUE(e.removeSequence(*dummy).ok());

  std::vector<SequenceInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    inputs[i].sequence = seqs[i];
    inputs[i].tokens = prompts_[i].tokens;
  }
  Status s = e.step(inputs, LogitsFor::AllTokens, logits);
  ASSERT_TRUE(s.ok()) << s.message();
  double diff = 0, worst = 0;
  std::vector<int32_t> next(n);
  int64_t row = 0;
  for (int i = 0; i < n; ++i) {
    const float *rows = logits.data() + row * V_;
    const size_t count = prompts_[i].prefillLogits.size();
    ASSERT_EQ(single[i].prefill.size(), count);
    diff = std::max(diff, batchDiff(rows, single[i].prefill.data(), count));
    worst = std::max(worst,
                     relError(rows, prompts_[i].prefillLogits.data(), count));
    row += static_cast<int64_t>(prompts_[i].tokens.size());
    next[i] = argmax(rows + count - V_, V_);
  }
  EXPECT_LE(diff, b.batchTol) << "batched prefill differs from one at a time";
  EXPECT_LE(worst, b.refTol);

  const size_t S = prompts_[0].greedyTokens.size();
  double worstDecode = 0;
  for (size_t st = 0; st < S; ++st) {
    for (int i = 0; i < n; ++i) {
      if (argmaxFeed) {
        ASSERT_EQ(next[i], prompts_[i].greedyTokens[st]) << "p" << i;
      } else {
        next[i] = static_cast<int32_t>(prompts_[i].greedyTokens[st]);
      }
      inputs[i].tokens = {&next[i], 1};
    }
    s = e.step(inputs, LogitsFor::LastTokenPerSequence, logits);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), size_t(n * V_));
    for (int i = 0; i < n; ++i) {
      const float *r = logits.data() + i * V_;
      diff = std::max(diff, batchDiff(r, single[i].decode[st].data(), V_));
      if (prompts_[i].greedyLogits.empty()) {
        ASSERT_TRUE(GetParam().greedyLogitsOptional)
            << fixture() << " p" << i << ": the reference has no greedy logits";
      } else {
        worstDecode = std::max(
            worstDecode,
            relError(r, prompts_[i].greedyLogits.data() + st * V_, V_));
      }
    }
    if (argmaxFeed)
      for (int i = 0; i < n; ++i)
        next[i] = argmax(logits.data() + i * V_, V_);
  }
  EXPECT_LE(diff, b.batchTol) << "batched decode differs from one at a time";
  EXPECT_LE(worstDecode, b.refTol);
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(e.sequenceLength(seqs[i]),
              int64_t(prompts_[i].tokens.size() + S));
  RecordProperty("batched_vs_single", std::to_string(diff));
  const bool relative =
      b.batchMetric == ExactnessBackend::BatchMetric::Relative;
  std::cout << b.tag << " " << fixture() << " batched: max "
            << (relative ? "rel " : "") << "|batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "")
            << ", worst rel err prefill " << worst << ", decode " << worstDecode
            << "\n";
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(e.removeSequence(seqs[i]).ok());
}

} // namespace
} // namespace nf::test::integration
