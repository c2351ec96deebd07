// nfrun serve's request parsing: the JSON bodies of /v1/completions and
// /v1/chat/completions, validated into the serving engine's request
// parameters (prompt tokens, limits, sampling, stop strings) or a one-line
// error for a 400 answer. Runs on the
// HTTP threads: it only reads the model (tokenizer, chat template, sizes),
// which is immutable after loading.
#include "serve_request.h"
#include "reasoning_parser.h"
#include "serve_request_util.h"
#include "serve_structured.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

namespace nfrun {
namespace detail {

/// The most choices (`n`) one request may ask for.
constexpr int kMaxChoices = 16;

/// A seed of its own for an unseeded request.
uint64_t randomSeed() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return gen();
}

/// A client's string (a field name, a part type) inside a one-line error:
/// JSON-quoted, so control characters are escaped and invalid UTF-8
/// replaced, and cut to 64 bytes.
std::string quoted(const std::string &text) {
  std::string q = json(text.substr(0, 64))
                      .dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 64 ? q.substr(0, q.size() - 1) + "...\"" : q;
}

/// The sampling and length fields of a request, shared by both endpoints:
/// max_tokens (chat: also max_completion_tokens, and by default the rest
/// of the context), temperature, top_p, top_k, min_p, seed, n, stream and
/// stop. `r.params.prompt` is set. An error message, or nullopt.
std::optional<std::string> parseSampling(const json &body,
                                         const RequestModel &model,
                                         const ServePolicy &policy,
                                         ParsedRequest &r) {
  const std::vector<int32_t> &prompt = r.params.prompt;
  if (prompt.empty())
    return std::string("the prompt has no tokens");
  // A number in [lo, hi] ((lo, hi] when `openLow`).
  auto number = [&](const char *key, double lo, double hi, double &out,
                    bool openLow = false) -> std::optional<std::string> {
    if (!body.contains(key) || body[key].is_null())
      return std::nullopt;
    if (!body[key].is_number())
      return "'" + std::string(key) + "' must be a number";
    out = body[key].get<double>();
    if (!((openLow ? out > lo : out >= lo) && out <= hi)) {
      char range[64];
      std::snprintf(range, sizeof range, "%c%.10g, %.10g]", openLow ? '(' : '[',
                    lo, hi);
      return "'" + std::string(key) + "' must be in " + range;
    }
    return std::nullopt;
  };
  // -1: no limit of the request's own (chat's default: the context).
  // Completions' default of 16 (OpenAI's), within the server's limit.
  const double completionsDefault =
      policy.maxNewTokens > 0 ? std::min(16, policy.maxNewTokens) : 16;
  // What the request omits: generation_config.json's defaults where it has
  // them, else OpenAI's (temperature 1, no filters).
  const nf_generation_defaults gen = model.generationDefaults();
  auto byDefault = [&](unsigned bit, double value, double openai) {
    return (gen.set & bit) ? value : openai;
  };
  double maxTokens = r.chat ? -1 : completionsDefault,
         temperature = byDefault(NF_GEN_TEMPERATURE, gen.temperature, 1.0),
         topP = byDefault(NF_GEN_TOP_P, gen.top_p, 1.0), n = 1, seed = 0,
         topK = byDefault(NF_GEN_TOP_K, gen.top_k, 0),
         minP = byDefault(NF_GEN_MIN_P, gen.min_p, 0), soft = 0;
  const bool hasSoft = body.contains("max_new_tokens_soft") &&
                       !body["max_new_tokens_soft"].is_null();
  // A soft limit alone: the hard limits (the server's, the context) bound
  // it, not completions' default of 16.
  if (hasSoft && !body.contains("max_tokens"))
    maxTokens = -1;
  for (auto err :
       {number("max_tokens", 1, 1 << 30, maxTokens),
        r.chat ? number("max_completion_tokens", 1, 1 << 30, maxTokens)
               : std::nullopt,
        number("temperature", 0, 100, temperature),
        number("top_p", 0, 1, topP, true), number("n", 1, 1e9, n),
        number("seed", 0, 9.0e15, seed), number("top_k", 0, 1 << 30, topK),
        number("min_p", 0, 1, minP),
        number("max_new_tokens_soft", 1, 1 << 30, soft)})
    if (err)
      return *err;
  if (n > kMaxChoices)
    return "'n' must be at most " + std::to_string(kMaxChoices);
  r.n = static_cast<int>(n);
  // Context left after the prompt; a model without attention has no limit.
  int64_t room = int64_t{1} << 30;
  if (model.maxContext() >= 0) {
    room = model.maxContext() - static_cast<int64_t>(prompt.size());
    if (room < 1)
      return "the prompt has " + std::to_string(prompt.size()) +
             " tokens; this model's context is " +
             std::to_string(model.maxContext());
  }
  // No limit of its own (0): the server's --max-new-tokens, else the
  // context. One above the server's limit is refused by the engine.
  r.params.maxTokens = static_cast<int32_t>(
      maxTokens < 0 ? 0 : std::min<double>(maxTokens, room));
  r.params.maxTokensSoft = static_cast<int32_t>(std::min<double>(soft, room));
  nf::SamplerParams sampling;
  sampling.temperature = static_cast<float>(temperature);
  sampling.topP = static_cast<float>(topP);
  sampling.topK = static_cast<int32_t>(topK);
  sampling.minP = static_cast<float>(minP);
  // Unseeded requests draw from their own stream, as OpenAI's and vLLM's
  // do: equal requests give different samples.
  const bool seeded = body.contains("seed") && !body["seed"].is_null();
  sampling.seed = seeded ? static_cast<uint64_t>(seed) : randomSeed();
  if (auto sampler = nf::Sampler::create(sampling); !sampler)
    return sampler.message();
  r.params.sampler = sampling;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      return std::string("'stream' must be true or false");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json &o = body["stream_options"];
    if (!o.is_object())
      return std::string("'stream_options' must be an object");
    if (!r.stream)
      return std::string("'stream_options' needs 'stream': true");
    if (o.contains("include_usage") && !o["include_usage"].is_null()) {
      if (!o["include_usage"].is_boolean())
        return std::string(
            "'stream_options.include_usage' must be true or false");
      r.includeUsage = o["include_usage"].get<bool>();
    }
  }
  // vLLM's flags: ignore_eos, include_stop_str_in_output (the text ends
  // after its stop string), skip_special_tokens (default true).
  for (auto [key, out, invert] :
       {std::tuple{"ignore_eos", &r.params.ignoreEos, false},
        std::tuple{"include_stop_str_in_output", &r.params.includeStopString,
                   false},
        std::tuple{"skip_special_tokens", &r.params.keepSpecialTokens, true}}) {
    if (!body.contains(key) || body[key].is_null())
      continue;
    if (!body[key].is_boolean())
      return "'" + std::string(key) + "' must be true or false";
    *out = body[key].get<bool>() != invert;
  }
  if (body.contains("return_token_ids") &&
      !body["return_token_ids"].is_null()) {
    if (!body["return_token_ids"].is_boolean())
      return std::string("'return_token_ids' must be true or false");
    r.returnTokenIds = body["return_token_ids"].get<bool>();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json &s = body["stop"];
    if (s.is_string())
      r.params.stopStrings.push_back(s.get<std::string>());
    else if (s.is_array() && std::all_of(s.begin(), s.end(), [](const json &v) {
               return v.is_string();
             }))
      for (const json &v : s)
        r.params.stopStrings.push_back(v.get<std::string>());
    else
      return std::string("'stop' must be a string or an array of strings");
    for (const std::string &s : r.params.stopStrings)
      if (s.empty())
        return std::string("'stop' strings must not be empty");
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    const json &ids = body["stop_token_ids"];
    if (!ids.is_array())
      return std::string("'stop_token_ids' must be an array of token ids");
    for (const json &v : ids) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= model.vocabSize())
        return "'stop_token_ids' must hold token ids in [0, " +
               std::to_string(model.vocabSize()) + ")";
      r.params.stopTokens.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }
  // Penalties and limits on the draw (vLLM's ranges).
  double presence = 0, frequency = 0, repetition = 1, minTokens = 0;
  for (auto err : {number("presence_penalty", -2, 2, presence),
                   number("frequency_penalty", -2, 2, frequency),
                   number("repetition_penalty", 0, 2, repetition, true),
                   number("min_tokens", 0, 1 << 30, minTokens)})
    if (err)
      return *err;
  if (minTokens != std::floor(minTokens))
    return std::string("'min_tokens' must be an integer");
  if (maxTokens > 0 && minTokens > maxTokens)
    return std::string("'min_tokens' must not be above 'max_tokens'");
  r.params.presencePenalty = static_cast<float>(presence);
  r.params.frequencyPenalty = static_cast<float>(frequency);
  r.params.repetitionPenalty = static_cast<float>(repetition);
  r.params.minTokens = static_cast<int32_t>(minTokens);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    // OpenAI's: {"token id": bias in [-100, 100]}.
    const json &bias = body["logit_bias"];
    if (!bias.is_object())
      return std::string("'logit_bias' must be an object of token ids and "
                         "biases");
    for (const auto &item : bias.items()) {
      const std::string &key = item.key();
      char *end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end || id < 0 || id >= model.vocabSize())
        return "'logit_bias': key " + quoted(key) +
               " is not a token id in [0, " +
               std::to_string(model.vocabSize()) + ")";
      const json &v = item.value();
      if (!v.is_number() || !(v.get<double>() >= -100) ||
          !(v.get<double>() <= 100))
        return "'logit_bias': the bias of token " + key +
               " must be a number in [-100, 100]";
      r.params.logitBias.emplace_back(static_cast<int32_t>(id),
                                      static_cast<float>(v.get<double>()));
    }
  }
  return std::nullopt;
}

