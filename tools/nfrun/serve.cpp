// nfrun serve: an OpenAI-compatible HTTP server (completions and chat
// completions) over one model.
//
// HTTP threads (HttpServer: cpp-httplib with per-request read deadlines and
// a body limit) parse and validate requests (serve_request.cpp: a chat
// request's messages become a prompt through the model's chat template)
// and submit them to libnf's serving engine (nf_engine), whose thread has
// the model's steps and runs every admitted request in shared steps:
// running requests' next tokens, then prompt chunks within a token budget.
// The engine's text (stop strings and UTF-8 held back) is streamed
// (server-sent events) or returned at the end. A request whose client goes
// away is cancelled. SIGINT / SIGTERM stop listening, end waiting requests,
// let running ones finish for a grace period, then end the rest; the
// process exits within the grace period and a few seconds.
#include "commands.h"
#include "http_server.h"
#include "reasoning_parser.h"
#include "serve_metrics.h"
#include "serve_request.h"
#include "tool_parser.h"

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#ifndef NF_VERSION
#define NF_VERSION "unknown"
#endif

namespace nfrun {
namespace {

using json = nlohmann::json;

/// How often a waiting handler checks that its client is still there.
constexpr std::chrono::milliseconds kClientCheck{100};

/// JSON text of a response: generated text may hold bytes that are not
/// UTF-8 (a byte-level tokenizer's pieces of a character, cut off by
/// max_tokens, or a sampled byte sequence that is none), which nlohmann's
/// strict dump rejects; they become U+FFFD, as clients' decoders do.
std::string dumpJson(const json &j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t unixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void sendError(httplib::Response &res, int status, const std::string &message,
               const std::string &type = "invalid_request_error") {
  res.status = status;
  res.set_content(
      dumpJson(json{{"error", {{"message", message}, {"type", type}}}}),
      "application/json");
}

/// Whether a and b are equal, in a time that does not depend on where
/// they differ (an API key must not be guessable byte by byte).
bool constantTimeEqual(const std::string &a, const std::string &b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |=
        static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0 && !b.empty();
}

/// A request's traffic class, named by the observer's user data: one
/// static object per (intent, priority), so that it outlives any request.
struct TrafficClass {
  Intent intent;
  PriorityClass priority;
};
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

/// A chat answer split, piece by piece, into reasoning and content
/// (--reasoning-parser) and the content's tool calls (tools with
/// tool_choice auto), kept for the end.
struct AnswerSplit {
  std::unique_ptr<ReasoningParser> reasoning;
  std::unique_ptr<ToolCallStream> tools;
  nlohmann::ordered_json toolSchemas;
  bool parallel = true;

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
    if (tools) {
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
      (policy.reasoningParser.empty() && p.toolCalls != ToolCalls::Auto))
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
  return split;
}

/// The finish_reason of an OpenAI response.
const char *finishReason(nf_finish_reason reason) {
  return reason == NF_FINISH_LENGTH ? "length" : "stop";
}

/// Answers a completion (`chat` false) or chat completion request: submits
/// it to the engine and waits for the whole text, or streams it as
/// server-sent events.
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
  nf_status code = NF_OK;
  auto submitted = engine.submit(p.params, &code);
  if (!submitted) {
    switch (code) {
    case NF_ERR_CAPACITY:
      res.set_header("Retry-After", "1");
      return sendError(res, 429,
                       "the server is busy: its queue of waiting requests is "
                       "full (--max-queue); retry later",
                       "rate_limit_error");
    case NF_ERR_UNAVAILABLE:
      return sendError(res, 503, "the server is shutting down", "server_error");
    case NF_ERR_INVALID_ARGUMENT:
      return sendError(res, 400, submitted.message());
    default:
      return sendError(res, 500, submitted.message(), "server_error");
    }
  }
  auto request = std::make_shared<nf::ServingRequest>(std::move(*submitted));
  // The response object (streamed: a chunk) around its one choice.
  auto response = [id, created, name, chat](const json &choice, bool chunk) {
    json c = choice;
    c["index"] = 0;
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
    // Waits for the end, and stops the request when its client goes away.
    nf::RequestOutput all;
    auto checked = std::chrono::steady_clock::now();
    for (;;) {
      auto o = request->read(kClientCheck);
      if (!o)
        return sendError(res, 500, o.message(), "server_error");
      all.tokens.insert(all.tokens.end(), o->tokens.begin(), o->tokens.end());
      all.text += o->text;
      if (o->finished()) {
        o->tokens = std::move(all.tokens);
        o->text = std::move(all.text);
        all = std::move(*o);
        break;
      }
      if (std::chrono::steady_clock::now() - checked >= kClientCheck) {
        checked = std::chrono::steady_clock::now();
        if (HttpServer::clientGone())
          request->cancel();
      }
    }
    if (all.finishReason != NF_FINISH_STOP &&
        all.finishReason != NF_FINISH_LENGTH)
      return sendError(res,
                       all.finishReason == NF_FINISH_UNAVAILABLE ? 503 : 500,
                       errorText(all), "server_error");
    json choice = {{"finish_reason", finishReason(all.finishReason)}};
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
        choice["finish_reason"] = "tool_calls";
      }
      choice["message"] = std::move(message);
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", all.text}};
    } else {
      choice["text"] = all.text;
    }
    if (p.returnTokenIds) { // as vLLM's return_token_ids
      choice["prompt_token_ids"] = p.params.prompt;
      choice["token_ids"] = all.tokens;
    }
    json out = response(choice, false);
    out["usage"] = usageJson(all);
    out["reasoning_trace"] = traceJson(all);
    res.set_header("X-Actual-New-Tokens", std::to_string(all.completionTokens));
    res.set_content(dumpJson(out), "application/json");
    return;
  }
  // One event: a piece of text (finish null) or the end (text empty).
  // With return_token_ids each event also lists its new token ids (so a
  // model without a tokenizer streams a chunk per token).
  // With a reasoning parser, a chat piece's text is split into the delta's
  // reasoning_content and content (either may be absent).
  // The last event (a finish_reason) also carries the reasoning_trace.
  auto event = [response, chat](const std::string &text, const json &finish,
                                const json &ids = nullptr,
                                const ReasoningParser::Delta *split = nullptr,
                                const json &trace = nullptr) {
    json choice = {{"finish_reason", finish}};
    if (!ids.is_null())
      choice["token_ids"] = ids;
    if (!chat) {
      choice["text"] = text;
    } else if (!finish.is_null()) {
      choice["delta"] = json::object();
    } else if (split) {
      choice["delta"] = json::object();
      if (!split->reasoning.empty())
        choice["delta"]["reasoning_content"] = split->reasoning;
      if (!split->content.empty())
        choice["delta"]["content"] = split->content;
    } else {
      choice["delta"] = {{"content", text}};
    }
    json chunk = response(choice, true);
    if (!trace.is_null())
      chunk["reasoning_trace"] = trace;
    return "data: " + dumpJson(chunk) + "\n\n";
  };
  std::shared_ptr<AnswerSplit> parser = answerSplit(p, policy);
  auto roleSent = std::make_shared<bool>(!chat);
  const bool returnTokenIds = p.returnTokenIds;
  // stream_options.include_usage: a last chunk with no choices and the
  // usage, as OpenAI's.
  auto usageChunk = [id, created, name, chat, include = p.includeUsage](
                        const nf::RequestOutput &o) -> std::string {
    if (!include)
      return "";
    json u = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", name},
              {"choices", json::array()},
              {"usage", usageJson(o)}};
    return "data: " + dumpJson(u) + "\n\n";
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [request, roleSent, returnTokenIds, event, response, errorText,
       usageChunk, parser](size_t, httplib::DataSink &sink) {
        std::string events;
        nf::RequestOutput o;
        if (!*roleSent) {
          // A chat stream opens with the role, before any text.
          json choice = {{"finish_reason", nullptr},
                         {"delta", {{"role", "assistant"}, {"content", ""}}}};
          events += "data: " + dumpJson(response(choice, true)) + "\n\n";
          *roleSent = true;
        } else {
          auto checked = std::chrono::steady_clock::now();
          for (;;) {
            auto read = request->read(kClientCheck);
            if (!read) {
              request->cancel();
              return false;
            }
            o = std::move(*read);
            if (o.finished() || !o.text.empty() ||
                (returnTokenIds && !o.tokens.empty()))
              break;
            // Nothing new, or tokens whose text is held back.
            if (std::chrono::steady_clock::now() - checked >= kClientCheck) {
              checked = std::chrono::steady_clock::now();
              if (HttpServer::clientGone()) {
                request->cancel(); // the client went away: stop generating
                return false;
              }
            }
          }
        }
        const json ids = returnTokenIds ? json(o.tokens) : json(nullptr);
        std::vector<ToolCall> calls;
        if (parser) {
          ReasoningParser::Delta d = parser->feed(o.text, o.finished(), calls);
          // Text held back inside a tag sends nothing yet (unless ids).
          if (!d.empty() || (returnTokenIds && !o.tokens.empty()))
            events += event(o.text, nullptr, ids, &d);
          if (!calls.empty()) {
            json choice = {
                {"finish_reason", nullptr},
                {"delta", {{"tool_calls", toolCallsJson(calls, true)}}}};
            events += "data: " + dumpJson(response(choice, true)) + "\n\n";
          }
        } else if (!o.text.empty() || (returnTokenIds && !o.tokens.empty())) {
          events += event(o.text, nullptr, ids);
        }
        const bool done = o.finished();
        if (done) {
          if (o.finishReason != NF_FINISH_STOP &&
              o.finishReason != NF_FINISH_LENGTH)
            events += "data: " +
                      dumpJson(json{{"error",
                                     {{"message", errorText(o)},
                                      {"type", "server_error"}}}}) +
                      "\n\n";
          else
            events += event("",
                            calls.empty() ? finishReason(o.finishReason)
                                          : "tool_calls",
                            nullptr, nullptr, traceJson(o)) +
                      usageChunk(o);
          events += "data: [DONE]\n\n";
        }
        if (!sink.write(events.data(), events.size())) {
          request->cancel(); // the client went away: stop generating
          return false;
        }
        if (done)
          sink.done();
        return true;
      },
      // However the response ends (httplib may end it without asking the
      // provider: stop(), a client that stopped reading), a request that
      // is still running has nobody to run for.
      [request](bool) { request->cancel(); });
}

