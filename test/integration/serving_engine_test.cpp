// libnf's serving engine (nf_engine, through nf.hpp) driven directly with
// many requests, no HTTP, on the pydoc-moe plan (CPU backend). The
// reference for every request's tokens is nf_generate on a model of its
// own: the request run alone, with no scheduler.
#include "nf/nf.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

std::string planPath() { return std::string(NF_PLAN_DIR) + "/pydoc-moe.nfb"; }

nf::Model load(int32_t kvPages = 0, int32_t maxSequences = 0) {
  nf::ModelParams p;
  p.backend = "cpu";
  p.kvPages = kvPages;
  p.maxSequences = maxSequences;
  auto m = nf::Model::load(planPath(), p);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::move(*m);
}

/// Prompts of different lengths (1 to 3 KV pages of pydoc-moe's 16 tokens).
std::vector<std::vector<int32_t>> prompts(const nf::Model &m, size_t n) {
  const std::vector<std::string> texts = {
      "def add(a, b):\n    \"\"\"Return the sum of a and b.",
      "class Stack:\n    \"\"\"A last-in first-out stack of items.\n\n    "
      "Push and pop",
      "import os\n\ndef list_files(path):\n    \"\"\"List",
      "def parse(text):\n    \"\"\"Parse a comma separated line of numbers "
      "and return them as a list of integers, skipping empty fields.",
  };
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < n; ++i) {
    auto ids = m.tokenize(texts[i % texts.size()] + std::string(i / 4, ' '));
    EXPECT_TRUE(ids.ok()) << ids.message();
    out.push_back(*ids);
  }
  return out;
}

/// Greedy tokens of `prompt` alone (nf_generate, no engine).
std::vector<int32_t> alone(nf::Model &m, const std::vector<int32_t> &prompt,
                           int32_t maxTokens) {
  nf::GenerateParams gp;
  gp.maxTokens = maxTokens;
  auto t = m.generate(prompt, gp);
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? *t : std::vector<int32_t>{};
}

nf::RequestParams greedy(const std::vector<int32_t> &prompt,
                         int32_t maxTokens) {
  nf::RequestParams p;
  p.prompt = prompt;
  p.maxTokens = maxTokens;
  p.ignoreEos = false;
  return p;
}

// The issue's test: a KV pool far too small for the requests together,
// each of which fits alone. Every request completes, with exactly the
// tokens and text it produces alone; the engine preempted to get there.
TEST(ServingEngine, TinyKvPoolCompletesEveryRequestExactly) {
  constexpr int kRequests = 32, kMaxTokens = 24;
  nf::Model reference = load();
  nf::Model model = load(/*kvPages=*/12);
  const auto ps = prompts(model, kRequests);
  for (const auto &p : ps) // each fits alone: 12 pages of 16 tokens
    ASSERT_LE(p.size() + kMaxTokens, 12u * 16u);
  // Every page back at the end: no prefix-cache snapshots holding any
  // (prefix_cache_test.cpp runs the same pool with them).
  nf::EngineParams ep;
  ep.prefixCaching = false;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<nf::ServingRequest> requests;
  for (const auto &p : ps) {
    auto r = engine->submit(greedy(p, kMaxTokens));
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  for (int i = 0; i < kRequests; ++i) {
    auto out = requests[i].wait();
    ASSERT_TRUE(out.ok()) << out.message();
    ASSERT_TRUE(out->finishReason == NF_FINISH_STOP ||
                out->finishReason == NF_FINISH_LENGTH)
        << "request " << i << ": " << out->error;
    const std::vector<int32_t> want = alone(reference, ps[i], kMaxTokens);
    EXPECT_EQ(out->tokens, want) << "request " << i;
    auto text = reference.detokenize(want);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(out->text, *text) << "request " << i;
    EXPECT_EQ(out->completionTokens, static_cast<int64_t>(want.size()));
    EXPECT_EQ(out->promptTokens, static_cast<int64_t>(ps[i].size()));
  }
  // The engine publishes its counts after the step that ended the last.
  nf_engine_stats s = engine->stats();
  for (int i = 0; i < 1000 && (s.running > 0 || s.kv_free_pages < 12); ++i) {
    std::this_thread::sleep_for(10ms);
    s = engine->stats();
  }
  EXPECT_GT(s.preemptions, 0) << "the pool was meant to run out";
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.kv_free_pages, 12);
}