std::string lower(std::string s) {
  for (char &c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// An expert budget in (0, 1] from text; nullopt when it is not one.
std::optional<float> budgetValue(const std::string &text) {
  const char *begin = text.c_str();
  char *end = nullptr;
  const double v = std::strtod(begin, &end);
  if (text.empty() || *end != '\0' || !(v > 0.0 && v <= 1.0))
    return std::nullopt;
  return static_cast<float>(v);
}

/// Intent, priority, expert budget and cache salt: the traffic headers, and
/// the body's `priority` (vLLM's integer, lower first), `expert_budget` and
/// `cache_salt` (vLLM's: only prefix-cache snapshots of the same salt). A
/// priority header without an intent header is ignored; an explicit budget
/// (body, then header) wins over the intent's.
std::optional<std::string> parseTraffic(const json &body,
                                        const TrafficHeaders &headers,
                                        const ServePolicy &policy,
                                        ParsedRequest &r) {
  if (!headers.intent.empty()) {
    const std::string v = lower(headers.intent);
    if (v == "interactive")
      r.intent = Intent::Interactive;
    else if (v == "batch")
      r.intent = Intent::Batch;
    else if (v == "search")
      r.intent = Intent::Search;
    else
      return std::string(
          "X-Client-Intent must be interactive, batch or search");
  }
  if (!headers.priority.empty()) {
    const std::string v = lower(headers.priority);
    PriorityClass p;
    if (v == "high")
      p = PriorityClass::High;
    else if (v == "medium")
      p = PriorityClass::Medium;
    else if (v == "low")
      p = PriorityClass::Low;
    else
      return std::string("X-Request-Priority must be high, medium or low");
    if (r.intent != Intent::None) // the rule: no intent, no priority
      r.priority = p;
  }
  r.params.priority = r.priority == PriorityClass::High  ? -1
                      : r.priority == PriorityClass::Low ? 1
                                                         : 0;
  if (body.contains("priority") && !body["priority"].is_null()) {
    const json &v = body["priority"];
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
        v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      return std::string("'priority' must be an integer (lower values are "
                         "served first)");
    r.params.priority = static_cast<int32_t>(v.get<int64_t>());
  }
  if (body.contains("cache_salt") && !body["cache_salt"].is_null()) {
    const json &v = body["cache_salt"];
    if (!v.is_string() || v.get_ref<const std::string &>().empty() ||
        v.get_ref<const std::string &>().size() > 1024)
      return std::string("'cache_salt' must be a non-empty string of at most "
                         "1024 bytes");
    r.params.cacheSalt = v.get<std::string>();
  }
  if (body.contains("expert_budget") && !body["expert_budget"].is_null()) {
    const json &v = body["expert_budget"];
    if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0))
      return std::string("'expert_budget' must be a number in (0, 1]");
    r.params.expertBudget = v.get<float>();
  } else if (!headers.expertBudget.empty()) {
    auto b = budgetValue(headers.expertBudget);
    if (!b)
      return std::string("X-Expert-Budget must be a number in (0, 1]");
    r.params.expertBudget = *b;
  } else if (r.intent != Intent::None) {
    const float base = r.intent == Intent::Interactive ? policy.interactive
                       : r.intent == Intent::Batch     ? policy.batch
                                                       : policy.search;
    const float scale = r.priority == PriorityClass::High  ? 1.3f
                        : r.priority == PriorityClass::Low ? 0.7f
                                                           : 1.0f;
    r.params.expertBudget = std::min(1.0f, base * scale);
  }
  return std::nullopt;
}

