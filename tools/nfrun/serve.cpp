// nfrun serve: an OpenAI-compatible HTTP server (completions and chat
// completions) over one model.
//
// HTTP threads (cpp-httplib) parse and validate requests (a chat request's
// messages become a prompt through the model's chat template) and hand them
// to one scheduler thread, which owns the model and batches every active
// request into each step (continuous batching): new requests join with their
// whole prompt, running ones with their last token, so a long prompt and
// many decoding sequences share the same model calls. Each request samples
// with its own sampler; text is produced incrementally from the generated
// tokens and streamed (server-sent events) or returned at the end.
#include "commands.h"

#include "nf/nf.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

namespace nfrun {
namespace {

using json = nlohmann::json;

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

/// One completion request, shared by its HTTP thread and the scheduler.
struct Request {
  // Set by the HTTP thread before queueing.
  std::vector<int32_t> prompt;
  int32_t maxTokens = 16;
  nf::SamplerParams sampling;
  std::vector<std::string> stops;
  bool stream = false;
  bool chat = false;     // /v1/chat/completions
  bool roleSent = false; // a chat stream's first chunk (HTTP thread only)

  // Scheduler side.
  std::optional<nf::Sampler> sampler;
  int32_t seq = -1;
  std::vector<int32_t> generated;
  std::string decoded; // text of `generated` (raw bytes)

  // Guarded by mu: text ready for the client, and the end of the request.
  std::mutex mu;
  std::condition_variable cv;
  std::string text; // everything the client may see so far
  size_t sent = 0;  // bytes of `text` already streamed
  bool done = false;
  std::string finishReason;           // "stop" or "length"
  std::string error;                  // non-empty: the request failed
  std::atomic<bool> cancelled{false}; // the streaming client went away
};

/// Index of the first stop string in `text` that ends after `from`, or
/// npos (text before `from` was searched at earlier tokens).
size_t findStop(const std::string &text, const std::vector<std::string> &stops,
                size_t from) {
  size_t best = std::string::npos;
  for (const std::string &s : stops)
    best = std::min(
        best, text.find(s, from >= s.size() ? from - s.size() + 1 : 0));
  return best;
}

/// Longest suffix of `text` that is a proper prefix of a stop string: held
/// back from streaming until it is known not to start a stop string.
size_t heldBack(const std::string &text,
                const std::vector<std::string> &stops) {
  size_t hold = 0;
  for (const std::string &s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return hold;
}

/// Bytes at the end of `text` that begin an incomplete UTF-8 character.
size_t incompleteUtf8(const std::string &text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80)
      continue; // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

class Scheduler {
public:
  Scheduler(nf::Model &model, int maxBatch)
      : model_(model), maxBatch_(maxBatch), worker_([this] { loop(); }) {}
  ~Scheduler() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  /// Requests waiting to join, running, and the largest step's batch so
  /// far (GET /health).
  struct Stats {
    int queued = 0, running = 0, peakBatch = 0;
  };
  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {static_cast<int>(pending_.size()), running_, peakBatch_};
  }

  void submit(std::shared_ptr<Request> r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(std::move(r));
    }
    cv_.notify_all();
  }

private:
  void finish(Request &r, const std::string &reason, const std::string &error) {
    if (r.seq >= 0)
      (void)model_.removeSequence(r.seq);
    r.seq = -1;
    std::lock_guard<std::mutex> lock(r.mu);
    r.done = true;
    r.finishReason = reason;
    r.error = error;
    r.cv.notify_all();
  }

