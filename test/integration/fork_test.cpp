// Forked sequences (Engine::forkSequence, cpu::Caches::fork): a fork
// continues exactly as its source would, shares the source's full KV pages
// and copies the partly filled one, and neither disturbs the other. On the
// CPU backend, against the same sequence computed without a fork.
#include "engine/caches.h"
#include "engine/engine.h"

#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace {

using namespace nf;
using namespace nf::test::integration;

std::string planPath(const std::string &name) {
  return std::string(NF_PLAN_DIR) + "/" + name + ".nfb";
}

std::vector<int32_t> tokens(int32_t first, int32_t n, int32_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    t[i] = (first + 7 * i) % vocab;
  return t;
}

/// Logits of `continuation` after `prefix`, each fed as one step (the
/// chunking the forked sequences see), on a fresh sequence.
std::vector<float> unforked(Engine &e, const std::vector<int32_t> &prefix,
                            const std::vector<std::vector<int32_t>> &steps) {
  StatusOr<int32_t> s = e.addSequence();
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<float> logits;
  EXPECT_TRUE(stepOne(e, *s, prefix, LogitsFor::AllTokens, logits).ok());
  for (const auto &t : steps)
    EXPECT_TRUE(stepOne(e, *s, t, LogitsFor::AllTokens, logits).ok());
  EXPECT_TRUE(e.removeSequence(*s).ok());
  return logits;
}

} // namespace

// tiny-nano: Mamba2 and attention layers, 16-token KV pages. A 21-token
// prefix leaves page 1 partly filled; both continuations write into it.
TEST(PlanFork, ContinuesAsTheSourceWouldAndLeavesItAlone) {
  std::unique_ptr<Engine> e = loadEngine(planPath("tiny-nano"));
  ASSERT_NE(e, nullptr);
  const int32_t V = static_cast<int32_t>(e->info().vocabSize);
  const std::vector<int32_t> prefix = tokens(3, 21, V);
  const std::vector<int32_t> a1 = tokens(11, 4, V), a2 = tokens(5, 14, V);
  const std::vector<int32_t> b1 = tokens(29, 9, V), b2 = {17};
  const std::vector<float> wantA = unforked(*e, prefix, {a1, a2});
  const std::vector<float> wantB = unforked(*e, prefix, {b1, b2});

  StatusOr<int32_t> a = e->addSequence();
  ASSERT_TRUE(a.ok());
  std::vector<float> logits;
  ASSERT_TRUE(stepOne(*e, *a, prefix, LogitsFor::AllTokens, logits).ok());
  const int64_t freeBefore = e->cacheUsage().kvFreePages;
  StatusOr<int32_t> b = e->forkSequence(*a);
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_NE(*b, *a);
  EXPECT_EQ(e->sequenceLength(*b), 21);
  // Page 0 (full) is shared; page 1 (5 of 16 positions) is copied.
  EXPECT_EQ(e->cacheUsage().kvFreePages, freeBefore - 1);

  // Both in one step, then each alone: bit-identical to the unforked runs.
  std::vector<SequenceInput> step = {{*a, a1}, {*b, b1}};
  ASSERT_TRUE(e->step(step, LogitsFor::AllTokens, logits).ok());
  ASSERT_TRUE(stepOne(*e, *a, a2, LogitsFor::AllTokens, logits).ok());
  EXPECT_EQ(logits,
            std::vector<float>(wantA.end() - a2.size() * V, wantA.end()));
  // The source can leave first: the fork keeps the pages it shares.
  ASSERT_TRUE(e->removeSequence(*a).ok());
  ASSERT_TRUE(stepOne(*e, *b, b2, LogitsFor::AllTokens, logits).ok());
  EXPECT_EQ(logits, std::vector<float>(wantB.end() - V, wantB.end()));
  ASSERT_TRUE(e->removeSequence(*b).ok());
  EXPECT_EQ(e->cacheUsage().kvFreePages, e->cacheUsage().kvPages);
  EXPECT_EQ(e->cacheUsage().sequences, 0);
}

// A page-aligned prefix copies no page; a fork without a free slot is one
// error and changes nothing; an unknown id is an error.
TEST(PlanFork, AlignedPrefixesShareEveryPageAndFullEnginesRefuse) {
  EngineOptions o = testOptions();
  o.maxSequences = 2;
  std::unique_ptr<Engine> e = loadEngine(planPath("tiny-nano"), o);
  ASSERT_NE(e, nullptr);
  const int32_t V = static_cast<int32_t>(e->info().vocabSize);
  StatusOr<int32_t> a = e->addSequence();
  ASSERT_TRUE(a.ok());
  std::vector<float> logits;
  ASSERT_TRUE(
      stepOne(*e, *a, tokens(1, 32, V), LogitsFor::LastTokenPerSequence, logits)
          .ok());
  const int64_t freeBefore = e->cacheUsage().kvFreePages;
  StatusOr<int32_t> b = e->forkSequence(*a);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(e->cacheUsage().kvFreePages, freeBefore);
  StatusOr<int32_t> c = e->forkSequence(*a);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("slots are in use"), std::string::npos)
      << c.message();
  EXPECT_EQ(e->cacheUsage().sequences, 2);
  EXPECT_EQ(e->cacheUsage().kvFreePages, freeBefore);
  EXPECT_FALSE(e->forkSequence(12345).ok());
}

// The page allocator under forks: references counted, a page free only
// when no table holds it.
TEST(CachesFork, PagesAreCountedAndFreedWithTheirLastHolder) {
  cpu::KvLayerShape kv{1, 2};
  cpu::CacheConfig cfg;
  cfg.numSlots = 3;
  cfg.numPages = 4;
  cfg.pageSize = 2;
  StatusOr<cpu::Caches> c = cpu::Caches::create({}, std::span(&kv, 1), cfg);
  ASSERT_TRUE(c.ok()) << c.message();
  StatusOr<int32_t> s = c->addSequence();
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(c->reserve(*s, 3).ok()); // pages for positions 0..2
  ASSERT_TRUE(c->advance(*s, 3).ok());
  cpu::PagedKvLayer layer = c->kv().layer(0);
  const int32_t partial = c->pageTable(*s)[1];
  layer.k[partial * 4] = 42.0f; // position 2, element 0
  StatusOr<cpu::Caches::Fork> f = c->fork(*s);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(c->length(f->slot), 3);
  EXPECT_EQ(c->pageTable(f->slot)[0], c->pageTable(*s)[0]);
  EXPECT_EQ(f->pageFrom, partial);
  EXPECT_NE(f->pageTo, partial);
  EXPECT_EQ(layer.k[f->pageTo * 4], 42.0f);
  EXPECT_EQ(c->kv().numFreePages(), 1);
  // Pages only some slots hold: each its copied page; both, all three.
  const int32_t source = *s, forked = f->slot;
  EXPECT_EQ(c->exclusivePages(std::span(&source, 1)), 1);
  EXPECT_EQ(c->exclusivePages(std::span(&forked, 1)), 1);
  const int32_t both[] = {source, forked, forked};
  EXPECT_EQ(c->exclusivePages(both), 3);
  EXPECT_EQ(c->exclusivePages({}), 0);
  ASSERT_TRUE(c->removeSequence(*s).ok());
  EXPECT_EQ(c->exclusivePages(std::span(&forked, 1)), 2);
  EXPECT_EQ(c->kv().numFreePages(), 2); // page 0 stays with the fork
  ASSERT_TRUE(c->removeSequence(f->slot).ok());
  EXPECT_EQ(c->kv().numFreePages(), 4);
}
