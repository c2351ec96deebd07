// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011): a counter-based generator, so that the host and a device
// draw the same random number for (seed, draw, token) without sharing any
// state. kernels/nf_sample.cuh has the device's copy; both must stay equal
// (the unit tests check Random123's known answers, the CUDA tests the
// device's draws against these).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace nf::sampling {

constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                                std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * ctr[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0],
           static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1],
           static_cast<uint32_t>(p0)};
  }
  return ctr;
}

/// The 64 random bits of draw `draw` of stream `seed` for token `token`:
/// counter (token, 0, draw low, draw high), key (seed low, seed high).
constexpr uint64_t randomBits(uint64_t seed, uint64_t draw, uint32_t token) {
  const std::array<uint32_t, 4> out = philox4x32_10(
      {token, 0u, static_cast<uint32_t>(draw),
       static_cast<uint32_t>(draw >> 32)},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return uint64_t{out[0]} | uint64_t{out[1]} << 32;
}

/// Uniform in (0, 1) from the top 52 bits, exactly (q + 0.5) / 2^52: never
/// 0 or 1 (with 53 bits, q + 0.5 would round to 2^53 for the largest q).
constexpr double uniformOpen(uint64_t bits) {
  return (static_cast<double>(bits >> 12) + 0.5) * 0x1.0p-52;
}

/// Standard Gumbel noise of (seed, draw, token): -log(-log(u)), in
/// [-3.61, 36.74].
inline double gumbelNoise(uint64_t seed, uint64_t draw, uint32_t token) {
  return -std::log(-std::log(uniformOpen(randomBits(seed, draw, token))));
}

} // namespace nf::sampling