  /// The bytes the last of r.generated adds to r.decoded: the decode of a
  /// short tail of the completion with and without it, so that the pieces
  /// come out as in one decode of the whole text (the tokenizer's decoders:
  /// byte-level, or none, which joins pieces with a space), at constant
  /// work per token (the whole completion was decoded again at every
  /// token). A tail that decodes to nothing before the token (every token
  /// in it skipped: specials) says nothing about the joint: then the whole
  /// completion.
  nf::StatusOr<std::string> newBytes(const Request &r) {
    constexpr size_t kTail = 8;
    const size_t n = r.generated.size();
    const std::vector<int32_t> tail(
        r.generated.begin() + static_cast<ptrdiff_t>(n > kTail + 1
                                                         ? n - kTail - 1
                                                         : 0),
        r.generated.end());
    constexpr int kFlags = NF_DETOKENIZE_SKIP_SPECIAL | NF_DETOKENIZE_RAW_BYTES;
    auto after = model_.detokenize(tail, kFlags);
    if (!after)
      return after.status();
    auto before = model_.detokenize(
        std::vector<int32_t>(tail.begin(), tail.end() - 1), kFlags);
    if (!before)
      return before.status();
    if (before->empty() && tail.size() < n) {
      auto all = model_.detokenize(r.generated, kFlags);
      if (!all)
        return all.status();
      if (all->compare(0, r.decoded.size(), r.decoded) == 0)
        return all->substr(r.decoded.size());
      return model_.detokenize({r.generated.back()}, kFlags);
    }
    if (after->compare(0, before->size(), *before) == 0)
      return after->substr(before->size());
    return model_.detokenize({r.generated.back()}, kFlags);
  }

  /// Adds the sampled token to r; returns true when r is finished.
  bool accept(Request &r, int32_t token) {
    r.generated.push_back(token);
    const bool eos = model_.isEos(token);
    const size_t searched = r.decoded.size();
    if (!eos) {
      auto piece = newBytes(r);
      if (!piece) {
        finish(r, "", piece.message());
        return true;
      }
      r.decoded += *piece;
    }
    // What the client may see: the decoded text up to a stop string, less
    // a tail that may still start one or is part of a character. It only
    // grows (a held-back tail is what a later stop string would start
    // with), so r.text takes the new bytes instead of a copy of the whole.
    const std::string &decoded = r.decoded;
    size_t visible = decoded.size();
    std::string reason;
    if (r.cancelled.load()) {
      finish(r, "cancelled", "");
      return true;
    }
    if (size_t at = findStop(decoded, r.stops, searched);
        at != std::string::npos) {
      visible = at;
      reason = "stop";
    } else if (eos) {
      reason = "stop";
    } else if (static_cast<int32_t>(r.generated.size()) >= r.maxTokens ||
               (model_.maxContext() >= 0 &&
                model_.sequenceLength(r.seq) + 1 >= model_.maxContext())) {
      reason = "length";
    } else {
      visible -=
          std::max(heldBack(decoded, r.stops), incompleteUtf8(decoded));
    }
    {
      std::lock_guard<std::mutex> lock(r.mu);
      if (visible >= r.text.size())
        r.text.append(decoded, r.text.size(), visible - r.text.size());
      else
        r.text.resize(visible);
    }
    // Only a stream reads text before the end (finish wakes the others):
    // a wake-up per token and request cost the scheduler's thread time.
    if (r.stream)
      r.cv.notify_all();
    if (!reason.empty()) {
      finish(r, reason, "");
      return true;
    }
    return false;
  }

