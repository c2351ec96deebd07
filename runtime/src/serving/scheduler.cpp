// The serving engine's scheduler: requests in and out, running the steps
// the plan chooses (scheduler_plan.cpp) and their events (see scheduler.h).
#include "serving/scheduler.h"

#include "capi/capi.h"

#include <algorithm>
#include <utility>

namespace nf::serving {
namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

} // namespace

Scheduler::Scheduler(nf_model *model, const SchedulerOptions &options)
    : model_(model), options_(options), pageSize_(nf_model_kv_page_size(model)),
      moeLayers_(static_cast<size_t>(nf_model_n_moe_layers(model))),
      cache_(options.prefixCaching
                 ? std::make_unique<PrefixCache>(
                       model, std::max<int32_t>(1, options.prefixBlock))
                 : nullptr),
      worker_([this] { loop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  const std::string why = "the engine is shutting down";
  for (auto &r : running_)
    finish(*r, NF_FINISH_UNAVAILABLE, why);
  for (auto &r : waiting_)
    finish(*r, NF_FINISH_UNAVAILABLE, why);
  std::deque<std::shared_ptr<Request>> inbox;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
  }
  for (auto &r : inbox)
    finish(*r, NF_FINISH_UNAVAILABLE, why);
}

nf_status Scheduler::submit(std::shared_ptr<Request> r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stopping_)
      return NF_ERR_UNAVAILABLE;
    if (static_cast<int64_t>(inbox_.size()) + stats_.waiting >=
        options_.maxQueue)
      return NF_ERR_CAPACITY;
    r->arrival = Clock::now();
    r->order = arrivals_++;
    inbox_.push_back(std::move(r));
  }
  cv_.notify_all();
  return NF_OK;
}

void Scheduler::shutdown(Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!draining_)
      deadline_ = deadline;
    draining_ = true;
    stats_.draining = 1;
  }
  cv_.notify_all();
}

bool Scheduler::drained() { return stats().drained != 0; }

void Scheduler::resetPrefixCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    resetCache_ = true;
  }
  cv_.notify_all();
}

std::vector<int64_t> Scheduler::expertUtilization() {
  std::lock_guard<std::mutex> lock(mu_);
  return utilization_;
}

nf_engine_stats Scheduler::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  nf_engine_stats s = stats_;
  s.waiting += static_cast<int32_t>(inbox_.size());
  s.drained = draining_ && s.waiting == 0 && s.running == 0;
  return s;
}

void Scheduler::syncWaiting() {
  // Both at once: a request between the two lists would otherwise count
  // in neither, and stats() report the engine drained while it runs.
  std::lock_guard<std::mutex> lock(mu_);
  stats_.waiting = static_cast<int32_t>(waiting_.size());
  stats_.running = static_cast<int32_t>(running_.size());
}

int64_t Scheduler::pagesFor(int64_t tokens) const {
  return pageSize_ > 0 ? (tokens + pageSize_ - 1) / pageSize_ : 0;
}

void Scheduler::notify(const nf_engine_event &event) const {
  if (!options_.observer)
    return;
  try { // a C++ observer that throws must not end the engine's thread
    options_.observer(&event, options_.observerData);
  } catch (...) {
  }
}

