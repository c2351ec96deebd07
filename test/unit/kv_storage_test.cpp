// The KV cache's storage dtypes on the CPU backend (engine/caches.h
// KvStorage): kvAppend rounds each written row as a bf16 or fp8 cache would
// hold it. Checked against the formats' definitions, not against the
// rounding helpers: every bf16 value is the nearest one of the two bf16
// neighbours of the input, every fp8 value the nearest of all 256 E4M3 codes
// times the row's scale (amax / 448).
#include "backends/cpu/kernels.h"

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
    const int64_t off = (table[p / kPageSize] * kPageSize + p % kPageSize) * kRow;
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
    const double mag =
        e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
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

TEST(KvStorage, Fp8HoldsTheNearestCodeTimesTheRowScale) {
  const auto k = rows(5), v = rows(6);
  auto [ko, vo] = append(k, v, KvStorage::F8E4M3);
  const std::vector<double> codes = e4m3Values();
  int checked = 0;
  for (const auto &[in, out] : {std::pair(&k, &ko), std::pair(&v, &vo)})
    for (int64_t r = 0; r < kTokens * kHeads; ++r) {
      const float *x = in->data() + r * kHeadDim;
      const float *y = out->data() + r * kHeadDim;
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
  EXPECT_GT(checked, 500);
}

} // namespace