// Under memory pressure the victims are the lowest priority: a
// high-priority request admitted last keeps its sequence throughout.
TEST(ServingEngine, PreemptionSparesHigherPriority) {
  nf::Model model = load(/*kvPages=*/12);
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 4);
  std::vector<nf::ServingRequest> low;
  for (int i = 0; i < 4; ++i) {
    nf::RequestParams p = greedy(ps[i], 64);
    p.ignoreEos = true;
    p.priority = 1;
    auto r = engine->submit(p);
    ASSERT_TRUE(r.ok());
    low.push_back(std::move(*r));
  }
  // The high-priority request comes once the others run: admitted last.
  std::vector<nf::RequestOutput> firstReads;
  for (auto &r : low) {
    auto o = r.read();
    ASSERT_TRUE(o.ok());
    firstReads.push_back(std::move(*o));
  }
  nf::RequestParams p = greedy(ps[3], 64);
  p.ignoreEos = true;
  p.priority = -1;
  auto high = engine->submit(p);
  ASSERT_TRUE(high.ok());
  auto h = high->wait();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->finishReason, NF_FINISH_LENGTH);
  EXPECT_EQ(h->preemptions, 0);
  int32_t lowPreemptions = 0;
  for (size_t i = 0; i < low.size(); ++i) {
    auto o =
        firstReads[i].finished() ? std::move(firstReads[i]) : low[i].wait();
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o->finishReason, NF_FINISH_LENGTH);
    lowPreemptions += o->preemptions;
  }
  EXPECT_GT(lowPreemptions, 0) << "the pool was meant to run out";
}

/// Collects the order in which requests finish (their user_data).
struct FinishOrder {
  std::mutex mu;
  std::vector<intptr_t> order;
  static void observe(const nf_engine_event *e, void *self) {
    if (e->kind != NF_EVENT_FINISHED)
      return;
    auto &f = *static_cast<FinishOrder *>(self);
    std::lock_guard<std::mutex> lock(f.mu);
    f.order.push_back(reinterpret_cast<intptr_t>(e->request_user_data));
  }
};

/// One sequence at a time: a first request holds it while the others
/// queue; they run in the order the engine admits them.
std::vector<intptr_t> admissionOrder(int64_t maxWaitMs,
                                     const std::vector<int32_t> &priorities) {
  nf::Model model = load();
  FinishOrder finished;
  nf::EngineParams ep;
  ep.maxBatch = 1;
  ep.maxWaitMs = maxWaitMs;
  ep.observer = FinishOrder::observe;
  ep.observerData = &finished;
  auto engine = nf::ServingEngine::create(model, ep);
  EXPECT_TRUE(engine.ok()) << engine.message();
  const auto ps = prompts(model, 1);
  nf::RequestParams first = greedy(ps[0], 64);
  first.ignoreEos = true;
  auto blocker = engine->submit(first);
  EXPECT_TRUE(blocker.ok());
  EXPECT_TRUE(blocker->read().ok()); // running: the others must wait
  std::vector<nf::ServingRequest> rs;
  for (size_t i = 0; i < priorities.size(); ++i) {
    nf::RequestParams p = greedy(ps[0], 2);
    p.priority = priorities[i];
    p.userData = reinterpret_cast<void *>(static_cast<intptr_t>(i + 1));
    auto r = engine->submit(p);
    EXPECT_TRUE(r.ok()) << r.message();
    rs.push_back(std::move(*r));
    std::this_thread::sleep_for(2ms); // distinct arrivals
  }
  // All queued while the first still runs.
  EXPECT_EQ(engine->stats().waiting, static_cast<int32_t>(priorities.size()));
  for (auto &r : rs)
    EXPECT_TRUE(r.wait().ok());
  EXPECT_TRUE(blocker->wait().ok());
  std::lock_guard<std::mutex> lock(finished.mu);
  std::vector<intptr_t> order;
  for (intptr_t tag : finished.order)
    if (tag != 0)
      order.push_back(tag);
  return order;
}

TEST(ServingEngine, PriorityOrdersTheQueue) {
  // Lower values first (vLLM's priority), arrival among equals.
  EXPECT_EQ(admissionOrder(0, {5, 0, -3, 0}),
            (std::vector<intptr_t>{3, 2, 4, 1}));
}

TEST(ServingEngine, LongWaitPromotesLowPriority) {
  // Every waiting request has waited past max_wait_ms by the time the
  // sequence frees: arrival order.
  EXPECT_EQ(admissionOrder(1, {5, 0, -3, 0}),
            (std::vector<intptr_t>{1, 2, 3, 4}));
}