void Scheduler::finish(Request &r, nf_finish_reason reason,
                       const std::string &error) {
  // A request that ended well leaves its context as a snapshot: the next
  // turn of a conversation starts with it.
  const bool ended = reason == NF_FINISH_STOP || reason == NF_FINISH_LENGTH;
  if (r.seq >= 0 && cache_ && ended && r.fed > 0 &&
      nf_seq_length(model_, r.seq) == static_cast<int64_t>(r.fed)) {
    std::vector<int32_t> context(r.fed);
    for (size_t i = 0; i < r.fed; ++i)
      context[i] = r.contextToken(i);
    cache_->insert(r.seq, context, r.cacheSalt, /*adopt=*/true);
  } else if (r.seq >= 0) {
    (void)nf_seq_remove(model_, r.seq);
  }
  r.seq = -1;
  const Clock::time_point now = Clock::now();
  // Only this thread writes r.finish: read without the lock. The observer
  // hears of the end before the reader can see it, without any lock held.
  if (r.finish != NF_FINISH_NONE)
    return;
  nf_engine_event e = {};
  e.kind = NF_EVENT_FINISHED;
  e.request_user_data = r.userData;
  e.seconds = seconds(r.arrival, now);
  e.finish_reason = reason;
  e.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  e.completion_tokens = static_cast<int64_t>(r.generated.size());
  e.expert_calls = r.expertCalls;
  e.expert_budget = r.expertBudget;
  notify(e);
  std::unique_lock<std::mutex> lock(r.mu);
  if (reason == NF_FINISH_STOP || reason == NF_FINISH_LENGTH)
    r.pendingText += r.text.take(true);
  r.finish = reason;
  r.error = error;
  if (r.admittedOnce) {
    r.queuedS = seconds(r.arrival, r.scheduled);
    if (r.generated.empty()) {
      r.prefillS = seconds(r.scheduled, now);
    } else {
      r.prefillS = seconds(r.scheduled, r.firstToken);
      r.decodeS = seconds(r.firstToken, now);
    }
  } else {
    r.queuedS = seconds(r.arrival, now);
  }
  lock.unlock();
  r.cv.notify_all();
}

void Scheduler::preempt(const std::shared_ptr<Request> &r) {
  // Recompute preemption: the sequence and its pages are freed; the request
  // keeps its sampler and generated tokens and refeeds prompt + generated
  // when it is admitted again (in its place by priority and arrival).
  (void)nf_seq_remove(model_, r->seq);
  r->seq = -1;
  r->fed = 0;
  running_.erase(std::find(running_.begin(), running_.end(), r));
  waiting_.push_back(r);
  syncWaiting();
  {
    std::lock_guard<std::mutex> lock(r->mu);
    ++r->preemptions;
  }
  nf_engine_event e = {};
  e.kind = NF_EVENT_PREEMPTED;
  e.request_user_data = r->userData;
  notify(e);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.preemptions;
}

bool Scheduler::runBatch(std::vector<Entry> &step, std::vector<Ran> &ran,
                         std::string &error) {
  std::vector<nf_seq_input> inputs(step.size());
  std::vector<std::vector<int32_t>> ids(step.size());
  std::vector<nf_sampler *> samplers(step.size());
  std::vector<capi::EntryOptions> options(step.size());
  std::vector<std::vector<int32_t>> targets(step.size());
  bool wantOptions = false;
  for (size_t i = 0; i < step.size(); ++i) {
    Request &r = *step[i].r;
    for (size_t t = r.fed; t < r.fed + step[i].count; ++t)
      ids[i].push_back(r.contextToken(t));
    inputs[i] = {};
    inputs[i].seq_id = r.seq;
    inputs[i].tokens = ids[i].data();
    inputs[i].n_tokens = static_cast<int32_t>(ids[i].size());
    inputs[i].expert_budget = r.expertBudget;
    // Only a context's last chunk draws a token.
    samplers[i] =
        r.fed + step[i].count == r.contextLength() ? r.sampler.get() : nullptr;
    capi::EntryOptions &lp = options[i];
    lp.penalties = r.penalties.active() ? &r.penalties : nullptr;
    lp.constraint = samplers[i] && r.constraint && r.constraintActive
                        ? &*r.constraint
                        : nullptr;
    lp.wantSampled = samplers[i] && r.logprobs >= 0;
    lp.sampled.top = std::max(r.logprobs, 0);
    lp.fed.top = std::max(r.promptLogprobs, 0);
    if (r.owesPromptLogprobs()) {
      // Row t gives the logprob of prompt token t + 1.
      for (size_t t = r.fed; t < r.fed + step[i].count; ++t)
        targets[i].push_back(t + 1 < r.prompt.size() &&
                                     t + 1 >= r.promptLogprobsNext
                                 ? r.prompt[t + 1]
                                 : -1);
      lp.fedTargets = targets[i];
    }
    wantOptions = wantOptions || lp.penalties || lp.constraint ||
                  lp.wantSampled || !lp.fedTargets.empty();
  }
  stepExpertCalls_.assign(step.size(), 0);
  stepExpertCallsPerLayer_.assign(step.size() * moeLayers_, 0);
  const nf_batch batch = {inputs.data(), static_cast<int32_t>(inputs.size()),
                          stepExpertCalls_.data(),
                          moeLayers_ ? stepExpertCallsPerLayer_.data()
                                     : nullptr};
  std::vector<int32_t> tokens(step.size(), -1);
  if (capi::decodeSample(model_, &batch, samplers.data(), tokens.data(),
                         wantOptions
                             ? std::span(options)
                             : std::span<capi::EntryOptions>()) != NF_OK) {
    error = nf_last_error();
    return false;
  }
  for (size_t i = 0; i < step.size(); ++i) {
    Request &r = *step[i].r;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      r.expertCalls += stepExpertCalls_[i];
      r.tokensRun += static_cast<int64_t>(step[i].count);
      r.expertCallsPerLayer.resize(moeLayers_, 0);
      for (size_t l = 0; l < moeLayers_; ++l)
        r.expertCallsPerLayer[l] +=
            stepExpertCallsPerLayer_[i * moeLayers_ + l];
    }
    ran.push_back({step[i], tokens[i], std::move(options[i].sampled),
                   std::move(options[i].fed)});
  }
  return true;
}

