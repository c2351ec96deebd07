// The CPU backend's per-sequence storage (see caches.h).
#include "engine/caches.h"

#include "weights.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <string>
#include <unordered_map>

namespace nf::cpu {

void roundKvRow(float *x, int64_t n, KvStorage storage) {
  if (storage == KvStorage::BF16) {
    for (int64_t i = 0; i < n; ++i)
      x[i] = roundToBf16(x[i]);
  } else if (storage == KvStorage::F8E4M3) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      amax = std::max(amax, std::fabs(x[i]));
    const float scale =
        amax > 0.0f && std::isfinite(amax) ? amax / 448.0f : 1.0f;
    for (int64_t i = 0; i < n; ++i)
      x[i] = roundToE4M3(std::clamp(x[i] / scale, -448.0f, 448.0f)) * scale;
  }
}

// ---------------------------------------------------------------------------
// StateCache

StatusOr<StateCache> StateCache::create(std::span<const MambaShape> layers,
                                        int32_t numSlots) {
  if (numSlots <= 0)
    return Status::error("state cache: numSlots must be positive");
  try {
    StateCache c;
    for (const MambaShape &s : layers) {
      c.shapes_.push_back(s);
      c.conv_.emplace_back(static_cast<size_t>(s.convStateSize() * numSlots),
                           0.0f);
      c.ssm_.emplace_back(static_cast<size_t>(s.ssmStateSize() * numSlots),
                          0.0f);
    }
    c.live_.assign(static_cast<size_t>(numSlots), false);
    return c;
  } catch (const std::bad_alloc &) {
    return Status::error("state cache: out of memory for " +
                         std::to_string(numSlots) + " slots");
  }
}

StatusOr<int32_t> StateCache::allocateSlot() {
  for (int32_t s = 0; s < numSlots(); ++s) {
    if (live_[s])
      continue;
    live_[s] = true;
    for (size_t l = 0; l < shapes_.size(); ++l) {
      std::fill_n(conv(static_cast<int32_t>(l), s), shapes_[l].convStateSize(),
                  0.0f);
      std::fill_n(ssm(static_cast<int32_t>(l), s), shapes_[l].ssmStateSize(),
                  0.0f);
    }
    return s;
  }
  return Status::error("state cache: all " + std::to_string(numSlots()) +
                       " slots are in use");
}

void StateCache::copySlot(int32_t from, int32_t to) {
  for (size_t l = 0; l < shapes_.size(); ++l) {
    const auto layer = static_cast<int32_t>(l);
    std::copy_n(conv(layer, from), shapes_[l].convStateSize(), conv(layer, to));
    std::copy_n(ssm(layer, from), shapes_[l].ssmStateSize(), ssm(layer, to));
  }
}

Status StateCache::freeSlot(int32_t slot) {
  if (!isLive(slot))
    return Status::error("state cache: slot " + std::to_string(slot) +
                         " is not in use");
  live_[slot] = false;
  return Status::success();
}

bool StateCache::isLive(int32_t slot) const {
  return slot >= 0 && slot < numSlots() && live_[slot];
}

int32_t StateCache::numFree() const {
  return static_cast<int32_t>(std::count(live_.begin(), live_.end(), false));
}

float *StateCache::conv(int32_t l, int32_t slot) {
  return conv_[l].data() + shapes_[l].convStateSize() * slot;
}

float *StateCache::ssm(int32_t l, int32_t slot) {
  return ssm_[l].data() + shapes_[l].ssmStateSize() * slot;
}

// ---------------------------------------------------------------------------
// KvCache