  void loop() {
    std::vector<std::shared_ptr<Request>> active;
    std::vector<int32_t> tokens;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return stopping_ || !pending_.empty() || !active.empty();
        });
        if (stopping_)
          break;
      }
      // Admit new requests while sequences are free.
      std::vector<std::shared_ptr<Request>> joining;
      {
        std::lock_guard<std::mutex> lock(mu_);
        while (!pending_.empty() &&
               static_cast<int>(active.size() + joining.size()) < maxBatch_) {
          joining.push_back(std::move(pending_.front()));
          pending_.pop_front();
        }
      }
      for (auto it = joining.begin(); it != joining.end();) {
        Request &r = **it;
        auto seq = model_.addSequence();
        auto sampler = nf::Sampler::create(r.sampling);
        if (!seq || !sampler) {
          finish(r, "", seq ? sampler.message() : seq.message());
          it = joining.erase(it);
          continue;
        }
        r.seq = *seq;
        r.sampler.emplace(std::move(*sampler));
        ++it;
      }
      // One step: the joining requests' prompts, the others' last tokens.
      std::vector<nf::SeqInput> batch;
      std::vector<std::shared_ptr<Request>> order;
      for (auto &r : active) {
        batch.push_back({r->seq, {r->generated.back()}});
        order.push_back(r);
      }
      for (auto &r : joining) {
        batch.push_back({r->seq, r->prompt});
        order.push_back(r);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_ = static_cast<int>(batch.size());
        peakBatch_ = std::max(peakBatch_, running_);
      }
      if (batch.empty())
        continue;
      // Greedy, small top-k and temperature-only samplers read only the
      // rows' best logits (or keys) where the backend ranks them on the
      // device.
      std::vector<nf::Sampler *> samplers;
      for (auto &r : order)
        samplers.push_back(&*r->sampler);
      if (nf::Status st = model_.decodeSample(batch, samplers, tokens); !st) {
        for (auto &r : order)
          finish(*r, "", st.message());
        active.clear();
        std::lock_guard<std::mutex> lock(mu_);
        running_ = 0;
        continue;
      }
      active.clear();
      for (size_t i = 0; i < order.size(); ++i) {
        Request &r = *order[i];
        if (tokens[i] < 0) {
          finish(r, "", "no token: every logit is -inf or NaN");
          continue;
        }
        if (!accept(r, tokens[i]))
          active.push_back(order[i]);
      }
      std::lock_guard<std::mutex> lock(mu_);
      running_ = static_cast<int>(active.size());
    }
    for (auto &r : active)
      finish(*r, "", "the server is shutting down");
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &r : pending_)
      finish(*r, "", "the server is shutting down");
  }

  nf::Model &model_;
  const int maxBatch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> pending_;
  bool stopping_ = false;
  int running_ = 0, peakBatch_ = 0; // guarded by mu_
  std::thread worker_; // last: starts after the members it uses
};

void sendError(httplib::Response &res, int status, const std::string &message,
               const std::string &type = "invalid_request_error") {
  res.status = status;
  res.set_content(
      dumpJson(json{{"error", {{"message", message}, {"type", type}}}}),
      "application/json");
}

/// The sampling and length fields of a request, shared by both endpoints:
/// max_tokens (chat: also max_completion_tokens, and by default the rest
/// of the context), temperature, top_p, top_k, min_p, seed, n, stream and
/// stop. `r.prompt` is set. An error message, or nullopt.
std::optional<std::string> parseSampling(const json &body,
                                         const nf::Model &model, Request &r) {
  if (r.prompt.empty())
    return std::string("the prompt has no tokens");
  auto number = [&](const char *key, double lo, double hi,
                    double &out) -> std::optional<std::string> {
    if (!body.contains(key) || body[key].is_null())
      return std::nullopt;
    if (!body[key].is_number())
      return "'" + std::string(key) + "' must be a number";
    out = body[key].get<double>();
    if (!(out >= lo && out <= hi)) {
      char range[64];
      std::snprintf(range, sizeof range, "[%.10g, %.10g]", lo, hi);
      return "'" + std::string(key) + "' must be in " + range;
    }
    return std::nullopt;
  };
  // -1: no limit of the request's own (chat's default: the context).
  double maxTokens = r.chat ? -1 : 16, temperature = 1.0, topP = 1.0, n = 1,
         seed = 0, topK = 0, minP = 0;
  for (auto err :
       {number("max_tokens", 1, 1 << 30, maxTokens),
        r.chat ? number("max_completion_tokens", 1, 1 << 30, maxTokens)
               : std::nullopt,
        number("temperature", 0, 100, temperature), number("top_p", 0, 1, topP),
        number("n", 1, 1, n), number("seed", 0, 9.0e15, seed),
        number("top_k", 0, 1 << 30, topK), number("min_p", 0, 1, minP)})
    if (err)
      return *err;
  // Context left after the prompt; a model without attention has no limit.
  int64_t room = int64_t{1} << 30;
  if (model.maxContext() >= 0) {
    room = model.maxContext() - static_cast<int64_t>(r.prompt.size());
    if (room < 1)
      return "the prompt has " + std::to_string(r.prompt.size()) +
             " tokens; this model's context is " +
             std::to_string(model.maxContext());
  }
  r.maxTokens = static_cast<int32_t>(
      maxTokens < 0 ? room : std::min<double>(maxTokens, room));
  r.sampling.temperature = static_cast<float>(temperature);
  r.sampling.topP = static_cast<float>(topP);
  r.sampling.topK = static_cast<int32_t>(topK);
  r.sampling.minP = static_cast<float>(minP);
  r.sampling.seed = static_cast<uint64_t>(seed);
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      return std::string("'stream' must be true or false");
    r.stream = body["stream"].get<bool>();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json &s = body["stop"];
    if (s.is_string())
      r.stops.push_back(s.get<std::string>());
    else if (s.is_array() && std::all_of(s.begin(), s.end(), [](const json &v) {
               return v.is_string();
             }))
      for (const json &v : s)
        r.stops.push_back(v.get<std::string>());
    else
      return std::string("'stop' must be a string or an array of strings");
    for (const std::string &s : r.stops)
      if (s.empty())
        return std::string("'stop' strings must not be empty");
  }
  return std::nullopt;
}