/// Records the engine's events into the server's metrics (on the engine's
/// thread).
void recordEvent(const nf_engine_event *e, void *data) {
  auto &metrics = *static_cast<ServeMetrics *>(data);
  switch (e->kind) {
  case NF_EVENT_STEP:
    metrics.step(e->step_tokens, e->expert_calls);
    break;
  case NF_EVENT_FIRST_TOKEN:
    metrics.firstToken(e->seconds);
    break;
  case NF_EVENT_TOKEN:
    metrics.nextToken(e->seconds);
    break;
  case NF_EVENT_FINISHED: {
    const auto *c = static_cast<const TrafficClass *>(e->request_user_data);
    metrics.finished(e->finish_reason == NF_FINISH_STOP     ? "stop"
                     : e->finish_reason == NF_FINISH_LENGTH ? "length"
                                                            : "abort",
                     intentName(c ? c->intent : Intent::None),
                     priorityName(c ? c->priority : PriorityClass::None),
                     e->seconds, e->prompt_tokens, e->completion_tokens,
                     e->expert_calls, e->expert_budget);
    break;
  }
  case NF_EVENT_PREEMPTED:
    metrics.preempted();
    break;
  }
}

/// Exits the process at a deadline unless disarmed: the bound on a stop
/// whose step does not end. Constructed before everything it guards, so
/// that it is destroyed (disarmed) last.
class ExitWatchdog {
public:
  ExitWatchdog()
      : thread_([this] {
          std::unique_lock<std::mutex> lock(mu_);
          for (;;) {
            if (quit_)
              return;
            if (!deadline_) {
              cv_.wait(lock);
            } else if (cv_.wait_until(lock, *deadline_) ==
                           std::cv_status::timeout &&
                       !quit_ &&
                       std::chrono::steady_clock::now() >= *deadline_) {
              std::fprintf(stderr,
                           "nfrun serve: still running %lld s after "
                           "the grace period: exiting\n",
                           static_cast<long long>(kForceAfter.count()));
              std::_Exit(1);
            }
          }
        }) {}
  ~ExitWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Exits at `graceEnd` + kForceAfter.
  void arm(std::chrono::steady_clock::time_point graceEnd) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      deadline_ = graceEnd + kForceAfter;
    }
    cv_.notify_all();
  }

