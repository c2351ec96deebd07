//===- nfrun.cpp - run nf execution plans ---------------------------------===//
//
//   nfrun generate PLAN (--prompt TEXT | --prompt-tokens 3,17,42) [...]
//   nfrun inspect PLAN
//   nfrun eval-ppl PLAN --text FILE [--top-k K | --expert-budget B] [...]
//   nfrun serve PLAN [--host H] [--port P] [--max-batch N] [...]
//
// generate, eval-ppl, bench and serve take --backend auto|cpu|cuda (default
// auto: the GPU for plans compiled with nfc compile --target=cuda when CUDA is
// usable).
//
// Every failure prints one line "nfrun: error: <file>: <problem>" and exits 1.
// nfrun uses libnf through its public C++ API (nf/nf.hpp); `inspect` reads
// the plan file itself. It never links MLIR.
//
//===----------------------------------------------------------------------===//

#include "commands.h"
#include "common/cli_checks.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#ifndef NF_VERSION
#define NF_VERSION "unknown"
#endif

namespace nfrun {

int fail(const std::string &message) {
  std::cerr << "nfrun: error: " << message << "\n";
  return 1;
}

nf::ModelParams modelParams(const CommonFlags &common) {
  nf::ModelParams mp;
  mp.weightsDir = common.weightsDir;
  mp.threads = common.threads;
  mp.backend = common.backend;
  mp.budgetScope = common.budgetScope;
  mp.distinctExpertCap = common.distinctExpertCap;
  return mp;
}

} // namespace nfrun