// A request's usage: routed-expert calls per MoE layer that sum to its
// total, the budget applied and the share of static top-k spent, as the
// model's own per-process counters count them (pydoc-moe's plan runs the
// budget policy: at 0.5 a decode token runs 2 of 4 experts, a prompt's
// tokens share 2 a token).
TEST(ServingEngine, UsageReportsExpertCallsPerLayerAndBudget) {
  nf::Model model = load();
  ASSERT_GT(model.numMoeLayers(), 0);
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 4);
  nf::RequestParams p = greedy(ps[3], 8);
  p.ignoreEos = true;
  p.expertBudget = 0.5f;
  auto r = engine->submit(p);
  ASSERT_TRUE(r.ok());
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->expertCallsPerLayer.size(),
            static_cast<size_t>(model.numMoeLayers()));
  int64_t sum = 0;
  for (int64_t c : out->expertCallsPerLayer)
    sum += c;
  EXPECT_EQ(sum, out->expertCalls);
  // The tokens run: the prompt and every generated token but the last.
  const int64_t tokens = static_cast<int64_t>(ps[3].size()) + 8 - 1;
  EXPECT_EQ(out->expertCalls,
            tokens * model.numMoeLayers() * model.expertsPerToken() / 2);
  EXPECT_FLOAT_EQ(out->expertBudget, 0.5f);
  EXPECT_DOUBLE_EQ(out->expertBudgetSpent, 0.5);
  auto used = engine->expertUtilization(model);
  ASSERT_TRUE(used.ok());
  int64_t routed = 0;
  for (int64_t c : *used)
    routed += c;
  EXPECT_EQ(routed, out->expertCalls); // the only request so far
  // Without a budget of its own: the plan's default (1), all of top-k.
  auto full = engine->submit(greedy(ps[0], 2));
  ASSERT_TRUE(full.ok());
  auto f = full->wait();
  ASSERT_TRUE(f.ok());
  EXPECT_FLOAT_EQ(f->expertBudget, 1.0f);
  EXPECT_DOUBLE_EQ(f->expertBudgetSpent, 1.0);
}

TEST(ServingEngine, HardLimitRefusesAndCaps) {
  nf::Model model = load();
  nf::EngineParams ep;
  ep.maxNewTokens = 8;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 1);
  nf_status code = NF_OK;
  auto refused = engine->submit(greedy(ps[0], 9), &code);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(refused.message().find("limit of 8"), std::string::npos)
      << refused.message();
  nf::RequestParams open = greedy(ps[0], 0); // no limit of its own
  open.ignoreEos = true;
  auto r = engine->submit(open);
  ASSERT_TRUE(r.ok());
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->finishReason, NF_FINISH_LENGTH);
  EXPECT_EQ(out->maxTokens, 8);
  EXPECT_EQ(out->completionTokens, 8);
}

TEST(ServingEngine, SoftLimitGrantsWhatTheFreeCacheHolds) {
  constexpr int32_t kPages = 8, kPage = 16;
  nf::Model model = load(kPages);
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 1);
  // Below what the cache holds: granted as asked.
  nf::RequestParams small = greedy(ps[0], 100);
  small.maxTokensSoft = 5;
  small.ignoreEos = true;
  auto a = engine->submit(small);
  ASSERT_TRUE(a.ok());
  auto outA = a->wait();
  ASSERT_TRUE(outA.ok());
  EXPECT_EQ(outA->maxTokens, 5);
  EXPECT_EQ(outA->completionTokens, 5);
  // Beside a running request, what the cache has left.
  nf::RequestParams hog = greedy(ps[0], 60);
  hog.ignoreEos = true;
  auto h = engine->submit(hog);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->read().ok()); // admitted and running
  nf::RequestParams soft = greedy(ps[0], 0);
  soft.maxTokensSoft = 1000;
  soft.ignoreEos = true;
  auto b = engine->submit(soft);
  ASSERT_TRUE(b.ok());
  auto outB = b->wait();
  ASSERT_TRUE(outB.ok());
  const int32_t alone = kPages * kPage - static_cast<int32_t>(ps[0].size());
  EXPECT_GE(outB->maxTokens, 1);
  EXPECT_LT(outB->maxTokens, alone);
  EXPECT_EQ(outB->completionTokens, outB->maxTokens);
  EXPECT_TRUE(h->wait().ok());
}

