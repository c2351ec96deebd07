// Per-sequence storage: the recurrent state of every Mamba layer per slot,
// the paged K/V cache of every attention layer, and the bookkeeping of the
// sequences holding them (slot, page table, length). Shared by both
// backends, so it lives with the plan layer (nf_plan): the CPU engine keeps
// its state here, the CUDA engine's sequence table only the bookkeeping
// (slots, page ids), and the reference executor (test/support) uses it too.
// MambaShape and PagedKvLayer, the layouts the CPU kernels
// (backends/cpu/kernels.h) read and write, are defined here for that reason.
#pragma once

#include "engine/page_pool.h"
#include "nf/status.h"

#include <cstdint>
#include <span>
#include <vector>

namespace nf::cpu {

class Executor;

/// Geometry of one Mamba2 layer (its recurrent state and projections).
struct MambaShape {
  int64_t numHeads = 0;   // nh
  int64_t headDim = 0;    // P
  int64_t stateSize = 0;  // N
  int64_t nGroups = 0;    // G
  int64_t convKernel = 0; // K
  int64_t inner() const { return numHeads * headDim; }
  int64_t convDim() const { return inner() + 2 * nGroups * stateSize; }
  int64_t inProjDim() const { return inner() + convDim() + numHeads; }
  int64_t convStateSize() const { return convDim() * (convKernel - 1); }
  int64_t ssmStateSize() const { return numHeads * headDim * stateSize; }
};

/// What an attention layer's cache stores (the plan's Storage.dtype): f32,
/// bf16, or fp8 E4M3 with one f32 scale per (token, kv head) row of
/// head_dim values (amax / 448). The CPU backend keeps f32 arrays and rounds
/// on write, so it holds exactly the values such a cache would.
enum class KvStorage : uint8_t { F32, BF16, F8E4M3 };

/// One (token, kv head) row of `n` values rounded as `storage` holds them
/// (bf16 to nearest even; fp8: E4M3 codes times the row's amax / 448).
void roundKvRow(float *x, int64_t n, KvStorage storage);

/// One attention layer's cache storage: K and V each [numPages, pageSize,
/// nkv, hd] f32. A sequence's logical page j (positions j·pageSize ...) lives
/// in physical page pageTable[j].
struct PagedKvLayer {
  float *k = nullptr;
  float *v = nullptr;
  int32_t numPages = 0;
  int32_t pageSize = 0;
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  KvStorage storage = KvStorage::F32; // values rounded on write
};

/// Recurrent state of every Mamba layer, per slot: conv [CD, K-1] and ssm
/// [nh, P, N], f32.
class StateCache {
public:
  /// One state per entry of `mambaLayers` (e.g. from a plan's Storage table).
  static StatusOr<StateCache> create(std::span<const MambaShape> mambaLayers,
                                     int32_t numSlots);
  StateCache() = default;

  /// The lowest free slot, its state zeroed.
  StatusOr<int32_t> allocateSlot();
  /// Copies slot `from`'s state of every layer into slot `to`.
  void copySlot(int32_t from, int32_t to);
  Status freeSlot(int32_t slot);
  bool isLive(int32_t slot) const;
  int32_t numSlots() const { return static_cast<int32_t>(live_.size()); }
  int32_t numFree() const;

