// nfrun serve's request parsing (see serve_request.cpp).
#pragma once

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <variant>

namespace nfrun {

/// What request parsing reads of the model (nf::Model in the server; the
/// fuzz target gives a tokenizer and a chat template without a plan).
class RequestModel {
public:
  virtual ~RequestModel() = default;
  virtual bool hasTokenizer() const = 0;
  virtual nf::StatusOr<std::vector<int32_t>>
  tokenize(const std::string &text, bool addSpecial) const = 0;
  virtual int64_t vocabSize() const = 0;
  /// Tokens a sequence may hold; -1: unlimited.
  virtual int64_t maxContext() const = 0;
  virtual bool hasChatTemplate() const = 0;
  /// Why the chat template cannot be used ("" when it can or there is none).
  virtual std::string chatTemplateError() const = 0;
  /// `messages`: a JSON array of message objects (role, content,
  /// tool_calls, ...); `variables`: more template variables (a JSON
  /// object, or null).
  virtual nf::StatusOr<std::string>
  applyChatTemplate(const nlohmann::ordered_json &messages,
                    bool addGenerationPrompt,
                    const nlohmann::ordered_json &variables) const = 0;
  /// Text of `tokens`, special tokens skipped.
  virtual nf::StatusOr<std::string>
  detokenize(const std::vector<int32_t> &tokens) const = 0;
  /// Sampling defaults for fields a request omits (generation_config.json).
  virtual nf_generation_defaults generationDefaults() const = 0;
  /// A token's text alone, as vLLM writes it in logprobs: special tokens
  /// kept, a partial UTF-8 sequence as U+FFFD; "token_id:N" without a
  /// tokenizer.
  virtual std::string tokenString(int32_t id) const = 0;
};

/// RequestModel over a loaded model.
class LoadedRequestModel final : public RequestModel {
public:
  explicit LoadedRequestModel(const nf::Model &model) : model_(model) {}
  bool hasTokenizer() const override { return model_.hasTokenizer(); }
  nf::StatusOr<std::vector<int32_t>> tokenize(const std::string &text,
                                              bool addSpecial) const override {
    return model_.tokenize(text, addSpecial);
  }
  int64_t vocabSize() const override { return model_.vocabSize(); }
  int64_t maxContext() const override { return model_.maxContext(); }
  bool hasChatTemplate() const override { return model_.hasChatTemplate(); }
  std::string chatTemplateError() const override {
    return model_.chatTemplateError();
  }
  nf::StatusOr<std::string>
  applyChatTemplate(const nlohmann::ordered_json &messages,
                    bool addGenerationPrompt,
                    const nlohmann::ordered_json &variables) const override {
    return model_.applyChatTemplateJson(messages.dump(), addGenerationPrompt,
                                        variables.is_null() ? std::string()
                                                            : variables.dump());
  }
  nf::StatusOr<std::string>
  detokenize(const std::vector<int32_t> &tokens) const override {
    return model_.detokenize(tokens);
  }
  nf_generation_defaults generationDefaults() const override {
    return model_.generationDefaults();
  }
  std::string tokenString(int32_t id) const override {
    if (model_.hasTokenizer())
      if (auto text = model_.detokenize({id}, /*flags=*/0))
        return *text;
    return "token_id:" + std::to_string(id);
  }

private:
  const nf::Model &model_;
};

/// nf's traffic classes: the header X-Client-Intent, and
/// X-Request-Priority, which counts only with an intent.
enum class Intent { None, Interactive, Batch, Search };
enum class PriorityClass { None, High, Medium, Low };
const char *intentName(Intent intent);            // "none", "interactive", ...
const char *priorityName(PriorityClass priority); // "none", "high", ...

/// The traffic headers of a request, as sent ("" when absent).
struct TrafficHeaders {
  std::string intent;       // X-Client-Intent
  std::string priority;     // X-Request-Priority
  std::string expertBudget; // X-Expert-Budget
};

/// The server's request policy: each intent's default expert budget
/// (--intent-budget), scaled by priority (x1.3 high, x1 medium, x0.7 low,
/// at most 1); the new-token limit; the chat template's default variables.
struct ServePolicy {
  float interactive = 1.0f, batch = 0.75f, search = 0.5f;
  /// The server's hard limit of new tokens (--max-new-tokens; 0: none):
  /// completions' default max_tokens (16) is cut to it.
  int32_t maxNewTokens = 0;
  /// --default-chat-template-kwargs: template variables of every chat
  /// request, under its own chat_template_kwargs (a JSON object).
  nlohmann::ordered_json chatTemplateKwargs = nlohmann::ordered_json::object();
  /// --reasoning-parser: "" (none) or "nemotron_v3" (reasoning_parser.h).
  std::string reasoningParser;
};
/// Parses --intent-budget's "interactive=1,batch=0.75,search=0.5" (any
/// subset) into `policy`; an error message, or "".
std::string parseIntentBudget(const std::string &text, ServePolicy &policy);

/// How a chat request's output gives tool calls: none; parsed from the
/// model's markup (tool_parser.h), with tools and tool_choice "auto"; or,
/// with tool_choice "required" or a named function, as JSON the grammar
/// forces (vLLM's way): an array of {"name", "parameters"}, or the named
/// function's arguments.
enum class ToolCalls { None, Auto, Required, Named };

/// A validated request: what the serving engine runs, and how to answer.
struct ParsedRequest {
  nf::RequestParams params;
  /// Choices of the prompt: n requests, choice i seeded with seed + i (a
  /// snapshot of the prompt shares its prefill: serving/prefix_cache.h).
  int n = 1;
  bool stream = false;
  bool returnTokenIds = false; // the response lists the token ids
  /// Completions' echo: the text starts with the prompt's (echoText), and
  /// with logprobs, so do the logprobs.
  bool echo = false;
  std::string echoText;
  bool includeUsage = false; // stream_options.include_usage
  bool chat = false;         // /v1/chat/completions
  /// Chat: the rendered prompt leaves a `<think>` block open, so the output
  /// starts inside the model's reasoning (reasoning_parser.h).
  bool promptOpensReasoning = false;
  /// Chat: the request's tools (their parameter schemas type the parsed
  /// arguments) and whether its output is parsed for tool calls.
  nlohmann::ordered_json tools;
  ToolCalls toolCalls = ToolCalls::None;
  std::string namedTool;         // ToolCalls::Named: the function
  bool parallelToolCalls = true; // false: the first call only
  Intent intent = Intent::None;
  PriorityClass priority = PriorityClass::None;
};

/// A validated request, or the one-line message of a 400 answer.
using Parsed = std::variant<ParsedRequest, std::string>;

/// The answer of vLLM's /tokenize (`{"count", "max_model_len", "tokens",
/// "token_strs"}`) to a body with a `prompt` (and `add_special_tokens`,
/// default true) or chat `messages` (and `add_generation_prompt`, default
/// true, and chat_template_kwargs over the server's defaults, as
/// /v1/chat/completions renders them), or a one-line error for a 400
/// answer.
std::variant<nlohmann::json, std::string>
tokenizeRequest(const nlohmann::json &body, const RequestModel &model,
                const ServePolicy &policy = {});

/// The answer of vLLM's /detokenize (`{"prompt"}`) to a body with `tokens`,
/// or a one-line error.
std::variant<nlohmann::json, std::string>
detokenizeRequest(const nlohmann::json &body, const RequestModel &model);

/// A /v1/completions body: prompt (text or token ids), max_tokens,
/// max_new_tokens_soft, temperature, top_p, top_k, min_p, seed, n, stream,
/// stop, return_token_ids, priority, expert_budget; and the traffic
/// headers.
Parsed parseCompletion(const nlohmann::json &body, const RequestModel &model,
                       const TrafficHeaders &headers = {},
                       const ServePolicy &policy = {});
/// A /v1/chat/completions body: messages rendered with the model's chat
/// template (and the generation prompt), then the fields of
/// /v1/completions (and max_completion_tokens).
Parsed parseChat(const nlohmann::json &body, const RequestModel &model,
                 const TrafficHeaders &headers = {},
                 const ServePolicy &policy = {});

} // namespace nfrun
