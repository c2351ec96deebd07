// The KV cache's page allocator (see page_pool.h).
#include "engine/page_pool.h"

#include <algorithm>
#include <functional>

namespace nf::cpu {

namespace {

void heapPush(std::vector<int32_t> &heap, int32_t v) {
  heap.push_back(v);
  std::push_heap(heap.begin(), heap.end(), std::greater<>());
}

int32_t heapPop(std::vector<int32_t> &heap) {
  std::pop_heap(heap.begin(), heap.end(), std::greater<>());
  const int32_t v = heap.back();
  heap.pop_back();
  return v;
}

} // namespace

PagePool::PagePool(int32_t units) : state_(static_cast<size_t>(units)) {
  // Ascending: already min-heaps. An odd last unit has no buddy: a single.
  for (int32_t u = 0; u + 1 < units; u += 2) {
    state_[u] = state_[u + 1] = kPair;
    pairs_.push_back(u);
  }
  if (units % 2) {
    state_[units - 1] = kSingle;
    singles_.push_back(units - 1);
  }
  freeUnits_ = units;
  freePairs_ = static_cast<int32_t>(pairs_.size());
  freeSingles_ = static_cast<int32_t>(singles_.size());
}

void PagePool::pushSingle(int32_t u) {
  state_[u] = kSingle;
  ++freeSingles_;
  heapPush(singles_, u);
  if (singles_.size() > 2 * static_cast<size_t>(freeSingles_) + 64) {
    singles_.clear();
    for (int32_t v = 0; v < numUnits(); ++v)
      if (state_[v] == kSingle)
        singles_.push_back(v);
  }
}

void PagePool::pushPair(int32_t u) {
  state_[u] = state_[u + 1] = kPair;
  ++freePairs_;
  heapPush(pairs_, u);
  if (pairs_.size() > 2 * static_cast<size_t>(freePairs_) + 64) {
    pairs_.clear();
    for (int32_t v = 0; v + 1 < numUnits(); v += 2)
      if (state_[v] == kPair)
        pairs_.push_back(v);
  }
}

std::optional<int32_t> PagePool::popSingle() {
  while (!singles_.empty()) {
    const int32_t u = heapPop(singles_);
    if (state_[u] == kSingle) {
      state_[u] = kUsed;
      --freeSingles_;
      return u;
    }
  }
  return std::nullopt;
}

std::optional<int32_t> PagePool::popPair() {
  while (!pairs_.empty()) {
    const int32_t u = heapPop(pairs_);
    if (state_[u] == kPair) {
      state_[u] = state_[u + 1] = kUsed;
      --freePairs_;
      return u;
    }
  }
  return std::nullopt;
}

std::optional<int32_t> PagePool::allocate(int order) {
  std::optional<int32_t> u;
  if (order == 1) {
    u = popPair();
    if (u)
      freeUnits_ -= 2;
    return u;
  }
  u = popSingle();
  if (!u) {
    u = popPair(); // split: the second unit stays free
    if (u)
      pushSingle(*u + 1);
  }
  if (u)
    --freeUnits_;
  return u;
}

void PagePool::release(int32_t unit, int order) {
  if (order == 1) {
    pushPair(unit);
    freeUnits_ += 2;
    return;
  }
  ++freeUnits_;
  const int32_t buddy = unit ^ 1;
  if (buddy < numUnits() && state_[buddy] == kSingle) {
    // Coalesce: the buddy's heap entry goes stale.
    --freeSingles_;
    pushPair(unit & ~1);
    return;
  }
  pushSingle(unit);
}

} // namespace nf::cpu
