// nf::Engine's CUDA backend on plans compiled with `nfc compile
// --target=cuda` from every fixture and pydoc-moe (GPU only): the exactness
// suite (exactness_suite.h) on the CUDA backend, prefill and greedy-decode
// logits within 1e-3 * max(1, max|ref|) of the Hugging Face references and
// the same greedy tokens, several sequences of different lengths batched ==
// one at a time (within 1e-5, relative); the wide decode bucket against one
// at a time; CUDA == CPU on the same plan, long prompts included; graph ==
// plain launches; top-logits lists, with sampler noise and row totals, and
// nf_decode_sample. See cuda_test_util.h for the environment.
#include "engine/engine.h"
#include "nf/nf.h"
#include "sampling/philox.h"
#include "sampling/sampler.h"

#include "ReferenceUtil.h"
#include "cuda_test_util.h"
#include "exactness_suite.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::ref;
using namespace nf::test::integration;
using namespace nf::test::gpu;

class CudaFixture : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    NF_REQUIRE_GPU();
    plan_ = cudaPlan(GetParam());
    NF_REQUIRE_PLAN(plan_);
    engine_ = loadEngine(plan_, testOptions("cuda", modelDir(GetParam())));
    ASSERT_NE(engine_, nullptr);
    ASSERT_EQ(engine_->info().backend, "cuda");
    ref_ = std::make_unique<RefFile>(modelDir(GetParam()) +
                                     "/reference.safetensors");
    prompts_ = loadPrompts(*ref_);
    ASSERT_FALSE(prompts_.empty());
    V_ = engine_->info().vocabSize;
  }

  /// One sequence per prompt with two samplers of params(i) (one draws
  /// from the lists, one from the rows), its prompt run, and its greedy
  /// token as the input of the next (decode) step.
  struct SampledSequences {
    std::vector<SequenceInput> in;
    std::vector<int32_t> seqs, next;
    std::vector<sampling::Sampler> fromTop, fromRow;
  };
  template <class Params>
  void startSampled(Params params, SampledSequences &s) {
    Engine &e = *engine_;
    const size_t n = prompts_.size();
    s.in.resize(n);
    s.next.resize(n);
    for (size_t i = 0; i < n; ++i) {
      StatusOr<int32_t> seq = e.addSequence();
      ASSERT_TRUE(seq.ok()) << seq.message();
      s.seqs.push_back(*seq);
      s.in[i].sequence = *seq;
      s.in[i].tokens = prompts_[i].tokens;
      const sampling::SamplerParams p = params(i);
      s.fromTop.push_back(*sampling::Sampler::create(p));
      s.fromRow.push_back(*sampling::Sampler::create(p));
    }
    std::vector<float> logits;
    ASSERT_TRUE(e.step(s.in, LogitsFor::LastTokenPerSequence, logits).ok());
    for (size_t i = 0; i < n; ++i) {
      s.next[i] = argmax(logits.data() + i * V_, V_);
      s.in[i].tokens = {&s.next[i], 1};
    }
  }

  std::string plan_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RefFile> ref_;
  std::vector<Prompt> prompts_;
  int64_t V_ = 0;
};

TEST_P(CudaFixture, WideDecodeBucketEqualsOneAtATime) {
  const double diff =
      wideDecodeDifference(*engine_, plan_, modelDir(GetParam()), prompts_);
  if (diff < 0 && !HasFailure())
    GTEST_SKIP() << "decode steps of fewer than 24 tokens";
  EXPECT_LE(diff, kBatchTol) << "wide decode differs from one at a time";
  std::cout << "[ cuda ] " << GetParam() << " wide decode (24 sequences): "
            << "max rel |batched - single| " << diff
            << (diff == 0 ? " (bit-identical)" : "") << "\n";
}

