// The serving engine's prefix cache (serving/prefix_cache.h) on the
// pydoc-moe plan (Mamba2, attention and MoE layers; CPU backend): requests
// that hit a snapshot skip those tokens (cached_tokens, the engine's
// counters) and still produce exactly the tokens they produce alone, with
// no engine (nf_generate on a model of its own); salts separate caches;
// snapshots give their slots and pages up under pressure.
#include "nf/nf.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

nf::Model load(int32_t kvPages = 0, int32_t maxSequences = 0) {
  nf::ModelParams p;
  p.backend = "cpu";
  p.kvPages = kvPages;
  p.maxSequences = maxSequences;
  auto m = nf::Model::load(std::string(NF_PLAN_DIR) + "/pydoc-moe.nfb", p);
  EXPECT_TRUE(m.ok()) << m.message();
  return std::move(*m);
}

std::vector<int32_t> tokens(const nf::Model &m, const std::string &text) {
  auto ids = m.tokenize(text);
  EXPECT_TRUE(ids.ok()) << ids.message();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::vector<int32_t> alone(nf::Model &m, const std::vector<int32_t> &prompt,
                           int32_t maxTokens) {
  nf::GenerateParams gp;
  gp.maxTokens = maxTokens;
  gp.ignoreEos = true;
  auto t = m.generate(prompt, gp);
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? *t : std::vector<int32_t>{};
}

std::vector<int32_t> concat(std::vector<int32_t> a,
                            const std::vector<int32_t> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
};

Outcome run(nf::ServingEngine &e, const std::vector<int32_t> &prompt,
            int32_t maxTokens, const std::string &salt = "") {
  nf::RequestParams p;
  p.prompt = prompt;
  p.maxTokens = maxTokens;
  p.ignoreEos = true;
  p.cacheSalt = salt;
  auto r = e.submit(p);
  EXPECT_TRUE(r.ok()) << r.message();
  if (!r.ok())
    return {};
  auto out = r->wait();
  EXPECT_TRUE(out.ok()) << out.message();
  EXPECT_EQ(out->finishReason, NF_FINISH_LENGTH) << out->error;
  return {out->tokens, out->cachedTokens};
}

/// The engine's counters once the step that ended the last request is in.
nf_engine_stats settled(nf::ServingEngine &e) {
  nf_engine_stats s = e.stats();
  for (int i = 0; i < 1000 && s.running > 0; ++i) {
    std::this_thread::sleep_for(10ms);
    s = e.stats();
  }
  return s;
}

const char *kSystem =
    "# A small library of helpers for lists.\n\n"
    "def first(items):\n    \"\"\"Return the first item of a list, or "
    "None when it is empty.\"\"\"\n    return items[0] if items else None\n\n";

} // namespace

// Exact repeats, longer prompts with the same start, a prompt that leaves
// the shared start part way, and the next turn of a conversation (the last
// request's prompt and answer, then more).
TEST(PrefixCache, HitsSkipTokensAndChangeNoToken) {
  nf::Model reference = load();
  nf::Model model = load();
  nf::EngineParams ep;
  ep.prefixCacheBlock = 16;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> a = tokens(model, kSystem);
  ASSERT_GT(a.size(), 40u);
  const size_t n = a.size();

  Outcome first = run(*engine, a, 8);
  EXPECT_EQ(first.cached, 0);
  EXPECT_EQ(first.tokens, alone(reference, a, 8));

  // The same prompt: everything but its last token comes from the cache.
  Outcome again = run(*engine, a, 8);
  EXPECT_EQ(again.cached, static_cast<int64_t>(n - 1));
  EXPECT_EQ(again.tokens, first.tokens);

  // A longer prompt with the same start: the snapshot of the first's
  // prompt and answer (its next turn) is the longest that fits.
  const std::vector<int32_t> turn =
      concat(concat(a, first.tokens), tokens(model, "\ndef last(items):"));
  Outcome next = run(*engine, turn, 6);
  EXPECT_EQ(next.cached, static_cast<int64_t>(n + first.tokens.size() - 1));
  EXPECT_EQ(next.tokens, alone(reference, turn, 6));

  // Leaving the shared start at the last block boundary before the first
  // prompt's last token (block 16): that snapshot is the longest that fits.
  const size_t boundary = (n - 1) / 16 * 16;
  const std::vector<int32_t> tail = tokens(model, " = 3\nprint(x)");
  ASSERT_NE(tail[0], a[boundary]);
  const std::vector<int32_t> other =
      concat(std::vector<int32_t>(a.begin(), a.begin() + boundary), tail);
  Outcome branch = run(*engine, other, 6);
  EXPECT_EQ(branch.cached, static_cast<int64_t>(boundary));
  EXPECT_EQ(branch.tokens, alone(reference, other, 6));

  const nf_engine_stats s = settled(*engine);
  EXPECT_EQ(s.prefix_cache_hits, again.cached + next.cached + branch.cached);
  EXPECT_EQ(s.prefix_cache_queries,
            static_cast<int64_t>(2 * n + turn.size() + other.size()));
  // Every live sequence is a snapshot now: they hold all the pages in use,
  // and each its recurrent state.
  EXPECT_GT(s.prefix_cache_entries, 0);
  EXPECT_EQ(s.live_sequences, s.prefix_cache_entries);
  EXPECT_GT(model.sequenceStateBytes(), 0);
  EXPECT_GT(model.kvPageBytes(), 0);
  EXPECT_EQ(s.prefix_cache_bytes,
            s.prefix_cache_entries * model.sequenceStateBytes() +
                (s.kv_pages - s.kv_free_pages) * model.kvPageBytes());
}