TEST(ServingEngine, CancelFreesTheSequence) {
  nf::Model model = load(16);
  nf::EngineParams ep;
  ep.prefixCaching = false; // no snapshot of its prompt holding pages
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 1);
  nf::RequestParams p = greedy(ps[0], 200);
  p.ignoreEos = true;
  auto r = engine->submit(p);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->read().ok());
  r->cancel();
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->finishReason, NF_FINISH_CANCELLED);
  EXPECT_LT(out->completionTokens, 200);
  for (int i = 0; i < 1000 && engine->stats().live_sequences > 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(engine->stats().live_sequences, 0);
  EXPECT_EQ(engine->stats().kv_free_pages, 16);
}

TEST(ServingEngine, BoundedQueueAndShutdown) {
  nf::Model model = load();
  nf::EngineParams ep;
  ep.maxBatch = 1;
  ep.maxQueue = 1;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 1);
  nf::RequestParams p = greedy(ps[0], 400);
  p.ignoreEos = true;
  auto running = engine->submit(p);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(running->read().ok()); // it holds the one sequence
  auto waiting = engine->submit(p);
  ASSERT_TRUE(waiting.ok());
  nf_status code = NF_OK;
  auto full = engine->submit(p, &code);
  EXPECT_FALSE(full.ok());
  EXPECT_EQ(code, NF_ERR_CAPACITY);
  engine->shutdown(0ms);
  auto late = engine->submit(p, &code);
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(code, NF_ERR_UNAVAILABLE);
  auto w = waiting->wait();
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->finishReason, NF_FINISH_UNAVAILABLE);
  EXPECT_EQ(w->completionTokens, 0);
  auto r = running->wait();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->finishReason, NF_FINISH_UNAVAILABLE);
  for (int i = 0; i < 1000 && !engine->stats().drained; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(engine->stats().drained);
}

TEST(ServingEngine, FreeingTheEngineEndsItsRequests) {
  nf::Model model = load();
  const auto ps = prompts(model, 1);
  std::optional<nf::ServingRequest> r;
  {
    auto engine = nf::ServingEngine::create(model);
    ASSERT_TRUE(engine.ok());
    nf::RequestParams p = greedy(ps[0], 400);
    p.ignoreEos = true;
    auto s = engine->submit(p);
    ASSERT_TRUE(s.ok());
    r.emplace(std::move(*s));
  }
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->finishReason, NF_FINISH_UNAVAILABLE);
  // The model is the caller's again.
  EXPECT_EQ(model.liveSequences(), 0);
  EXPECT_TRUE(model.addSequence().ok());
}

TEST(ServingEngine, SubmissionErrorsNameTheProblem) {
  nf::Model model = load(4);
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok());
  nf_status code = NF_OK;
  auto empty = engine->submit(greedy({}, 4), &code);
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(empty.message().find("no tokens"), std::string::npos);
  auto outside = engine->submit(greedy({1, model.vocabSize()}, 4), &code);
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(outside.message().find("token id"), std::string::npos);
  auto tooLong = engine->submit(greedy(std::vector<int32_t>(64, 1), 4), &code);
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(tooLong.message().find("context is 64"), std::string::npos)
      << tooLong.message();
  nf::RequestParams badStop = greedy({1, 2}, 4);
  badStop.stopStrings = {""};
  EXPECT_FALSE(engine->submit(badStop, &code).ok());
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  nf::RequestParams badSampler = greedy({1, 2}, 4);
  badSampler.sampler.topP = 0.0f;
  EXPECT_FALSE(engine->submit(badSampler, &code).ok());
  EXPECT_EQ(code, NF_ERR_INVALID_ARGUMENT);
  // A model already in use is refused an engine, and so is a second one.
  nf::Model busy = load();
  ASSERT_TRUE(busy.addSequence().ok());
  EXPECT_FALSE(nf::ServingEngine::create(busy).ok());
  auto second = nf::ServingEngine::create(model);
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.message().find("already has an engine"), std::string::npos);
  engine = nf::ServingEngine::create(model); // not while the first lives
  EXPECT_FALSE(engine.ok());
}

