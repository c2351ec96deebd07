// The serving engine's prefix cache (see prefix_cache.h).
#include "serving/prefix_cache.h"

#include <algorithm>

namespace nf::serving {

PrefixCache::Hit PrefixCache::find(std::span<const int32_t> context,
                                   const std::string &salt) const {
  Hit best;
  for (const Entry &e : entries_) {
    if (e.salt != salt || e.tokens.size() >= context.size() ||
        (best.seq >= 0 && e.tokens.size() <= best.length))
      continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), context.begin()))
      best = {e.seq, e.tokens.size()};
  }
  return best;
}

int32_t PrefixCache::fork(const Hit &hit) {
  auto e = std::find_if(entries_.begin(), entries_.end(),
                        [&](const Entry &x) { return x.seq == hit.seq; });
  int32_t seq = -1;
  if (e == entries_.end() || nf_seq_fork(model_, e->seq, &seq) != NF_OK)
    return -1;
  e->used = ++uses_;
  return seq;
}

bool PrefixCache::insert(int32_t seq, std::span<const int32_t> tokens,
                         const std::string &salt, bool adopt) {
  for (Entry &e : entries_)
    if (e.salt == salt && std::equal(e.tokens.begin(), e.tokens.end(),
                                     tokens.begin(), tokens.end())) {
      e.used = ++uses_;
      if (adopt)
        (void)nf_seq_remove(model_, seq);
      return true;
    }
  int32_t kept = seq;
  if (!adopt) {
    // A free slot, or one a snapshot gives up (the oldest first).
    while (nf_seq_fork(model_, seq, &kept) != NF_OK)
      if (!evictOne())
        return false;
  }
  Entry e;
  e.seq = kept;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.salt = salt;
  e.used = ++uses_;
  entries_.push_back(std::move(e));
  return true;
}

bool PrefixCache::evictOne(int32_t keep) {
  int oldest = -1;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].seq != keep &&
        (oldest < 0 || entries_[i].used < entries_[oldest].used))
      oldest = static_cast<int>(i);
  if (oldest < 0)
    return false;
  (void)nf_seq_remove(model_, entries_[oldest].seq);
  entries_.erase(entries_.begin() + oldest);
  ++evictions_;
  return true;
}

void PrefixCache::clear() {
  for (const Entry &e : entries_)
    (void)nf_seq_remove(model_, e.seq);
  entries_.clear();
}

int64_t PrefixCache::bytes() const {
  if (entries_.empty())
    return 0;
  std::vector<int32_t> seqs;
  seqs.reserve(entries_.size());
  for (const Entry &e : entries_)
    seqs.push_back(e.seq);
  int64_t pages = 0;
  if (nf_seq_exclusive_pages(model_, seqs.data(),
                             static_cast<int32_t>(seqs.size()),
                             &pages) != NF_OK)
    pages = 0;
  return static_cast<int64_t>(seqs.size()) *
             nf_model_sequence_state_bytes(model_) +
         pages * nf_model_kv_page_bytes(model_);
}

} // namespace nf::serving