/// Refuses, with one line, every field this server does not implement where
/// it asks for something (a non-default value), and every field it does
/// not know: a request is never answered as if a field had been applied.
/// `chat`: /v1/chat/completions, else /v1/completions.
std::optional<std::string> unsupportedField(const json &body, bool chat) {
  // Read elsewhere (parseCompletion/parseChat, parseSampling, parseTraffic);
  // `user` is the client's end-user id, informational only.
  static const char *const kCommon[] = {"model",
                                        "max_tokens",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "n",
                                        "seed",
                                        "stream",
                                        "stream_options",
                                        "stop",
                                        "stop_token_ids",
                                        "ignore_eos",
                                        "return_token_ids",
                                        "max_new_tokens_soft",
                                        "priority",
                                        "expert_budget",
                                        "cache_salt",
                                        "user",
                                        "logprobs",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "repetition_penalty",
                                        "logit_bias",
                                        "min_tokens",
                                        "include_stop_str_in_output",
                                        "skip_special_tokens"};
  static const char *const kCompletions[] = {"prompt", "echo"};
  static const char *const kChat[] = {
      "messages",    "max_completion_tokens", "tools",
      "tool_choice", "parallel_tool_calls",   "chat_template_kwargs",
      "top_logprobs"};
  auto isDefault = [](const json &v, const char *name) {
    const std::string n = name;
    if (v.is_null())
      return true;
    if (n == "logprobs" || n == "echo" || n == "parallel_tool_calls" ||
        n == "use_beam_search")
      return v.is_boolean() ? !v.get<bool>()
                            : v.is_number() && v.get<double>() == 0.0;
    if (n == "top_logprobs" || n == "presence_penalty" ||
        n == "frequency_penalty" || n == "min_tokens")
      return v.is_number() && v.get<double>() == 0.0;
    if (n == "repetition_penalty" || n == "best_of")
      return v.is_number() && v.get<double>() == 1.0;
    if (n == "logit_bias")
      return v.is_object() && v.empty();
    if (n == "suffix")
      return v.is_string() && v.get<std::string>().empty();
    if (n == "tool_choice")
      return v.is_string() && v.get<std::string>() == "none";
    return false;
  };
  // Not implemented yet (issue: the OpenAI API for Nemotron 3): refused
  // unless they ask for nothing.
  static const char *const kNotYet[] = {"top_logprobs", "echo", "best_of",
                                        "suffix", "use_beam_search"};
  for (const auto &item : body.items()) {
    // Named, not a structured binding: lambdas cannot capture those before
    // C++20 as clang implements it.
    const std::string &key = item.key();
    const json &value = item.value();
    auto in = [&](const auto &list) {
      return std::find_if(std::begin(list), std::end(list), [&](const char *k) {
               return key == k;
             }) != std::end(list);
    };
    if (in(kCommon) || in(kStructuredOutputFields) ||
        (chat ? in(kChat) : in(kCompletions)))
      continue;
    if (in(kNotYet)) {
      if (isDefault(value, key.c_str()))
        continue;
      return "'" + key + "' is not supported yet";
    }
    return "unknown field " + quoted(key);
  }
  return std::nullopt;
}

