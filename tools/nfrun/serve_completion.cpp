// nfrun serve's completion endpoints (see serve_completion.h).
#include "serve_completion.h"
#include "reasoning_parser.h"
#include "serve_logprobs.h"
#include "tool_parser.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <memory>
#include <vector>

namespace nfrun {

using json = nlohmann::json;

std::string dumpJson(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void sendError(httplib::Response &res, int status, const std::string &message,
               const std::string &type) {
  res.status = status;
  res.set_content(
      dumpJson(json{{"error", {{"message", message}, {"type", type}}}}),
      "application/json");
}

int64_t unixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const TrafficClass *trafficClass(Intent intent, PriorityClass priority) {
  static const auto table = [] {
    std::array<std::array<TrafficClass, 4>, 4> t{};
    for (int i = 0; i < 4; ++i)
      for (int p = 0; p < 4; ++p)
        t[i][p] = {static_cast<Intent>(i), static_cast<PriorityClass>(p)};
    return t;
  }();
  return &table[static_cast<int>(intent)][static_cast<int>(priority)];
}

namespace {

/// A response's usage: OpenAI's token counts (the prompt's from the prefix
/// cache in prompt_tokens_details.cached_tokens), and for MoE models nf's
/// routed-expert calls per MoE layer, the budget applied and the share of
/// static top-k's calls spent.
json usageJson(const nf::RequestOutput &o) {
  json u = {{"prompt_tokens", o.promptTokens},
            {"completion_tokens", o.completionTokens},
            {"total_tokens", o.promptTokens + o.completionTokens},
            {"prompt_tokens_details", {{"cached_tokens", o.cachedTokens}}}};
  if (!o.expertCallsPerLayer.empty()) {
    u["expert_calls"] = o.expertCallsPerLayer;
    u["expert_budget"] = o.expertBudget;
    u["expert_budget_spent"] = o.expertBudgetSpent;
  }
  return u;
}

/// nf's timing trace of a finished request (the response's
/// reasoning_trace): time queued, its prompt's prefill, and generation
/// after the first token, in milliseconds.
json traceJson(const nf::RequestOutput &o) {
  return json::array(
      {{{"step", "queue"}, {"latency_ms", o.queuedS * 1e3}},
       {{"step", "prefill"}, {"latency_ms", o.prefillS * 1e3}},
       {{"step", "generation"}, {"latency_ms", o.decodeS * 1e3}}});
}

/// The tool_calls of a response (`index` for streamed deltas).
json toolCallsJson(const std::vector<ToolCall> &calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {
        {"id", newToolCallId()},
        {"type", "function"},
        {"function",
         {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}}}};
    if (indexed)
      c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

/// The calls of a forced tool_choice's JSON (ToolCalls::Required: an
/// array of {"name", "parameters"}; Named: `name`'s arguments); none when
/// it is not that JSON (cut short by max_tokens).
std::vector<ToolCall> forcedCalls(const std::string &text, ToolCalls mode,
                                  const std::string &name) {
  const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
  std::vector<ToolCall> calls;
  if (mode == ToolCalls::Named && doc.is_object())
    calls.push_back({name, doc});
  if (mode == ToolCalls::Required && doc.is_array())
    for (const auto &c : doc) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
          !c.contains("parameters") || !c["parameters"].is_object())
        return {};
      calls.push_back({c["name"].get<std::string>(), c["parameters"]});
    }
  return calls;
}

/// A chat answer split, piece by piece, into reasoning and content
/// (--reasoning-parser) and the content's tool calls (tools with
/// tool_choice auto: parsed from the model's markup; required or named:
/// the JSON the grammar forced), kept for the end.
struct AnswerSplit {
  std::unique_ptr<ReasoningParser> reasoning;
  std::unique_ptr<ToolCallStream> tools;
  nlohmann::ordered_json toolSchemas;
  bool parallel = true;
  ToolCalls forced = ToolCalls::None; // Required or Named
  std::string namedTool;
  std::string forcedText; // the content so far, under a forced tool_choice

  /// The finish_reason of an answer with calls: OpenAI's "stop" for a
  /// named function, else "tool_calls".
  const char *callsFinishReason() const {
    return forced == ToolCalls::Named ? "stop" : "tool_calls";
  }

