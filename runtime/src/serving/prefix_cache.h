// The serving engine's prefix cache: snapshots of sequences at points of
// their token streams, parked (never stepped again) so that a later request
// whose context starts with the same tokens continues from a fork of one
// instead of prefilling them.
//
// A hybrid model's Mamba state after token t summarises the whole prefix,
// so reuse needs the state at exactly the reused length: KV pages alone
// are not enough. A snapshot is therefore a whole parked sequence (its
// recurrent state in a state slot, its K/V pages shared with whoever forks
// it, nf_seq_fork). Which points are kept (the scheduler decides): the
// last block boundary before a prompt's last token, the token before it
// (so an exact repeat hits, and still computes its last token's logits),
// and a finished request's whole context (so a conversation's next turn,
// which starts with it, hits).
//
// Snapshots hold slots and pages that running requests may need: the
// scheduler evicts them, least recently used first, before it would refuse
// or preempt a request. A salt (the request's cache_salt) is part of every
// snapshot's key, so tenants with different salts never share one.
// Scheduler thread only.
#pragma once

#include "nf/nf.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nf::serving {

class PrefixCache {
public:
  /// `model` must outlive the cache. `block`: tokens between the prompt
  /// boundaries snapshots are taken at (> 0).
  PrefixCache(nf_model *model, int32_t block) : model_(model), block_(block) {}
  /// Frees every snapshot's sequence.
  ~PrefixCache() { clear(); }
  PrefixCache(const PrefixCache &) = delete;
  PrefixCache &operator=(const PrefixCache &) = delete;

  int32_t block() const { return block_; }

  /// A snapshot: its parked sequence and how many tokens it holds.
  struct Hit {
    int32_t seq = -1;
    size_t length = 0;
  };
  /// The longest snapshot whose tokens start `context` and are fewer than
  /// it (the last token is always run, for its logits), under `salt`;
  /// seq -1 when there is none.
  Hit find(std::span<const int32_t> context, const std::string &salt) const;
  /// A new sequence continuing from snapshot `hit` (nf_seq_fork), which
  /// becomes the most recently used; -1 when none could be made (no slot
  /// or page free, or the snapshot is gone).
  int32_t fork(const Hit &hit);

  /// Keeps a snapshot of `seq` holding `tokens` under `salt` (a fork of it;
  /// or `seq` itself when `adopt`, which the cache then owns and frees).
  /// A snapshot of the same tokens and salt is only touched. Returns
  /// whether one is kept; when not (no slot for the fork), an adopted
  /// sequence is freed.
  bool insert(int32_t seq, std::span<const int32_t> tokens,
              const std::string &salt, bool adopt = false);

  /// Frees the least recently used snapshot, except the one parked in
  /// sequence `keep`; false when there is none to free.
  bool evictOne(int32_t keep = -1);
  void clear();

  size_t size() const { return entries_.size(); }
  int64_t evictions() const { return evictions_; }
  /// The memory the snapshots hold alone: each one's recurrent state and
  /// the KV pages no running sequence shares (nf_seq_exclusive_pages).
  int64_t bytes() const;

private:
  struct Entry {
    int32_t seq = -1;
    std::vector<int32_t> tokens;
    std::string salt;
    uint64_t used = 0; // last use, in uses_
  };
  nf_model *model_;
  const int32_t block_;
  std::vector<Entry> entries_;
  uint64_t uses_ = 0;
  int64_t evictions_ = 0;
};

} // namespace nf::serving
