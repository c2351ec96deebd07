// The KV cache's storage dtypes on the CPU backend (engine/caches.h
// KvStorage): kvAppend rounds each written row as a bf16 or fp8 cache would
// hold it. Checked against the formats' definitions, not against the
// rounding helpers: every bf16 value is the nearest one of the two bf16
// neighbours of the input, every fp8 value the nearest of all 256 E4M3 codes
// times the row's scale (amax / 448). A tiered cache's pages hold the
// bf16 values while in a sequence's hot window and their fp8 rounding after.
#include "backends/cpu/kernels.h"
#include "engine/caches.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace nf;
using namespace nf::cpu;

constexpr int64_t kHeads = 2, kHeadDim = 32, kRow = kHeads * kHeadDim;
constexpr int32_t kPageSize = 4, kPages = 4, kTokens = 6;

/// K and V rows of kTokens tokens with magnitudes from 1e-6 to 1e3, a zero
/// row and an exact tie for bf16.
std::vector<float> rows(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-20, 10);
  std::vector<float> x(kTokens * kRow);
  for (float &v : x)
    v = std::ldexp(mant(rng), exp(rng));
  std::fill(x.begin() + 2 * kRow, x.begin() + 2 * kRow + kHeadDim, 0.0f);
  x[1] = 1.0f + std::ldexp(1.0f, -8); // halfway between two bf16 values
  return x;
}

/// Appends `k`/`v` for one sequence over pages {2, 0} and returns the cache
/// rows in position order.
std::pair<std::vector<float>, std::vector<float>>
append(const std::vector<float> &k, const std::vector<float> &v,
       KvStorage storage) {
  std::vector<float> kc(kPages * kPageSize * kRow, NAN),
      vc(kPages * kPageSize * kRow, NAN);
  PagedKvLayer cache{kc.data(), vc.data(), kPages, kPageSize,
                     kHeads,    kHeadDim,  storage};
  const std::vector<int32_t> table = {2, 0};
  const std::span<const int32_t> tables[] = {table};
  const SeqSpan spans[] = {{0, kTokens, 0, 0}};
  kvAppend(k.data(), kRow, v.data(), kRow, spans, tables, cache);
  std::vector<float> ko, vo;
  for (int32_t p = 0; p < kTokens; ++p) {
    const int64_t off =
        (table[p / kPageSize] * kPageSize + p % kPageSize) * kRow;
    ko.insert(ko.end(), kc.begin() + off, kc.begin() + off + kRow);
    vo.insert(vo.end(), vc.begin() + off, vc.begin() + off + kRow);
  }
  return {ko, vo};
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// The bf16 value nearest `x` (ties to an even last bit), from its two
/// neighbours.
float nearestBf16(float x) {
  const float lo = fromBits(bits(x) & 0xffff0000u);
  const float hi = fromBits((bits(x) & 0xffff0000u) + 0x10000u);
  const double dl = std::fabs(double(x) - lo), dh = std::fabs(double(hi) - x);
  if (dl != dh)
    return dl < dh ? lo : hi;
  return (bits(lo) >> 16) % 2 == 0 ? lo : hi;
}

/// Every finite E4M3 value, from its definition (sign, 4 exponent bits of
/// bias 7, 3 mantissa bits; S.1111.111 is NaN).
std::vector<double> e4m3Values() {
  std::vector<double> out;
  for (int code = 0; code < 256; ++code) {
    const int e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7)
      continue;
    const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    out.push_back(code & 0x80 ? -mag : mag);
  }
  return out;
}

TEST(KvStorage, F32KeepsTheRows) {
  const auto k = rows(1), v = rows(2);
  auto [ko, vo] = append(k, v, KvStorage::F32);
  EXPECT_EQ(ko, k);
  EXPECT_EQ(vo, v);
}

TEST(KvStorage, Bf16HoldsTheNearestBf16) {
  const auto k = rows(3), v = rows(4);
  auto [ko, vo] = append(k, v, KvStorage::BF16);
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(ko[i], nearestBf16(k[i])) << "k " << i << " of " << k[i];
    EXPECT_EQ(vo[i], nearestBf16(v[i])) << "v " << i << " of " << v[i];
  }
  EXPECT_EQ(ko[1], 1.0f); // the tie goes to the even neighbour
}