private:
  static constexpr std::chrono::seconds kForceAfter{5};
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  bool quit_ = false;
  std::thread thread_; // last: starts after the members it uses
};

/// Stops the server on SIGINT or SIGTERM: a thread that waits for them
/// (blocked in every thread from the start of runServe), so that the stop
/// runs outside a signal handler. Before serve() is called (the model is
/// loading) a signal ends the process at once. Then: the engine stops
/// admitting and gives running requests the grace period, the server stops
/// once they are done (streams end with their last events) or the grace
/// period is over, and the watchdog bounds the rest. A second signal exits
/// at once.
class SignalStop {
public:
  SignalStop(ExitWatchdog &watchdog, std::chrono::milliseconds grace)
      : watchdog_(watchdog), grace_(grace) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    thread_ = std::thread([this] { run(); });
  }
  ~SignalStop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    pthread_kill(thread_.native_handle(), SIGTERM); // ends a waiting sigwait
    thread_.join();
  }
  /// The server has stopped: a signal from now on does nothing here (the
  /// watchdog still bounds the exit).
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
  }
  /// From now on a signal stops `server` and drains `engine`.
  void serve(HttpServer &server, nf::ServingEngine &engine) {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = &server;
    engine_ = &engine;
  }

private:
  void run() {
    int sig = 0;
    sigwait(&set_, &sig);
    std::unique_lock<std::mutex> lock(mu_);
    if (quit_)
      return;
    if (!server_) {
      std::fprintf(stderr, "nfrun serve: %s before serving: exiting\n",
                   sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::_Exit(0);
    }
    std::fprintf(stderr,
                 "nfrun serve: %s: stopping (running requests have %.3g s "
                 "to finish)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", grace_.count() / 1000.0);
    const auto deadline = std::chrono::steady_clock::now() + grace_;
    watchdog_.arm(deadline);
    engine_->shutdown(grace_);
    // A second signal: exit now.
    std::thread([set = set_] {
      int again = 0;
      sigwait(&set, &again);
      std::_Exit(1);
    }).detach();
    // The streams still running end with their last events before the
    // server stops writing.
    while (!quit_ && !engine_->stats().drained &&
           std::chrono::steady_clock::now() < deadline + kLastEvents)
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    // The handlers write their requests' last events.
    if (!quit_)
      cv_.wait_for(lock, kLastEvents);
    // listen_after_bind may not have started yet: stop() is then lost.
    while (!quit_ && !server_->is_running())
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    if (!quit_)
      server_->stop();
  }

  /// Time for the handlers to write their requests' last events.
  static constexpr std::chrono::milliseconds kLastEvents{500};
  ExitWatchdog &watchdog_;
  std::chrono::milliseconds grace_;
  sigset_t set_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  HttpServer *server_ = nullptr;
  nf::ServingEngine *engine_ = nullptr;
  std::thread thread_;
};

} // namespace