// Shutdown lets running requests finish within the grace period, those
// preempted on their way included: only requests never admitted end
// unavailable, with nothing generated.
TEST(ServingEngine, ShutdownLetsPreemptedRequestsFinish) {
  nf::Model model = load(/*kvPages=*/12);
  // Without prefix caching, whose snapshots give way before a preemption
  // and whose waits for shared starts admit the prompts in turn: every
  // request holds pages at once, and the pool runs out early.
  nf::EngineParams ep;
  ep.prefixCaching = false;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok());
  const auto ps = prompts(model, 16);
  std::vector<nf::ServingRequest> rs;
  for (const auto &p : ps) {
    nf::RequestParams rp = greedy(p, 48);
    rp.ignoreEos = true;
    auto r = engine->submit(rp);
    ASSERT_TRUE(r.ok());
    rs.push_back(std::move(*r));
  }
  for (int i = 0; i < 6000 && engine->stats().preemptions == 0; ++i)
    std::this_thread::sleep_for(5ms);
  ASSERT_GT(engine->stats().preemptions, 0);
  engine->shutdown(std::chrono::milliseconds(60000));
  int finished = 0;
  for (auto &r : rs) {
    auto o = r.wait();
    ASSERT_TRUE(o.ok());
    if (o->finishReason == NF_FINISH_UNAVAILABLE) {
      EXPECT_EQ(o->completionTokens, 0) << "a running request was cut";
      EXPECT_EQ(o->preemptions, 0);
    } else {
      EXPECT_EQ(o->finishReason, NF_FINISH_LENGTH);
      ++finished;
    }
  }
  EXPECT_GT(finished, 0);
  // The engine publishes its counts after the step that ended the last.
  for (int i = 0; i < 1000 && !engine->stats().drained; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(engine->stats().drained);
}

/// log-softmax of `row` at `token`, in double.
double logprobOf(const float *row, size_t vocab, int32_t token) {
  double max = row[0], sum = 0;
  for (size_t v = 0; v < vocab; ++v)
    max = std::max<double>(max, row[v]);
  for (size_t v = 0; v < vocab; ++v)
    sum += std::exp(row[v] - max);
  return row[token] - max - std::log(sum);
}

// Logprobs through preemption: every request of a pool far too small gets
// each prompt position's logprob once and each generated token's, equal to
// the log-softmax of the logits of its context run alone (nf_decode, every
// row), with its alternatives in order; recomputed steps add none.
TEST(ServingEngine, LogprobsSurvivePreemption) {
  constexpr int kRequests = 12, kMaxTokens = 16, kTop = 3;
  nf::Model reference = load();
  nf::Model model = load(/*kvPages=*/12);
  const auto ps = prompts(model, kRequests);
  nf::EngineParams ep;
  ep.maxBatchedTokens = 24; // prompts in chunks
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  std::vector<nf::ServingRequest> requests;
  for (const auto &p : ps) {
    nf::RequestParams rp = greedy(p, kMaxTokens);
    rp.logprobs = kTop;
    rp.promptLogprobs = 1;
    auto r = engine->submit(rp);
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  const size_t vocab = static_cast<size_t>(reference.vocabSize());
  int64_t preemptions = 0;
  for (int i = 0; i < kRequests; ++i) {
    auto out = requests[i].wait();
    ASSERT_TRUE(out.ok()) << out.message();
    preemptions += out->preemptions;
    const auto &prompt = ps[i];
    ASSERT_EQ(out->promptLogprobs.size(), prompt.size() - 1) << i;
    ASSERT_EQ(out->logprobs.size(), out->tokens.size()) << i;
    ASSERT_EQ(out->logprobs.topTokens.size(), out->tokens.size() * kTop);
    // The reference: the whole context in one step, every row.
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), out->tokens.begin(), out->tokens.end());
    auto seq = reference.addSequence();
    ASSERT_TRUE(seq.ok());
    std::vector<float> logits;
    ASSERT_TRUE(reference.decode({{*seq, context}}, true, logits).ok());
    ASSERT_TRUE(reference.removeSequence(*seq).ok());
    for (size_t t = 1; t < prompt.size(); ++t) {
      EXPECT_EQ(out->promptLogprobs.tokens[t - 1], prompt[t]);
      EXPECT_NEAR(out->promptLogprobs.logprobs[t - 1],
                  logprobOf(&logits[(t - 1) * vocab], vocab, prompt[t]), 1e-4)
          << "request " << i << " prompt position " << t;
    }
    for (size_t g = 0; g < out->tokens.size(); ++g) {
      const float *row = &logits[(prompt.size() - 1 + g) * vocab];
      EXPECT_NEAR(out->logprobs.logprobs[g],
                  logprobOf(row, vocab, out->tokens[g]), 1e-4)
          << "request " << i << " token " << g;
      // Greedy: the token is the first alternative; they descend.
      EXPECT_EQ(out->logprobs.topTokens[g * kTop], out->tokens[g]);
      for (int k = 1; k < kTop; ++k)
        EXPECT_LE(out->logprobs.topLogprobs[g * kTop + k],
                  out->logprobs.topLogprobs[g * kTop + k - 1]);
    }
  }
  EXPECT_GT(preemptions, 0) << "the pool was meant to run out";
}