/// Checks that each row of `y` ([rows, kHeadDim]) holds the nearest E4M3
/// code of each value of `x`'s row times the row's scale (amax / 448);
/// returns the values checked (ties, where either neighbour is nearest, are
/// not).
int expectNearestE4M3(const float *x, const float *y, int64_t rows) {
  static const std::vector<double> codes = e4m3Values();
  int checked = 0;
  for (int64_t r = 0; r < rows; ++r, x += kHeadDim, y += kHeadDim) {
    float amax = 0.0f;
    for (int64_t i = 0; i < kHeadDim; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    if (amax == 0.0f) {
      for (int64_t i = 0; i < kHeadDim; ++i)
        EXPECT_EQ(y[i], 0.0f);
      continue;
    }
    const float scale = amax / 448.0f;
    for (int64_t i = 0; i < kHeadDim; ++i) {
      const double t = double(x[i] / scale);
      double best = codes[0], second = std::numeric_limits<double>::max();
      for (double c : codes)
        if (std::fabs(c - t) < std::fabs(best - t)) {
          second = best;
          best = c;
        } else if (c != best && std::fabs(c - t) < std::fabs(second - t)) {
          second = c;
        }
      if (std::fabs(best - t) == std::fabs(second - t))
        continue; // a tie: either neighbour is a nearest code
      EXPECT_EQ(y[i], static_cast<float>(best) * scale)
          << "row " << r << " element " << i << " of " << x[i];
      ++checked;
    }
    // The row's largest magnitude becomes the largest code, 448.
    float ymax = 0.0f;
    for (int64_t i = 0; i < kHeadDim; ++i)
      ymax = std::max(ymax, std::fabs(y[i]));
    EXPECT_EQ(ymax, 448.0f * scale) << "row " << r;
  }
  return checked;
}

TEST(KvStorage, Fp8HoldsTheNearestCodeTimesTheRowScale) {
  const auto k = rows(5), v = rows(6);
  auto [ko, vo] = append(k, v, KvStorage::F8E4M3);
  const int checked = expectNearestE4M3(k.data(), ko.data(), kTokens * kHeads) +
                      expectNearestE4M3(v.data(), vo.data(), kTokens * kHeads);
  EXPECT_GT(checked, 500);
}

/// A tiered cache (hot window kWindow) with one sequence written kChunk
/// tokens a step, compressed after each step as the engines do.
constexpr int32_t kWindow = 6, kChunk = 3;

struct Tiered {
  Caches caches;
  int32_t slot = -1;
  std::vector<float> k, v; // every position's rows as written
  static Tiered make(int32_t units) {
    const KvLayerShape shape{kHeads, kHeadDim, KvStorage::F8E4M3};
    CacheConfig cfg;
    cfg.numSlots = 2;
    cfg.numPages = units;
    cfg.pageSize = kPageSize;
    cfg.hotWindow = kWindow;
    StatusOr<Caches> c = Caches::create({}, std::span(&shape, 1), cfg);
    EXPECT_TRUE(c) << c.message();
    Tiered t{std::move(*c)};
    t.slot = *t.caches.addSequence();
    return t;
  }
  void write(int32_t slot, int64_t count, uint32_t seed) {
    const int64_t len = caches.length(slot);
    ASSERT_TRUE(caches.reserve(slot, len + count));
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> kr(count * kRow), vr(count * kRow);
    for (float &x : kr)
      x = d(rng);
    for (float &x : vr)
      x = d(rng);
    if (slot == this->slot) {
      k.insert(k.end(), kr.begin(), kr.end());
      v.insert(v.end(), vr.begin(), vr.end());
    }
    const std::span<const int32_t> tables[] = {caches.pageTable(slot)};
    const SeqSpan spans[] = {{0, static_cast<int32_t>(count), len, slot}};
    kvAppend(kr.data(), kRow, vr.data(), kRow, spans, tables,
             caches.kv().layer(0));
    ASSERT_TRUE(caches.advance(slot, count));
    caches.compress();
  }
  /// Position p's K (or V) row as the cache holds it.
  const float *row(int64_t p, bool isV) {
    const PagedKvLayer l = caches.kv().layer(0);
    const int32_t page = caches.pageTable(slot)[p / kPageSize];
    return (isV ? l.v : l.k) + (page * kPageSize + p % kPageSize) * kRow;
  }
};

TEST(KvStorage, TieredPagesLeaveTheHotWindowAsFp8) {
  Tiered t = Tiered::make(16);
  for (int i = 0; i < 5; ++i)
    t.write(t.slot, i < 4 ? kChunk : 2, 10 + i);
  // 14 positions: pages 0 and 1 end before position 14 - 6 = 8, so they are
  // cold; 2 and 3 hold positions of the window.
  const std::vector<int32_t> &table = t.caches.pageTable(t.slot);
  ASSERT_EQ(table.size(), 4u);
  int checked = 0;
  for (int64_t p = 0; p < 14; ++p) {
    const bool cold = p < 8;
    EXPECT_EQ(t.caches.kv().isHot(table[p / kPageSize]), !cold) << p;
    for (bool isV : {false, true}) {
      const float *in = (isV ? t.v : t.k).data() + p * kRow;
      const float *held = t.row(p, isV);
      std::vector<float> bf16(in, in + kRow);
      for (float &x : bf16)
        x = nearestBf16(x);
      if (cold)
        checked += expectNearestE4M3(bf16.data(), held, kHeads);
      else
        for (int64_t i = 0; i < kRow; ++i)
          EXPECT_EQ(held[i], bf16[i]) << "position " << p;
    }
  }
  EXPECT_GT(checked, 400);
  // Page 0 shrank where it was (unit 0); page 1 moved into the unit that
  // left (1), so its pair (2, 3) is whole again; pages 2 and 3 are hot
  // pairs: 3 of the 8 pairs are in use.
  EXPECT_EQ(table, (std::vector<int32_t>{0, 1, 4, 6}));
  EXPECT_EQ(t.caches.kv().numPages(), 8);
  EXPECT_EQ(t.caches.kv().numFreePages(), 5);
  // Freed, every unit merges back into pairs.
  ASSERT_TRUE(t.caches.removeSequence(t.slot));
  EXPECT_EQ(t.caches.kv().numFreePages(), 8);
}

TEST(KvStorage, TieredPagesOfTwoTablesStayHotUntilOneIsLeft) {
  Tiered t = Tiered::make(32);
  for (int i = 0; i < 5; ++i)
    t.write(t.slot, i < 4 ? kChunk : 2, 20 + i);
  StatusOr<Caches::Fork> f = t.caches.fork(t.slot); // shares pages 0-2
  ASSERT_TRUE(f) << f.message();
  t.write(t.slot, 6, 30); // 20 positions: page 2 leaves the window
  const int32_t page2 = t.caches.pageTable(t.slot)[2];
  EXPECT_TRUE(t.caches.kv().isHot(page2));
  EXPECT_EQ(t.caches.pageTable(f->slot)[2], page2);
  ASSERT_TRUE(t.caches.removeSequence(f->slot));
  EXPECT_EQ(t.caches.compress(), 1);
  EXPECT_FALSE(t.caches.kv().isHot(t.caches.pageTable(t.slot)[2]));
  // Pages 0-2 cold, 3 and 4 (positions 12-19) hot: 3 + 2 x 2 units.
  const int32_t slots[] = {t.slot};
  EXPECT_EQ(t.caches.exclusivePages(slots), 7);
  std::vector<float> bf16(t.k.begin() + 8 * kRow, t.k.begin() + 9 * kRow);
  for (float &x : bf16)
    x = nearestBf16(x);
  EXPECT_GT(expectNearestE4M3(bf16.data(), t.row(8, false), kHeads), 30);
}

// Many sequences of random lengths growing, forking and ending, compressed
// before every step as the engines do: hot pages keep finding pairs while
// units are free in pairs, every table holds live pages of its own tier,
// and once every sequence has ended the units merge back into whole pairs.
TEST(KvStorage, TieredCachesDoNotFragment) {
  const KvLayerShape shape{kHeads, kHeadDim, KvStorage::F8E4M3};
  CacheConfig cfg;
  cfg.numSlots = 16;
  cfg.numPages = 512;
  cfg.pageSize = kPageSize;
  cfg.hotWindow = kWindow;
  StatusOr<Caches> made = Caches::create({}, std::span(&shape, 1), cfg);
  ASSERT_TRUE(made) << made.message();
  Caches &c = *made;
  std::mt19937 rng(7);
  std::vector<int32_t> live;
  int64_t compressed = 0;
  for (int step = 0; step < 4000; ++step) {
    compressed += c.compress();
    // Pages that lie wholly before a sequence's window are cold unless
    // another table holds them; the rest are hot.
    for (int32_t slot : live) {
      const std::vector<int32_t> &t = c.pageTable(slot);
      const int64_t cold =
          std::max<int64_t>(0, c.length(slot) - kWindow) / kPageSize;
      for (size_t j = 0; j < t.size(); ++j) {
        ASSERT_GT(c.kv().pageRefs(t[j]), 0);
        if (static_cast<int64_t>(j) >= cold)
          ASSERT_TRUE(c.kv().isHot(t[j])) << "slot " << slot << " page " << j;
        else if (c.kv().pageRefs(t[j]) == 1)
          ASSERT_FALSE(c.kv().isHot(t[j])) << "slot " << slot << " page " << j;
      }
    }
    const unsigned r = rng() % 100;
    if (live.size() < 3 || (r < 10 && live.size() < 12)) {
      if (StatusOr<int32_t> s = c.addSequence())
        live.push_back(*s);
    } else if (r < 14) {
      StatusOr<Caches::Fork> f = c.fork(live[rng() % live.size()]);
      if (f)
        live.push_back(f->slot);
    } else if (r < 24) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(c.removeSequence(live[i]));
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      const int32_t slot = live[rng() % live.size()];
      const int64_t n = 1 + rng() % 9;
      if (c.pagesNeeded(slot, c.length(slot) + n) > c.kv().numFreePages())
        continue; // as a scheduler would wait
      ASSERT_TRUE(c.reserve(slot, c.length(slot) + n));
      ASSERT_TRUE(c.advance(slot, n));
    }
  }
  EXPECT_GT(compressed, 1000);
  for (int32_t slot : live)
    ASSERT_TRUE(c.removeSequence(slot));
  EXPECT_EQ(c.kv().numFreePages(), 256);
}

TEST(KvStorage, AHotWindowNeedsFp8Layers) {
  const KvLayerShape shape{kHeads, kHeadDim, KvStorage::BF16};
  StatusOr<KvCache> c = KvCache::create(std::span(&shape, 1), 8, 4, 16);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.message(), "kv cache: a hot window needs fp8 layers");
}

} // namespace
