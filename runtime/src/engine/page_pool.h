// The KV cache's page allocator: a buddy allocator of two orders over equal
// units of storage. A page takes one unit, or an aligned pair of units (the
// hot pages of a tiered cache, bf16, take twice an fp8 page's bytes). A
// freed unit whose buddy is free merges with it into a free pair
// (coalescing), so cold pages freed in any order give back room for hot
// pages. Allocation takes the lowest free block of the order asked for; a
// unit comes from a free single before a pair is split, which keeps pairs
// whole while singles last.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace nf::cpu {

class PagePool {
public:
  explicit PagePool(int32_t units = 0);

  /// A free unit (order 0), or an aligned pair (order 1: its first, even
  /// unit); nullopt when none is free.
  std::optional<int32_t> allocate(int order);
  /// Gives back a block allocate(order) returned.
  void release(int32_t unit, int order);

  int32_t numUnits() const { return static_cast<int32_t>(state_.size()); }
  /// Units free, and aligned pairs whose both units are free.
  int32_t freeUnits() const { return freeUnits_; }
  int32_t freePairs() const { return freePairs_; }
  /// Free units whose buddy is in use.
  int32_t freeSingles() const { return freeSingles_; }

private:
  enum : uint8_t { kUsed, kSingle, kPair }; // kPair: both units of a pair
  void pushSingle(int32_t u);
  void pushPair(int32_t u);
  std::optional<int32_t> popSingle();
  std::optional<int32_t> popPair();

  std::vector<uint8_t> state_; // per unit
  // Min-heaps of candidates; an entry whose unit's state has changed since
  // it was pushed is skipped when it reaches the top (lazy deletion), and
  // the heaps are rebuilt from state_ when stale entries dominate.
  std::vector<int32_t> singles_, pairs_;
  int32_t freeUnits_ = 0, freePairs_ = 0, freeSingles_ = 0;
};

} // namespace nf::cpu