  int32_t numMambaLayers() const {
    return static_cast<int32_t>(shapes_.size());
  }
  float *conv(int32_t mambaLayer, int32_t slot);
  float *ssm(int32_t mambaLayer, int32_t slot);

private:
  std::vector<MambaShape> shapes_;
  std::vector<std::vector<float>> conv_, ssm_; // per Mamba layer
  std::vector<bool> live_;
};

/// K/V row layout of one attention layer's cache.
struct KvLayerShape {
  int64_t numKvHeads = 0;
  int64_t headDim = 0;
  KvStorage storage = KvStorage::F32;
};

/// Bytes of one page of a layer's K (or V) cache as the CUDA kernels store
/// it (kernels/nf_attention.cuh): its values, 4 or 2 bytes each; fp8: a
/// byte each, then an f32 scale per (position, kv head) row.
constexpr int64_t kvPageBytes(const KvLayerShape &s, int64_t pageSize) {
  const int64_t values = pageSize * s.numKvHeads * s.headDim;
  switch (s.storage) {
  case KvStorage::F32:
    return 4 * values;
  case KvStorage::BF16:
    return 2 * values;
  case KvStorage::F8E4M3:
    return values + 4 * pageSize * s.numKvHeads;
  }
  return 0;
}

/// Paged K/V storage of every attention layer and its page allocator.
/// Pages are reference-counted: forked sequences share the full pages of
/// the prefix they have in common (which neither writes again).
///
/// A tiered cache (hotWindow > 0, fp8 layers) allocates every page hot: it
/// holds bf16 values in two units of storage (PagePool order 1; the CPU
/// keeps them in the first unit's f32 rows). compressPage turns a hot page
/// no other table holds into a cold one, fp8 in one unit. Page ids are the
/// pages' first units.
class KvCache {
public:
  /// One layer per entry of `attentionLayers`, all sharing the page ids;
  /// `numPages` units of storage.
  static StatusOr<KvCache> create(std::span<const KvLayerShape> attentionLayers,
                                  int32_t numPages, int32_t pageSize,
                                  int32_t hotWindow = 0);
  KvCache() = default;

  bool tiered() const { return hotWindow_ > 0; }
  int32_t hotWindow() const { return hotWindow_; }
  bool isHot(int32_t page) const { return !hot_.empty() && hot_[page]; }
  /// Storage units a compression leaves free, given back by
  /// releaseUnits once every move of a batch is done (a unit freed by one
  /// move must not receive another's codes while the device may still read
  /// it).
  struct FreedUnits {
    std::vector<std::pair<int32_t, int>> blocks; // first unit, order
  };
  /// A hot page that only one table holds, its rows rounded to fp8, in a
  /// free unit if there is one whose buddy is in use (the pair it leaves
  /// merges), else in its own first unit (the second is freed). Returns
  /// the cold page's id; the units it left are added to `freed`.
  StatusOr<int32_t> compressPage(int32_t page, FreedUnits &freed);
  void releaseUnits(FreedUnits &freed);

  /// A free page (one reference): the lowest one whose buddy is in use,
  /// else the lowest (page_pool.h).
  StatusOr<int32_t> allocatePage();
  /// One more reference to a page in use.
  Status sharePage(int32_t page);
  /// Drops one reference; the page is free when none is left.
  Status freePage(int32_t page);
  /// Copies page `from`'s K/V rows of every layer into page `to`.
  void copyPage(int32_t from, int32_t to);
  /// Pages the cache holds when every one is as allocated (tiered: hot),
  /// and those allocatePage can give now.
  int32_t numPages() const;
  int32_t numFreePages() const;
  /// Units of storage (page ids are below this).
  int32_t numUnits() const { return static_cast<int32_t>(refs_.size()); }
  /// The page tables holding `page` (0: free).
  int32_t pageRefs(int32_t page) const { return refs_[page]; }
  int32_t pageSize() const { return pageSize_; }

  /// Grows `pageTable` with fresh pages until positions [0, numTokens) are
  /// covered; on failure the table keeps the pages it got.
  Status reserve(std::vector<int32_t> &pageTable, int64_t numTokens);
  /// Frees every page of `pageTable` and clears it.
  void release(std::vector<int32_t> &pageTable);