  /// The parts of the next piece of text; at the `last` one, also the
  /// calls.
  ReasoningParser::Delta feed(const std::string &text, bool last,
                              std::vector<ToolCall> &calls) {
    ReasoningParser::Delta d;
    if (reasoning) {
      d = reasoning->feed(text);
      if (last) {
        ReasoningParser::Delta end = reasoning->finish();
        d.reasoning += end.reasoning;
        d.content += end.content;
      }
    } else {
      d.content = text;
    }
    if (forced != ToolCalls::None) {
      forcedText += d.content;
      d.content.clear();
      if (last) {
        calls = forcedCalls(forcedText, forced, namedTool);
        if (calls.empty()) // not the JSON: the text as it came
          d.content = std::move(forcedText);
      }
    } else if (tools) {
      d.content = tools->feed(d.content);
      if (last) {
        ToolCallOutput out = tools->finish(toolSchemas);
        d.content += out.content;
        calls = std::move(out.calls);
        if (!parallel && !calls.empty())
          calls.resize(1);
      }
    }
    return d;
  }
  bool sawReasoning() const { return reasoning && reasoning->sawReasoning(); }
};

/// The split a chat request's answer needs (null: none).
std::unique_ptr<AnswerSplit> answerSplit(const ParsedRequest &p,
                                         const ServePolicy &policy) {
  if (!p.chat ||
      (policy.reasoningParser.empty() && p.toolCalls == ToolCalls::None))
    return nullptr;
  auto split = std::make_unique<AnswerSplit>();
  if (!policy.reasoningParser.empty())
    split->reasoning =
        std::make_unique<ReasoningParser>(p.promptOpensReasoning);
  if (p.toolCalls == ToolCalls::Auto) {
    split->tools = std::make_unique<ToolCallStream>();
    split->toolSchemas = p.tools;
    split->parallel = p.parallelToolCalls;
  }
  if (p.toolCalls == ToolCalls::Required || p.toolCalls == ToolCalls::Named) {
    split->forced = p.toolCalls;
    split->namedTool = p.namedTool;
  }
  return split;
}

/// The finish_reason of an OpenAI response.
const char *finishReason(nf_finish_reason reason) {
  return reason == NF_FINISH_LENGTH ? "length" : "stop";
}

/// A whole answer's choice (without its index): the text (after the
/// prompt's, with echo), or the chat message split into reasoning, content
/// and tool calls; its logprobs (null unless asked for); with
/// return_token_ids, the prompt's and the choice's token ids.
json choiceJson(const nf::RequestOutput &all, const ParsedRequest &p,
                const ServePolicy &policy, const RequestModel &model) {
  json choice = {{"finish_reason", finishReason(all.finishReason)},
                 {"logprobs", nullptr}};
  if (p.params.logprobs >= 0 && p.chat) {
    choice["logprobs"] = chatLogprobs(all.logprobs, model);
  } else if (p.params.logprobs >= 0) {
    CompletionLogprobs lp(model);
    if (p.echo) {
      lp.addFirst(p.params.prompt.front());
      lp.add(all.promptLogprobs);
    }
    lp.add(all.logprobs);
    choice["logprobs"] = lp.take();
  }
  if (auto split = answerSplit(p, policy)) {
    std::vector<ToolCall> calls;
    ReasoningParser::Delta d = split->feed(all.text, true, calls);
    const bool reasoned = split->sawReasoning();
    if (!calls.empty()) // the text before the calls, without its end
      while (!d.content.empty() &&
             std::isspace(static_cast<unsigned char>(d.content.back())))
        d.content.pop_back();
    json message = {
        {"role", "assistant"},
        {"content", d.content.empty() && (reasoned || !calls.empty())
                        ? json(nullptr)
                        : json(d.content)}};
    if (!policy.reasoningParser.empty())
      message["reasoning_content"] =
          reasoned ? json(d.reasoning) : json(nullptr);
    if (!calls.empty()) {
      message["tool_calls"] = toolCallsJson(calls, false);
      choice["finish_reason"] = split->callsFinishReason();
    }
    choice["message"] = std::move(message);
  } else if (p.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", all.text}};
  } else {
    choice["text"] = p.echo ? p.echoText + all.text : all.text;
  }
  if (p.returnTokenIds) { // as vLLM's return_token_ids
    choice["prompt_token_ids"] = p.params.prompt;
    choice["token_ids"] = all.tokens;
  }
  return choice;
}

/// The usage of n choices of one prompt, as OpenAI counts it: the prompt
/// once (its cached tokens: the fewest any choice took from the cache),
/// the choices' tokens and expert calls summed, the budget spent over all.
nf::RequestOutput choicesTotal(const std::vector<nf::RequestOutput> &outs) {
  nf::RequestOutput total = outs.front();
  double calls = 0, topK = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const nf::RequestOutput &o = outs[i];
    if (i > 0) {
      total.completionTokens += o.completionTokens;
      total.cachedTokens = std::min(total.cachedTokens, o.cachedTokens);
      for (size_t l = 0; l < total.expertCallsPerLayer.size() &&
                         l < o.expertCallsPerLayer.size();
           ++l)
        total.expertCallsPerLayer[l] += o.expertCallsPerLayer[l];
    }
    if (o.expertBudgetSpent > 0) {
      calls += static_cast<double>(o.expertCalls);
      topK += static_cast<double>(o.expertCalls) / o.expertBudgetSpent;
    }
  }
  total.expertBudgetSpent = topK > 0 ? calls / topK : 0.0;
  return total;
}

} // namespace