StatusOr<KvCache> KvCache::create(std::span<const KvLayerShape> layers,
                                  int32_t numPages, int32_t pageSize,
                                  int32_t hotWindow) {
  if (numPages <= 0 || pageSize <= 0)
    return Status::error("kv cache: numPages and pageSize must be positive");
  if (hotWindow < 0)
    return Status::error("kv cache: the hot window must not be negative");
  if (hotWindow > 0)
    for (const KvLayerShape &shape : layers)
      if (shape.storage != KvStorage::F8E4M3)
        return Status::error("kv cache: a hot window needs fp8 layers");
  try {
    KvCache c;
    c.pageSize_ = pageSize;
    c.hotWindow_ = hotWindow;
    if (hotWindow > 0)
      c.hot_.assign(static_cast<size_t>(numPages), 0);
    for (const KvLayerShape &shape : layers) {
      Storage s;
      s.numKvHeads = shape.numKvHeads;
      s.headDim = shape.headDim;
      s.storage = shape.storage;
      const size_t n = static_cast<size_t>(numPages) * pageSize *
                       static_cast<size_t>(s.numKvHeads * s.headDim);
      s.k.assign(n, 0.0f);
      s.v.assign(n, 0.0f);
      c.layers_.push_back(std::move(s));
    }
    c.refs_.assign(static_cast<size_t>(numPages), 0);
    c.pool_ = PagePool(numPages);
    return c;
  } catch (const std::bad_alloc &) {
    return Status::error("kv cache: out of memory for " +
                         std::to_string(numPages) + " pages of " +
                         std::to_string(pageSize));
  }
}

StatusOr<int32_t> KvCache::allocatePage() {
  const std::optional<int32_t> p = pool_.allocate(tiered() ? 1 : 0);
  if (!p)
    return Status::error("kv cache: all " + std::to_string(numPages()) +
                         " pages are in use");
  refs_[static_cast<size_t>(*p)] = 1;
  if (tiered())
    hot_[static_cast<size_t>(*p)] = 1;
  return *p;
}

StatusOr<int32_t> KvCache::compressPage(int32_t page, FreedUnits &freed) {
  if (!isHot(page) || refs_[page] != 1)
    return Status::error("kv cache: page " + std::to_string(page) +
                         " is not a hot page of one table");
  // A free single fills a hole; else the page shrinks where it is.
  int32_t to = page;
  if (pool_.freeSingles() > 0)
    to = *pool_.allocate(0);
  for (Storage &s : layers_) {
    const int64_t row = s.numKvHeads * s.headDim;
    const size_t n = static_cast<size_t>(pageSize_ * row);
    for (std::vector<float> *kv : {&s.k, &s.v}) {
      float *dst = kv->data() + static_cast<size_t>(to) * n;
      std::copy_n(kv->data() + static_cast<size_t>(page) * n, n, dst);
      for (int64_t r = 0; r < pageSize_ * s.numKvHeads; ++r)
        roundKvRow(dst + r * s.headDim, s.headDim, KvStorage::F8E4M3);
    }
  }
  hot_[page] = 0;
  if (to == page) {
    freed.blocks.emplace_back(page + 1, 0);
  } else {
    refs_[to] = 1;
    refs_[page] = 0;
    freed.blocks.emplace_back(page, 1);
  }
  return to;
}

void KvCache::releaseUnits(FreedUnits &freed) {
  for (const auto &[unit, order] : freed.blocks)
    pool_.release(unit, order);
  freed.blocks.clear();
}

Status KvCache::sharePage(int32_t page) {
  if (page < 0 || page >= numUnits() || refs_[page] == 0)
    return Status::error("kv cache: page " + std::to_string(page) +
                         " is not in use");
  ++refs_[page];
  return Status::success();
}

Status KvCache::freePage(int32_t page) {
  if (page < 0 || page >= numUnits() || refs_[page] == 0)
    return Status::error("kv cache: page " + std::to_string(page) +
                         " is not in use");
  if (--refs_[page] == 0) {
    pool_.release(page, isHot(page) ? 1 : 0);
    if (tiered())
      hot_[page] = 0;
  }
  return Status::success();
}

