// The CPU reference executor against Hugging Face float64 references
// (test/data/fixtures, examples/pydoc-moe): prefill and greedy-decode logits,
// MoE routes, hidden states, continuous batching (mixed prefill/decode steps,
// sequences joining and leaving, scattered KV pages), plus kernel checks.
#include "backends/cpu/kernels.h"
#include "hf/HFConfig.h"
#include "nf/safetensors.h"
#include "reference_model.h"
#include "weights.h"

#include "ReferenceUtil.h"
#include "TestUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>

namespace {

using namespace nf;
using namespace nf::cpu;
using namespace nf::test::ref;

// ---------------------------------------------------------------------------
// ModelDesc from a Hugging Face checkpoint (config.json + bindCheckpoint).

struct LoadedModel {
  hf::ModelConfig config;
  WeightStore store;
  ModelDesc desc;
};

WeightView viewOf(const WeightStore &ws, const hf::WeightBinding &b) {
  StatusOr<WeightView> v = ws.find(b.tensors.at(0));
  EXPECT_TRUE(v.ok()) << v.message();
  return v.ok() ? *v : WeightView{};
}

std::vector<WeightView> expertViews(const WeightStore &ws,
                                    const hf::WeightBinding &b) {
  if (b.tensors.size() == 1)
    return splitExperts(viewOf(ws, b)); // one stacked [E, ...] tensor
  std::vector<WeightView> out;
  for (const std::string &name : b.tensors) {
    StatusOr<WeightView> v = ws.find(name);
    EXPECT_TRUE(v.ok()) << v.message();
    out.push_back(v.ok() ? *v : WeightView{});
  }
  return out;
}

std::unique_ptr<LoadedModel> loadModel(const std::string &dir) {
  auto m = std::make_unique<LoadedModel>();
  StatusOr<hf::ModelConfig> cfg = hf::parseConfigFile(dir + "/config.json");
  EXPECT_TRUE(cfg.ok()) << cfg.message();
  if (!cfg)
    return nullptr;
  m->config = *cfg;
  StatusOr<Checkpoint> ckpt = openCheckpoint(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.message();
  if (!ckpt)
    return nullptr;
  StatusOr<hf::ModelBinding> bind = hf::bindCheckpoint(m->config, *ckpt);
  EXPECT_TRUE(bind.ok()) << bind.message();
  if (!bind)
    return nullptr;
  StatusOr<WeightStore> ws = WeightStore::openCheckpoint(dir);
  EXPECT_TRUE(ws.ok()) << ws.message();
  if (!ws)
    return nullptr;
  m->store = std::move(*ws);

  const hf::ModelConfig &c = m->config;
  const WeightStore &st = m->store;
  ModelDesc &d = m->desc;
  d.vocabSize = c.vocabSize;
  d.hiddenSize = c.hiddenSize;
  d.eps = c.layerNormEpsilon;
  d.embedding = viewOf(st, bind->embedding);
  d.finalNorm = viewOf(st, bind->finalNorm);
  d.lmHead = viewOf(st, bind->lmHead);
  for (const hf::LayerBinding &lb : bind->layers) {
    LayerDesc l;
    l.norm = viewOf(st, lb.norm);
    auto role = [&](const char *r) {
      const hf::WeightBinding *w = lb.find(r);
      return w ? viewOf(st, *w) : WeightView{};
    };
    switch (lb.kind) {
    case hf::BlockKind::Mamba:
      l.kind = LayerKind::Mamba;
      l.mamba.shape = {c.mambaNumHeads, c.mambaHeadDim, c.ssmStateSize,
                       c.nGroups, c.convKernel};
      l.mamba.dtMin = static_cast<float>(c.timeStepLimitMin);
      l.mamba.dtMax = static_cast<float>(c.timeStepLimitMax);
      l.mamba.inProj = role("in_proj");
      l.mamba.convWeight = role("conv_weight");
      l.mamba.convBias = role("conv_bias");
      l.mamba.dtBias = role("dt_bias");
      l.mamba.aLog = role("A_log");
      l.mamba.d = role("D");
      l.mamba.norm = role("norm");
      l.mamba.outProj = role("out_proj");
      break;
    case hf::BlockKind::Attention:
      l.kind = LayerKind::Attention;
      l.attention.numHeads = c.numAttentionHeads;
      l.attention.numKvHeads = c.numKeyValueHeads;
      l.attention.headDim = c.headDim;
      l.attention.q = role("q_proj");
      l.attention.k = role("k_proj");
      l.attention.v = role("v_proj");
      l.attention.o = role("o_proj");
      break;
    case hf::BlockKind::Mlp:
      l.kind = LayerKind::Mlp;
      l.mlp.up = role("up_proj");
      l.mlp.down = role("down_proj");
      break;
    case hf::BlockKind::Moe:
      l.kind = LayerKind::Moe;
      l.moe.router.numExperts = c.nRoutedExperts;
      l.moe.router.nGroup = c.nGroup;
      l.moe.router.topkGroup = c.topkGroup;
      l.moe.router.normTopkProb = c.normTopkProb;
      l.moe.router.routedScalingFactor =
          static_cast<float>(c.routedScalingFactor);
      l.moe.topK = static_cast<int32_t>(c.numExpertsPerTok);
      l.moe.gate = role("gate");
      l.moe.correctionBias = role("correction_bias");
      l.moe.expertsUp = expertViews(st, *lb.find("experts_up"));
      l.moe.expertsDown = expertViews(st, *lb.find("experts_down"));
      l.moe.sharedUp = role("shared_up");
      l.moe.sharedDown = role("shared_down");
      l.moe.latentDown = role("latent_down");
      l.moe.latentUp = role("latent_up");
      break;
    }
    d.layers.push_back(std::move(l));
  }
  return m;
}

struct Worst {
  double prefill = 0, decode = 0;
};

// The reference tests run on one thread: results do not depend on the thread
// count (CpuThreads checks that bit for bit), and OpenMP barriers are slow on
// the oversubscribed machines tests often share.
ExecutorOptions oneThread() {
  ExecutorOptions o;
  o.numThreads = 1;
  return o;
}

std::unique_ptr<Executor> makeExecutor(const ModelDesc &d,
                                       ExecutorOptions opts = oneThread()) {
  StatusOr<Executor> ex = Executor::create(d, opts);
  EXPECT_TRUE(ex.ok()) << ex.message();
  return ex ? std::make_unique<Executor>(std::move(*ex)) : nullptr;
}

Caches makeCaches(const ModelDesc &d, CacheConfig cfg) {
  StatusOr<Caches> c = createCaches(d, cfg);
  EXPECT_TRUE(c.ok()) << c.message();
  return c ? std::move(*c) : Caches();
}

// ---------------------------------------------------------------------------
// Fixtures: one at a time, batched, join/leave

class CpuModelFixture : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    dir_ = test::fixtureDir(GetParam());
    model_ = loadModel(dir_);
    ASSERT_NE(model_, nullptr);
    ref_ = std::make_unique<RefFile>(dir_ + "/reference.safetensors");
    prompts_ = loadPrompts(*ref_);
    ASSERT_FALSE(prompts_.empty());
    exec_ = makeExecutor(model_->desc);
    ASSERT_NE(exec_, nullptr);
    V_ = model_->desc.vocabSize;
  }

