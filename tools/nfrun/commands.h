// nfrun's subcommands. Each returns the process exit status: 0, or 1 after
// printing one line "nfrun: error: <file>: <problem>" (see fail()).
#pragma once

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
};

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
};

int runGenerate(const GenerateFlags &flags);
int runInspect(const std::string &plan);
int runEvalPpl(const EvalPplFlags &flags);

} // namespace nfrun