// vLLM's include_stop_str_in_output and skip_special_tokens: the text ends
// after the stop string instead of before it; special tokens keep their
// text. References: the decode of the tokens the request generated alone.
TEST(ServingEngine, StopStringIncludedAndSpecialTokensKept) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const auto prompt = prompts(model, 1)[0];
  auto run = [&](const nf::RequestParams &p) {
    auto r = engine->submit(p);
    EXPECT_TRUE(r.ok()) << r.message();
    auto out = r->wait();
    EXPECT_TRUE(out.ok()) << out.message();
    return *out;
  };
  const nf::RequestOutput free = run(greedy(prompt, 24));
  ASSERT_GT(free.text.size(), 12u);
  const std::string stop = free.text.substr(8, 3);
  const size_t at = free.text.find(stop);
  nf::RequestParams p = greedy(prompt, 24);
  p.stopStrings = {stop};
  EXPECT_EQ(run(p).text, free.text.substr(0, at));
  p.includeStopString = true;
  const nf::RequestOutput with = run(p);
  EXPECT_EQ(with.finishReason, NF_FINISH_STOP);
  EXPECT_EQ(with.text, free.text.substr(0, at + stop.size()));
  // <s> (a special token, not EOS) forced by logit_bias.
  nf::RequestParams special = greedy(prompt, 3);
  special.logitBias = {{1, 100.0f}};
  const nf::RequestOutput skipped = run(special);
  special.keepSpecialTokens = true;
  const nf::RequestOutput kept = run(special);
  ASSERT_EQ(kept.tokens, std::vector<int32_t>({1, 1, 1}));
  EXPECT_EQ(skipped.text, "");
  auto text = model.detokenize(kept.tokens, /*flags=*/0);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(kept.text, *text);
  EXPECT_EQ(kept.text, "<s><s><s>");
}

// The text stream (the engine's and nfrun generate's): pieces that join to
// the whole decode, cut before the first stop string, never ending inside
// a UTF-8 character or a possible stop string's beginning.
TEST(TextStream, PiecesJoinToTheDecodeAndStopBeforeTheStopString) {
  nf::Model model = load();
  const std::string text =
      "def f(x):\n    return \"héllo wörld ✓ 日本\" + x  # END here";
  auto ids = model.tokenize(text);
  ASSERT_TRUE(ids.ok());
  auto whole = model.detokenize(*ids);
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(*whole, text);
  {
    auto s = nf::TextStream::create(model);
    ASSERT_TRUE(s.ok()) << s.message();
    std::string joined;
    for (int32_t id : *ids) {
      auto piece = s->add(id);
      ASSERT_TRUE(piece.ok());
      joined += *piece;
      // Never inside a character: every prefix handed out is whole UTF-8.
      EXPECT_EQ(text.compare(0, joined.size(), joined), 0);
      if (!joined.empty())
        EXPECT_NE(static_cast<unsigned char>(joined.back()) & 0xC0, 0xC0)
            << "a piece ends with a lead byte";
    }
    auto rest = s->finish();
    ASSERT_TRUE(rest.ok());
    EXPECT_EQ(joined + *rest, text);
  }
  {
    auto s = nf::TextStream::create(model, {"# END", "never"});
    ASSERT_TRUE(s.ok());
    std::string joined;
    bool stopped = false;
    size_t n = 0;
    for (; n < ids->size() && !stopped; ++n) {
      auto piece = s->add((*ids)[n], false, &stopped);
      ASSERT_TRUE(piece.ok());
      joined += *piece;
      // "#" alone (a possible "# END") is held back until it is decided.
      if (!stopped)
        EXPECT_EQ(joined.find('#'), std::string::npos);
    }
    EXPECT_TRUE(stopped);
    EXPECT_LT(n, ids->size());
    EXPECT_EQ(joined, text.substr(0, text.find("# END")));
  }
  EXPECT_FALSE(nf::TextStream::create(model, {""}).ok());
}

} // namespace
