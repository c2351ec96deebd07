// nfrun serve's scheduler: one thread that owns the model and runs every
// admitted request in shared steps (continuous batching).
//
// Each step holds the running requests' next tokens first (one each), then
// prompt chunks up to a token budget (chunked prefill), so a long prompt
// never stalls the streams already running. A request is admitted when a
// sequence slot is free and the KV cache can hold its whole context; when
// a step would need more KV pages than are free, the latest admitted
// requests are preempted (their sequences freed, their context recomputed
// when they are admitted again) instead of failing anyone. A step that
// fails is retried one request at a time, so only the requests that cannot
// run fail. Cancelled requests (clients gone) free their sequence before
// the next step. Shutdown stops admitting, lets running requests finish
// until a deadline and ends the rest.
#pragma once

#include "serve_metrics.h"

#include "nf/nf.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace nfrun {

/// One completion request, shared by its HTTP thread and the scheduler.
struct Request {
  // Set by the HTTP thread before submitting.
  std::vector<int32_t> prompt;
  int32_t maxTokens = 16;
  /// Created with the request (bad parameters are the client's error).
  std::optional<nf::Sampler> sampler;
  std::vector<std::string> stops;
  bool stream = false;
  bool returnTokenIds = false; // the response lists the token ids
  bool chat = false;           // /v1/chat/completions
  bool roleSent = false;       // a chat stream's first chunk (HTTP thread only)

  // Scheduler side.
  std::chrono::steady_clock::time_point arrival, lastToken;
  int32_t seq = -1; // the model's sequence, -1 while waiting
  size_t fed = 0;   // tokens of prompt + generated in the sequence
  std::vector<int32_t> generated;
  int failures = 0;    // steps that failed after changing its sequence
  std::string decoded; // text of `generated` (raw bytes)

  // Guarded by mu: text ready for the client, and the end of the request.
  std::mutex mu;
  std::condition_variable cv;
  std::string text;            // everything the client may see so far
  size_t sent = 0;             // bytes of `text` already streamed
  std::vector<int32_t> tokens; // generated tokens (for return_token_ids)
  size_t tokensSent = 0;       // of `tokens`, already streamed
  bool done = false;
  std::string finishReason; // "stop", "length" or "cancelled"
  std::string error;        // non-empty: the request failed
  bool unavailable = false; // error: the server is shutting down (503)

  /// The client went away: the scheduler drops the request.
  std::atomic<bool> cancelled{false};

  /// Tokens the sequence must hold before the next token is drawn: the
  /// prompt and every generated token (the last one is fed by the next
  /// step).
  size_t contextLength() const { return prompt.size() + generated.size(); }
  int32_t contextToken(size_t i) const {
    return i < prompt.size() ? prompt[i] : generated[i - prompt.size()];
  }
};

struct SchedulerOptions {
  int maxBatch = 1;          // sequences alive at once
  int maxQueue = 256;        // requests waiting to be admitted
  int64_t stepTokens = 2048; // tokens of one step (decodes + prompt chunks)
  ServeMetrics *metrics = nullptr; // recorded into when given
};

/// Counters for GET /health (and tests).
struct SchedulerStats {
  int queued = 0, running = 0, peakBatch = 0;
  int liveSequences = 0; // sequences the model holds
  int64_t kvPages = 0;   // 0: no attention
  int64_t kvFreePages = 0;
  int64_t preemptions = 0; // since start
  int64_t steps = 0;
  bool draining = false; // shutting down
};

class Scheduler {
public:
  Scheduler(nf::Model &model, const SchedulerOptions &options);
  /// Ends every request still there ("the server is shutting down").
  ~Scheduler();

  enum class Submit { Queued, QueueFull, ShuttingDown };
  Submit submit(std::shared_ptr<Request> r);

  /// Stops admitting: waiting requests end at once (unavailable); running
  /// ones may finish until `deadline`, then end with an error.
  void shutdown(std::chrono::steady_clock::time_point deadline);
  /// Whether every request has ended after shutdown().
  bool drained();

  SchedulerStats stats();

private:
  void loop();
  /// Admits, preempts and cuts the next step; false when nothing can run.
  struct Entry {
    std::shared_ptr<Request> r;
    size_t count = 0; // tokens of its context fed in this step
  };
  std::vector<Entry> plan();
  void runStep(std::vector<Entry> &step);
  bool runBatch(std::vector<Entry> &step, std::vector<int32_t> &tokens,
                std::string &error);
  void preempt(const std::shared_ptr<Request> &r);
  void finish(Request &r, const std::string &reason, const std::string &error,
              bool unavailable = false);
  nf::StatusOr<std::string> newBytes(const Request &r);
  bool accept(Request &r, int32_t token);
  int64_t pagesFor(int64_t tokens) const;
  /// Copies the scheduler thread's counts into stats_.
  void updateStats(int stepSize);

  nf::Model &model_;
  const SchedulerOptions options_;
  const int32_t pageSize_; // 0: no attention

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> pending_; // guarded by mu_
  bool stopping_ = false, draining_ = false;     // guarded by mu_
  std::chrono::steady_clock::time_point deadline_;
  SchedulerStats stats_; // guarded by mu_

  // Scheduler thread only: running requests, oldest admitted first.
  std::vector<std::shared_ptr<Request>> running_;
  // Preempted requests, admitted again before the queue (scheduler thread).
  std::deque<std::shared_ptr<Request>> resumed_;

  std::thread worker_; // last: starts after the members it uses
};

/// Index of the first stop string in `text` that ends after `from`, or
/// npos (text before `from` was searched at earlier tokens).
size_t findStop(const std::string &text, const std::vector<std::string> &stops,
                size_t from);
/// Longest suffix of `text` that is a proper prefix of a stop string.
size_t heldBack(const std::string &text, const std::vector<std::string> &stops);
/// Bytes at the end of `text` that begin an incomplete UTF-8 character.
size_t incompleteUtf8(const std::string &text);

} // namespace nfrun
