// nfrun serve's request parsing (see serve_request.cpp).
#pragma once

#include "serve_scheduler.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <variant>

namespace nfrun {

/// A validated request, or the one-line message of a 400 answer.
using Parsed = std::variant<std::shared_ptr<Request>, std::string>;

/// A /v1/completions body: prompt (text or token ids), max_tokens,
/// temperature, top_p, top_k, min_p, seed, n, stream, stop.
Parsed parseCompletion(const nlohmann::json &body, const nf::Model &model);
/// A /v1/chat/completions body: messages rendered with the model's chat
/// template, then the fields of /v1/completions (and
/// max_completion_tokens).
Parsed parseChat(const nlohmann::json &body, const nf::Model &model);

} // namespace nfrun