// The CPU backend on the same plan (it ignores the binaries) agrees.
TEST_P(CudaFixture, MatchesTheCpuBackend) {
  std::unique_ptr<Engine> cpu =
      loadEngine(plan_, testOptions("cpu", modelDir(GetParam())));
  ASSERT_NE(cpu, nullptr);
  const std::vector<SingleRun> a =
      runOneAtATime(*engine_, prompts_, Feed::Reference);
  const std::vector<SingleRun> b =
      runOneAtATime(*cpu, prompts_, Feed::Reference);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, relError(a[i].prefill.data(), b[i].prefill.data(),
                                     a[i].prefill.size()));
    for (size_t s = 0; s < a[i].decode.size(); ++s)
      worst = std::max(
          worst, relError(a[i].decode[s].data(), b[i].decode[s].data(), V_));
  }
  EXPECT_LE(worst, kCudaTol);
  std::cout << "[ cuda ] " << GetParam() << ": max rel |cuda - cpu| " << worst
            << "\n";
}

// Prompts longer than the chunked SSM scan's 256-token chunks (several
// chunks per sequence, walked in parallel from carried inits), two of them
// batched in one step with different lengths and chunk boundaries, then a
// few decode steps (which read the state the last chunk wrote): the CUDA
// logits must match the CPU backend's (sequential scan) per sequence.
TEST_P(CudaFixture, LongPromptsMatchTheCpuBackend) {
  std::unique_ptr<Engine> cpu =
      loadEngine(plan_, testOptions("cpu", modelDir(GetParam())));
  ASSERT_NE(cpu, nullptr);
  std::vector<std::vector<int32_t>> prompts(2);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const size_t len = i == 0 ? 700 : 301;
    for (size_t k = 0; prompts[i].size() < len; ++k) {
      const Prompt &p = prompts_[(i + k) % prompts_.size()];
      for (int64_t t : p.tokens)
        if (prompts[i].size() < len)
          prompts[i].push_back(static_cast<int32_t>(t));
    }
  }
  double worst = 0;
  std::vector<std::vector<float>> got(2), want(2);
  std::vector<int32_t> ids[2];
  for (int which = 0; which < 2; ++which) {
    Engine &e = which == 0 ? *engine_ : *cpu;
    std::vector<SequenceInput> inputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      StatusOr<int32_t> seq = e.addSequence();
      ASSERT_TRUE(seq.ok()) << seq.message();
      ids[which].push_back(*seq);
      inputs[i].sequence = *seq;
      inputs[i].tokens = prompts[i];
    }
    std::vector<float> &out = which == 0 ? got[0] : want[0];
    Status s = e.step(inputs, LogitsFor::AllTokens, out);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<int32_t> next(prompts.size());
    for (int st = 0; st < 3; ++st) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        next[i] = prompts[i][static_cast<size_t>(st) * 7 % prompts[i].size()];
        inputs[i].tokens = {&next[i], 1};
      }
      std::vector<float> l;
      s = e.step(inputs, LogitsFor::LastTokenPerSequence, l);
      ASSERT_TRUE(s.ok()) << s.message();
      std::vector<float> &acc = which == 0 ? got[1] : want[1];
      acc.insert(acc.end(), l.begin(), l.end());
    }
    for (int32_t id : ids[which])
      EXPECT_TRUE(e.removeSequence(id).ok());
  }
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    const size_t rows = got[k].size() / static_cast<size_t>(V_);
    for (size_t r = 0; r < rows; ++r)
      worst = std::max(
          worst, relError(got[k].data() + r * V_, want[k].data() + r * V_, V_));
  }
  EXPECT_LE(worst, kCudaTol);
  std::cout << "[ cuda ] " << GetParam()
            << ": long prompts, max rel |cuda - cpu| " << worst << "\n";
}

// Decode through the captured graph == the same kernels launched one by one.
TEST_P(CudaFixture, GraphEqualsLaunches) {
  EngineOptions o = testOptions("cuda", modelDir(GetParam()));
  o.cudaGraphs = false;
  std::unique_ptr<Engine> plain = loadEngine(plan_, o);
  ASSERT_NE(plain, nullptr);
  const std::vector<SingleRun> a =
      runOneAtATime(*engine_, prompts_, Feed::Reference);
  const std::vector<SingleRun> b =
      runOneAtATime(*plain, prompts_, Feed::Reference);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t s = 0; s < a[i].decode.size(); ++s)
      worst = std::max(
          worst, relError(a[i].decode[s].data(), b[i].decode[s].data(), V_));
  EXPECT_LE(worst, kBatchTol);
  std::cout << "[ cuda ] " << GetParam() << ": graph vs launches " << worst
            << "\n";
}