/// A template's error without the server's file path that starts it
/// ("/srv/t.jinja: chat template line 3: ..." -> "chat template line 3:
/// ...").
std::string withoutTemplatePath(const std::string &message) {
  const size_t at = message.find(": chat template line ");
  return at == std::string::npos ? message : message.substr(at + 2);
}

} // namespace detail

using namespace detail;

const char *intentName(Intent intent) {
  switch (intent) {
  case Intent::Interactive:
    return "interactive";
  case Intent::Batch:
    return "batch";
  case Intent::Search:
    return "search";
  case Intent::None:
    break;
  }
  return "none";
}

const char *priorityName(PriorityClass priority) {
  switch (priority) {
  case PriorityClass::High:
    return "high";
  case PriorityClass::Medium:
    return "medium";
  case PriorityClass::Low:
    return "low";
  case PriorityClass::None:
    break;
  }
  return "none";
}

std::string parseIntentBudget(const std::string &text, ServePolicy &policy) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos)
      end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    const std::string key = lower(item.substr(0, eq));
    auto value = eq == std::string::npos ? std::nullopt
                                         : budgetValue(item.substr(eq + 1));
    if (!value)
      return "--intent-budget: '" + item +
             "' is not INTENT=BUDGET with a budget in (0, 1]";
    if (key == "interactive")
      policy.interactive = *value;
    else if (key == "batch")
      policy.batch = *value;
    else if (key == "search")
      policy.search = *value;
    else
      return "--intent-budget: unknown intent '" + key +
             "' (interactive, batch, search)";
    start = end + 1;
  }
  return "";
}

