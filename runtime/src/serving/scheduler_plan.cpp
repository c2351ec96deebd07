// The serving engine's scheduler: which requests run in the next step,
// with how many tokens each, and the prefix-cache snapshots they take and
// restore (see scheduler.h).
#include "serving/scheduler.h"

#include "capi/capi.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

namespace nf::serving {
namespace {

/// Running requests in the order they keep their sequences: better
/// priority first, then earlier admission (the back is preempted first).
bool keepsBefore(const std::shared_ptr<Request> &x,
                 const std::shared_ptr<Request> &y) {
  return x->effectivePriority() < y->effectivePriority();
}

/// `r`'s prompt is longer than p tokens and starts with the first p tokens
/// of `source`'s, under the same cache salt (so a snapshot of `source` at p
/// serves `r`). Compared from the point back: prompts with a common start
/// differ near their ends, so a pair that does not match stops at once.
bool startsWithPromptOf(const Request &r, const Request &source, size_t p) {
  return r.cacheSalt == source.cacheSalt && p < r.prompt.size() &&
         p <= source.prompt.size() &&
         std::equal(std::make_reverse_iterator(source.prompt.begin() + p),
                    source.prompt.rend(),
                    std::make_reverse_iterator(r.prompt.begin() + p));
}

} // namespace

std::deque<std::shared_ptr<Request>>::iterator Scheduler::nextWaiting() {
  // Promoted requests (waiting longer than max_wait_ms) first, then better
  // priority; earlier arrival among equals.
  const Clock::time_point now = Clock::now();
  const auto maxWait = std::chrono::milliseconds(options_.maxWaitMs);
  auto key = [&](const std::shared_ptr<Request> &r) {
    const bool promoted = options_.maxWaitMs > 0 && now - r->arrival >= maxWait;
    const bool first = promoted || r->promoted;
    return std::make_tuple(
        first ? 0 : 1, first ? 0 : static_cast<int64_t>(r->priority), r->order);
  };
  auto best = waiting_.end();
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if (!awaitsSnapshot(**it) &&
        (best == waiting_.end() || key(*it) < key(*best)))
      best = it;
  return best;
}

bool Scheduler::awaitsSnapshot(const Request &r) const {
  // A fresh request whose context starts with the first p tokens of a
  // running prompt that will be kept at p (a shared system prompt, n
  // choices, a repeat) waits for that snapshot rather than computing the
  // same tokens beside it. Once the running one passes p, or leaves, the
  // wait ends, whether or not the snapshot was kept.
  if (!cache_ || !r.generated.empty() || r.owesPromptLogprobs())
    return false;
  for (const auto &l : running_)
    for (auto p = l->snapshots.rbegin(); p != l->snapshots.rend(); ++p)
      if (*p > l->fed && startsWithPromptOf(r, *l, *p))
        return true;
  return false;
}

bool Scheduler::evictSnapshot(int32_t keep) {
  return cache_ && cache_->evictOne(keep);
}

int32_t Scheduler::openSequence(Request &r, const PrefixCache::Hit &hit) {
  PrefixCache::Hit from = hit;
  for (;;) {
    int32_t seq = -1;
    if (from.seq >= 0 && (seq = cache_->fork(from)) >= 0) {
      r.fed = from.length;
      return seq;
    }
    if (from.seq < 0 && nf_seq_add(model_, &seq) == NF_OK) {
      r.fed = 0;
      return seq;
    }
    if (evictSnapshot(from.seq))
      continue;
    if (from.seq < 0)
      return -1;
    from = {}; // the snapshot cannot be forked: start afresh
  }
}

void Scheduler::planSnapshots(Request &r) const {
  r.snapshots.clear();
  if (!cache_ || r.prompt.size() < 2)
    return;
  // The last block boundary before the prompt's last token (a longer
  // prompt with the same start hits it), and the token before the last (an
  // exact repeat hits it, and computes the last token's logits itself).
  const size_t last = r.prompt.size() - 1;
  const size_t block = static_cast<size_t>(cache_->block());
  for (size_t p : {last / block * block, last})
    if (p > r.fed && (r.snapshots.empty() || r.snapshots.back() != p))
      r.snapshots.push_back(p);
}

bool Scheduler::awaitedByWaiting(const Request &r, size_t p) const {
  for (const auto &w : waiting_)
    if (w->generated.empty() && startsWithPromptOf(*w, r, p))
      return true;
  return false;
}

void Scheduler::fitSnapshots(Request &r, int64_t &count, int64_t budget) const {
  // The prompt's last point (the token before its last) always ends a
  // chunk, and so does the block boundary before it, except in a request
  // that continues from a snapshot (a conversation's next turn): there the
  // boundary lies in the new messages, and pausing a chunk that would run
  // on costs a step (a MoE model's prefill step reads about all its expert
  // weights: 40 ms of a turn's 90 on the Nano shape). Such a request keeps
  // the point only where the step's budget ends the chunk there or later
  // anyway, or where a request waiting to be admitted starts with the same
  // tokens up to it; otherwise the point is dropped.
  const auto fed = static_cast<int64_t>(r.fed);
  const bool hasLast = !r.snapshots.empty() &&
                       r.snapshots.back() + 1 == r.prompt.size() &&
                       r.snapshots.back() > r.fed;
  if (hasLast)
    count = std::min(count, static_cast<int64_t>(r.snapshots.back()) - fed);
  const int64_t target = hasLast ? static_cast<int64_t>(r.snapshots.back())
                                 : static_cast<int64_t>(r.contextLength());
  const bool budgetCut = count == budget && fed + count < target;
  for (auto p = r.snapshots.begin(); p != r.snapshots.end();) {
    const auto at = static_cast<int64_t>(*p);
    if (at <= fed || at >= fed + count || (hasLast && at == target)) {
      ++p;
      continue;
    }
    if (r.cachedTokens == 0 || budgetCut || awaitedByWaiting(r, *p)) {
      count = at - fed;
      break;
    }
    p = r.snapshots.erase(p);
  }
}

std::vector<Scheduler::Entry> Scheduler::plan() {
  // New submissions join the waiting requests.
  bool draining, reset;
  Clock::time_point deadline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reset = std::exchange(resetCache_, false);
    for (auto &r : inbox_)
      waiting_.push_back(std::move(r));
    inbox_.clear();
    stats_.waiting = static_cast<int32_t>(waiting_.size());
    draining = draining_;
    deadline = deadline_;
  }
  // Requests whose readers gave up free their sequence first.
  auto cancelled = [&](const std::shared_ptr<Request> &r) {
    if (!r->cancelled.load())
      return false;
    finish(*r, NF_FINISH_CANCELLED, "");
    return true;
  };
  std::erase_if(running_, cancelled);
  std::erase_if(waiting_, cancelled);
  if (reset && cache_)
    cache_->clear();
  const std::string why = "the engine is shutting down";
  if (draining) {
    // Requests not yet admitted end now; running ones, and those preempted
    // on their way (admitted before), may finish until the deadline.
    const bool over = Clock::now() >= deadline;
    std::erase_if(waiting_, [&](const std::shared_ptr<Request> &r) {
      if (r->admittedOnce && !over)
        return false;
      finish(*r, NF_FINISH_UNAVAILABLE, why);
      return true;
    });
    if (over) {
      for (auto &r : running_)
        finish(*r, NF_FINISH_UNAVAILABLE, why);
      running_.clear();
      syncWaiting();
      return {};
    }
  }
  syncWaiting();
  std::stable_sort(running_.begin(), running_.end(), keepsBefore);

