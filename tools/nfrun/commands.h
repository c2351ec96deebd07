// nfrun's subcommands. Each returns the process exit status: 0, or 1 after
// printing one line "nfrun: error: <file>: <problem>" (see fail()).
#pragma once

#include "nf/nf.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace nfrun {

/// Prints "nfrun: error: <message>" on stderr and returns 1.
int fail(const std::string &message);

struct CommonFlags {
  std::string plan;
  std::string weightsDir;
  int threads = 0;
  std::string backend = "auto";        // "auto", "cpu" or "cuda"
  std::string budgetScope = "request"; // "request" or "step"
  double distinctExpertCap = 0.0;      // 0: none
};

/// The model parameters the common flags give (weights, threads, backend).
nf::ModelParams modelParams(const CommonFlags &common);

struct GenerateFlags {
  CommonFlags common;
  std::string prompt;
  std::string promptTokens; // "3,17,42"
  bool havePrompt = false;
  int maxTokens = 64;
  float temperature = 0.0f;
  int topK = 0;
  float topP = 1.0f;
  float minP = 0.0f;
  uint64_t seed = 0;
  std::vector<int32_t> stopTokens;
  std::vector<std::string> stopStrings;
  bool ignoreEos = false;
  float expertBudget = 0.0f; // <= 0: the plan's default
  std::string dumpLogits;
};

struct EvalPplFlags {
  CommonFlags common;
  std::string text;
  int topK = 0;              // > 0: static top-k override
  float expertBudget = 0.0f; // > 0: expert budget
  int windows = 0;           // 0: the protocol's 128
  int batch = 4;             // windows per step
  bool decode = false;       // one token a step (the decode protocol)
};

struct BenchFlags {
  CommonFlags common;
  bool syntheticWeights = false; // --random-weights
  uint64_t seed = 0;
  std::string batches = "1,8,32,64"; // decode batch sizes
  std::string prefill = "1024,8192"; // prompt lengths
  int64_t context = 1024;            // decode context per sequence
  int64_t steps = 32;                // timed decode steps
  double copyBandwidth = 0.0;        // bytes/s, device-to-device (roofline)
  double matmulRate = 0.0;           // FLOP/s, bf16 matmul (roofline)
  std::string expertBudgets; // decode: budgets timed in turn; "": the plan's
  // CUDA: KV pages fill this share of the GPU's memory (printed); 0: as
  // many as the measurements need.
  double gpuMemoryUtilization = 0.0;
  // --sample: timed decode steps also draw each sequence's next token
  // (nf_decode_sample) with these sampler parameters and feed it back.
  bool sample = false;
  float temperature = 0.0f;
  int32_t topK = 0;
  float topP = 1.0f;
};

struct ServeFlags {
  CommonFlags common;
  std::string host = "127.0.0.1";
  int port = 8080;
  int maxBatch = 0;      // sequences decoded together; 0: the plan's slots
  std::string modelName; // the id reported by /v1/models; default: the plan's
  std::string chatTemplate; // Jinja chat template file; default: the model's
  /// Template variables of every chat request (a JSON object), under the
  /// request's own chat_template_kwargs.
  std::string defaultChatTemplateKwargs;
  /// "" (none) or "nemotron_v3" (reasoning_parser.h).
  std::string reasoningParser;
  int kvPages = 0; // KV pages per attention layer; 0: the plan's
  // CUDA: the KV pages fill this share of the GPU (vLLM's default); 0 or
  // --kv-pages: a page count.
  double gpuMemoryUtilization = 0.9;
  bool syntheticWeights = false; // --random-weights (soak tests of shapes)
  uint64_t seed = 0;
  int maxQueue = 256; // requests waiting to be admitted (429 beyond)
  int64_t maxBatchedTokens = 2048; // tokens a step: decodes + prompt chunks
  int64_t maxBodyBytes = 8 << 20;  // largest request body (413 beyond)
  double readTimeout = 30;   // seconds to send one request's headers and body
  double shutdownGrace = 10; // seconds running requests get after SIGTERM
  std::string apiKey;   // non-empty: /v1/* need "Authorization: Bearer <key>"
  int maxNewTokens = 0; // hard limit of a request's tokens; 0: the context
  double maxWaitMs = 0; // waiting longer promotes a request; 0: never
  bool prefixCaching = true;
  int prefixCacheBlock = 256; // tokens between prompt snapshot points
  std::string intentBudget = "interactive=1,batch=0.75,search=0.5";
};

int runGenerate(const GenerateFlags &flags);
int runServe(const ServeFlags &flags);
int runBench(const BenchFlags &flags);
int runInspect(const std::string &plan, bool launches = false);
int runEvalPpl(const EvalPplFlags &flags);

} // namespace nfrun