void KvCache::copyPage(int32_t from, int32_t to) {
  for (Storage &s : layers_) {
    const size_t n = static_cast<size_t>(pageSize_) *
                     static_cast<size_t>(s.numKvHeads * s.headDim);
    std::copy_n(s.k.begin() + from * n, n, s.k.begin() + to * n);
    std::copy_n(s.v.begin() + from * n, n, s.v.begin() + to * n);
  }
}

int32_t KvCache::numPages() const {
  return tiered() ? numUnits() / 2 : numUnits();
}

int32_t KvCache::numFreePages() const {
  return tiered() ? pool_.freePairs() : pool_.freeUnits();
}

Status KvCache::reserve(std::vector<int32_t> &pageTable, int64_t numTokens) {
  const int64_t need = (numTokens + pageSize_ - 1) / pageSize_;
  while (static_cast<int64_t>(pageTable.size()) < need) {
    StatusOr<int32_t> p = allocatePage();
    if (!p)
      return p.status();
    pageTable.push_back(*p);
  }
  return Status::success();
}

void KvCache::release(std::vector<int32_t> &pageTable) {
  for (int32_t p : pageTable)
    (void)freePage(p); // a foreign page id is ignored: nothing to undo
  pageTable.clear();
}

PagedKvLayer KvCache::layer(int32_t l) {
  Storage &s = layers_[l];
  PagedKvLayer out;
  out.k = s.k.data();
  out.v = s.v.data();
  out.numPages = numUnits();
  out.pageSize = pageSize_;
  out.numKvHeads = s.numKvHeads;
  out.headDim = s.headDim;
  // A tiered cache's steps write hot pages: bf16.
  out.storage = tiered() ? KvStorage::BF16 : s.storage;
  return out;
}

// ---------------------------------------------------------------------------
// Caches

StatusOr<Caches> Caches::create(std::span<const MambaShape> mambaLayers,
                                std::span<const KvLayerShape> attentionLayers,
                                const CacheConfig &cfg) {
  StatusOr<StateCache> st = StateCache::create(mambaLayers, cfg.numSlots);
  if (!st)
    return st.status();
  StatusOr<KvCache> kv = KvCache::create(attentionLayers, cfg.numPages,
                                         cfg.pageSize, cfg.hotWindow);
  if (!kv)
    return kv.status();
  try {
    Caches c;
    c.state_ = std::move(*st);
    c.kv_ = std::move(*kv);
    c.pageTables_.resize(static_cast<size_t>(cfg.numSlots));
    c.lengths_.assign(static_cast<size_t>(cfg.numSlots), 0);
    c.firstHot_.assign(static_cast<size_t>(cfg.numSlots), 0);
    return c;
  } catch (const std::bad_alloc &) {
    return Status::error("caches: out of memory");
  }
}

StatusOr<int32_t> Caches::addSequence() {
  StatusOr<int32_t> slot = state_.allocateSlot();
  if (!slot)
    return slot;
  pageTables_[*slot].clear();
  lengths_[*slot] = 0;
  firstHot_[*slot] = 0;
  return slot;
}

StatusOr<Caches::Fork> Caches::fork(int32_t from) {
  if (!isLive(from))
    return Status::error("caches: slot " + std::to_string(from) +
                         " is not in use");
  StatusOr<int32_t> slot = state_.allocateSlot();
  if (!slot)
    return slot.status();
  Fork f;
  f.slot = *slot;
  std::vector<int32_t> &table = pageTables_[f.slot];
  table.clear();
  const std::vector<int32_t> &source = pageTables_[from];
  const int64_t length = lengths_[from];
  if (kv_.numAttentionLayers() > 0) {
    const int64_t full = length / kv_.pageSize();
    for (int64_t j = 0; j < full && j < static_cast<int64_t>(source.size());
         ++j) {
      (void)kv_.sharePage(source[j]); // in use: source holds it
      table.push_back(source[j]);
    }
    if (length % kv_.pageSize() != 0 &&
        static_cast<int64_t>(source.size()) > full) {
      StatusOr<int32_t> page = kv_.allocatePage();
      if (!page) {
        kv_.release(table);
        (void)state_.freeSlot(f.slot);
        return page.status();
      }
      f.pageFrom = source[full];
      f.pageTo = *page;
      kv_.copyPage(f.pageFrom, f.pageTo);
      table.push_back(*page);
    }
  }
  state_.copySlot(from, f.slot);
  lengths_[f.slot] = length;
  firstHot_[f.slot] = firstHot_[from];
  return f;
}

