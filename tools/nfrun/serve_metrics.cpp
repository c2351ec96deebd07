// nfrun serve's metrics (see serve_metrics.h).
#include "serve_metrics.h"

#include <prometheus/text_serializer.h>

#include <sstream>

namespace nfrun {
namespace {

using prometheus::Histogram;

// vLLM's buckets for these histograms.
const Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItlBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries kE2eBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

} // namespace

ServeMetrics::ServeMetrics(const std::string &modelName)
    : registry_(std::make_shared<prometheus::Registry>()), model_{{"model_name",
                                                                   modelName}},
      running_(prometheus::BuildGauge()
                   .Name("vllm:num_requests_running")
                   .Help("Requests admitted (holding a sequence).")
                   .Register(*registry_)
                   .Add(model_)),
      waiting_(prometheus::BuildGauge()
                   .Name("vllm:num_requests_waiting")
                   .Help("Requests waiting to be admitted.")
                   .Register(*registry_)
                   .Add(model_)),
      kvUsage_(prometheus::BuildGauge()
                   .Name("vllm:kv_cache_usage_perc")
                   .Help("Fraction of KV-cache pages in use (0 to 1).")
                   .Register(*registry_)
                   .Add(model_)),
      promptTokens_(prometheus::BuildCounter()
                        .Name("vllm:prompt_tokens_total")
                        .Help("Prompt tokens of the requests ended.")
                        .Register(*registry_)
                        .Add(model_)),
      generationTokens_(prometheus::BuildCounter()
                            .Name("vllm:generation_tokens_total")
                            .Help("Tokens generated.")
                            .Register(*registry_)
                            .Add(model_)),
      preemptions_(prometheus::BuildCounter()
                       .Name("vllm:num_preemptions_total")
                       .Help("Requests preempted for KV-cache pages.")
                       .Register(*registry_)
                       .Add(model_)),
      steps_(prometheus::BuildCounter()
                 .Name("nf:steps_total")
                 .Help("Model steps run.")
                 .Register(*registry_)
                 .Add(model_)),
      success_(prometheus::BuildCounter()
                   .Name("vllm:request_success_total")
                   .Help("Requests ended, by finish reason.")
                   .Register(*registry_)),
      refused_(prometheus::BuildCounter()
                   .Name("nf:http_errors_total")
                   .Help("HTTP answers with an error status, by status "
                         "(400, 401, 413, 429, 500, 503, ...).")
                   .Register(*registry_)),
      ttft_(prometheus::BuildHistogram()
                .Name("vllm:time_to_first_token_seconds")
                .Help("Time from a request's arrival to its first token.")
                .Register(*registry_)
                .Add(model_, kTtftBuckets)),
      itl_(prometheus::BuildHistogram()
               .Name("vllm:inter_token_latency_seconds")
               .Help("Time between a request's consecutive tokens.")
               .Register(*registry_)
               .Add(model_, kItlBuckets)),
      e2e_(prometheus::BuildHistogram()
               .Name("vllm:e2e_request_latency_seconds")
               .Help("Time from a request's arrival to its end.")
               .Register(*registry_)
               .Add(model_, kE2eBuckets)) {}

void ServeMetrics::firstToken(double seconds) { ttft_.Observe(seconds); }
void ServeMetrics::nextToken(double seconds) { itl_.Observe(seconds); }

void ServeMetrics::finished(const std::string &reason, double seconds,
                            int64_t promptTokens, int64_t generatedTokens) {
  prometheus::Labels labels = model_;
  labels["finished_reason"] = reason;
  success_.Add(labels).Increment();
  e2e_.Observe(seconds);
  promptTokens_.Increment(static_cast<double>(promptTokens));
  generationTokens_.Increment(static_cast<double>(generatedTokens));
}

void ServeMetrics::preempted() { preemptions_.Increment(); }

void ServeMetrics::step() { steps_.Increment(); }

void ServeMetrics::httpError(int status) {
  prometheus::Labels labels = model_;
  labels["status"] = std::to_string(status);
  refused_.Add(labels).Increment();
}

void ServeMetrics::setLoad(int running, int waiting, double kvCacheUsage) {
  running_.Set(running);
  waiting_.Set(waiting);
  kvUsage_.Set(kvCacheUsage);
}

std::string ServeMetrics::text() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

} // namespace nfrun