namespace {

const std::string kVersion = std::string("nfrun ") + NF_VERSION;

void addCommon(CLI::App *cmd, nfrun::CommonFlags &c) {
  cmd->add_option("PLAN", c.plan, "Execution plan written by nfc compile")
      ->required();
  cmd->add_option("--weights", c.weightsDir,
                  "Directory of the safetensors weights (default: the "
                  "checkpoint recorded in the plan)");
  cmd->add_option("--threads", c.threads, "CPU threads (0: OpenMP default)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1024")); // libnf's limit too
  cmd->add_option("--backend", c.backend,
                  "auto: CUDA when the plan has binaries for this GPU and the "
                  "driver loads, else CPU; cpu; cuda (an error without CUDA)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--budget-scope", c.budgetScope,
                  "Budget plans: request (each sequence spends its own "
                  "budget; results independent of batch-mates) or step (a "
                  "step's budgets pooled across its tokens)")
      ->capture_default_str()
      ->check(CLI::IsMember({"request", "step"}));
  cmd->add_option("--distinct-expert-cap", c.distinctExpertCap,
                  "Most distinct routed experts a MoE layer runs in a step: "
                  "a number, or a fraction in (0, 1) of those its tokens' "
                  "candidates name; 0: none")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->set_version_flag("--version", kVersion);
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"nfrun: run nf execution plans (Nemotron-H models)"};
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);

  // generate
  nfrun::GenerateFlags gen;
  auto *generate = app.add_subcommand(
      "generate", "Generate a continuation of a prompt (greedy by default)");
  addCommon(generate, gen.common);
  auto *promptOpt = generate->add_option(
      "--prompt", gen.prompt, "Prompt text (needs the model's tokenizer)");
  auto *promptTokensOpt =
      generate->add_option("--prompt-tokens", gen.promptTokens,
                           "Prompt token ids, comma separated: 3,17,42");
  promptOpt->excludes(promptTokensOpt);
  promptTokensOpt->excludes(promptOpt);
  generate->add_option("--max-tokens", gen.maxTokens, "Most tokens to generate")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  generate
      ->add_option("--temperature", gen.temperature,
                   "Sampling temperature; 0: greedy")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  generate
      ->add_option("--top-k", gen.topK,
                   "Sample among the K most likely tokens; 0: off")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  generate
      ->add_option("--top-p", gen.topP,
                   "Nucleus sampling: smallest set with probability >= P; "
                   "1: off")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1"));
  generate
      ->add_option("--min-p", gen.minP,
                   "Drop tokens below M x the largest probability; 0: off")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1"));
  generate->add_option("--seed", gen.seed, "Random seed")
      ->capture_default_str();
  generate
      ->add_option("--stop-token", gen.stopTokens,
                   "Stop after this token id (repeatable, or comma separated; "
                   "the model's EOS always stops unless --ignore-eos)")
      ->delimiter(',')
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(nf::cli::NonNegative);
  generate
      ->add_option("--stop", gen.stopStrings,
                   "End the text before this string (repeatable; needs the "
                   "tokenizer)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check([](const std::string &s) {
        return s.empty() ? std::string("a stop string must not be empty")
                         : std::string();
      });
  generate->add_flag("--ignore-eos", gen.ignoreEos,
                     "Do not stop at the model's EOS token");
  generate
      ->add_option("--expert-budget", gen.expertBudget,
                   "Fraction of the static top-k expert FLOPs (plans compiled "
                   "with --expert-policy=budget; default: the plan's)")
      ->check(nf::cli::Positive);
  generate->add_option(
      "--dump-logits", gen.dumpLogits,
      "Write prefill_logits [T,V], step_logits [S,V] and tokens [S] to this "
      "safetensors file");

  // inspect
  std::string inspectPlan;
  auto *inspect =
      app.add_subcommand("inspect", "Print a readable summary of a plan");
  inspect
      ->add_option("PLAN", inspectPlan, "Execution plan written by nfc compile")
      ->required();
  bool inspectLaunches = false;
  inspect->add_flag("--launches", inspectLaunches,
                    "Also list every CUDA launch of each step in order: "
                    "kernel, function, grid x block, dynamic shared bytes "
                    "and the step sizes it runs for");
  inspect->set_version_flag("--version", kVersion);

  // eval-ppl
  nfrun::EvalPplFlags ev;
  auto *evalPpl = app.add_subcommand(
      "eval-ppl",
      "Perplexity of a text: 512-token windows from an empty state (first "
      "65,537 tokens, 128 windows of 513 tokens, no BOS)");
  addCommon(evalPpl, ev.common);
  evalPpl->add_option("--text", ev.text, "UTF-8 text file")->required();
  auto *topKOpt =
      evalPpl
          ->add_option("--top-k", ev.topK,
                       "Run exactly K routed experts per token (static top-k)")
          ->check(nf::cli::Positive);
  auto *budgetOpt = evalPpl
                        ->add_option("--expert-budget", ev.expertBudget,
                                     "Fraction of the static top-k expert "
                                     "FLOPs (budget plans)")
                        ->check(nf::cli::Positive);
  topKOpt->excludes(budgetOpt);
  budgetOpt->excludes(topKOpt);
  evalPpl
      ->add_option("--windows", ev.windows,
                   "Evaluate only the first N windows (quick checks)")
      ->check(nf::cli::Positive);
  evalPpl->add_option("--batch", ev.batch, "Windows run together in one step")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  evalPpl->add_flag("--decode", ev.decode,
                    "The decode protocol: feed each window one token a step "
                    "(teacher-forced, as serving decodes), --batch windows "
                    "a step");

  // bench
  nfrun::BenchFlags bench;
  auto *benchCmd = app.add_subcommand(
      "bench", "Decode and prefill throughput next to the roofline (see "
               "docs/performance.md)");
  addCommon(benchCmd, bench.common);
  benchCmd->add_flag("--random-weights", bench.syntheticWeights,
                     "Seeded random weights of the plan's shapes instead of "
                     "the checkpoint");
  benchCmd->add_option("--seed", bench.seed, "Seed of weights and tokens")
      ->capture_default_str();
  benchCmd->add_option("--batch", bench.batches, "Decode batch sizes")
      ->capture_default_str();
  benchCmd->add_option("--prefill", bench.prefill, "Prompt lengths (prefill)")
      ->capture_default_str();
  benchCmd
      ->add_option("--context", bench.context, "Decode context per sequence")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  benchCmd->add_option("--steps", bench.steps, "Timed decode steps")
      ->capture_default_str()
      ->check(nf::cli::Positive);
  benchCmd->add_option("--copy-bandwidth", bench.copyBandwidth,
                       "Device-to-device copy bandwidth measured in the same "
                       "run, bytes/s (decode roofline)");
  benchCmd->add_option("--matmul-rate", bench.matmulRate,
                       "bf16 matmul rate measured in the same run, FLOP/s "
                       "(prefill roofline)");
  benchCmd
      ->add_option("--gpu-memory-utilization", bench.gpuMemoryUtilization,
                   "CUDA: give the KV cache what this share of the GPU's "
                   "memory leaves and print its pages (0: the pages the "
                   "measurements need)")
      ->check(nf::cli::Between("0", "1"));
  benchCmd->add_option("--expert-budget", bench.expertBudgets,
                       "Decode: expert budgets to time in turn, e.g. "
                       "1,0.75,0.5 (budget plans; default: the plan's)");
  benchCmd->add_flag("--sample", bench.sample,
                     "Decode steps also sample each sequence's next token "
                     "(as generate and serve do) and feed it back");
  benchCmd
      ->add_option("--temperature", bench.temperature,
                   "With --sample: sampling temperature (0: greedy)")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  benchCmd->add_option("--top-k", bench.topK, "With --sample: top-k (0: off)")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  benchCmd->add_option("--top-p", bench.topP, "With --sample: top-p (1: off)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1"));

  // serve
  nfrun::ServeFlags serve;
  auto *serveCmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: /v1/completions and "
               "/v1/chat/completions (streaming too), /v1/models, /health");
  addCommon(serveCmd, serve.common);
  serveCmd->add_option("--host", serve.host, "Address to listen on")
      ->capture_default_str();
  serveCmd->add_option("--port", serve.port, "TCP port")
      ->capture_default_str()
      ->check(nf::cli::Between("1", "65535"));
  serveCmd
      ->add_option("--max-batch", serve.maxBatch,
                   "Requests decoded together (0: every sequence slot of "
                   "the plan)")
      ->capture_default_str()
      ->check(nf::cli::NonNegative);
  serveCmd->add_option("--model-name", serve.modelName,
                       "Model id reported to clients (default: the plan's "
                       "model name)");
  serveCmd->add_option("--chat-template", serve.chatTemplate,
                       "Jinja chat template for /v1/chat/completions "
                       "(default: the tokenizer's chat_template.jinja or "
                       "tokenizer_config.json)");
  serveCmd->add_option(
      "--default-chat-template-kwargs", serve.defaultChatTemplateKwargs,
      "Chat template variables of every chat request, as a JSON object "
      "(e.g. '{\"enable_thinking\": false}'); a request's "
      "chat_template_kwargs override them");
  serveCmd
      ->add_option("--reasoning-parser", serve.reasoningParser,
                   "Split chat outputs into reasoning_content and content: "
                   "nemotron_v3 (<think>...</think>, Nemotron 3)")
      ->check(CLI::IsMember({"nemotron_v3"}));
  serveCmd->add_flag("--random-weights", serve.syntheticWeights,
                     "Seeded random weights of the plan's shapes instead of "
                     "the checkpoint (load and soak tests of model shapes; "
                     "prompts as token ids when there is no tokenizer)");
  serveCmd->add_option("--seed", serve.seed, "Seed of --random-weights")
      ->capture_default_str();
  serveCmd
      ->add_option("--api-key", serve.apiKey,
                   "Require 'Authorization: Bearer KEY' on /v1/* (401 "
                   "otherwise; /health and /metrics stay open)")
      ->envname("NF_API_KEY");
  auto *kvPagesOpt =
      serveCmd
          ->add_option("--kv-pages", serve.kvPages,
                       "KV-cache pages per attention layer, shared by the "
                       "sequences (0: the plan's; nfrun inspect shows their "
                       "size)")
          ->capture_default_str()
          ->check(nf::cli::Between("0", "1000000000"));
  serveCmd
      ->add_option("--gpu-memory-utilization", serve.gpuMemoryUtilization,
                   "CUDA: the share of the GPU's memory to take; the KV "
                   "cache gets as many pages as fit beside the weights, the "
                   "arena and the sequences' state (vLLM's; 0: the plan's "
                   "pages; not with --kv-pages)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1"))
      ->excludes(kvPagesOpt);
  serveCmd
      ->add_option("--max-queue", serve.maxQueue,
                   "Requests that may wait for a sequence slot; more get "
                   "HTTP 429 (each waiting request holds an HTTP thread)")
      ->capture_default_str()
      ->check(nf::cli::Between("1", "4096"));
  serveCmd
      ->add_option("--max-num-batched-tokens", serve.maxBatchedTokens,
                   "Tokens of one step: running requests' next tokens, then "
                   "prompt chunks (a longer prompt is split across steps)")
      ->capture_default_str()
      ->check(nf::cli::Between("1", "1000000000"));
  serveCmd
      ->add_option("--max-body-bytes", serve.maxBodyBytes,
                   "Largest request body; larger ones get HTTP 413")
      ->capture_default_str()
      ->check(nf::cli::Between("1024", "1000000000000"));
  serveCmd
      ->add_option("--read-timeout", serve.readTimeout,
                   "Seconds a client has to send a request's headers and "
                   "body")
      ->capture_default_str()
      ->check(nf::cli::Between("0.1", "86400"));
  serveCmd
      ->add_option("--shutdown-grace", serve.shutdownGrace,
                   "Seconds running requests may finish after SIGTERM or "
                   "SIGINT before they are ended")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "86400"));
  serveCmd
      ->add_option("--max-new-tokens", serve.maxNewTokens,
                   "Most tokens one request may generate: a request asking "
                   "for more gets HTTP 400, one asking for no limit gets "
                   "this (0: no limit but the context)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "1000000000"));
  serveCmd
      ->add_option("--max-wait-ms", serve.maxWaitMs,
                   "A request waiting this long is admitted before waiting "
                   "requests of higher priority, so that low priority "
                   "cannot starve (0: off)")
      ->capture_default_str()
      ->check(nf::cli::Between("0", "86400000"));
  serveCmd->add_flag(
      "--enable-prefix-caching,!--no-enable-prefix-caching",
      serve.prefixCaching,
      "Reuse the state of recent requests whose tokens a new request's "
      "context starts with (snapshots at prompt block boundaries, before "
      "each prompt's last token and at each request's end; default on)");
  serveCmd
      ->add_option("--prefix-cache-block", serve.prefixCacheBlock,
                   "Tokens between the prompt boundaries at which prefix "
                   "caching keeps a snapshot")
      ->capture_default_str()
      ->check(nf::cli::Between("1", "1048576"));
  serveCmd
      ->add_option("--intent-budget", serve.intentBudget,
                   "Default expert budget of each X-Client-Intent, e.g. "
                   "interactive=1,batch=0.75,search=0.5 (the default); "
                   "X-Request-Priority scales it (high x1.3, low x0.7, at "
                   "most 1); expert_budget or X-Expert-Budget override it")
      ->default_str("interactive=1,batch=0.75,search=0.5");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp &e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion &e) {
    // CLI11 2.1 prints the version without a line end.
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError &e) {
    return nfrun::fail(e.what());
  }

  if (*generate) {
    gen.havePrompt = promptOpt->count() > 0;
    if (!gen.havePrompt && promptTokensOpt->count() == 0)
      return nfrun::fail("generate: one of --prompt or --prompt-tokens is "
                         "required");
    return nfrun::runGenerate(gen);
  }
  if (*inspect)
    return nfrun::runInspect(inspectPlan, inspectLaunches);
  if (*evalPpl)
    return nfrun::runEvalPpl(ev);
  if (*benchCmd)
    return nfrun::runBench(bench);
  if (*serveCmd)
    return nfrun::runServe(serve);
  return 0;
}