// Decode steps asked for the top logits: each sequence's list is its row's
// largest values, ranked by value then id (the row read back after the
// step), and a greedy sampler draws the row's argmax from it.
TEST_P(CudaFixture, TopLogitsAreTheRowsLargest) {
  Engine &e = *engine_;
  ASSERT_EQ(e.info().topLogits, 64) << "plan without top-logits launches";
  std::vector<SequenceInput> in(prompts_.size());
  std::vector<int32_t> seqs;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    StatusOr<int32_t> seq = e.addSequence();
    ASSERT_TRUE(seq.ok()) << seq.message();
    seqs.push_back(*seq);
    in[i].sequence = *seq;
    in[i].tokens = prompts_[i].tokens;
  }
  std::vector<float> logits;
  TopLogits top;
  // A prefill step returns rows.
  ASSERT_TRUE(e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
  EXPECT_EQ(top.k, 0);
  ASSERT_EQ(logits.size(), prompts_.size() * size_t(V_));
  std::vector<int32_t> next(prompts_.size());
  for (size_t i = 0; i < prompts_.size(); ++i) {
    next[i] = argmax(logits.data() + i * V_, V_);
    in[i].tokens = {&next[i], 1};
  }
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    ASSERT_EQ(top.ids.size(), prompts_.size() * 64);
    std::vector<float> row(static_cast<size_t>(V_));
    for (size_t i = 0; i < prompts_.size(); ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      std::vector<int32_t> order(static_cast<size_t>(V_));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (size_t j = 0; j < 64; ++j) {
        const bool listed = j < order.size();
        ASSERT_EQ(top.ids[i * 64 + j], listed ? order[j] : -1)
            << GetParam() << " sequence " << i << " rank " << j;
        if (listed)
          ASSERT_EQ(top.values[i * 64 + j], row[order[j]]);
      }
      next[i] = top.ids[i * 64];
      EXPECT_EQ(next[i], argmax(row.data(), V_));
    }
  }
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// Decode steps whose lists are ranked by temperature samplers' noisy keys
// (one sequence greedy, by its logits): each list is the row ranked by
// float(logit / T + G) computed on the host, its values the logits, and the
// sampler draws from it what it draws from the row.
TEST_P(CudaFixture, NoisyTopListsDrawWhatTheRowDraws) {
  Engine &e = *engine_;
  ASSERT_TRUE(e.info().topLogitsNoise) << "plan before format 1.6";
  const size_t n = prompts_.size();
  SampledSequences ss;
  startSampled(
      [](size_t i) {
        sampling::SamplerParams p;
        p.temperature = i == 0 ? 0.0f : 0.5f + 0.4f * static_cast<float>(i);
        p.seed = 1000 + i;
        return p;
      },
      ss);
  if (HasFatalFailure())
    return;
  auto &[in, seqs, next, fromTop, fromRow] = ss;
  std::vector<float> logits;
  TopLogits top;
  std::vector<float> row(static_cast<size_t>(V_));
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    top.noise.clear();
    for (size_t i = 0; i < n; ++i) {
      const auto z = fromTop[i].noiseDraw();
      top.noise.push_back(z ? TopNoise{z->temperature, z->seed, z->draw, true}
                            : TopNoise{});
    }
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      const TopNoise z = top.noise[i];
      std::vector<float> key(row);
      if (z.keys)
        for (size_t t = 0; t < key.size(); ++t)
          if (!std::isnan(row[t]))
            key[t] = static_cast<float>(
                static_cast<double>(row[t]) /
                    static_cast<double>(z.temperature) +
                sampling::gumbelNoise(z.seed, z.draw,
                                      static_cast<uint32_t>(t)));
      std::vector<int32_t> order;
      for (int32_t t = 0; t < V_; ++t)
        if (!std::isnan(key[static_cast<size_t>(t)]))
          order.push_back(t);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return key[a] > key[b] || (key[a] == key[b] && a < b);
      });
      for (size_t j = 0; j < 64; ++j) {
        const bool listed = j < order.size();
        ASSERT_EQ(top.ids[i * 64 + j], listed ? order[j] : -1)
            << GetParam() << " sequence " << i << " rank " << j;
        if (listed)
          ASSERT_EQ(top.values[i * 64 + j], row[order[j]]);
      }
      StatusOr<std::optional<int32_t>> t = fromTop[i].sampleTop(
          std::span<const int32_t>(top.ids.data() + i * 64, 64),
          std::span<const float>(top.values.data() + i * 64, 64), V_, z.keys);
      ASSERT_TRUE(t.ok()) << t.message();
      ASSERT_TRUE(t->has_value()) << "a list that could not decide";
      StatusOr<int32_t> want = fromRow[i].sample(row);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(**t, *want) << GetParam() << " sequence " << i;
      next[i] = **t;
    }
  }
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// Decode steps whose lists come with the rows' totals (top-p samplers at
// several temperatures, one sequence without): each total is the host's
// sum of exp((x - max) / T) over the row read back, to 1e-12 relative, and
// a top-p sampler draws from the list what it draws from the row.
TEST_P(CudaFixture, TopListsCarryTheRowTotals) {
  Engine &e = *engine_;
  ASSERT_TRUE(e.info().topLogitsTotals) << "plan without totals";
  const size_t n = prompts_.size();
  SampledSequences ss;
  startSampled(
      [](size_t i) {
        sampling::SamplerParams p;
        p.temperature = 0.3f + 0.3f * static_cast<float>(i);
        p.topP = i == 0 ? 1.0f : 0.5f + 0.1f * static_cast<float>(i % 5);
        p.seed = 77 + i;
        return p;
      },
      ss);
  if (HasFatalFailure())
    return;
  auto &[in, seqs, next, fromTop, fromRow] = ss;
  std::vector<float> logits;
  TopLogits top;
  std::vector<float> row(static_cast<size_t>(V_));
  int fromLists = 0;
  for (int stepNo = 0; stepNo < 3; ++stepNo) {
    top.noise.clear();
    for (size_t i = 0; i < n; ++i) {
      TopNoise z;
      z.temperature = fromTop[i].params().temperature;
      z.total = fromTop[i].needsRowTotal();
      top.noise.push_back(z);
    }
    ASSERT_TRUE(
        e.step(in, LogitsFor::LastTokenTop, logits, nullptr, &top).ok());
    ASSERT_EQ(top.k, 64);
    ASSERT_EQ(top.totals.size(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(e.lastTokenRow(i, row).ok());
      if (!top.noise[i].total) {
        EXPECT_TRUE(std::isnan(top.totals[i]));
      } else {
        float m = -std::numeric_limits<float>::infinity();
        for (float v : row)
          m = v > m ? v : m;
        double want = 0.0;
        for (float v : row)
          if (v > -std::numeric_limits<float>::infinity())
            want +=
                std::exp((static_cast<double>(v) - m) *
                         (1.0 / static_cast<double>(top.noise[i].temperature)));
        EXPECT_NEAR(top.totals[i], want, 1e-12 * want)
            << GetParam() << " sequence " << i;
      }
      StatusOr<std::optional<int32_t>> t = fromTop[i].sampleTop(
          std::span<const int32_t>(top.ids.data() + i * 64, 64),
          std::span<const float>(top.values.data() + i * 64, 64), V_, false,
          top.totals[i]);
      ASSERT_TRUE(t.ok()) << t.message();
      fromLists += t->has_value() ? 1 : 0;
      const int32_t got = t->has_value() ? **t : *fromTop[i].sample(row);
      StatusOr<int32_t> want = fromRow[i].sample(row);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(got, *want) << GetParam() << " sequence " << i;
      next[i] = got;
    }
  }
  std::cout << "[ cuda ] " << GetParam() << ": top-p drawn from the lists "
            << fromLists << " of " << 3 * n << " times\n";
  for (int32_t s : seqs)
    ASSERT_TRUE(e.removeSequence(s).ok());
}

// One sampler for two entries of a batch (nf_decode_sample): the second
// entry's list was ranked for the draw the first one consumed, so it must
// draw from its row; the tokens are those of drawing one entry after the
// other from the rows (nf_decode, nf_sample).
TEST_P(CudaFixture, CApiSamplerSharedByTwoEntriesDrawsInTurn) {
  nf_model_params p = nf_model_default_params();
  p.backend = "cuda";
  const std::string dir = modelDir(GetParam());
  p.weights_dir = dir.c_str();
  nf_model *a = nullptr, *b = nullptr;
  ASSERT_EQ(nf_model_load(plan_.c_str(), &p, &a), NF_OK) << nf_last_error();
  ASSERT_EQ(nf_model_load(plan_.c_str(), &p, &b), NF_OK) << nf_last_error();
  nf_sampler_params sp = nf_sampler_default_params();
  sp.temperature = 0.9f;
  sp.seed = 21;
  nf_sampler *sa = nullptr, *sb = nullptr;
  ASSERT_EQ(nf_sampler_create(&sp, &sa), NF_OK);
  ASSERT_EQ(nf_sampler_create(&sp, &sb), NF_OK);
  nf_seq_input ia[2] = {}, ib[2] = {};
  int32_t ta[2] = {prompts_.front().tokens[0], prompts_.back().tokens[0]};
  int32_t tb[2] = {ta[0], ta[1]};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(nf_seq_add(a, &ia[i].seq_id), NF_OK);
    ASSERT_EQ(nf_seq_add(b, &ib[i].seq_id), NF_OK);
    ia[i].tokens = &ta[i];
    ib[i].tokens = &tb[i];
    ia[i].n_tokens = ib[i].n_tokens = 1;
  }
  nf_batch ba = {ia, 2, nullptr}, bb = {ib, 2, nullptr};
  nf_sampler *const both[2] = {sa, sa};
  std::vector<float> logits(2 * static_cast<size_t>(V_));
  for (int step = 0; step < 4; ++step) {
    int32_t got[2];
    ASSERT_EQ(nf_decode_sample(a, &ba, both, got), NF_OK) << nf_last_error();
    ASSERT_EQ(nf_decode(b, &bb, logits.data(), logits.size(), 0), NF_OK)
        << nf_last_error();
    for (int i = 0; i < 2; ++i) {
      const int32_t want =
          nf_sample(sb, logits.data() + i * V_, static_cast<int32_t>(V_));
      ASSERT_GE(want, 0) << nf_last_error();
      EXPECT_EQ(got[i], want)
          << GetParam() << " step " << step << " entry " << i;
      ta[i] = got[i];
      tb[i] = want;
    }
  }
  nf_sampler_free(sa);
  nf_sampler_free(sb);
  nf_model_free(a);
  nf_model_free(b);
}

