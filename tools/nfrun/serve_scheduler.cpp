// nfrun serve's scheduler (see serve_scheduler.h).
#include "serve_scheduler.h"

#include <algorithm>
#include <limits>

namespace nfrun {

size_t findStop(const std::string &text, const std::vector<std::string> &stops,
                size_t from) {
  size_t best = std::string::npos;
  for (const std::string &s : stops)
    best = std::min(best,
                    text.find(s, from >= s.size() ? from - s.size() + 1 : 0));
  return best;
}

size_t heldBack(const std::string &text,
                const std::vector<std::string> &stops) {
  size_t hold = 0;
  for (const std::string &s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

size_t incompleteUtf8(const std::string &text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80)
      continue; // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

Scheduler::Scheduler(nf::Model &model, const SchedulerOptions &options)
    : model_(model), options_(options), pageSize_(model.kvPageSize()),
      worker_([this] { loop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  const std::string why = "the server is shutting down";
  for (auto &r : running_)
    finish(*r, "", why, true);
  for (auto &r : resumed_)
    finish(*r, "", why, true);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto &r : pending_)
    finish(*r, "", why, true);
  pending_.clear();
}

Scheduler::Submit Scheduler::submit(std::shared_ptr<Request> r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stopping_)
      return Submit::ShuttingDown;
    if (static_cast<int>(pending_.size()) >= options_.maxQueue)
      return Submit::QueueFull;
    r->arrival = std::chrono::steady_clock::now();
    pending_.push_back(std::move(r));
  }
  cv_.notify_all();
  return Submit::Queued;
}

void Scheduler::shutdown(std::chrono::steady_clock::time_point deadline) {
  std::deque<std::shared_ptr<Request>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    stats_.draining = true;
    deadline_ = deadline;
    waiting.swap(pending_);
  }
  cv_.notify_all();
  for (auto &r : waiting)
    finish(*r, "", "the server is shutting down", true);
}

bool Scheduler::drained() {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_ && pending_.empty() && stats_.running == 0 &&
         stats_.queued == 0;
}

SchedulerStats Scheduler::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queued += static_cast<int>(pending_.size());
  return s;
}

int64_t Scheduler::pagesFor(int64_t tokens) const {
  return pageSize_ > 0 ? (tokens + pageSize_ - 1) / pageSize_ : 0;
}

void Scheduler::finish(Request &r, const std::string &reason,
                       const std::string &error, bool unavailable) {
  if (r.seq >= 0)
    (void)model_.removeSequence(r.seq);
  r.seq = -1;
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.done)
    return;
  if (options_.metrics)
    options_.metrics->finished(error.empty() && reason != "cancelled" ? reason
                                                                      : "abort",
                               std::chrono::duration<double>(
                                   std::chrono::steady_clock::now() - r.arrival)
                                   .count(),
                               static_cast<int64_t>(r.prompt.size()),
                               static_cast<int64_t>(r.generated.size()));
  r.done = true;
  r.finishReason = reason;
  r.error = error;
  r.unavailable = unavailable;
  r.cv.notify_all();
}

void Scheduler::preempt(const std::shared_ptr<Request> &r) {
  // Recompute preemption: the sequence and its pages are freed; the request
  // keeps its sampler and generated tokens and refeeds prompt + generated
  // when it is admitted again, ahead of the queue.
  (void)model_.removeSequence(r->seq);
  r->seq = -1;
  r->fed = 0;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  resumed_.push_front(r);
  if (options_.metrics)
    options_.metrics->preempted();
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.preemptions;
}