  const bool paged = pageSize_ > 0;
  // Free pages, read once (preemption frees some: read again then), less
  // those this step's entries take.
  int64_t free = paged ? nf_model_kv_free_pages(model_)
                       : std::numeric_limits<int64_t>::max() / 4;
  int64_t reserved = 0;
  auto freePages = [&] { return free - reserved; };
  auto preemptLast = [&](const std::shared_ptr<Request> &r) {
    preempt(r);
    if (paged)
      free = nf_model_kv_free_pages(model_);
  };
  int64_t budget = options_.stepTokens;
  std::vector<Entry> step;

  // Running requests' next tokens first, in the order they keep their
  // sequences; when the cache cannot take one, the last in that order
  // gives its pages up.
  for (size_t i = 0; i < running_.size(); ++i) {
    std::shared_ptr<Request> r = running_[i];
    if (r->contextLength() - r->fed != 1)
      continue;
    const int64_t need = pagesFor(static_cast<int64_t>(r->fed) + 1) -
                         pagesFor(static_cast<int64_t>(r->fed));
    while (need > freePages() && evictSnapshot())
      free = nf_model_kv_free_pages(model_);
    while (need > freePages() && running_.back() != r)
      preemptLast(running_.back());
    if (need > freePages()) {
      preemptLast(r);
      break;
    }
    reserved += need;
    --budget;
    step.push_back({r, 1});
  }
  // Then waiting requests, while a sequence is free and the cache can hold
  // the whole context next to what the prompts being fed still need
  // (`committed`).
  int64_t committed = 0;
  for (auto &r : running_)
    if (r->contextLength() - r->fed > 1)
      committed += pagesFor(static_cast<int64_t>(r->contextLength())) -
                   pagesFor(static_cast<int64_t>(r->fed));
  std::vector<std::shared_ptr<Request>> admitted;
  while (static_cast<int32_t>(running_.size()) < options_.maxBatch &&
         !waiting_.empty()) {
    auto at = nextWaiting();
    if (at == waiting_.end())
      break; // the rest wait for a snapshot being prefilled
    std::shared_ptr<Request> r = *at;
    // The longest cached prefix of its context: the full pages of that
    // prefix are shared, not taken.
    PrefixCache::Hit hit;
    std::vector<int32_t> tokens;
    if (cache_ && !r->owesPromptLogprobs()) {
      tokens.reserve(r->contextLength());
      for (size_t i = 0; i < r->contextLength(); ++i)
        tokens.push_back(r->contextToken(i));
      hit = cache_->find(tokens, r->cacheSalt);
    }
    const int64_t shared =
        paged ? static_cast<int64_t>(hit.length) / pageSize_ : 0;
    int64_t context =
        pagesFor(static_cast<int64_t>(r->contextLength())) - shared;
    while (paged && context > freePages() - committed && evictSnapshot(hit.seq))
      free = nf_model_kv_free_pages(model_);
    if (paged && context > freePages() - committed)
      break;
    const int32_t seq = openSequence(*r, hit);
    const bool added = seq >= 0;
    if (added && paged) {
      // A fork copies its partly filled page now; the rest is still to come.
      free = nf_model_kv_free_pages(model_);
      context = pagesFor(static_cast<int64_t>(r->contextLength())) -
                pagesFor(static_cast<int64_t>(r->fed));
    }
    // Admitted for having waited too long: kept as the first priority, or
    // the next page shortage would preempt it again at once.
    if (options_.maxWaitMs > 0 &&
        Clock::now() - r->arrival >=
            std::chrono::milliseconds(options_.maxWaitMs))
      r->promoted = true;
    waiting_.erase(at);
    syncWaiting();
    if (!added) {
      finish(*r, NF_FINISH_ERROR, nf_last_error());
      continue;
    }
    if (cache_) {
      cacheQueries_ += static_cast<int64_t>(r->contextLength());
      cacheHits_ += static_cast<int64_t>(r->fed);
      std::lock_guard<std::mutex> lock(r->mu);
      r->cachedTokens = static_cast<int64_t>(r->fed);
    }
    planSnapshots(*r);
    if (!r->admittedOnce) {
      // The soft limit: what the free cache holds for it beside what the
      // requests admitted before it still need.
      if (r->maxTokensSoft > 0) {
        int64_t room = std::numeric_limits<int32_t>::max();
        if (paged)
          room = (freePages() - committed) * pageSize_ -
                 static_cast<int64_t>(r->contextLength());
        r->maxTokens = static_cast<int32_t>(std::clamp<int64_t>(
            std::min<int64_t>(r->maxTokensSoft, room), 1, r->maxTokens));
      }
      r->admittedOnce = true;
      r->scheduled = Clock::now();
      std::lock_guard<std::mutex> lock(r->mu);
      r->grantedMaxTokens = r->maxTokens;
    }
    r->seq = seq;
    running_.push_back(r);
    admitted.push_back(r);
    committed += context;
  }
  syncWaiting();
  // Then the prompts, in chunks within the step's token budget and the free
  // pages; the fewest tokens left first, so that a short prompt is not held
  // behind a long one (which takes what the others leave of every step).
  std::vector<std::shared_ptr<Request>> prompts;
  for (auto &r : running_)
    if (r->contextLength() - r->fed > 1)
      prompts.push_back(r);
  // A one-token context (or one token left after a cached prefix): not a
  // decode of this step.
  for (auto &r : admitted)
    if (r->contextLength() - r->fed == 1)
      prompts.push_back(r);
  std::stable_sort(
      prompts.begin(), prompts.end(), [](const auto &x, const auto &y) {
        return x->contextLength() - x->fed < y->contextLength() - y->fed;
      });
  for (auto &r : prompts) {
    if (budget <= 0)
      break;
    const int64_t fed = static_cast<int64_t>(r->fed);
    int64_t count = std::min<int64_t>(
        static_cast<int64_t>(r->contextLength()) - fed, budget);
    fitSnapshots(*r, count, budget);
    if (paged) {
      auto room = [&] {
        return (pagesFor(fed) + freePages()) * pageSize_ - fed;
      };
      while (room() < count && evictSnapshot())
        free = nf_model_kv_free_pages(model_);
      count = std::min(count, room());
    }
    if (count <= 0)
      continue;
    reserved += pagesFor(fed + count) - pagesFor(fed);
    budget -= count;
    step.push_back({r, static_cast<size_t>(count)});
  }
  // Nothing fits (prompts holding pages wait on each other): the last
  // request makes room, and the next plan runs the others.
  if (step.empty() && running_.size() > 1 && !evictSnapshot())
    preempt(running_.back());
  return step;
}

} // namespace nf::serving