void Scheduler::runStep(std::vector<Entry> &step) {
  std::string error;
  std::vector<Ran> done; // entries run
  const Clock::time_point start = Clock::now();
  int64_t expertCalls = 0;
  // A step that fails in its checks leaves the sequences as they were; one
  // that fails later (a device error, memory) leaves them unspecified.
  auto unchanged = [&](const std::vector<Entry> &entries) {
    for (const Entry &e : entries)
      if (nf_seq_length(model_, e.r->seq) != static_cast<int64_t>(e.r->fed))
        return false;
    return true;
  };
  // A sequence whose state may be wrong is recomputed (its request is
  // preempted), once; a request that fails again ends with the error.
  auto recompute = [&](const Entry &e, const std::string &why) {
    if (e.r->failures++ > 0)
      finish(*e.r, NF_FINISH_ERROR, why);
    else
      preempt(e.r);
  };
  auto count = [&](size_t from) {
    for (size_t i = from; i < done.size(); ++i)
      expertCalls += stepExpertCalls_[i - from];
  };
  if (runBatch(step, done, error)) {
    count(0);
  } else if (!unchanged(step)) {
    for (Entry &e : step)
      recompute(e, error);
  } else if (step.size() == 1) {
    finish(*step[0].r, NF_FINISH_ERROR, error);
  } else {
    // Each request alone: only those that fail alone fail.
    for (Entry &e : step) {
      std::vector<Entry> one{e};
      std::string why;
      const size_t before = done.size();
      if (runBatch(one, done, why))
        count(before);
      else if (!unchanged(one))
        recompute(e, why);
      else
        finish(*e.r, NF_FINISH_ERROR, why);
    }
  }
  int64_t stepTokens = 0;
  for (const Ran &d : done)
    stepTokens += static_cast<int64_t>(d.e.count);
  nf_engine_event ev = {};
  ev.kind = NF_EVENT_STEP;
  ev.seconds = seconds(start, Clock::now());
  ev.step_sequences = static_cast<int32_t>(done.size());
  ev.step_tokens = stepTokens;
  ev.expert_calls = expertCalls;
  {
    // Before any request of the step ends: what a reader sees after its
    // end includes its last step.
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps += 1;
    stats_.peak_batch =
        std::max(stats_.peak_batch, static_cast<int32_t>(step.size()));
  }
  if (!done.empty()) {
    refreshUtilization();
    notify(ev);
  }
  for (Ran &d : done) {
    Request &r = *d.e.r;
    r.fed += d.e.count;
    if (!d.fed.empty()) {
      r.promptLogprobsNext = r.fed + 1;
      std::lock_guard<std::mutex> lock(r.mu);
      r.pendingPromptLogprobs.top = d.fed.top;
      r.pendingPromptLogprobs.append(d.fed);
    }
    if (cache_ && r.seq >= 0 &&
        std::binary_search(r.snapshots.begin(), r.snapshots.end(), r.fed))
      cache_->insert(r.seq, std::span(r.prompt).first(r.fed), r.cacheSalt);
    if (r.fed < r.contextLength())
      continue; // a prompt chunk: the next one follows
    if (d.token < 0)
      finish(r, NF_FINISH_ERROR,
             r.constraint ? "no token: the grammar allows no token the model "
                            "can draw (every allowed logit is -inf or NaN)"
                          : "no token: every logit is -inf or NaN");
    else
      accept(r, d.token, d.sampled);
  }
  std::erase_if(running_,
                [](const std::shared_ptr<Request> &r) { return r->seq < 0; });
  // All of the step's counts at once: a reader that sees its requests gone
  // from `running` sees the pages, sequences and snapshots they left.
  updateStats();
}