void serveCompletion(const httplib::Request &req, httplib::Response &res,
                     bool chat, const RequestModel &model,
                     const ServePolicy &policy, nf::ServingEngine &engine,
                     const std::string &name, std::atomic<int64_t> &nextId) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded())
    return sendError(res, 400, "the body is not valid JSON");
  const TrafficHeaders headers = {req.get_header_value("X-Client-Intent"),
                                  req.get_header_value("X-Request-Priority"),
                                  req.get_header_value("X-Expert-Budget")};
  Parsed parsed = chat ? parseChat(body, model, headers, policy)
                       : parseCompletion(body, model, headers, policy);
  if (auto *err = std::get_if<std::string>(&parsed))
    return sendError(res, 400, *err);
  ParsedRequest &p = std::get<ParsedRequest>(parsed);
  p.params.userData =
      const_cast<TrafficClass *>(trafficClass(p.intent, p.priority));
  const std::string id =
      (chat ? "chatcmpl-" : "cmpl-") + std::to_string(nextId++);
  const int64_t created = unixTime();
  // One request per choice, choice i seeded with seed + i; a failed
  // submission cancels those before it (their handles go).
  std::vector<std::shared_ptr<nf::ServingRequest>> requests;
  for (int i = 0; i < p.n; ++i) {
    nf::RequestParams params = p.params;
    params.sampler.seed += static_cast<uint64_t>(i);
    nf_status code = NF_OK;
    auto submitted = engine.submit(params, &code);
    if (!submitted) {
      switch (code) {
      case NF_ERR_CAPACITY:
        res.set_header("Retry-After", "1");
        return sendError(res, 429,
                         "the server is busy: its queue of waiting requests "
                         "is full (--max-queue); retry later",
                         "rate_limit_error");
      case NF_ERR_UNAVAILABLE:
        return sendError(res, 503, "the server is shutting down",
                         "server_error");
      case NF_ERR_INVALID_ARGUMENT:
        return sendError(res, 400, submitted.message());
      default:
        return sendError(res, 500, submitted.message(), "server_error");
      }
    }
    requests.push_back(
        std::make_shared<nf::ServingRequest>(std::move(*submitted)));
  }
  // The response object (streamed: a chunk) around its one choice.
  auto response = [id, created, name, chat](const json &choice, bool chunk) {
    json c = choice;
    c["index"] = 0;
    if (!c.contains("logprobs"))
      c["logprobs"] = nullptr;
    return json{{"id", id},
                {"object", !chat   ? "text_completion"
                           : chunk ? "chat.completion.chunk"
                                   : "chat.completion"},
                {"created", created},
                {"model", name},
                {"choices", json::array({c})}};
  };
  auto errorText = [](const nf::RequestOutput &o) {
    return o.finishReason == NF_FINISH_CANCELLED
               ? std::string("the request was cancelled")
               : o.error;
  };
  if (!p.stream) {
    // Waits for the ends, and stops the requests when the client goes away.
    std::vector<nf::RequestOutput> outs;
    auto checked = std::chrono::steady_clock::now();
    for (const auto &r : requests) {
      nf::RequestOutput all;
      for (;;) {
        auto o = r->read(kClientCheck);
        if (!o)
          return sendError(res, 500, o.message(), "server_error");
        all.join(std::move(*o));
        if (all.finished())
          break;
        if (std::chrono::steady_clock::now() - checked >= kClientCheck) {
          checked = std::chrono::steady_clock::now();
          if (HttpServer::clientGone())
            for (const auto &c : requests)
              c->cancel();
        }
      }
      if (all.finishReason != NF_FINISH_STOP &&
          all.finishReason != NF_FINISH_LENGTH)
        return sendError(res,
                         all.finishReason == NF_FINISH_UNAVAILABLE ? 503 : 500,
                         errorText(all), "server_error");
      outs.push_back(std::move(all));
    }
    json choices = json::array();
    for (size_t i = 0; i < outs.size(); ++i) {
      json choice = choiceJson(outs[i], p, policy, model);
      choice["index"] = i;
      choices.push_back(std::move(choice));
    }
    json out = response(json::object(), false);
    out["choices"] = std::move(choices);
    const nf::RequestOutput total = choicesTotal(outs);
    out["usage"] = usageJson(total);
    out["reasoning_trace"] = traceJson(outs.front());
    res.set_header("X-Actual-New-Tokens",
                   std::to_string(total.completionTokens));
    res.set_content(dumpJson(out), "application/json");
    return;
  }
  // The streamed choices, each with its own parser and logprobs, polled in
  // turn; every event names its choice's index.
  struct Choice {
    explicit Choice(const RequestModel &model) : completion(model) {}
    std::shared_ptr<nf::ServingRequest> request;
    std::shared_ptr<AnswerSplit> parser; // chat with a reasoning parser
    bool echo = false;                   // the prompt's text still to send
    nf::Logprobs prompt;                 // echo's, until the first event
    CompletionLogprobs completion;       // its text offsets count on
    bool done = false;
    nf::RequestOutput end; // its last output (usage)
  };
  struct Stream {
    std::vector<Choice> choices;
    bool rolesSent = false;
  };
  auto stream = std::make_shared<Stream>();
  for (const auto &r : requests) {
    Choice &c = stream->choices.emplace_back(model);
    c.request = r;
    c.parser = answerSplit(p, policy);
    c.echo = p.echo;
  }
  stream->rolesSent = !chat;
  const RequestModel *m = &model; // the server's, which outlives responses
  const bool returnTokenIds = p.returnTokenIds,
             wantLogprobs = p.params.logprobs >= 0;
  const std::string echoText = p.echoText;
  const int32_t firstToken = p.params.prompt.front();
  // A chunk of choice `index` (its fields but the index and logprobs).
  auto chunk = [id, created, name, chat](const json &choice, size_t index,
                                         const json &trace = nullptr) {
    json c = choice;
    c["index"] = index;
    if (!c.contains("logprobs"))
      c["logprobs"] = nullptr;
    json out = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", name},
                {"choices", json::array({c})}};
    if (!trace.is_null())
      out["reasoning_trace"] = trace;
    return "data: " + dumpJson(out) + "\n\n";
  };
  // The events of one read of choice `i`: a piece of text (with a reasoning
  // parser, split into the delta's reasoning_content and content; with
  // return_token_ids or logprobs, also for tokens whose text is held
  // back), tool calls, and at the end the finish_reason with the
  // reasoning_trace. Sets `failed` when the choice ended in an error.
  auto events = [chunk, chat, m, returnTokenIds, wantLogprobs, echoText,
                 firstToken, errorText](Choice &c, size_t i,
                                        nf::RequestOutput &o, bool &failed) {
    std::string out;
    c.prompt.append(o.promptLogprobs);
    // The chunk's logprobs (null unless asked for), and its text: after
    // the prompt's on the first chunk of an echo.
    auto piece = [&](std::string &text) -> json {
      const bool first = c.echo;
      if (first) {
        text = echoText + text;
        c.echo = false;
      }
      if (!wantLogprobs)
        return nullptr;
      if (chat)
        return chatLogprobs(o.logprobs, *m);
      if (first) {
        c.completion.addFirst(firstToken);
        c.completion.add(c.prompt);
      }
      c.completion.add(o.logprobs);
      return c.completion.take();
    };
    const bool tokensSent =
        (returnTokenIds || wantLogprobs) && !o.tokens.empty();
    auto textEvent = [&](const ReasoningParser::Delta *split) {
      std::string text = o.text;
      json choice = {{"finish_reason", nullptr}, {"logprobs", piece(text)}};
      if (returnTokenIds)
        choice["token_ids"] = o.tokens;
      if (!chat) {
        choice["text"] = text;
      } else if (split) {
        choice["delta"] = json::object();
        if (!split->reasoning.empty())
          choice["delta"]["reasoning_content"] = split->reasoning;
        if (!split->content.empty())
          choice["delta"]["content"] = split->content;
      } else {
        choice["delta"] = {{"content", text}};
      }
      out += chunk(choice, i);
    };
    std::vector<ToolCall> calls;
    if (c.parser) {
      ReasoningParser::Delta d = c.parser->feed(o.text, o.finished(), calls);
      // Text held back inside a tag sends nothing yet (unless tokens).
      if (!d.empty() || tokensSent)
        textEvent(&d);
      if (!calls.empty())
        out += chunk({{"finish_reason", nullptr},
                      {"delta", {{"tool_calls", toolCallsJson(calls, true)}}}},
                     i);
    } else if (!o.text.empty() || tokensSent || c.echo) {
      textEvent(nullptr);
    }
    if (!o.finished())
      return out;
    c.done = true;
    if (o.finishReason != NF_FINISH_STOP &&
        o.finishReason != NF_FINISH_LENGTH) {
      failed = true;
      return out + "data: " +
             dumpJson(json{
                 {"error",
                  {{"message", errorText(o)}, {"type", "server_error"}}}}) +
             "\n\n";
    }
    json choice = {{"finish_reason", calls.empty()
                                         ? finishReason(o.finishReason)
                                         : c.parser->callsFinishReason()}};
    if (chat)
      choice["delta"] = json::object();
    else
      choice["text"] = "";
    out += chunk(choice, i, traceJson(o));
    c.end = std::move(o);
    return out;
  };
  // stream_options.include_usage: a last chunk with no choices and the
  // usage of them all, as OpenAI's.
  auto usageChunk = [id, created, name, chat, include = p.includeUsage](
                        const std::vector<Choice> &choices) -> std::string {
    if (!include)
      return "";
    std::vector<nf::RequestOutput> ends;
    for (const Choice &c : choices)
      ends.push_back(c.end);
    json u = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", name},
              {"choices", json::array()},
              {"usage", usageJson(choicesTotal(ends))}};
    return "data: " + dumpJson(u) + "\n\n";
  };
  auto cancelAll = [stream] {
    for (Choice &c : stream->choices)
      c.request->cancel();
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, chunk, events, usageChunk, cancelAll](size_t,
                                                     httplib::DataSink &sink) {
        std::string out;
        bool failed = false;
        if (!stream->rolesSent) {
          // A chat stream opens with each choice's role, before any text.
          for (size_t i = 0; i < stream->choices.size(); ++i)
            out += chunk({{"finish_reason", nullptr},
                          {"delta", {{"role", "assistant"}, {"content", ""}}}},
                         i);
          stream->rolesSent = true;
        } else {
          // Reads the choices in turn until one has something to send: one
          // choice waits as long as the client check; several take short
          // turns.
          const size_t n = stream->choices.size();
          const auto wait = n == 1 ? kClientCheck : kClientCheck / 10;
          auto checked = std::chrono::steady_clock::now();
          while (out.empty()) {
            for (size_t i = 0; i < n && !failed; ++i) {
              Choice &c = stream->choices[i];
              if (c.done)
                continue;
              auto read = c.request->read(wait);
              if (!read) {
                cancelAll();
                return false;
              }
              out += events(c, i, *read, failed);
            }
            if (failed ||
                std::all_of(stream->choices.begin(), stream->choices.end(),
                            [](const Choice &c) { return c.done; }))
              break;
            if (std::chrono::steady_clock::now() - checked >= kClientCheck) {
              checked = std::chrono::steady_clock::now();
              if (HttpServer::clientGone()) {
                cancelAll(); // the client went away: stop generating
                return false;
              }
            }
          }
        }
        const bool done =
            failed ||
            std::all_of(stream->choices.begin(), stream->choices.end(),
                        [](const Choice &c) { return c.done; });
        if (done) {
          if (failed)
            cancelAll();
          else
            out += usageChunk(stream->choices);
          out += "data: [DONE]\n\n";
        }
        if (!sink.write(out.data(), out.size())) {
          cancelAll(); // the client went away: stop generating
          return false;
        }
        if (done)
          sink.done();
        return true;
      },
      // However the response ends (httplib may end it without asking the
      // provider: stop(), a client that stopped reading), requests still
      // running have nobody to run for.
      [cancelAll](bool) { cancelAll(); });
}

} // namespace nfrun