  std::string dir_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<RefFile> ref_;
  std::vector<Prompt> prompts_;
  std::unique_ptr<Executor> exec_;
  int64_t V_ = 0;
};

TEST_P(CpuModelFixture, PrefillAndGreedyMatchReference) {
  Worst worst;
  double worstHidden = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const Prompt &p = prompts_[i];
    const std::string pre = "p" + std::to_string(i) + ".";
    // Small pages so that prompts span several of them.
    Caches caches = makeCaches(model_->desc, {2, 64, 4});
    StatusOr<int32_t> slot = caches.addSequence();
    ASSERT_TRUE(slot.ok()) << slot.message();
    const int32_t T = static_cast<int32_t>(p.tokens.size());
    SeqSpan span{0, T, 0, *slot};
    std::vector<float> logits;
    std::vector<LayerRoutes> routes;
    std::vector<std::vector<float>> hidden;
    StepOptions opts;
    opts.routes = &routes;
    if (ref_->has(pre + "hidden.0"))
      opts.hiddenStates = &hidden;
    Status s = exec_->step(caches, {&span, 1}, p.tokens, logits, opts);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(logits.size(), p.prefillLogits.size());
    const double e =
        relError(logits.data(), p.prefillLogits.data(), logits.size());
    worst.prefill = std::max(worst.prefill, e);
    EXPECT_LE(e, kTol) << GetParam() << " p" << i << " prefill";

    // Routes: experts per token, sorted ascending as in the reference.
    for (const LayerRoutes &lr : routes) {
      const std::string name = pre + "routes.layer" + std::to_string(lr.layer);
      ASSERT_TRUE(ref_->has(name)) << name;
      std::vector<int64_t> want = ref_->i64(name);
      const int64_t k = ref_->shape(name)[1];
      ASSERT_EQ(lr.routes.numTokens(), T);
      for (int32_t t = 0; t < T; ++t) {
        ASSERT_EQ(lr.routes.count[t], k);
        std::vector<int64_t> got(lr.routes.experts.begin() + t * lr.routes.maxK,
                                 lr.routes.experts.begin() +
                                     t * lr.routes.maxK + k);
        std::sort(got.begin(), got.end());
        std::vector<int64_t> exp(want.begin() + t * k,
                                 want.begin() + (t + 1) * k);
        EXPECT_EQ(got, exp) << name << " token " << t;
      }
    }
    for (size_t j = 0; j < hidden.size(); ++j) {
      const std::string name = pre + "hidden." + std::to_string(j);
      ASSERT_TRUE(ref_->has(name)) << name;
      std::vector<float> want = ref_->f32(name);
      ASSERT_EQ(want.size(), hidden[j].size()) << name;
      const double he = relError(hidden[j].data(), want.data(), want.size());
      worstHidden = std::max(worstHidden, he);
      EXPECT_LE(he, kTol) << name;
    }

    // Greedy decode: one token per step through the caches.
    const int64_t S = static_cast<int64_t>(p.greedyTokens.size());
    int32_t tok = argmax(logits.data() + int64_t(T - 1) * V_, V_);
    double de = 0;
    for (int64_t st = 0; st < S; ++st) {
      ASSERT_EQ(tok, p.greedyTokens[st])
          << GetParam() << " p" << i << " greedy step " << st;
      SeqSpan d{0, 1, caches.length(*slot), *slot};
      ASSERT_EQ(d.startPos, T + st);
      s = exec_->step(caches, {&d, 1}, {&tok, 1}, logits);
      ASSERT_TRUE(s.ok()) << s.message();
      de = std::max(
          de, relError(logits.data(), p.greedyLogits.data() + st * V_, V_));
      tok = argmax(logits.data(), V_);
    }
    worst.decode = std::max(worst.decode, de);
    EXPECT_LE(de, kTol) << GetParam() << " p" << i << " greedy logits";
    ASSERT_TRUE(caches.removeSequence(*slot).ok());
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  std::cout << "[ cpu-model ] " << GetParam() << ": worst rel err prefill "
            << worst.prefill << ", decode " << worst.decode << ", hidden "
            << worstHidden << " (" << prompts_.size() << " prompts, " << ms
            << " ms)\n";
}