using Parsed = std::variant<std::shared_ptr<Request>, std::string>;

/// A validated /v1/completions request from its JSON body, or an error
/// message. Runs on the HTTP threads: it only reads the model (tokenizer,
/// sizes), which is immutable after loading, while the scheduler thread
/// runs it.
Parsed parseCompletion(const json &body, const nf::Model &model) {
  auto r = std::make_shared<Request>();
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (!body.contains("prompt"))
    return std::string("'prompt' is required");
  const json &p = body["prompt"];
  if (p.is_string()) {
    if (!model.hasTokenizer())
      return std::string("this model has no tokenizer: send 'prompt' as an "
                         "array of token ids");
    auto ids = model.tokenize(p.get<std::string>());
    if (!ids)
      return "prompt: " + ids.message();
    r->prompt = std::move(*ids);
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(),
                         [](const json &v) { return v.is_number_integer(); })) {
    for (const json &v : p) {
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= model.vocabSize())
        return "prompt: token id " + std::to_string(id) + " is not in [0, " +
               std::to_string(model.vocabSize()) + ")";
      r->prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    return std::string("'prompt' must be a string or a non-empty array of "
                       "token ids (one prompt per request)");
  }
  if (auto err = parseSampling(body, model, *r))
    return *err;
  return r;
}

/// The messages of a /v1/chat/completions request: role and content (a
/// string, or text parts, concatenated). Neither may hold a NUL character
/// (JSON's "\u0000"): the C API takes them as C strings.
std::variant<std::vector<nf::ChatMessage>, std::string>
parseMessages(const json &body) {
  if (!body.contains("messages"))
    return std::string("'messages' is required");
  const json &list = body["messages"];
  if (!list.is_array() || list.empty())
    return std::string("'messages' must be a non-empty array");
  std::vector<nf::ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const json &m = list[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      return where + " must be an object";
    if (!m.contains("role") || !m["role"].is_string())
      return where + ": 'role' must be a string";
    if (m.contains("tool_calls") && !m["tool_calls"].is_null() &&
        !m["tool_calls"].empty())
      return where + ": tool calls are not supported";
    nf::ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role.find('\0') != std::string::npos)
      return where + ": role must not contain NUL characters";
    const json content = m.value("content", json());
    if (content.is_string()) {
      msg.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (size_t k = 0; k < content.size(); ++k) {
        const json &part = content[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") ||
            !part["type"].is_string())
          return at + " must be an object with a 'type'";
        if (part["type"] != "text")
          return at + ": only text parts are supported, not '" +
                 part["type"].get<std::string>() + "'";
        if (!part.contains("text") || !part["text"].is_string())
          return at + ": 'text' must be a string";
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return where + ": 'content' must be a string or an array of text parts";
    }
    if (msg.content.find('\0') != std::string::npos)
      return where + ": content must not contain NUL characters";
    messages.push_back(std::move(msg));
  }
  return messages;
}

