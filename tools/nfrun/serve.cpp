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
#include "serve_completion.h"
#include "serve_metrics.h"
#include "serve_request.h"

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

/// Whether a and b are equal, in a time that does not depend on where
/// they differ (an API key must not be guessable byte by byte).
bool constantTimeEqual(const std::string &a, const std::string &b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |=
        static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0 && !b.empty();
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
  params.gpuMemoryUtilization = f.kvPages > 0 ? 0.0 : f.gpuMemoryUtilization;
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
                      {"prefix_cache_bytes", s.prefix_cache_bytes},
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
                           s.prefix_cache_evictions, s.prefix_cache_entries,
                           s.prefix_cache_bytes);
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
  // vLLM's /tokenizer_info: the special tokens, what lm-evaluation-harness's
  // remote tokenizer reads (with /tokenize and /detokenize).
  server.Get("/tokenizer_info", [&](const httplib::Request &req,
                                    httplib::Response &res) {
    if (!authorized(req, res))
      return;
    if (!model->hasTokenizer())
      return sendError(res, 400, "this model has no tokenizer");
    auto token = [&](int32_t id) {
      return id < 0 ? json(nullptr) : json(requestModel.tokenString(id));
    };
    json info = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"eos_token", token(model->eos())},
                 {"bos_token", token(model->bos())},
                 {"pad_token", nullptr}};
    if (model->maxContext() >= 0)
      info["model_max_length"] = model->maxContext();
    res.set_content(dumpJson(info), "application/json");
  });
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
  if (model->kvPages() > 0)
    std::fprintf(stderr,
                 "nfrun serve: KV cache: %lld pages, %lld tokens of context "
                 "in all\n",
                 static_cast<long long>(model->kvPages()),
                 static_cast<long long>(model->maxContext()));
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