/// Adds the sampled token to r, and ends r when it is the last.
void Scheduler::accept(Request &r, int32_t token,
                       const sampling::LogprobList &logprobs) {
  if (r.cancelled.load()) { // the token is nobody's
    finish(r, NF_FINISH_CANCELLED, "");
    return;
  }
  r.generated.push_back(token);
  r.penalties.observe(token);
  if (r.constraint && r.constraintActive && !r.constraint->accept(token)) {
    // The mask allowed it, so the grammar engine disagrees with itself.
    finish(r, NF_FINISH_ERROR,
           "internal: the grammar rejected token " + std::to_string(token) +
               " it allowed");
    return;
  }
  if (r.constraint && !r.constraintActive &&
      r.generated.size() >= r.constraintAfter.size() &&
      std::equal(r.constraintAfter.begin(), r.constraintAfter.end(),
                 r.generated.end() -
                     static_cast<std::ptrdiff_t>(r.constraintAfter.size())))
    r.constraintActive = true; // from the next token
  const Clock::time_point now = Clock::now();
  nf_engine_event e = {};
  e.request_user_data = r.userData;
  if (r.generated.size() == 1) {
    r.firstToken = now;
    e.kind = NF_EVENT_FIRST_TOKEN;
    e.seconds = seconds(r.arrival, now);
  } else {
    e.kind = NF_EVENT_TOKEN;
    e.seconds = seconds(r.lastToken, now);
  }
  r.lastToken = now;
  notify(e);
  const bool eos = !r.ignoreEos && nf_model_is_eos(model_, token);
  const bool stopToken = std::find(r.stopTokens.begin(), r.stopTokens.end(),
                                   token) != r.stopTokens.end();
  bool stopString = false;
  if (!eos && !stopToken) {
    auto stopped = r.text.add(token);
    if (!stopped) {
      finish(r, NF_FINISH_ERROR, stopped.message());
      return;
    }
    stopString = *stopped;
  }
  if (r.cancelled.load()) {
    finish(r, NF_FINISH_CANCELLED, "");
    return;
  }
  nf_finish_reason reason = NF_FINISH_NONE;
  if (eos || stopToken || stopString)
    reason = NF_FINISH_STOP;
  else if (static_cast<int32_t>(r.generated.size()) >= r.maxTokens ||
           (nf_model_max_context(model_) >= 0 &&
            nf_seq_length(model_, r.seq) + 1 >= nf_model_max_context(model_)))
    reason = NF_FINISH_LENGTH;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    r.pendingTokens.push_back(token);
    if (!logprobs.empty()) {
      r.pendingLogprobs.top = logprobs.top;
      r.pendingLogprobs.append(logprobs);
    }
    r.completionTokens = static_cast<int64_t>(r.generated.size());
    if (reason == NF_FINISH_NONE)
      r.pendingText += r.text.take(false);
  }
  if (reason != NF_FINISH_NONE)
    finish(r, reason, ""); // takes the rest of the text
  else
    r.cv.notify_all();
}