  int32_t numAttentionLayers() const {
    return static_cast<int32_t>(layers_.size());
  }
  PagedKvLayer layer(int32_t attentionLayer);

private:
  struct Storage {
    int64_t numKvHeads = 0, headDim = 0;
    KvStorage storage = KvStorage::F32;
    std::vector<float> k, v;
  };
  std::vector<Storage> layers_;
  std::vector<int32_t> refs_; // per page: the page tables holding it
  std::vector<uint8_t> hot_;  // per page of a tiered cache: bf16, two units
  int32_t hotWindow_ = 0;
  // The free pages: allocation stays O(log pages) when a KV cache sized to
  // a GPU has millions; the count of free ones is a member (a server reads
  // it every step).
  PagePool pool_;
  int32_t pageSize_ = 0;
};

struct CacheConfig {
  int32_t numSlots = 8;  // concurrent sequences
  int32_t numPages = 64; // KV pages shared by all sequences
  int32_t pageSize = 16; // positions per page
  /// A tiered KV cache (fp8 layers): pages that hold any of a sequence's
  /// last hotWindow positions stay bf16; Caches::compress turns older ones
  /// fp8. numPages then counts units (a hot page takes two). 0: no tiers.
  int32_t hotWindow = 0;
};

/// Both caches plus per-sequence bookkeeping (page table, length), keyed by
/// slot. Sequences join and leave between steps.
class Caches {
public:
  /// Caches for the layer shapes of a model (a plan's Storage table, or
  /// createCaches of a ModelDesc).
  static StatusOr<Caches> create(std::span<const MambaShape> mambaLayers,
                                 std::span<const KvLayerShape> attentionLayers,
                                 const CacheConfig &c);
  Caches() = default;

  /// A new, empty sequence: a slot with zeroed state and no pages.
  StatusOr<int32_t> addSequence();
  /// What fork() did beyond the bookkeeping, for a backend that keeps the
  /// state elsewhere (the CUDA engine copies the same on the device).
  struct Fork {
    int32_t slot = -1;                  // the new sequence's
    int32_t pageFrom = -1, pageTo = -1; // the partly filled page copied
  };
  /// A new sequence continuing from `slot` as it is now: the same length, a
  /// copy of its recurrent state, its full KV pages shared and its last,
  /// partly filled page (positions the two will write) copied. On error
  /// (no free slot or page) nothing has changed.
  StatusOr<Fork> fork(int32_t slot);
  /// Frees the sequence's slot and pages.
  Status removeSequence(int32_t slot);
  bool isLive(int32_t slot) const { return state_.isLive(slot); }
  /// Tokens of the sequence processed so far (the next step's startPos).
  int64_t length(int32_t slot) const;
  const std::vector<int32_t> &pageTable(int32_t slot) const;
  /// Pages for positions [0, numTokens) of the sequence.
  Status reserve(int32_t slot, int64_t numTokens);
  /// Pages that reserve(slot, numTokens) would still have to allocate.
  int64_t pagesNeeded(int32_t slot, int64_t numTokens) const;
  /// KV pages that only the given live slots hold (each page and slot
  /// counted once): what freeing all of them would give back. A tiered
  /// cache's hot pages count two (its units).
  int64_t exclusivePages(std::span<const int32_t> slots) const;
  /// Records that `count` more tokens of the sequence were processed (for
  /// executors other than Executor, which advances lengths itself).
  Status advance(int32_t slot, int64_t count);
  /// Tiered cache: compresses every page of every sequence that lies wholly
  /// before the sequence's last hotWindow positions, unless another table
  /// also holds it (it is compressed once only one does), at most
  /// kMaxKvMoves pages a call (the rest in later calls). Engines call it
  /// before each run. Appends each move (the hot page's first unit, the
  /// cold page's unit) to `moves` when given: what a device applies before
  /// the run's appends. Returns the pages compressed.
  int64_t compress(std::vector<int32_t> *moves = nullptr);
  static constexpr int64_t kMaxKvMoves = 4096;

  StateCache &state() { return state_; }
  KvCache &kv() { return kv_; }
  const StateCache &state() const { return state_; }
  const KvCache &kv() const { return kv_; }

private:
  friend class Executor;
  StateCache state_;
  KvCache kv_;
  std::vector<std::vector<int32_t>> pageTables_; // per slot
  std::vector<int64_t> lengths_;                 // per slot
  // Tiered cache, per slot: pages before this one are cold.
  std::vector<int64_t> firstHot_;
};

} // namespace nf::cpu