// A salted request sees only its salt's snapshots.
TEST(PrefixCache, SaltsSeparateCaches) {
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> a = tokens(model, kSystem);
  const Outcome plain = run(*engine, a, 4);
  EXPECT_EQ(plain.cached, 0);
  const Outcome salted = run(*engine, a, 4, "tenant-1");
  EXPECT_EQ(salted.cached, 0);
  EXPECT_EQ(salted.tokens, plain.tokens);
  EXPECT_EQ(run(*engine, a, 4, "tenant-1").cached,
            static_cast<int64_t>(a.size() - 1));
  EXPECT_EQ(run(*engine, a, 4, "tenant-2").cached, 0);
  EXPECT_EQ(run(*engine, a, 4).cached, static_cast<int64_t>(a.size() - 1));
}

// Off: nothing is cached and every sequence is freed.
TEST(PrefixCache, OffCachesNothing) {
  nf::Model model = load();
  nf::EngineParams ep;
  ep.prefixCaching = false;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok());
  const std::vector<int32_t> a = tokens(model, kSystem);
  run(*engine, a, 4);
  EXPECT_EQ(run(*engine, a, 4).cached, 0);
  const nf_engine_stats s = settled(*engine);
  EXPECT_EQ(s.prefix_cache_entries, 0);
  EXPECT_EQ(s.prefix_cache_hits, 0);
  EXPECT_EQ(s.live_sequences, 0);
}

