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

#include <memory>
#include <string>

namespace nfrun {

class ServeMetrics {
public:
  explicit ServeMetrics(const std::string &modelName);

  /// A request's first token, `seconds` after it arrived.
  void firstToken(double seconds);
  /// A later token, `seconds` after the one before.
  void nextToken(double seconds);
  /// A request's end: "stop", "length", "abort" (cancelled or failed).
  void finished(const std::string &reason, double seconds, int64_t promptTokens,
                int64_t generatedTokens);
  void preempted();
  void step();
  /// An HTTP answer with an error status (>= 400).
  void httpError(int status);
  void setLoad(int running, int waiting, double kvCacheUsage);

  /// The exposition (text/plain; version=0.0.4).
  std::string text() const;

private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Labels model_;
  prometheus::Gauge &running_, &waiting_, &kvUsage_;
  prometheus::Counter &promptTokens_, &generationTokens_, &preemptions_,
      &steps_;
  prometheus::Family<prometheus::Counter> &success_, &refused_;
  prometheus::Histogram &ttft_, &itl_, &e2e_;
};

} // namespace nfrun