Status Caches::removeSequence(int32_t slot) {
  if (Status s = state_.freeSlot(slot); !s)
    return s;
  kv_.release(pageTables_[slot]);
  lengths_[slot] = 0;
  return Status::success();
}

int64_t Caches::length(int32_t slot) const {
  return isLive(slot) ? lengths_[slot] : 0;
}

const std::vector<int32_t> &Caches::pageTable(int32_t slot) const {
  static const std::vector<int32_t> empty;
  return isLive(slot) ? pageTables_[slot] : empty;
}

Status Caches::reserve(int32_t slot, int64_t numTokens) {
  if (!isLive(slot))
    return Status::error("caches: slot " + std::to_string(slot) +
                         " is not in use");
  if (kv_.numAttentionLayers() == 0)
    return Status::success(); // no attention: pages would never be read
  return kv_.reserve(pageTables_[slot], numTokens);
}

int64_t Caches::pagesNeeded(int32_t slot, int64_t numTokens) const {
  if (!isLive(slot) || kv_.numAttentionLayers() == 0)
    return 0;
  const int64_t ps = kv_.pageSize();
  const int64_t need = (numTokens + ps - 1) / ps;
  return std::max<int64_t>(
      0, need - static_cast<int64_t>(pageTables_[slot].size()));
}

int64_t Caches::exclusivePages(std::span<const int32_t> slots) const {
  std::vector<int32_t> distinct(slots.begin(), slots.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::unordered_map<int32_t, int32_t> held; // page -> tables of `slots`
  for (int32_t slot : distinct)
    if (isLive(slot))
      for (int32_t page : pageTables_[static_cast<size_t>(slot)])
        ++held[page];
  int64_t n = 0;
  for (const auto &[page, tables] : held)
    if (tables == kv_.pageRefs(page))
      n += kv_.isHot(page) ? 2 : 1;
  return n;
}

Status Caches::advance(int32_t slot, int64_t count) {
  if (!isLive(slot))
    return Status::error("caches: slot " + std::to_string(slot) +
                         " is not in use");
  lengths_[slot] += count;
  return Status::success();
}

int64_t Caches::compress(std::vector<int32_t> *moves) {
  if (!kv_.tiered())
    return 0;
  const int64_t ps = kv_.pageSize();
  int64_t done = 0;
  KvCache::FreedUnits freed;
  for (int32_t slot = 0; slot < state_.numSlots() && done < kMaxKvMoves;
       ++slot) {
    if (!isLive(slot))
      continue;
    std::vector<int32_t> &table = pageTables_[slot];
    const int64_t cold = std::min<int64_t>(
        static_cast<int64_t>(table.size()),
        std::max<int64_t>(0, lengths_[slot] - kv_.hotWindow()) / ps);
    int64_t &first = firstHot_[slot];
    bool allCold = true; // pages [first, j) are cold
    for (int64_t j = first; j < cold && done < kMaxKvMoves; ++j) {
      int32_t &page = table[static_cast<size_t>(j)];
      if (kv_.isHot(page) && kv_.pageRefs(page) == 1) {
        const int32_t from = page;
        StatusOr<int32_t> to = kv_.compressPage(from, freed);
        if (to) {
          page = *to;
          ++done;
          if (moves) {
            moves->push_back(from);
            moves->push_back(*to);
          }
        }
      }
      allCold = allCold && !kv_.isHot(page);
      if (allCold)
        first = j + 1;
    }
  }
  kv_.releaseUnits(freed);
  return done;
}

} // namespace nf::cpu
