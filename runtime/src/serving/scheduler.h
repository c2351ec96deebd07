// The serving engine's scheduler (nf_engine in nf.h): one thread that has
// a model's steps to itself and runs every admitted request in shared
// steps (continuous batching).
//
// Each step holds the running requests' next tokens first (one each), then
// prompt chunks up to a token budget (chunked prefill), so a long prompt
// never stalls the streams already running. Waiting requests are admitted
// by priority (lower values first, as vLLM's `priority`; a request waiting
// longer than max_wait_ms goes first), then arrival, when a sequence slot
// is free and the KV cache can hold the request's whole context. When a
// step would need more KV pages than are free, the running request of the
// lowest priority admitted last is preempted: its sequence is freed and
// its context (prompt and generated tokens) recomputed when it is admitted
// again, so no accepted request fails for lack of memory. With prefix
// caching (prefix_cache.h) an admitted request continues from the longest
// snapshot its context starts with, prompts pause at the points kept as
// snapshots, and snapshots give their slots and pages up (least recently
// used first) before a request is refused or preempted. A step that fails
// is retried one request at a time, so only the requests that cannot run
// fail. Cancelled requests free their sequence before the next step.
// Shutdown stops admitting, lets running requests finish until a deadline
// and ends the rest.
#pragma once

#include "nf/nf.h"
#include "nf/status.h"
#include "sampling/grammar.h"
#include "sampling/logprobs.h"
#include "sampling/penalties.h"
#include "serving/prefix_cache.h"
#include "serving/text_stream.h"

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace nf::serving {

using Clock = std::chrono::steady_clock;

struct SamplerFree {
  void operator()(nf_sampler *s) const { nf_sampler_free(s); }
};

/// One request, shared by its reader (nf_request) and the scheduler.
struct Request {
  // Set at submission, then read-only.
  std::vector<int32_t> prompt;
  int32_t maxTokens = 16;
  int32_t maxTokensSoft = 0; // > 0: may be shortened at admission
  std::vector<int32_t> stopTokens;
  bool ignoreEos = false;
  int32_t priority = 0;
  float expertBudget = 0.0f;  // as submitted (<= 0: the plan's default)
  float appliedBudget = 1.0f; // what it runs with
  void *userData = nullptr;
  std::string cacheSalt; // part of every prefix-cache key it uses
  /// Log-probabilities wanted (-1: none, else alternatives per position):
  /// of each generated token, and of the prompt's tokens after the first.
  int32_t logprobs = -1;
  int32_t promptLogprobs = -1;
  std::unique_ptr<nf_sampler, SamplerFree> sampler;
  Clock::time_point arrival;
  uint64_t order = 0; // arrival order

  // Scheduler thread only.
  /// Penalties on its rows (set at submission), and the generated tokens
  /// they count.
  sampling::PenaltyState penalties;
  /// Its grammar (structured output; set at submission), which follows
  /// the generated tokens.
  std::optional<sampling::TokenConstraint> constraint;
  /// Tokens the output contains before the grammar applies (none: from
  /// the first), and whether it applies.
  std::vector<int32_t> constraintAfter;
  bool constraintActive = true;
  TextStream text{nullptr, {}};
  int32_t seq = -1; // the model's sequence, -1 while waiting
  size_t fed = 0;   // tokens of prompt + generated in the sequence
  std::vector<int32_t> generated;
  /// Context lengths at which its prompt pauses for a prefix-cache
  /// snapshot, ascending.
  std::vector<size_t> snapshots;
  int failures = 0; // steps that failed after changing its sequence
  /// The first prompt position whose logprob is still owed (a recomputed
  /// prompt does not give them twice).
  size_t promptLogprobsNext = 1;
  bool admittedOnce = false;
  bool promoted = false; // admitted for waiting past max_wait_ms
  Clock::time_point scheduled, firstToken, lastToken;

  // Guarded by mu: what the reader has not taken yet, and the end.
  std::mutex mu;
  std::condition_variable cv;
  std::string pendingText;
  std::vector<int32_t> pendingTokens;
  sampling::LogprobList pendingLogprobs;       // of pendingTokens
  sampling::LogprobList pendingPromptLogprobs; // prompt positions from 1
  nf_finish_reason finish = NF_FINISH_NONE;
  std::string error;
  int64_t completionTokens = 0;
  int32_t grantedMaxTokens = 0; // 0 until admitted
  int32_t preemptions = 0;
  int64_t expertCalls = 0;
  std::vector<int64_t> expertCallsPerLayer; // [MoE layer]
  int64_t tokensRun = 0; // tokens fed through the model (recomputed too)
  int64_t cachedTokens =
      0; // context from a prefix-cache snapshot (last admission)
  double queuedS = 0, prefillS = 0, decodeS = 0;

  /// The reader gave up on it: the scheduler drops it.
  std::atomic<bool> cancelled{false};

  /// Tokens the sequence must hold before the next token is drawn: the
  /// prompt and every generated token (the last one is fed by the next
  /// step).
  size_t contextLength() const { return prompt.size() + generated.size(); }
  /// Whether prompt logprobs are still owed (its prompt is then computed,
  /// never taken from a prefix-cache snapshot).
  bool owesPromptLogprobs() const {
    return promptLogprobs >= 0 && promptLogprobsNext < prompt.size();
  }
  /// The priority it keeps its sequence by: a promoted request comes first.
  int64_t effectivePriority() const {
    return promoted ? INT64_MIN : static_cast<int64_t>(priority);
  }
  int32_t contextToken(size_t i) const {
    return i < prompt.size() ? prompt[i] : generated[i - prompt.size()];
  }
};

struct SchedulerOptions {
  int32_t maxBatch = 1;      // sequences alive at once
  int32_t maxQueue = 256;    // requests waiting to be admitted
  int64_t stepTokens = 2048; // tokens of one step (decodes + chunks)
  int64_t maxWaitMs = 0;     // > 0: waiting longer promotes a request
  bool prefixCaching = true;
  int32_t prefixBlock = 256; // tokens between prompt snapshot points
  nf_engine_observer observer = nullptr;
  void *observerData = nullptr;
};

class Scheduler {
public:
  /// `model` must outlive the scheduler; its steps are the scheduler's.
  Scheduler(nf_model *model, const SchedulerOptions &options);
  /// Ends every request still there (NF_FINISH_UNAVAILABLE).
  ~Scheduler();

  /// Queues `r`: NF_ERR_CAPACITY when the queue is full,
  /// NF_ERR_UNAVAILABLE after shutdown().
  nf_status submit(std::shared_ptr<Request> r);

  /// Stops admitting: waiting requests end at once (unavailable); running
  /// ones may finish until `deadline`, then end unavailable.
  void shutdown(Clock::time_point deadline);
  /// Whether every request has ended after shutdown().
  bool drained();

  nf_engine_stats stats();
  /// Frees every prefix-cache snapshot before the next step.
  void resetPrefixCache();
  /// Tokens routed to each [MoE layer][expert] as of the last step.
  std::vector<int64_t> expertUtilization();

private:
  struct Entry {
    std::shared_ptr<Request> r;
    size_t count = 0; // tokens of its context fed in this step
  };
  /// An entry that ran: the token drawn (-1: none) and the logprobs it
  /// asked for.
  struct Ran {
    Entry e;
    int32_t token = -1;
    sampling::LogprobList sampled, fed;
  };
  void loop();
  /// Admits, preempts and cuts the next step (empty: nothing can run).
  std::vector<Entry> plan();
  /// The waiting request to admit next, or end() when every waiting
  /// request is deferred (awaitsSnapshot).
  std::deque<std::shared_ptr<Request>>::iterator nextWaiting();
  /// Whether `r` waits for a running request whose prompt starts as its
  /// own does to reach a snapshot point within that common start, to fork
  /// it then instead of computing those tokens twice (a shared system
  /// prompt, n > 1, duplicate requests).
  bool awaitsSnapshot(const Request &r) const;
  void runStep(std::vector<Entry> &step);
  /// Runs `step`; on success `ran` gets its entries (appended).
  bool runBatch(std::vector<Entry> &step, std::vector<Ran> &ran,
                std::string &error);
  void preempt(const std::shared_ptr<Request> &r);
  void finish(Request &r, nf_finish_reason reason, const std::string &error);
  void accept(Request &r, int32_t token, const sampling::LogprobList &logprobs);
  int64_t pagesFor(int64_t tokens) const;
  /// Publishes waiting_'s and running_'s sizes (the queue's bound counts
  /// the first; drained() both).
  void syncWaiting();
  /// Ends every request held with `why` (an exception in a step).
  void failAll(const std::string &why);
  void notify(const nf_engine_event &event) const;
  /// Copies the scheduler thread's counts into stats_.
  void updateStats();
  /// Copies the model's expert counters into utilization_.
  void refreshUtilization();
  /// Frees the least recently used prefix-cache snapshot except the one in
  /// sequence `keep`; false when there is none.
  bool evictSnapshot(int32_t keep = -1);
  /// A sequence for `r` at admission: a fork of the longest snapshot its
  /// context starts with (r->fed is then its length), else a new one,
  /// evicting snapshots for a slot; -1 when none is free.
  int32_t openSequence(Request &r, const PrefixCache::Hit &hit);
  /// The points of r's prompt after r->fed kept as snapshots.
  void planSnapshots(Request &r) const;
  /// This step's chunk of r's prompt (`count` tokens, within `budget`)
  /// shortened to end at a snapshot point, or r's block point dropped
  /// where ending there would cost a step (fitSnapshots in scheduler_plan.cpp).
  void fitSnapshots(Request &r, int64_t &count, int64_t budget) const;
  /// Whether a request waiting to be admitted starts with r's first p
  /// prompt tokens (same salt).
  bool awaitedByWaiting(const Request &r, size_t p) const;

  nf_model *model_;
  const SchedulerOptions options_;
  const int32_t pageSize_; // 0: no attention

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> inbox_; // guarded by mu_
  bool stopping_ = false, draining_ = false;   // guarded by mu_
  bool resetCache_ = false;                    // guarded by mu_
  Clock::time_point deadline_;                 // guarded by mu_
  nf_engine_stats stats_{};                    // guarded by mu_
  uint64_t arrivals_ = 0;                      // guarded by mu_
  std::vector<int64_t> utilization_;           // guarded by mu_

  // Scheduler thread only: running requests (kept in order of priority,
  // then admission), and waiting ones (preempted ones included).
  std::vector<std::shared_ptr<Request>> running_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::vector<int64_t> stepExpertCalls_;
  std::vector<int64_t> stepExpertCallsPerLayer_; // [entry][MoE layer]
  const size_t moeLayers_;
  std::unique_ptr<PrefixCache> cache_;       // null without prefix caching
  int64_t cacheQueries_ = 0, cacheHits_ = 0; // tokens looked up, reused
  // The snapshots' bytes as last counted (PrefixCache::bytes walks their
  // page tables): when snapshots come or go, when the last running request
  // ends, else every 250 ms; for how many snapshots and requests, when.
  int64_t cacheBytes_ = 0;
  size_t cacheBytesEntries_ = 0, cacheBytesRunning_ = 0;
  Clock::time_point cacheBytesAt_;

  std::thread worker_; // last: starts after the members it uses
};

} // namespace nf::serving