/// A validated /v1/chat/completions request: the messages rendered with the
/// model's chat template (and the generation prompt), tokenized without
/// special tokens (the template writes them, BOS included), then the same
/// fields as /v1/completions.
Parsed parseChat(const json &body, const nf::Model &model) {
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (!model.hasChatTemplate()) {
    if (std::string why = model.chatTemplateError(); !why.empty())
      return "this model's chat template cannot be used (" + why +
             "): start nfrun serve with --chat-template FILE (a Jinja chat "
             "template), or fix it; /v1/completions takes plain prompts";
    return std::string(
        "this model has no chat template: start nfrun serve with "
        "--chat-template FILE (a Jinja chat template), or put "
        "chat_template.jinja (or tokenizer_config.json with a "
        "\"chat_template\") next to its tokenizer.json; /v1/completions "
        "takes plain prompts");
  }
  if (!model.hasTokenizer())
    return std::string("this model has no tokenizer: chat completions need "
                       "one (use /v1/completions with token ids)");
  if (body.contains("tools") && !body["tools"].is_null() &&
      !body["tools"].empty())
    return std::string("'tools' are not supported");
  auto messages = parseMessages(body);
  if (auto *err = std::get_if<std::string>(&messages))
    return *err;
  auto text = model.applyChatTemplate(
      std::get<std::vector<nf::ChatMessage>>(messages), true);
  if (!text)
    return text.message();
  auto r = std::make_shared<Request>();
  r->chat = true;
  auto ids = model.tokenize(*text, false);
  if (!ids)
    return "prompt: " + ids.message();
  r->prompt = std::move(*ids);
  if (auto err = parseSampling(body, model, *r))
    return *err;
  return r;
}

/// Answers a completion (`chat` false) or chat completion request: queues
/// it and waits for the whole text, or streams it as server-sent events.
void serveCompletion(const httplib::Request &req, httplib::Response &res,
                     bool chat, const nf::Model &model, Scheduler &scheduler,
                     const std::string &name, std::atomic<int64_t> &nextId) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded())
    return sendError(res, 400, "the body is not valid JSON");
  Parsed parsed = chat ? parseChat(body, model) : parseCompletion(body, model);
  if (auto *err = std::get_if<std::string>(&parsed))
    return sendError(res, 400, *err);
  std::shared_ptr<Request> r = std::get<std::shared_ptr<Request>>(parsed);
  const bool stream = r->stream;
  const std::string id =
      (chat ? "chatcmpl-" : "cmpl-") + std::to_string(nextId++);
  const int64_t created = unixTime();
  const size_t promptTokens = r->prompt.size();
  scheduler.submit(r);
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
  if (!stream) {
    std::unique_lock<std::mutex> lock(r->mu);
    r->cv.wait(lock, [&] { return r->done; });
    if (!r->error.empty())
      return sendError(res, 500, r->error, "server_error");
    json choice = {{"finish_reason", r->finishReason}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", r->text}};
    else
      choice["text"] = r->text;
    json out = response(choice, false);
    out["usage"] = {{"prompt_tokens", promptTokens},
                    {"completion_tokens", r->generated.size()},
                    {"total_tokens", promptTokens + r->generated.size()}};
    res.set_content(dumpJson(out), "application/json");
    return;
  }
  // One event: a piece of text (finish null) or the end (text empty).
  auto event = [response, chat](const std::string &text, const json &finish) {
    json choice = {{"finish_reason", finish}};
    if (!chat)
      choice["text"] = text;
    else if (finish.is_null())
      choice["delta"] = {{"content", text}};
    else
      choice["delta"] = json::object();
    return "data: " + dumpJson(response(choice, true)) + "\n\n";
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [r, event, response](size_t, httplib::DataSink &sink) {
        std::unique_lock<std::mutex> lock(r->mu);
        std::string events;
        if (r->chat && !r->roleSent) {
          // A chat stream opens with the role, before any text.
          json choice = {{"finish_reason", nullptr},
                         {"delta", {{"role", "assistant"}, {"content", ""}}}};
          events += "data: " + dumpJson(response(choice, true)) + "\n\n";
          r->roleSent = true;
        } else {
          r->cv.wait(lock, [&] { return r->done || r->text.size() > r->sent; });
        }
        // Read under the lock: the scheduler may finish the request
        // between this chunk and the check below, and a stream that
        // ended on a later reading of `done` lost its finish chunk and
        // [DONE] (the intermittent failure serve.test once allowed a
        // retry for).
        const bool done = r->done;
        if (r->text.size() > r->sent) {
          events += event(r->text.substr(r->sent), nullptr);
          r->sent = r->text.size();
        }
        if (done) {
          if (!r->error.empty())
            events +=
                "data: " +
                dumpJson(
                    json{{"error",
                          {{"message", r->error}, {"type", "server_error"}}}}) +
                "\n\n";
          else
            events += event("", r->finishReason);
          events += "data: [DONE]\n\n";
        }
        lock.unlock();
        if (!sink.write(events.data(), events.size())) {
          r->cancelled = true; // the client went away: stop generating
          return false;
        }
        if (done)
          sink.done();
        return true;
      });
}