int runServe(const ServeFlags &f) {
  // Blocked before any thread starts, so that every thread inherits it and
  // only SignalStop's receives them.
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  ExitWatchdog watchdog; // first: destroyed (disarmed) last
  SignalStop stop(watchdog, std::chrono::milliseconds(
                                static_cast<int64_t>(f.shutdownGrace * 1000)));

  nf::ModelParams params = modelParams(f.common);
  params.chatTemplatePath = f.chatTemplate;
  params.kvPages = f.kvPages;
  params.syntheticWeights = f.syntheticWeights;
  params.syntheticSeed = f.seed;
  auto model = nf::Model::load(f.common.plan, params);
  if (!model)
    return fail(model.message());
  // The tokenizer's own template, when broken, only costs the chat
  // endpoint: said once here (a refused chat request says to look here).
  if (std::string why = model->chatTemplateError(); !why.empty())
    std::fprintf(stderr,
                 "nfrun: warning: %s; /v1/chat/completions is unavailable\n",
                 why.c_str());
  if (const nf_generation_defaults g = model->generationDefaults(); g.set) {
    std::string said;
    auto add = [&](unsigned bit, const char *key, double v) {
      if (g.set & bit)
        said += (said.empty() ? "" : ", ") + std::string(key) + " " +
                std::to_string(v).substr(0, 6);
    };
    add(NF_GEN_TEMPERATURE, "temperature", g.temperature);
    add(NF_GEN_TOP_P, "top_p", g.top_p);
    add(NF_GEN_TOP_K, "top_k", g.top_k);
    add(NF_GEN_MIN_P, "min_p", g.min_p);
    std::fprintf(stderr,
                 "nfrun: requests that omit them get generation_config.json's "
                 "%s\n",
                 said.c_str());
  }
  const std::string name = f.modelName.empty() ? model->name() : f.modelName;
  const int maxBatch =
      std::max(1, f.maxBatch > 0 ? std::min(f.maxBatch, model->maxSequences())
                                 : model->maxSequences());
  ServePolicy policy;
  policy.maxNewTokens = f.maxNewTokens;
  policy.reasoningParser = f.reasoningParser;
  if (!f.defaultChatTemplateKwargs.empty()) {
    policy.chatTemplateKwargs = nlohmann::ordered_json::parse(
        f.defaultChatTemplateKwargs, nullptr, /*allow_exceptions=*/false);
    if (policy.chatTemplateKwargs.is_discarded() ||
        !policy.chatTemplateKwargs.is_object())
      return fail("--default-chat-template-kwargs: expected a JSON object, "
                  "like '{\"enable_thinking\": false}'");
  }
  if (std::string err = parseIntentBudget(f.intentBudget, policy); !err.empty())
    return fail(err);
  ServeMetrics metrics(name,
                       MoeShape{model->numMoeLayers(), model->numExperts(),
                                model->expertsPerToken()});
  nf::EngineParams ep;
  ep.maxBatch = maxBatch;
  ep.maxQueue = f.maxQueue;
  ep.maxNewTokens = f.maxNewTokens;
  ep.maxWaitMs = static_cast<int64_t>(f.maxWaitMs);
  ep.maxBatchedTokens = std::max<int64_t>(f.maxBatchedTokens, maxBatch);
  ep.observer = recordEvent;
  ep.observerData = &metrics;
  ep.prefixCaching = f.prefixCaching;
  ep.prefixCacheBlock = f.prefixCacheBlock;
  auto engine = nf::ServingEngine::create(*model, ep);
  if (!engine)
    return fail(engine.message());

  HttpLimits limits;
  limits.maxBodyBytes = static_cast<size_t>(f.maxBodyBytes);
  limits.requestReadTimeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.readTimeout * 1000));
  HttpServer server(limits);
  std::atomic<int64_t> nextId{0};
  const LoadedRequestModel requestModel(*model);
  server.Get("/health", [&](const httplib::Request &, httplib::Response &res) {
    const nf_engine_stats s = engine->stats();
    res.status = s.draining ? 503 : 200;
    res.set_content(
        dumpJson(json{{"status", s.draining ? "stopping" : "ok"},
                      {"queued", s.waiting},
                      {"running", s.running},
                      {"sequences", s.live_sequences - s.prefix_cache_entries},
                      {"prefix_cache_snapshots", s.prefix_cache_entries},
                      {"max_batch", maxBatch},
                      {"kv_pages", s.kv_pages},
                      {"kv_pages_free", s.kv_free_pages},
                      {"preemptions", s.preemptions},
                      {"steps", s.steps},
                      {"peak_batch", s.peak_batch}}),
        "application/json");
  });
  server.Get("/metrics", [&](const httplib::Request &, httplib::Response &res) {
    const nf_engine_stats s = engine->stats();
    metrics.setLoad(
        s.running, s.waiting,
        s.kv_pages > 0 ? 1.0 - static_cast<double>(s.kv_free_pages) / s.kv_pages
                       : 0.0);
    metrics.setPrefixCache(s.prefix_cache_queries, s.prefix_cache_hits,
                           s.prefix_cache_entries);
    if (model->numMoeLayers() > 0)
      if (auto used = engine->expertUtilization(*model); used)
        metrics.setExpertUtilization(*used);
    res.set_content(metrics.text(), "text/plain; version=0.0.4");
  });
  server.set_logger(
      [&](const httplib::Request &, const httplib::Response &res) {
        if (res.status >= 400)
          metrics.httpError(res.status);
      });
  // --api-key: /v1/* need "Authorization: Bearer KEY"; /health and
  // /metrics stay open, as vLLM's. Checked in the handlers, after httplib
  // has read the body (refused before, the body's bytes would be read as
  // the connection's next request).
  auto authorized = [key = f.apiKey](const httplib::Request &req,
                                     httplib::Response &res) {
    if (key.empty() || constantTimeEqual(req.get_header_value("Authorization"),
                                         "Bearer " + key))
      return true;
    sendError(res, 401,
              "a valid API key is required: Authorization: Bearer <key>",
              "authentication_error");
    return false;
  };
  server.Get(
      "/v1/models", [&](const httplib::Request &req, httplib::Response &res) {
        if (!authorized(req, res))
          return;
        json m = {{"id", name},
                  {"object", "model"},
                  {"created", unixTime()},
                  {"owned_by", "nf"}};
        res.set_content(
            dumpJson(json{{"object", "list"}, {"data", json::array({m})}}),
            "application/json");
      });
  // vLLM's tokenizer endpoints and /version.
  auto tokenizerEndpoint = [&](auto handler) {
    return [&, handler](const httplib::Request &req, httplib::Response &res) {
      if (!authorized(req, res))
        return;
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded())
        return sendError(res, 400, "the body is not valid JSON");
      auto answer = handler(body, requestModel, policy);
      if (auto *err = std::get_if<std::string>(&answer))
        return sendError(res, 400, *err);
      res.set_content(dumpJson(std::get<json>(answer)), "application/json");
    };
  };
  server.Post("/tokenize", tokenizerEndpoint(tokenizeRequest));
  server.Post("/detokenize",
              tokenizerEndpoint([](const json &body, const RequestModel &model,
                                   const ServePolicy &) {
                return detokenizeRequest(body, model);
              }));
  server.Get("/version", [&](const httplib::Request &, httplib::Response &res) {
    res.set_content(dumpJson(json{{"version", NF_VERSION}}),
                    "application/json");
  });
  // vLLM's: frees every prefix-cache snapshot (after a benchmark's warm-up,
  // say); the key guards it where one is set.
  server.Post("/reset_prefix_cache",
              [&](const httplib::Request &req, httplib::Response &res) {
                if (!authorized(req, res))
                  return;
                engine->resetPrefixCache();
                res.set_content("{}", "application/json");
              });
  server.Post("/v1/completions",
              [&](const httplib::Request &req, httplib::Response &res) {
                if (authorized(req, res))
                  serveCompletion(req, res, false, requestModel, policy,
                                  *engine, name, nextId);
              });
  server.Post("/v1/chat/completions",
              [&](const httplib::Request &req, httplib::Response &res) {
                if (authorized(req, res))
                  serveCompletion(req, res, true, requestModel, policy, *engine,
                                  name, nextId);
              });
  server.set_exception_handler([](const httplib::Request &,
                                  httplib::Response &res,
                                  std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception &e) {
      what = e.what();
    } catch (...) {
    }
    sendError(res, 500, "internal error: " + what, "server_error");
  });
  const int64_t maxBody = f.maxBodyBytes;
  server.set_error_handler(
      [maxBody](const httplib::Request &, httplib::Response &res) {
        if (!res.body.empty())
          return;
        if (res.status == 404)
          sendError(res, 404,
                    "unknown endpoint (this server has /v1/completions, "
                    "/v1/chat/completions, /v1/models, /tokenize, "
                    "/detokenize, /version, /health, /metrics)");
        else if (res.status == 413)
          sendError(res, 413,
                    "the request body is larger than " +
                        std::to_string(maxBody) + " bytes (--max-body-bytes)");
        else
          sendError(res, res.status, "bad request");
      });

  // Every request holds an HTTP worker thread until its completion ends
  // (waiting for it, or writing its stream): threads for every sequence
  // slot, every queued request, and the cheap endpoints.
  const size_t httpThreads =
      static_cast<size_t>(maxBatch) + static_cast<size_t>(f.maxQueue) + 8;
  server.new_task_queue = [httpThreads] {
    return new httplib::ThreadPool(httpThreads);
  };

  if (!server.bind(f.host, f.port))
    return fail(f.host + ":" + std::to_string(f.port) +
                ": cannot listen (address in use or not available)");
  stop.serve(server, *engine);
  std::fprintf(stderr,
               "nfrun serve: %s (%s backend, up to %d sequences at once, "
               "%lld tokens a step) on http://%s:%d\n",
               name.c_str(), model->backend().c_str(), maxBatch,
               static_cast<long long>(ep.maxBatchedTokens), f.host.c_str(),
               f.port);
  bool ok = false;
  try { // httplib starts its worker threads here
    ok = server.listen_after_bind();
  } catch (const std::exception &e) {
    stop.finish();
    engine->shutdown(std::chrono::milliseconds(0));
    return fail(std::string("cannot start the HTTP worker threads: ") +
                e.what());
  }
  stop.finish(); // before the server and the engine go
  std::fprintf(stderr, "nfrun serve: stopped\n");
  return ok ? 0 : fail("the server stopped with an error");
}

} // namespace nfrun