std::vector<Scheduler::Entry> Scheduler::plan() {
  // Requests whose clients went away free their sequence first.
  auto cancelled = [&](const std::shared_ptr<Request> &r) {
    if (!r->cancelled.load())
      return false;
    finish(*r, "cancelled", "");
    return true;
  };
  std::erase_if(running_, cancelled);
  std::erase_if(resumed_, cancelled);
  bool draining;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(pending_, cancelled);
    draining = draining_;
    if (draining && std::chrono::steady_clock::now() >= deadline_) {
      for (auto &r : running_)
        finish(*r, "", "the server is shutting down", true);
      for (auto &r : resumed_)
        finish(*r, "", "the server is shutting down", true);
      running_.clear();
      resumed_.clear();
      return {};
    }
  }

  const bool paged = pageSize_ > 0;
  // Free pages, read once (preemption frees some: read again then), less
  // those this step's entries take.
  int64_t free =
      paged ? model_.kvFreePages() : std::numeric_limits<int64_t>::max() / 2;
  int64_t reserved = 0;
  auto freePages = [&] { return free - reserved; };
  auto preemptLatest = [&](const std::shared_ptr<Request> &r) {
    preempt(r);
    if (paged)
      free = model_.kvFreePages();
  };
  int64_t budget = options_.stepTokens;
  std::vector<Entry> step;

  // Running requests' next tokens first, oldest admitted first; when the
  // cache cannot take one, the latest admitted request gives its pages up.
  for (size_t i = 0; i < running_.size(); ++i) {
    std::shared_ptr<Request> r = running_[i];
    if (r->contextLength() - r->fed != 1)
      continue;
    const int64_t need = pagesFor(static_cast<int64_t>(r->fed) + 1) -
                         pagesFor(static_cast<int64_t>(r->fed));
    while (need > freePages() && running_.back() != r)
      preemptLatest(running_.back());
    if (need > freePages()) {
      preemptLatest(r);
      break;
    }
    reserved += need;
    --budget;
    step.push_back({r, 1});
  }
  // Then new requests (preempted ones first) while a sequence is free and
  // the cache can hold the whole context next to what the prompts being
  // fed still need (`committed`).
  int64_t committed = 0;
  for (auto &r : running_)
    if (r->contextLength() - r->fed > 1)
      committed += pagesFor(static_cast<int64_t>(r->contextLength())) -
                   pagesFor(static_cast<int64_t>(r->fed));
  std::vector<std::shared_ptr<Request>> admitted;
  while (static_cast<int>(running_.size()) < options_.maxBatch) {
    std::shared_ptr<Request> r;
    const bool fromResumed = !resumed_.empty();
    if (fromResumed) {
      r = resumed_.front();
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() || draining_)
        break;
      r = pending_.front();
    }
    const int64_t context = pagesFor(static_cast<int64_t>(r->contextLength()));
    if (paged && context > freePages() - committed)
      break;
    if (fromResumed) {
      resumed_.pop_front();
    } else {
      // shutdown() may have taken the queue (and ended r) since it was
      // read: admit r only if it is still at the front.
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() || pending_.front() != r)
        break;
      pending_.pop_front();
    }
    nf::StatusOr<int32_t> seq = model_.addSequence();
    if (!seq) {
      finish(*r, "", seq.message());
      continue;
    }
    r->seq = *seq;
    r->fed = 0;
    running_.push_back(r);
    admitted.push_back(r);
    committed += context;
  }
  // Then the prompts, in chunks within the step's token budget and the free
  // pages; the fewest tokens left first, so that a short prompt is not held
  // behind a long one (which takes what the others leave of every step).
  std::vector<std::shared_ptr<Request>> prompts;
  for (auto &r : running_)
    if (r->contextLength() - r->fed > 1)
      prompts.push_back(r);
  for (auto &r : admitted) // a one-token prompt: not a decode of this step
    if (r->contextLength() == 1)
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
    if (paged)
      count = std::min(count, (pagesFor(fed) + freePages()) * pageSize_ - fed);
    if (count <= 0)
      continue;
    reserved += pagesFor(fed + count) - pagesFor(fed);
    budget -= count;
    step.push_back({r, static_cast<size_t>(count)});
  }
  // Nothing fits (prompts holding pages wait on each other): the latest
  // admitted request makes room, and the next plan runs the others.
  if (step.empty() && running_.size() > 1)
    preempt(running_.back());
  return step;
}