std::atomic<httplib::Server *> gServer{nullptr};

void onSignal(int) {
  if (httplib::Server *s = gServer.load())
    s->stop();
}

} // namespace

int runServe(const ServeFlags &f) {
  nf::ModelParams params = modelParams(f.common);
  params.chatTemplatePath = f.chatTemplate;
  auto model = nf::Model::load(f.common.plan, params);
  if (!model)
    return fail(model.message());
  // The tokenizer's own template, when broken, only costs the chat
  // endpoint: said once here (and in each refused chat request).
  if (std::string why = model->chatTemplateError(); !why.empty())
    std::fprintf(stderr,
                 "nfrun: warning: %s; /v1/chat/completions is unavailable\n",
                 why.c_str());
  const std::string name = f.modelName.empty() ? model->name() : f.modelName;
  const int maxBatch = f.maxBatch > 0
                           ? std::min(f.maxBatch, model->maxSequences())
                           : model->maxSequences();
  Scheduler scheduler(*model, std::max(maxBatch, 1));

  httplib::Server server;
  std::atomic<int64_t> nextId{0};
  server.Get("/health", [&](const httplib::Request &, httplib::Response &res) {
    const Scheduler::Stats s = scheduler.stats();
    res.set_content(dumpJson(json{{"status", "ok"},
                                  {"queued", s.queued},
                                  {"running", s.running},
                                  {"peak_batch", s.peakBatch},
                                  {"max_batch", std::max(maxBatch, 1)}}),
                    "application/json");
  });
  server.Get("/v1/models", [&](const httplib::Request &,
                               httplib::Response &res) {
    json m = {{"id", name},
              {"object", "model"},
              {"created", unixTime()},
              {"owned_by", "nf"}};
    res.set_content(dumpJson(json{{"object", "list"}, {"data", json::array({m})}}),
                    "application/json");
  });
  server.Post("/v1/completions", [&](const httplib::Request &req,
                                     httplib::Response &res) {
    serveCompletion(req, res, false, *model, scheduler, name, nextId);
  });
  server.Post("/v1/chat/completions", [&](const httplib::Request &req,
                                          httplib::Response &res) {
    serveCompletion(req, res, true, *model, scheduler, name, nextId);
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
  server.set_error_handler(
      [](const httplib::Request &, httplib::Response &res) {
        if (res.body.empty())
          sendError(res, res.status,
                    res.status == 404 ? "unknown endpoint (this server has "
                                        "/v1/completions, "
                                        "/v1/chat/completions, /v1/models, "
                                        "/health)"
                                      : "request failed");
      });

  // Every request holds an HTTP worker thread until its completion ends
  // (waiting for it, or writing its stream), and httplib's default pool is
  // max(8, cores - 1) threads: the batch could not grow past that however
  // many clients came. Threads for every sequence slot, as many queued
  // requests, and the cheap endpoints.
  const size_t httpThreads = static_cast<size_t>(std::max(maxBatch, 1)) * 2 + 8;
  server.new_task_queue = [httpThreads] {
    return new httplib::ThreadPool(httpThreads);
  };

  if (!server.bind_to_port(f.host, f.port))
    return fail(f.host + ":" + std::to_string(f.port) +
                ": cannot listen (address in use or not available)");
  gServer = &server;
  std::signal(SIGINT, onSignal);
  std::signal(SIGTERM, onSignal);
  std::fprintf(stderr,
               "nfrun serve: %s (%s backend, up to %d sequences at once) on "
               "http://%s:%d\n",
               name.c_str(), model->backend().c_str(), std::max(maxBatch, 1),
               f.host.c_str(), f.port);
  const bool ok = server.listen_after_bind();
  gServer = nullptr;
  std::fprintf(stderr, "nfrun serve: stopped\n");
  return ok ? 0 : fail("the server stopped with an error");
}

} // namespace nfrun