/// A count of logprob alternatives, `key` (0 to kMaxTopLogprobs) into
/// `out` when present; an error message, or nullopt.
std::optional<std::string> detail::topLogprobs(const json &body,
                                               const char *key, int32_t &out) {
  if (!body.contains(key) || body[key].is_null())
    return std::nullopt;
  const json &v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      v.get<int64_t>() > nf::kMaxTopLogprobs)
    return "'" + std::string(key) + "' must be an integer from 0 to " +
           std::to_string(nf::kMaxTopLogprobs);
  out = v.get<int32_t>();
  return std::nullopt;
}

/// A validated /v1/completions request from its JSON body, or an error
/// message. Runs on the HTTP threads: it only reads the model (tokenizer,
/// sizes), which is immutable after loading, while the scheduler thread
/// runs it.
Parsed parseCompletion(const json &body, const RequestModel &model,
                       const TrafficHeaders &headers,
                       const ServePolicy &policy) {
  ParsedRequest r;
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (auto err = unsupportedField(body, /*chat=*/false))
    return *err;
  if (!body.contains("prompt"))
    return std::string("'prompt' is required");
  // A batch of one prompt (as lm-evaluation-harness sends it) is that
  // prompt.
  const json &p =
      body["prompt"].is_array() && body["prompt"].size() == 1 &&
              (body["prompt"][0].is_string() || body["prompt"][0].is_array())
          ? body["prompt"][0]
          : body["prompt"];
  if (p.is_string()) {
    if (!model.hasTokenizer())
      return std::string("this model has no tokenizer: send 'prompt' as an "
                         "array of token ids");
    auto ids = model.tokenize(p.get<std::string>(), false);
    if (!ids)
      return "prompt: " + ids.message();
    r.params.prompt = std::move(*ids);
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(),
                         [](const json &v) { return v.is_number_integer(); })) {
    for (const json &v : p) {
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= model.vocabSize())
        return "prompt: token id " + std::to_string(id) + " is not in [0, " +
               std::to_string(model.vocabSize()) + ")";
      r.params.prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    return std::string("'prompt' must be a string or a non-empty array of "
                       "token ids (one prompt per request)");
  }
  if (auto err = parseSampling(body, model, policy, r))
    return *err;
  if (auto err = parseStructuredOutput(body, r.params))
    return *err;
  // logprobs: the tokens' and as many alternatives; with echo, the
  // prompt's too (the text then starts with the prompt).
  if (auto err = topLogprobs(body, "logprobs", r.params.logprobs))
    return *err;
  if (body.contains("echo") && !body["echo"].is_null()) {
    if (!body["echo"].is_boolean())
      return std::string("'echo' must be true or false");
    r.echo = body["echo"].get<bool>();
  }
  if (r.echo) {
    if (p.is_string())
      r.echoText = p.get<std::string>();
    else if (model.hasTokenizer()) {
      auto text = model.detokenize(r.params.prompt);
      if (!text)
        return "prompt: " + text.message();
      r.echoText = std::move(*text);
    }
    r.params.promptLogprobs = r.params.logprobs;
  }
  if (auto err = parseTraffic(body, headers, policy, r))
    return *err;
  return r;
}