bool Scheduler::runBatch(std::vector<Entry> &step, std::vector<int32_t> &tokens,
                         std::string &error) {
  std::vector<nf::SeqInput> batch;
  std::vector<nf::Sampler *> samplers;
  for (const Entry &e : step) {
    Request &r = *e.r;
    nf::SeqInput in;
    in.seq = r.seq;
    for (size_t i = r.fed; i < r.fed + e.count; ++i)
      in.tokens.push_back(r.contextToken(i));
    batch.push_back(std::move(in));
    // Only a context's last chunk draws a token.
    samplers.push_back(r.fed + e.count == r.contextLength() ? &*r.sampler
                                                            : nullptr);
  }
  if (nf::Status st = model_.decodeSample(batch, samplers, tokens); !st) {
    error = st.message();
    return false;
  }
  return true;
}

void Scheduler::runStep(std::vector<Entry> &step) {
  std::vector<int32_t> tokens;
  std::string error;
  std::vector<std::pair<Entry, int32_t>> done; // entries run, their tokens
  // A step that fails in its checks leaves the sequences as they were; one
  // that fails later (a device error, memory) leaves them unspecified.
  auto unchanged = [&](const std::vector<Entry> &entries) {
    for (const Entry &e : entries)
      if (model_.sequenceLength(e.r->seq) != static_cast<int64_t>(e.r->fed))
        return false;
    return true;
  };
  // A sequence whose state may be wrong is recomputed (its request is
  // preempted), once; a request that fails again ends with the error.
  auto recompute = [&](const Entry &e, const std::string &why) {
    if (e.r->failures++ > 0)
      finish(*e.r, "", why);
    else
      preempt(e.r);
  };
  if (runBatch(step, tokens, error)) {
    for (size_t i = 0; i < step.size(); ++i)
      done.push_back({step[i], tokens[i]});
  } else if (!unchanged(step)) {
    for (Entry &e : step)
      recompute(e, error);
  } else if (step.size() == 1) {
    finish(*step[0].r, "", error);
  } else {
    // Each request alone: only those that fail alone fail.
    for (Entry &e : step) {
      std::vector<Entry> one{e};
      std::string why;
      if (runBatch(one, tokens, why))
        done.push_back({e, tokens[0]});
      else if (!unchanged(one))
        recompute(e, why);
      else
        finish(*e.r, "", why);
    }
  }
  for (auto &[e, token] : done) {
    Request &r = *e.r;
    r.fed += e.count;
    if (r.fed < r.contextLength())
      continue; // a prompt chunk: the next one follows
    if (token < 0)
      finish(r, "", "no token: every logit is -inf or NaN");
    else
      accept(r, token);
  }
  std::erase_if(running_,
                [](const std::shared_ptr<Request> &r) { return r->seq < 0; });
}

/// The bytes the last of r.generated adds to r.decoded: the decode of a
/// short tail of the completion with and without it, so that the pieces
/// come out as in one decode of the whole text (the tokenizer's decoders:
/// byte-level, or none, which joins pieces with a space), at constant work
/// per token. A tail that decodes to nothing before the token (every token
/// in it skipped: specials) says nothing about the joint: then the whole
/// completion.
nf::StatusOr<std::string> Scheduler::newBytes(const Request &r) {
  if (!model_.hasTokenizer()) // token ids only (return_token_ids)
    return std::string();
  constexpr size_t kTail = 8;
  const size_t n = r.generated.size();
  const std::vector<int32_t> tail(
      r.generated.begin() +
          static_cast<ptrdiff_t>(n > kTail + 1 ? n - kTail - 1 : 0),
      r.generated.end());
  constexpr int kFlags = NF_DETOKENIZE_SKIP_SPECIAL | NF_DETOKENIZE_RAW_BYTES;
  auto after = model_.detokenize(tail, kFlags);
  if (!after)
    return after.status();
  auto before = model_.detokenize(
      std::vector<int32_t>(tail.begin(), tail.end() - 1), kFlags);
  if (!before)
    return before.status();
  if (before->empty() && tail.size() < n) {
    auto all = model_.detokenize(r.generated, kFlags);
    if (!all)
      return all.status();
    if (all->compare(0, r.decoded.size(), r.decoded) == 0)
      return all->substr(r.decoded.size());
    return model_.detokenize({r.generated.back()}, kFlags);
  }
  if (after->compare(0, before->size(), *before) == 0)
    return after->substr(before->size());
  return model_.detokenize({r.generated.back()}, kFlags);
}