void Scheduler::refreshUtilization() {
  // The model's expert counters, read on this thread (the steps').
  const size_t cells = static_cast<size_t>(nf_model_n_moe_layers(model_)) *
                       static_cast<size_t>(nf_model_n_experts(model_));
  if (cells == 0)
    return;
  std::vector<int64_t> used(cells);
  if (nf_model_expert_utilization(model_, used.data(), cells) != NF_OK)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  utilization_.swap(used);
}

void Scheduler::updateStats() {
  if (cache_) {
    const Clock::time_point now = Clock::now();
    // Not at every step: the count walks every snapshot's page table.
    if (cache_->size() != cacheBytesEntries_ ||
        (running_.empty() && cacheBytesRunning_ != 0) ||
        now - cacheBytesAt_ >= std::chrono::milliseconds(250)) {
      cacheBytes_ = cache_->bytes();
      cacheBytesEntries_ = cache_->size();
      cacheBytesRunning_ = running_.size();
      cacheBytesAt_ = now;
    }
  }
  const int64_t pages = pageSize_ > 0 ? nf_model_kv_pages(model_) : 0;
  const int64_t freePages = pageSize_ > 0 ? nf_model_kv_free_pages(model_) : 0;
  const int32_t live = nf_model_live_sequences(model_);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.waiting = static_cast<int32_t>(waiting_.size());
  stats_.running = static_cast<int32_t>(running_.size());
  stats_.live_sequences = live;
  stats_.kv_pages = pages;
  stats_.kv_free_pages = freePages;
  stats_.prefix_cache_queries = cacheQueries_;
  stats_.prefix_cache_hits = cacheHits_;
  stats_.prefix_cache_entries =
      cache_ ? static_cast<int32_t>(cache_->size()) : 0;
  stats_.prefix_cache_evictions = cache_ ? cache_->evictions() : 0;
  stats_.prefix_cache_bytes = cacheBytes_;
}

void Scheduler::failAll(const std::string &why) {
  // What failed may have left any of them half done (out of memory, most
  // likely): every request held ends with the error.
  for (auto &r : running_)
    finish(*r, NF_FINISH_ERROR, why);
  running_.clear();
  for (auto &r : waiting_)
    finish(*r, NF_FINISH_ERROR, why);
  waiting_.clear();
  syncWaiting();
}

void Scheduler::loop() {
  refreshUtilization();
  updateStats();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Wake for new requests, or every 50 ms while requests are held
      // (cancellations, the shutdown deadline, pages freed).
      auto work = [&] {
        return stopping_ || resetCache_ || !inbox_.empty() ||
               !running_.empty() || !waiting_.empty();
      };
      if (running_.empty() && waiting_.empty())
        cv_.wait(lock, work);
      if (stopping_)
        return;
    }
    std::vector<Entry> step;
    int64_t preemptionsBefore = 0;
    const int64_t evictionsBefore = cache_ ? cache_->evictions() : 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      preemptionsBefore = stats_.preemptions;
    }
    try {
      step = plan();
      if (!step.empty())
        runStep(step);
    } catch (const std::exception &e) {
      failAll(std::string("internal error: ") + e.what());
      step.clear();
    } catch (...) {
      failAll("internal error");
      step.clear();
    }
    updateStats();
    // Room made (a request preempted, a snapshot given up): plan again.
    bool preempted = cache_ && cache_->evictions() != evictionsBefore;
    {
      std::lock_guard<std::mutex> lock(mu_);
      preempted = preempted || stats_.preemptions != preemptionsBefore;
    }
    if (step.empty() && !preempted) {
      // Nothing could run (waiting for pages or a cancellation): do not
      // spin.
      std::unique_lock<std::mutex> lock(mu_);
      if (!stopping_ && inbox_.empty())
        cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
}

} // namespace nf::serving
