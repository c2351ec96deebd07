// The KV cache's page allocator (runtime/src/engine/page_pool.h) against a
// direct model of its rule: a unit is the lowest free unit whose buddy is in
// use, else the first unit of the lowest free aligned pair; a pair is the
// lowest aligned pair with both units free.
#include "engine/page_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace {

using nf::cpu::PagePool;

struct Model {
  std::vector<bool> free;
  explicit Model(int n) : free(static_cast<size_t>(n), true) {}
  int n() const { return static_cast<int>(free.size()); }
  bool buddyFree(int u) const { return (u ^ 1) < n() && free[u ^ 1]; }
  std::optional<int> allocate(int order) {
    if (order == 0)
      for (int u = 0; u < n(); ++u)
        if (free[u] && !buddyFree(u)) {
          free[u] = false;
          return u;
        }
    for (int u = 0; u + 1 < n(); u += 2)
      if (free[u] && free[u + 1]) {
        free[u] = false;
        if (order == 1)
          free[u + 1] = false;
        return u;
      }
    return std::nullopt;
  }
  int freeUnits() const {
    int c = 0;
    for (bool f : free)
      c += f;
    return c;
  }
  int freePairs() const {
    int c = 0;
    for (int u = 0; u + 1 < n(); u += 2)
      c += free[u] && free[u + 1];
    return c;
  }
};

TEST(PagePool, FreedNeighboursMergeIntoAPair) {
  PagePool pool(4);
  EXPECT_EQ(pool.allocate(0), 0);
  EXPECT_EQ(pool.allocate(0), 1); // the single left by the split
  EXPECT_EQ(pool.allocate(1), 2);
  EXPECT_EQ(pool.allocate(1), std::nullopt);
  EXPECT_EQ(pool.freePairs(), 0);
  pool.release(1, 0);
  EXPECT_EQ(pool.freeUnits(), 1);
  EXPECT_EQ(pool.allocate(1), std::nullopt); // 0 is in use
  pool.release(0, 0);
  EXPECT_EQ(pool.freePairs(), 1);
  EXPECT_EQ(pool.allocate(1), 0);
}

TEST(PagePool, UnitsComeFromSinglesBeforePairsAreSplit) {
  PagePool pool(8);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(pool.allocate(0), i);
  pool.release(2, 0); // pair 2-3 is whole again below
  pool.release(3, 0);
  pool.release(6, 0); // a single: 7 is in use
  EXPECT_EQ(pool.allocate(0), 6);
  EXPECT_EQ(pool.allocate(1), 2);
}

TEST(PagePool, AnOddLastUnitIsASingle) {
  PagePool pool(3);
  EXPECT_EQ(pool.freePairs(), 1);
  EXPECT_EQ(pool.allocate(0), 2);
  EXPECT_EQ(pool.allocate(1), 0);
  EXPECT_EQ(pool.allocate(0), std::nullopt);
  pool.release(2, 0);
  EXPECT_EQ(pool.freePairs(), 0);
  EXPECT_EQ(pool.freeUnits(), 1);
}

TEST(PagePool, RandomUseMatchesTheModel) {
  for (int n : {1, 2, 7, 64, 301}) {
    PagePool pool(n);
    Model model(n);
    std::mt19937 rng(static_cast<unsigned>(n));
    std::vector<std::pair<int, int>> held; // unit, order
    for (int step = 0; step < 20000; ++step) {
      const bool alloc = held.empty() || rng() % 100 < 52;
      if (alloc) {
        const int order = static_cast<int>(rng() % 2);
        const std::optional<int> want = model.allocate(order);
        const std::optional<int32_t> got = pool.allocate(order);
        ASSERT_EQ(got.has_value(), want.has_value()) << n << " " << step;
        if (got) {
          ASSERT_EQ(*got, *want) << n << " " << step << " order " << order;
          held.emplace_back(*got, order);
        }
      } else {
        const size_t i = rng() % held.size();
        const auto [u, order] = held[i];
        held[i] = held.back();
        held.pop_back();
        pool.release(u, order);
        model.free[u] = true;
        if (order == 1)
          model.free[u + 1] = true;
      }
      ASSERT_EQ(pool.freeUnits(), model.freeUnits()) << n << " " << step;
      ASSERT_EQ(pool.freePairs(), model.freePairs()) << n << " " << step;
    }
  }
}

} // namespace