/// Adds the sampled token to r; returns true when r is finished.
bool Scheduler::accept(Request &r, int32_t token) {
  r.generated.push_back(token);
  if (options_.metrics) {
    const auto now = std::chrono::steady_clock::now();
    if (r.generated.size() == 1)
      options_.metrics->firstToken(
          std::chrono::duration<double>(now - r.arrival).count());
    else
      options_.metrics->nextToken(
          std::chrono::duration<double>(now - r.lastToken).count());
    r.lastToken = now;
  }
  const bool eos = model_.isEos(token);
  const size_t searched = r.decoded.size();
  if (!eos) {
    auto piece = newBytes(r);
    if (!piece) {
      finish(r, "", piece.message());
      return true;
    }
    r.decoded += *piece;
  }
  if (r.cancelled.load()) {
    finish(r, "cancelled", "");
    return true;
  }
  // What the client may see: the decoded text up to a stop string, less a
  // tail that may still start one or is part of a character. It only grows
  // (a held-back tail is what a later stop string would start with), so
  // r.text takes the new bytes instead of a copy of the whole.
  const std::string &decoded = r.decoded;
  size_t visible = decoded.size();
  std::string reason;
  if (size_t at = findStop(decoded, r.stops, searched);
      at != std::string::npos) {
    visible = at;
    reason = "stop";
  } else if (eos) {
    reason = "stop";
  } else if (static_cast<int32_t>(r.generated.size()) >= r.maxTokens ||
             (model_.maxContext() >= 0 &&
              model_.sequenceLength(r.seq) + 1 >= model_.maxContext())) {
    reason = "length";
  } else {
    visible -= std::max(heldBack(decoded, r.stops), incompleteUtf8(decoded));
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.tokens.push_back(token);
    if (visible >= r.text.size())
      r.text.append(decoded, r.text.size(), visible - r.text.size());
    else
      r.text.resize(visible);
  }
  // Only a stream reads text before the end (finish wakes the others): a
  // wake-up per token and request costs the scheduler's thread time.
  if (r.stream)
    r.cv.notify_all();
  if (!reason.empty()) {
    finish(r, reason, "");
    return true;
  }
  return false;
}

void Scheduler::updateStats(int stepSize) {
  const int64_t pages = pageSize_ > 0 ? model_.kvPages() : 0;
  const int64_t freePages = pageSize_ > 0 ? model_.kvFreePages() : 0;
  const int live = model_.liveSequences();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = static_cast<int>(running_.size());
  stats_.queued = static_cast<int>(resumed_.size());
  stats_.peakBatch = std::max(stats_.peakBatch, stepSize);
  stats_.liveSequences = live;
  stats_.kvPages = pages;
  stats_.kvFreePages = freePages;
  stats_.steps += stepSize > 0 ? 1 : 0;
  if (options_.metrics) {
    if (stepSize > 0)
      options_.metrics->step();
    options_.metrics->setLoad(
        stats_.running, stats_.queued + static_cast<int>(pending_.size()),
        pages > 0 ? 1.0 - static_cast<double>(freePages) / pages : 0.0);
  }
}

void Scheduler::loop() {
  updateStats(0);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wake for new requests, or every 50 ms while requests are held
      // (cancellations, the shutdown deadline, pages freed).
      auto work = [&] {
        return stopping_ || !pending_.empty() || !running_.empty() ||
               !resumed_.empty();
      };
      if (running_.empty() && resumed_.empty())
        cv_.wait(lock, work);
      if (stopping_)
        return;
    }
    std::vector<Entry> step = plan();
    if (!step.empty())
      runStep(step);
    updateStats(static_cast<int>(step.size()));
    if (step.empty()) {
      // Nothing could run (waiting for pages or a cancellation): do not
      // spin.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
}

} // namespace nfrun
