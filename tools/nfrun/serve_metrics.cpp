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

const Histogram::BucketBoundaries kBudgetBuckets = {
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.2};

} // namespace

ServeMetrics::ServeMetrics(const std::string &modelName, const MoeShape &moe)
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
      snapshots_(prometheus::BuildGauge()
                     .Name("nf:prefix_cache_snapshots")
                     .Help("Prefix-cache snapshots held (each a sequence).")
                     .Register(*registry_)
                     .Add(model_)),
      snapshotBytes_(prometheus::BuildGauge()
                         .Name("nf:prefix_cache_snapshot_bytes")
                         .Help("Memory the prefix-cache snapshots hold alone: "
                               "their recurrent state and the KV pages no "
                               "running request shares.")
                         .Register(*registry_)
                         .Add(model_)),
      cacheQueries_(prometheus::BuildCounter()
                        .Name("vllm:prefix_cache_queries_total")
                        .Help("Context tokens of admitted requests looked up "
                              "in the prefix cache.")
                        .Register(*registry_)
                        .Add(model_)),
      cacheHits_(prometheus::BuildCounter()
                     .Name("vllm:prefix_cache_hits_total")
                     .Help("Context tokens taken from the prefix cache.")
                     .Register(*registry_)
                     .Add(model_)),
      evictions_(prometheus::BuildCounter()
                     .Name("nf:prefix_cache_evictions_total")
                     .Help("Prefix-cache snapshots given up for room.")
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
      traffic_(prometheus::BuildCounter()
                   .Name("nf:requests_total")
                   .Help("Requests ended, by intent (X-Client-Intent), "
                         "priority (X-Request-Priority; none without an "
                         "intent) and finish reason.")
                   .Register(*registry_)),
      e2e_(prometheus::BuildHistogram()
               .Name("vllm:e2e_request_latency_seconds")
               .Help("Time from a request's arrival to its end.")
               .Register(*registry_)
               .Add(model_, kE2eBuckets)),
      moe_(moe),
      expertCalls_(prometheus::BuildCounter()
                       .Name("nf:routed_expert_calls_total")
                       .Help("Routed-expert calls (token x expert) of the "
                             "steps run, summed over MoE layers.")
                       .Register(*registry_)
                       .Add(model_)),
      topKCalls_(prometheus::BuildCounter()
                     .Name("nf:routed_expert_calls_topk_total")
                     .Help("Routed-expert calls static top-k would have made "
                           "for the same tokens: the budget spent is "
                           "nf:routed_expert_calls_total over this.")
                     .Register(*registry_)
                     .Add(model_)),
      violations_(prometheus::BuildCounter()
                      .Name("nf:expert_budget_violations_total")
                      .Help("Requests that spent more than their expert "
                            "budget (by more than 0.01).")
                      .Register(*registry_)
                      .Add(model_)),
      budgetSpent_(prometheus::BuildHistogram()
                       .Name("nf:request_expert_budget_spent")
                       .Help("A request's routed-expert calls over static "
                             "top-k's for its tokens.")
                       .Register(*registry_)
                       .Add(model_, kBudgetBuckets)) {
  if (moe_.layers <= 0 || moe_.experts <= 0)
    return;
  auto &layerFamily = prometheus::BuildCounter()
                          .Name("nf:expert_layer_calls_total")
                          .Help("Routed-expert calls of each MoE layer.")
                          .Register(*registry_);
  auto &expertFamily = prometheus::BuildCounter()
                           .Name("nf:expert_tokens_total")
                           .Help("Tokens routed to each expert of each MoE "
                                 "layer (utilisation).")
                           .Register(*registry_);
  for (int32_t l = 0; l < moe_.layers; ++l) {
    prometheus::Labels labels = model_;
    labels["layer"] = std::to_string(l);
    layerCalls_.push_back(&layerFamily.Add(labels));
    for (int32_t e = 0; e < moe_.experts; ++e) {
      labels["expert"] = std::to_string(e);
      expertTokens_.push_back(&expertFamily.Add(labels));
    }
  }
  lastCounts_.assign(expertTokens_.size(), 0);
}

void ServeMetrics::firstToken(double seconds) { ttft_.Observe(seconds); }
void ServeMetrics::nextToken(double seconds) { itl_.Observe(seconds); }

void ServeMetrics::finished(const std::string &reason,
                            const std::string &intent,
                            const std::string &priority, double seconds,
                            int64_t promptTokens, int64_t generatedTokens,
                            int64_t expertCalls, float expertBudget) {
  prometheus::Labels labels = model_;
  labels["finished_reason"] = reason;
  success_.Add(labels).Increment();
  labels["intent"] = intent;
  labels["priority"] = priority;
  traffic_.Add(labels).Increment();
  e2e_.Observe(seconds);
  promptTokens_.Increment(static_cast<double>(promptTokens));
  generationTokens_.Increment(static_cast<double>(generatedTokens));
  // The budget spent: only where the backend counts expert calls.
  const double topK = static_cast<double>(moe_.topK) * moe_.layers *
                      static_cast<double>(promptTokens + generatedTokens);
  if (expertCalls > 0 && topK > 0) {
    const double spent = static_cast<double>(expertCalls) / topK;
    budgetSpent_.Observe(spent);
    if (expertBudget > 0 && spent > expertBudget + 0.01)
      violations_.Increment();
  }
}

void ServeMetrics::preempted() { preemptions_.Increment(); }

void ServeMetrics::step(int64_t tokens, int64_t expertCalls) {
  steps_.Increment();
  if (expertCalls > 0) {
    expertCalls_.Increment(static_cast<double>(expertCalls));
    topKCalls_.Increment(static_cast<double>(moe_.topK) * moe_.layers *
                         static_cast<double>(tokens));
  }
}

void ServeMetrics::setExpertUtilization(const std::vector<int64_t> &counts) {
  std::lock_guard<std::mutex> lock(expertMu_);
  if (counts.size() != lastCounts_.size())
    return;
  const size_t experts = static_cast<size_t>(moe_.experts);
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > lastCounts_[i]) {
      const double delta = static_cast<double>(counts[i] - lastCounts_[i]);
      expertTokens_[i]->Increment(delta);
      layerCalls_[i / experts]->Increment(delta);
      lastCounts_[i] = counts[i];
    }
}

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

void ServeMetrics::setPrefixCache(int64_t queries, int64_t hits,
                                  int64_t evictions, int snapshots,
                                  int64_t bytes) {
  // Counters only go up: add what is new since the last scrape.
  std::lock_guard<std::mutex> lock(expertMu_);
  cacheQueries_.Increment(
      std::max(0.0, static_cast<double>(queries) - cacheQueries_.Value()));
  cacheHits_.Increment(
      std::max(0.0, static_cast<double>(hits) - cacheHits_.Value()));
  evictions_.Increment(
      std::max(0.0, static_cast<double>(evictions) - evictions_.Value()));
  snapshots_.Set(snapshots);
  snapshotBytes_.Set(static_cast<double>(bytes));
}

std::string ServeMetrics::text() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

} // namespace nfrun