std::vector<std::string> cudaFixtures() {
  std::vector<std::string> f = exactnessFixtures();
  f.push_back("pydoc-moe");
  return f;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture,
                         ::testing::ValuesIn(cudaFixtures()), ParamName());

// ---------------------------------------------------------------------------
// The exactness suite (exactness_suite.h) on the CUDA backend: within
// kCudaTol of the references, batched within kBatchTol (relative) of one
// sequence at a time (decode steps fed the reference's greedy tokens).

const ExactnessBackend kCudaBackend = {
    .name = "cuda",
    .tag = "[ cuda ]",
    .plan = cudaPlan,
    .options =
        [](const std::string &fixture) {
          return testOptions("cuda", modelDir(fixture));
        },
    .modelDir = modelDir,
    .require =
        [](const std::string &plan) {
          NF_REQUIRE_GPU();
          NF_REQUIRE_PLAN(plan);
        },
    .refTol = kCudaTol,
    .batchMetric = ExactnessBackend::BatchMetric::Relative,
    .batchTol = kBatchTol,
    .feed = Feed::Reference,
};

INSTANTIATE_TEST_SUITE_P(Cuda, Exactness,
                         ::testing::ValuesIn(exactnessCases(kCudaBackend,
                                                            cudaFixtures())),
                         ExactnessName());

} // namespace