// All prompts prefilled in one step (mixed lengths, different slots and
// pages), then decoded in lockstep; results must equal the one-at-a-time run
// bit for bit (kernels are batch-invariant) and the reference.
TEST_P(CpuModelFixture, BatchedStepsMatchSingleSequence) {
  const int n = static_cast<int>(prompts_.size());
  // One-at-a-time results first.
  std::vector<std::vector<float>> single(n);
  for (int i = 0; i < n; ++i) {
    Caches c = makeCaches(model_->desc, {1, 64, 8});
    const int32_t slot = *c.addSequence();
    SeqSpan sp{0, static_cast<int32_t>(prompts_[i].tokens.size()), 0, slot};
    ASSERT_TRUE(exec_->step(c, {&sp, 1}, prompts_[i].tokens, single[i]).ok());
  }

  Caches caches = makeCaches(model_->desc, {n + 2, 128, 4});
  // A placeholder sequence takes slot 0 and some pages, then leaves, so the
  // batch gets non-zero slots and scattered pages.
  const int32_t dummy = *caches.addSequence();
  ASSERT_TRUE(caches.reserve(dummy, 9).ok());
  std::vector<int32_t> slots(n);
  for (int i = n - 1; i >= 0; --i) // reverse: slot order != span order
    slots[i] = *caches.addSequence();
  ASSERT_TRUE(caches.removeSequence(dummy).ok());

  std::vector<int32_t> tokens;
  std::vector<SeqSpan> spans;
  for (int i = 0; i < n; ++i) {
    spans.push_back({static_cast<int32_t>(tokens.size()),
                     static_cast<int32_t>(prompts_[i].tokens.size()), 0,
                     slots[i]});
    tokens.insert(tokens.end(), prompts_[i].tokens.begin(),
                  prompts_[i].tokens.end());
  }
  std::vector<float> logits;
  Status s = exec_->step(caches, spans, tokens, logits);
  ASSERT_TRUE(s.ok()) << s.message();
  double maxDiff = 0, worst = 0;
  std::vector<int32_t> next(n);
  for (int i = 0; i < n; ++i) {
    const float *rows = logits.data() + int64_t(spans[i].begin) * V_;
    for (size_t j = 0; j < single[i].size(); ++j)
      maxDiff = std::max(maxDiff, double(std::fabs(rows[j] - single[i][j])));
    worst = std::max(worst, relError(rows, prompts_[i].prefillLogits.data(),
                                     single[i].size()));
    next[i] = argmax(rows + int64_t(spans[i].count - 1) * V_, V_);
  }
  EXPECT_EQ(maxDiff, 0.0) << "batched prefill differs from single";
  EXPECT_LE(worst, kTol);

  // Lockstep decode of every sequence, one token each per step.
  const int64_t S = static_cast<int64_t>(prompts_[0].greedyTokens.size());
  double worstDecode = 0;
  for (int64_t st = 0; st < S; ++st) {
    spans.clear();
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(next[i], prompts_[i].greedyTokens[st]) << "p" << i;
      spans.push_back({i, 1, caches.length(slots[i]), slots[i]});
    }
    StepOptions opts;
    opts.logits = LogitsMode::LastTokenPerSequence;
    s = exec_->step(caches, spans, next, logits, opts);
    ASSERT_TRUE(s.ok()) << s.message();
    for (int i = 0; i < n; ++i) {
      worstDecode = std::max(
          worstDecode, relError(logits.data() + i * V_,
                                prompts_[i].greedyLogits.data() + st * V_, V_));
      next[i] = argmax(logits.data() + i * V_, V_);
    }
  }
  EXPECT_LE(worstDecode, kTol);
  // Pages of a sequence are scattered (interleaved with other sequences).
  bool scattered = false;
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t> &pt = caches.pageTable(slots[i]);
    for (size_t j = 1; j < pt.size(); ++j)
      scattered |= pt[j] != pt[j - 1] + 1;
  }
  EXPECT_TRUE(scattered);
  std::cout << "[ cpu-model ] " << GetParam()
            << " batched: max |batched - single| " << maxDiff
            << ", worst rel err decode " << worstDecode << "\n";
}