// A pool too small for the requests together, and 6 sequence slots for 4
// running requests: the snapshots give their pages and slots up rather
// than hold a request back, and every request still gets exactly its
// tokens.
TEST(PrefixCache, SnapshotsGiveWayUnderPressure) {
  constexpr int kRequests = 16, kMaxTokens = 12;
  nf::Model reference = load();
  nf::Model model = load(/*kvPages=*/16, /*maxSequences=*/6);
  nf::EngineParams ep;
  ep.maxBatch = 4;
  ep.prefixCacheBlock = 16;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> base = tokens(model, kSystem);
  std::vector<std::vector<int32_t>> ps;
  for (int i = 0; i < kRequests; ++i) // shared starts, different ends
    ps.push_back(concat(
        std::vector<int32_t>(base.begin(), base.begin() + 20 + 3 * (i % 5)),
        tokens(model, "x" + std::to_string(i))));
  std::vector<nf::ServingRequest> requests;
  for (const auto &p : ps) {
    nf::RequestParams rp;
    rp.prompt = p;
    rp.maxTokens = kMaxTokens;
    rp.ignoreEos = true;
    auto r = engine->submit(rp);
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  for (int i = 0; i < kRequests; ++i) {
    auto out = requests[i].wait();
    ASSERT_TRUE(out.ok()) << out.message();
    ASSERT_EQ(out->finishReason, NF_FINISH_LENGTH) << out->error;
    EXPECT_EQ(out->tokens, alone(reference, ps[i], kMaxTokens))
        << "request " << i;
  }
  const nf_engine_stats s = settled(*engine);
  EXPECT_GT(s.prefix_cache_hits, 0);
  EXPECT_GT(s.prefix_cache_evictions, 0);
  EXPECT_LE(s.prefix_cache_entries, 6);
  EXPECT_EQ(s.live_sequences, s.prefix_cache_entries);
}

// Requests with the same prompt submitted together (n > 1, duplicates):
// one prefills the prompt, the others wait for its snapshot before the
// last token and fork it; each still samples its own tokens.
TEST(PrefixCache, SamePromptsTogetherPrefillOnce) {
  nf::Model reference = load();
  nf::Model model = load();
  auto engine = nf::ServingEngine::create(model);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> a = tokens(model, kSystem);
  std::vector<nf::ServingRequest> requests;
  for (int i = 0; i < 4; ++i) {
    nf::RequestParams p;
    p.prompt = a;
    p.maxTokens = 6;
    p.ignoreEos = true;
    if (i > 0) { // seeded sampling: three draws of one distribution
      p.sampler.temperature = 1.0f;
      p.sampler.seed = static_cast<uint64_t>(i);
    }
    auto r = engine->submit(p);
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  int64_t cached = 0;
  std::vector<std::vector<int32_t>> sampled;
  for (int i = 0; i < 4; ++i) {
    auto out = requests[i].wait();
    ASSERT_TRUE(out.ok()) << out.message();
    ASSERT_EQ(out->finishReason, NF_FINISH_LENGTH) << out->error;
    cached += out->cachedTokens;
    if (i == 0)
      EXPECT_EQ(out->tokens, alone(reference, a, 6));
    else
      sampled.push_back(out->tokens);
  }
  EXPECT_EQ(cached, 3 * static_cast<int64_t>(a.size() - 1));
  // Each sampled as it would alone: the same seed gives the same tokens.
  nf::RequestParams p;
  p.prompt = a;
  p.maxTokens = 6;
  p.ignoreEos = true;
  p.sampler.temperature = 1.0f;
  p.sampler.seed = 2;
  nf::EngineParams off;
  off.prefixCaching = false;
  nf::Model fresh = load();
  auto plain = nf::ServingEngine::create(fresh, off);
  ASSERT_TRUE(plain.ok());
  auto r = plain->submit(p);
  ASSERT_TRUE(r.ok());
  auto out = r->wait();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->tokens, sampled[1]);
}

// A conversation's next turn continues from the snapshot of the last one
// and computes its new tokens in one chunk, where a first prompt pauses at
// its last block boundary: on a MoE model each pause is a step that reads
// about all the expert weights.
TEST(PrefixCache, NextTurnsDoNotPauseAtBlockBoundaries) {
  nf::Model reference = load();
  nf::Model model = load();
  nf::EngineParams ep;
  ep.prefixCacheBlock = 16;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> a = tokens(model, kSystem);
  const size_t n = a.size();
  ASSERT_NE((n - 1) % 16, 0u); // a block boundary before its last token
  constexpr int kTokens = 4;
  Outcome first = run(*engine, a, kTokens);
  const int64_t firstSteps = settled(*engine).steps;
  // Chunks to the block boundary, to the last token, the last token (the
  // first answer token), then the other answer tokens one step each.
  EXPECT_EQ(firstSteps, 3 + (kTokens - 1));

  const std::vector<int32_t> turn =
      concat(concat(a, first.tokens),
             tokens(model, "\ndef last(items):\n    return items[-1]\n"));
  const size_t hit = n + kTokens - 1;
  ASSERT_LT(hit / 16, (turn.size() - 1) / 16); // a boundary among the new
  ASSERT_NE((turn.size() - 1) % 16, 0u);
  Outcome next = run(*engine, turn, kTokens);
  EXPECT_EQ(next.cached, static_cast<int64_t>(hit));
  EXPECT_EQ(next.tokens, alone(reference, turn, kTokens));
  EXPECT_EQ(settled(*engine).steps - firstSteps, 2 + (kTokens - 1));
}

// Requests that arrive together with one system prompt and questions of
// their own compute the system prompt once: the others wait for the first
// one's snapshot at the last block boundary inside it and continue from
// there, with the tokens they would get alone.
TEST(PrefixCache, SharedSystemPromptTogetherPrefillOnce) {
  nf::Model reference = load();
  nf::Model model = load();
  nf::EngineParams ep;
  ep.prefixCacheBlock = 16;
  auto engine = nf::ServingEngine::create(model, ep);
  ASSERT_TRUE(engine.ok()) << engine.message();
  const std::vector<int32_t> system = tokens(model, kSystem);
  const size_t shared = system.size() / 16 * 16;
  ASSERT_GE(shared, 16u);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<nf::ServingRequest> requests;
  for (const char *q : {"def mean(values):", "class Queue:", "import re\n",
                        "def is_prime(n):"}) {
    nf::RequestParams p;
    p.prompt = concat(system, tokens(model, q));
    p.maxTokens = 5;
    p.ignoreEos = true;
    prompts.push_back(p.prompt);
    auto r = engine->submit(p);
    ASSERT_TRUE(r.ok()) << r.message();
    requests.push_back(std::move(*r));
  }
  int64_t cached = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto out = requests[i].wait();
    ASSERT_TRUE(out.ok()) << out.message();
    EXPECT_EQ(out->tokens, alone(reference, prompts[i], 5)) << i;
    cached += out->cachedTokens;
  }
  EXPECT_GE(cached, 3 * static_cast<int64_t>(shared));
}
