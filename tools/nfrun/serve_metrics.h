// nfrun serve's GET /metrics: Prometheus text format (prometheus-cpp), with
// vLLM's metric names where one exists (dashboards made for vLLM work) and
// nf's own under "nf:". Thread-safe: the scheduler and the HTTP threads
// record, a scrape reads.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace nfrun {

/// The model's MoE shape, for the expert metrics (zeros without MoE).
struct MoeShape {
  int32_t layers = 0, experts = 0, topK = 0;
};

class ServeMetrics {
public:
  ServeMetrics(const std::string &modelName, const MoeShape &moe);

  /// A request's first token, `seconds` after it arrived.
  void firstToken(double seconds);
  /// A later token, `seconds` after the one before.
  void nextToken(double seconds);
  /// A request's end: "stop", "length", "abort" (cancelled or failed),
  /// with its traffic class ("none" where not given), the routed-expert
  /// calls of its tokens and its expert budget (<= 0: the plan's).
  void finished(const std::string &reason, const std::string &intent,
                const std::string &priority, double seconds,
                int64_t promptTokens, int64_t generatedTokens,
                int64_t expertCalls, float expertBudget);
  void preempted();
  /// A step of `tokens` tokens and `expertCalls` routed-expert calls.
  void step(int64_t tokens, int64_t expertCalls);
  /// Tokens routed to each [layer][expert] since the start (the engine's
  /// counters, flat).
  void setExpertUtilization(const std::vector<int64_t> &counts);
  /// An HTTP answer with an error status (>= 400).
  void httpError(int status);
  void setLoad(int running, int waiting, double kvCacheUsage);
  /// The engine's prefix-cache counters since the start (context tokens
  /// looked up and taken from snapshots, snapshots given up), the
  /// snapshots held and the memory they hold alone.
  void setPrefixCache(int64_t queries, int64_t hits, int64_t evictions,
                      int snapshots, int64_t bytes);

  /// The exposition (text/plain; version=0.0.4).
  std::string text() const;

private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Labels model_;
  prometheus::Gauge &running_, &waiting_, &kvUsage_, &snapshots_,
      &snapshotBytes_;
  prometheus::Counter &cacheQueries_, &cacheHits_, &evictions_;
  prometheus::Counter &promptTokens_, &generationTokens_, &preemptions_,
      &steps_;
  prometheus::Family<prometheus::Counter> &success_, &refused_, &traffic_;
  prometheus::Histogram &ttft_, &itl_, &e2e_;
  // Expert metrics.
  MoeShape moe_;
  prometheus::Counter &expertCalls_, &topKCalls_, &violations_;
  prometheus::Histogram &budgetSpent_;
  std::vector<prometheus::Counter *> layerCalls_, expertTokens_;
  std::mutex expertMu_;
  std::vector<int64_t> lastCounts_; // guarded by expertMu_
};

} // namespace nfrun