// Sequences join (prefill inside a decode step of others) and leave (their
// slot and pages are reused) between steps; each sequence still reproduces
// the reference.
TEST_P(CpuModelFixture, SequencesJoinAndLeave) {
  const int n = static_cast<int>(prompts_.size());
  Caches caches = makeCaches(model_->desc, {2, 64, 4}); // 2 slots for n seqs
  struct Live {
    int prompt;
    int32_t slot;
    int64_t steps = 0; // greedy tokens consumed
    int32_t next = -1; // token to feed next (-1: needs prefill)
  };
  std::vector<Live> live;
  int nextPrompt = 0, finished = 0;
  double worst = 0;
  int steps = 0;
  const int order[] = {3, 4, 0, 2, 1};
  while (finished < n) {
    // Admit at most one new sequence per step while a slot is free.
    if (nextPrompt < n && caches.state().numFree() > 0) {
      const int pi = n == 5 ? order[nextPrompt] : nextPrompt;
      ++nextPrompt;
      StatusOr<int32_t> slot = caches.addSequence();
      ASSERT_TRUE(slot.ok()) << slot.message();
      live.push_back({pi, *slot});
    }
    std::vector<int32_t> tokens;
    std::vector<SeqSpan> spans;
    for (Live &l : live) {
      const std::vector<int32_t> &pt = prompts_[l.prompt].tokens;
      const int32_t begin = static_cast<int32_t>(tokens.size());
      if (l.next < 0)
        tokens.insert(tokens.end(), pt.begin(), pt.end());
      else
        tokens.push_back(l.next);
      spans.push_back({begin, static_cast<int32_t>(tokens.size()) - begin,
                       caches.length(l.slot), l.slot});
    }
    std::vector<float> logits;
    StepOptions opts;
    opts.logits = LogitsMode::LastTokenPerSequence;
    Status s = exec_->step(caches, spans, tokens, logits, opts);
    ASSERT_TRUE(s.ok()) << s.message();
    ++steps;
    std::vector<Live> still;
    for (size_t i = 0; i < live.size(); ++i) {
      Live &l = live[i];
      const Prompt &p = prompts_[l.prompt];
      const float *row = logits.data() + int64_t(i) * V_;
      const float *want;
      if (l.next < 0) {
        want = p.prefillLogits.data() + int64_t(p.tokens.size() - 1) * V_;
      } else {
        want = p.greedyLogits.data() + l.steps * V_;
        ++l.steps;
      }
      worst = std::max(worst, relError(row, want, V_));
      l.next = argmax(row, V_);
      if (l.steps >= static_cast<int64_t>(p.greedyTokens.size())) {
        ASSERT_TRUE(caches.removeSequence(l.slot).ok());
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
  EXPECT_EQ(caches.kv().numFreePages(), caches.kv().numPages());
  std::cout << "[ cpu-model ] " << GetParam() << " join/leave: " << steps
            << " steps, worst rel err " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CpuModelFixture,
                         ::testing::Values("tiny-hybrid", "tiny-hybrid-bf16",
                                           "tiny-nano", "tiny-dense",
                                           "tiny-latent"),
                         [](const auto &param) {
                           std::string n = param.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// ---------------------------------------------------------------------------
// pydoc-moe: the trained demo model (bf16)

TEST(CpuModelPydoc, PrefillAndGreedyTokens) {
  const std::string dir = test::examplesDir() + "/pydoc-moe";
  std::unique_ptr<LoadedModel> model = loadModel(dir);
  ASSERT_NE(model, nullptr);
  RefFile ref(dir + "/reference.safetensors");
  std::vector<Prompt> prompts = loadPrompts(ref);
  ASSERT_EQ(prompts.size(), 4u);
  std::unique_ptr<Executor> ex = makeExecutor(model->desc);
  ASSERT_NE(ex, nullptr);
  const int64_t V = model->desc.vocabSize;
  const int n = static_cast<int>(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();

  Caches caches = makeCaches(model->desc, {n, 64, 16});
  std::vector<int32_t> tokens, slots(n);
  std::vector<SeqSpan> spans;
  for (int i = 0; i < n; ++i) {
    slots[i] = *caches.addSequence();
    spans.push_back({static_cast<int32_t>(tokens.size()),
                     static_cast<int32_t>(prompts[i].tokens.size()), 0,
                     slots[i]});
    tokens.insert(tokens.end(), prompts[i].tokens.begin(),
                  prompts[i].tokens.end());
  }
  std::vector<float> logits;
  Status s = ex->step(caches, spans, tokens, logits);
  ASSERT_TRUE(s.ok()) << s.message();
  double worst = 0;
  std::vector<int32_t> next(n);
  for (int i = 0; i < n; ++i) {
    const float *rows = logits.data() + int64_t(spans[i].begin) * V;
    const double e = relError(rows, prompts[i].prefillLogits.data(),
                              prompts[i].prefillLogits.size());
    worst = std::max(worst, e);
    EXPECT_LE(e, kTol) << "p" << i;
    next[i] = argmax(rows + int64_t(spans[i].count - 1) * V, V);
  }
  const int64_t S = static_cast<int64_t>(prompts[0].greedyTokens.size());
  std::vector<std::vector<int64_t>> got(n);
  for (int64_t st = 0; st < S; ++st) {
    spans.clear();
    for (int i = 0; i < n; ++i) {
      got[i].push_back(next[i]);
      spans.push_back({i, 1, caches.length(slots[i]), slots[i]});
    }
    StepOptions opts;
    opts.logits = LogitsMode::LastTokenPerSequence;
    s = ex->step(caches, spans, next, logits, opts);
    ASSERT_TRUE(s.ok()) << s.message();
    for (int i = 0; i < n; ++i)
      next[i] = argmax(logits.data() + i * V, V);
  }
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(got[i], prompts[i].greedyTokens) << "p" << i;
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count();
  std::cout << "[ cpu-model ] pydoc-moe: worst rel err prefill " << worst
            << ", " << S << " greedy steps x " << n << " sequences, " << ms
            << " ms\n";
}

// ---------------------------------------------------------------------------
// Threading: every kernel forced parallel, 1 vs 2 threads, bit-identical.

class ParallelThresholdScope {
public:
  explicit ParallelThresholdScope(int64_t w) : saved_(parallelThreshold()) {
    setParallelThreshold(w);
  }
  ~ParallelThresholdScope() { setParallelThreshold(saved_); }

private:
  int64_t saved_;
};

/// Logits of a batched prefill of all prompts plus `decodeSteps` lockstep
/// greedy steps, concatenated.
std::vector<float> runBatch(const ModelDesc &d, const std::vector<Prompt> &ps,
                            int numThreads, int decodeSteps) {
  ExecutorOptions o;
  o.numThreads = numThreads;
  std::unique_ptr<Executor> ex = makeExecutor(d, o);
  if (!ex)
    return {};
  const int n = static_cast<int>(ps.size());
  Caches caches = makeCaches(d, {n, 128, 4});
  std::vector<int32_t> tokens, slots(n);
  std::vector<SeqSpan> spans;
  for (int i = 0; i < n; ++i) {
    slots[i] = *caches.addSequence();
    spans.push_back({static_cast<int32_t>(tokens.size()),
                     static_cast<int32_t>(ps[i].tokens.size()), 0, slots[i]});
    tokens.insert(tokens.end(), ps[i].tokens.begin(), ps[i].tokens.end());
  }
  std::vector<float> all, logits;
  StepOptions opts;
  opts.logits = LogitsMode::LastTokenPerSequence;
  for (int st = 0; st <= decodeSteps; ++st) {
    Status s = ex->step(caches, spans, tokens, logits, opts);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s)
      return {};
    all.insert(all.end(), logits.begin(), logits.end());
    tokens.clear();
    for (int i = 0; i < n; ++i) {
      tokens.push_back(argmax(logits.data() + i * d.vocabSize, d.vocabSize));
      spans[i] = {i, 1, caches.length(slots[i]), slots[i]};
    }
  }
  return all;
}

TEST(CpuThreads, ResultsIndependentOfThreadCount) {
  ParallelThresholdScope everythingParallel(0);
  // tiny-hybrid has every block kind; one prefill + one decode step keeps
  // the number of (forced) parallel regions small.
  for (const char *name : {"tiny-hybrid"}) {
    const std::string dir = test::fixtureDir(name);
    std::unique_ptr<LoadedModel> model = loadModel(dir);
    ASSERT_NE(model, nullptr);
    RefFile ref(dir + "/reference.safetensors");
    std::vector<Prompt> prompts = loadPrompts(ref);
    std::vector<float> one = runBatch(model->desc, prompts, 1, 1);
    std::vector<float> two = runBatch(model->desc, prompts, 2, 1);
    ASSERT_FALSE(one.empty());
    ASSERT_EQ(one.size(), two.size());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), two.begin())) << name;
    // And the multi-threaded prefill still matches the reference.
    const int64_t V = model->desc.vocabSize;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Prompt &p = prompts[i];
      const float *want =
          p.prefillLogits.data() + int64_t(p.tokens.size() - 1) * V;
      EXPECT_LE(relError(two.data() + i * V, want, V), kTol) << name << i;
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels and API edges

uint16_t f32ToBf16Trunc(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

TEST(CpuKernels, F16ToF32IsExactForAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float got = f16ToF32(static_cast<uint16_t>(h));
    if (exp == 31) {
      if (mant == 0)
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == (sign < 0)) << h;
      else
        EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    const double want = exp == 0
                            ? sign * std::ldexp(double(mant), -24)
                            : sign * std::ldexp(1.0 + mant / 1024.0, exp - 15);
    ASSERT_EQ(double(got), want) << "f16 bits " << h;
    ASSERT_EQ(std::signbit(got), sign < 0) << h;
  }
}

TEST(CpuKernels, LinearAllWeightDtypes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t T = 3, N = 37, K = 70;
  std::vector<float> x(T * K), w(N * K);
  for (float &v : x)
    v = nd(rng);
  for (float &v : w)
    v = nd(rng);
  // Weights representable exactly in bf16 and f16, so every dtype must give
  // the same product.
  std::vector<uint16_t> wb(N * K), wh(N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    w[i] = std::ldexp(std::round(std::ldexp(w[i], 6)), -6); // 7 bits
    wb[i] = f32ToBf16Trunc(w[i]);
    ASSERT_EQ(bf16ToF32(wb[i]), w[i]);
    // f16 of a value with <= 10 mantissa bits and |v| < 2^5: build bits.
    const float a = std::fabs(w[i]);
    uint16_t bits = w[i] < 0 ? 0x8000 : 0;
    if (a != 0) {
      int e;
      const float m = std::frexp(a, &e); // a = m * 2^e, m in [0.5, 1)
      const int fe = e - 1 + 15;
      ASSERT_GT(fe, 0);
      bits = static_cast<uint16_t>(bits | (fe << 10) |
                                   static_cast<int>(std::ldexp(m * 2 - 1, 10)));
    }
    wh[i] = bits;
    ASSERT_EQ(f16ToF32(bits), w[i]);
  }
  std::vector<double> want(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(x[t * K + k]) * w[n * K + k];
      want[t * N + n] = s;
    }
  const WeightView views[] = {{w.data(), DType::F32, {N, K}},
                              {wb.data(), DType::BF16, {N, K}},
                              {wh.data(), DType::F16, {N, K}}};
  for (const WeightView &v : views)
    for (Accum acc : {Accum::F32, Accum::F64}) {
      std::vector<float> y(T * N);
      linear(x.data(), T, K, v, y.data(), N, acc);
      for (int64_t i = 0; i < T * N; ++i)
        EXPECT_NEAR(y[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
            << dtypeName(v.dtype) << " " << i;
    }
}

TEST(CpuKernels, RouterGroupLimitedTopKAndPerTokenK) {
  // E = 8 experts in 4 groups of 2; keep 2 groups; gate = identity-like so
  // that logits are chosen directly.
  const int64_t E = 8, H = 8;
  std::vector<float> gate(E * H, 0.0f);
  for (int64_t e = 0; e < E; ++e)
    gate[e * H + e] = 1.0f;
  // sigmoid scores per expert via x; bias shifts selection only.
  const float x[H] = {2.0f, -1.0f, 0.5f, 0.4f, 1.5f, 1.4f, -3.0f, 3.0f};
  std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0.8f, -0.9f};
  RouterConfig c;
  c.numExperts = E;
  c.nGroup = 4;
  c.topkGroup = 2;
  c.normTopkProb = true;
  c.routedScalingFactor = 2.5f;
  std::vector<float> xs(x, x + H);
  xs.insert(xs.end(), x, x + H); // two tokens
  const int32_t ks[] = {3, 1};
  RouterOutput out;
  moeRoute(xs.data(), 2, H, {gate.data(), DType::F32, {E, H}},
           {bias.data(), DType::F32, {E}}, c, 0, ks, out);
  // Independent computation.
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  std::vector<double> s(E), sb(E);
  for (int e = 0; e < E; ++e) {
    s[e] = sig(x[e]);
    sb[e] = s[e] + bias[e];
  }
  // group scores (top-2 sum = both members): g0 .88+.27, g1 .62+.60,
  // g2 .82+.80, g3 (.05+.8)+(.95-.9): g0=1.15, g1=1.22, g2=1.62, g3=0.90
  // -> groups 2 and 1 kept; experts 4, 5, 2, 3 candidates.
  ASSERT_EQ(out.maxK, 3);
  EXPECT_EQ(out.count[0], 3);
  EXPECT_EQ(out.count[1], 1);
  EXPECT_EQ(
      (std::vector<int32_t>(out.experts.begin(), out.experts.begin() + 3)),
      (std::vector<int32_t>{4, 5, 2}));
  const double sum = s[4] + s[5] + s[2];
  EXPECT_NEAR(out.weights[0], s[4] / sum * 2.5, 1e-6);
  EXPECT_NEAR(out.weights[2], s[2] / sum * 2.5, 1e-6);
  EXPECT_EQ(out.experts[3], 4);
  EXPECT_NEAR(out.weights[3], 2.5, 1e-6); // one expert renormalised to 1
  EXPECT_EQ(out.experts[4], -1);
}

TEST(CpuKernels, StepValidatesInput) {
  std::unique_ptr<LoadedModel> model =
      loadModel(test::fixtureDir("tiny-hybrid"));
  ASSERT_NE(model, nullptr);
  std::unique_ptr<Executor> ex = makeExecutor(model->desc);
  ASSERT_NE(ex, nullptr);
  Caches caches = makeCaches(model->desc, {2, 4, 4});
  const int32_t slot = *caches.addSequence();
  std::vector<float> logits;
  std::vector<int32_t> toks = {1, 2, 3};
  SeqSpan bad{0, 2, 0, slot}; // leaves token 2 uncovered
  EXPECT_FALSE(ex->step(caches, {&bad, 1}, toks, logits).ok());
  SeqSpan wrongPos{0, 3, 5, slot};
  EXPECT_FALSE(ex->step(caches, {&wrongPos, 1}, toks, logits).ok());
  SeqSpan deadSlot{0, 3, 0, 1};
  EXPECT_FALSE(ex->step(caches, {&deadSlot, 1}, toks, logits).ok());
  std::vector<int32_t> oov = {1, 2, 100000};
  SeqSpan ok{0, 3, 0, slot};
  EXPECT_FALSE(ex->step(caches, {&ok, 1}, oov, logits).ok());
  // 4 pages of 4 positions: 17 tokens do not fit.
  std::vector<int32_t> many(17, 1);
  SeqSpan big{0, 17, 0, slot};
  Status s = ex->step(caches, {&big, 1}, many, logits);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pages"), std::string::npos) << s.message();
  EXPECT_EQ(caches.length(slot), 0);
  EXPECT_TRUE(ex->step(caches, {&ok, 1}, toks, logits).ok());
  EXPECT_EQ(caches.length(slot), 3);
  // Fewer experts for some tokens.
  SeqSpan next{0, 3, 3, slot};
  const int32_t ks[] = {1, 0, 4};
  StepOptions opts;
  opts.expertsPerToken = ks;
  std::vector<LayerRoutes> routes;
  opts.routes = &routes;
  EXPECT_TRUE(ex->step(caches, {&next, 1}, toks, logits, opts).ok());
  ASSERT_FALSE(routes.empty());
  EXPECT_EQ(routes[0].routes.count, (std::vector<int32_t>{1, 0, 4}));
  const int32_t tooMany[] = {17};
  opts.expertsPerToken = tooMany;
  SeqSpan after{0, 3, 6, slot};
  EXPECT_FALSE(ex->step(caches, {&after, 1}, toks, logits, opts).ok());
  // A broken description is refused with the layer named.
  ModelDesc broken = model->desc;
  broken.layers[2].attention.k.shape = {31, 64};
  StatusOr<Executor> bad2 = Executor::create(broken);
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.message().find("layer 2"), std::string::npos)
      << bad2.message();
}

TEST(CpuKernels, WeightStoreErrorsNameTheFile) {
  StatusOr<WeightStore> ws =
      WeightStore::openFile("/nonexistent/x.safetensors");
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.message().find("/nonexistent/x.safetensors"), std::string::npos);
  StatusOr<WeightStore> ok = WeightStore::openFile(
      test::fixtureDir("tiny-hybrid") + "/model.safetensors");
  ASSERT_TRUE(ok.ok()) << ok.message();
  StatusOr<WeightView> missing = ok->find("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("model.safetensors"), std::string::npos);
  StatusOr<WeightView> emb = ok->find("backbone.embeddings.weight");
  ASSERT_TRUE(emb.ok());
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
}

} // namespace
