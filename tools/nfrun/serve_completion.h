// nfrun serve's completion endpoints: /v1/completions and
// /v1/chat/completions, from a parsed request (serve_request.h) to the
// engine and back as one JSON answer or server-sent events; and what the
// rest of the server shares with them.
#pragma once

#include "http_server.h"
#include "serve_request.h"

#include "nf/nf.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace nfrun {

/// How often a waiting handler checks that its client is still there.
constexpr std::chrono::milliseconds kClientCheck{100};

/// JSON text of a response: generated text may hold bytes that are not
/// UTF-8 (a byte-level tokenizer's pieces of a character, cut off by
/// max_tokens, or a sampled byte sequence that is none), which nlohmann's
/// strict dump rejects; they become U+FFFD, as clients' decoders do.
std::string dumpJson(const nlohmann::json &j);

/// Seconds since the Unix epoch (responses' `created`).
int64_t unixTime();

/// An OpenAI error answer.
void sendError(httplib::Response &res, int status, const std::string &message,
               const std::string &type = "invalid_request_error");

/// A request's traffic class, named by the observer's user data: one
/// static object per (intent, priority), so that it outlives any request.
struct TrafficClass {
  Intent intent;
  PriorityClass priority;
};
const TrafficClass *trafficClass(Intent intent, PriorityClass priority);

/// Answers a completion (`chat` false) or chat completion request: submits
/// it to the engine (n of them for `n` choices) and waits for the whole
/// text, or streams it as server-sent events.
void serveCompletion(const httplib::Request &req, httplib::Response &res,
                     bool chat, const RequestModel &model,
                     const ServePolicy &policy, nf::ServingEngine &engine,
                     const std::string &name, std::atomic<int64_t> &nextId);

} // namespace nfrun