std::variant<json, std::string> tokenizeRequest(const json &body,
                                                const RequestModel &model,
                                                const ServePolicy &policy) {
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (!model.hasTokenizer())
    return std::string("this model has no tokenizer");
  auto flag = [&](const char *key, bool &out) -> std::optional<std::string> {
    if (!body.contains(key) || body[key].is_null())
      return std::nullopt;
    if (!body[key].is_boolean())
      return "'" + std::string(key) + "' must be true or false";
    out = body[key].get<bool>();
    return std::nullopt;
  };
  for (const auto &[key, value] : body.items())
    if (key != "model" && key != "prompt" && key != "messages" &&
        key != "add_special_tokens" && key != "add_generation_prompt" &&
        key != "chat_template_kwargs")
      return "unknown field " + quoted(key);
  nf::StatusOr<std::vector<int32_t>> ids = std::vector<int32_t>();
  if (body.contains("prompt") == body.contains("messages"))
    return std::string("give either 'prompt' or 'messages'");
  if (body.contains("prompt")) {
    if (!body["prompt"].is_string())
      return std::string("'prompt' must be a string");
    bool addSpecial = true;
    if (auto err = flag("add_special_tokens", addSpecial))
      return *err;
    ids = model.tokenize(body["prompt"].get<std::string>(), addSpecial);
  } else {
    if (!model.hasChatTemplate())
      return std::string("this model has no chat template");
    bool generation = true;
    if (auto err = flag("add_generation_prompt", generation))
      return *err;
    auto messages = parseMessages(body);
    if (auto *err = std::get_if<std::string>(&messages))
      return *err;
    auto variables = templateVariables(body, policy);
    if (auto *err = std::get_if<std::string>(&variables))
      return *err;
    auto text = model.applyChatTemplate(
        std::get<nlohmann::ordered_json>(messages), generation,
        std::get<nlohmann::ordered_json>(variables));
    if (!text)
      return withoutTemplatePath(text.message());
    ids = model.tokenize(*text, false);
  }
  if (!ids)
    return "prompt: " + ids.message();
  return json{{"count", ids->size()},
              {"max_model_len", model.maxContext()},
              {"tokens", *ids},
              {"token_strs", nullptr}};
}

std::variant<json, std::string> detokenizeRequest(const json &body,
                                                  const RequestModel &model) {
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (!model.hasTokenizer())
    return std::string("this model has no tokenizer");
  for (const auto &[key, value] : body.items())
    if (key != "model" && key != "tokens")
      return "unknown field " + quoted(key);
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return std::string("'tokens' must be an array of token ids");
  std::vector<int32_t> ids;
  for (const json &v : body["tokens"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() >= model.vocabSize())
      return "'tokens' must hold token ids in [0, " +
             std::to_string(model.vocabSize()) + ")";
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  auto text = model.detokenize(ids);
  if (!text)
    return "tokens: " + text.message();
  return json{{"prompt", *text}};
}

} // namespace nfrun
