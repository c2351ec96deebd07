// nfrun serve's reasoning parser (see reasoning_parser.h).
#include "reasoning_parser.h"

#include <algorithm>

namespace nfrun {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";

bool isSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/// Length of the longest suffix of `text` that is a proper prefix of
/// `tag`: bytes that may become the tag with the next piece.
size_t partialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n))
      return n;
  return 0;
}

} // namespace

bool isReasoningParser(std::string_view name) { return name == "nemotron_v3"; }

bool promptOpensReasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos)
    return false;
  const size_t close = prompt.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

ReasoningParser::ReasoningParser(bool inReasoning)
    : state_(inReasoning ? State::Reasoning : State::Start),
      sawReasoning_(inReasoning) {}

ReasoningParser::Delta ReasoningParser::feed(std::string_view text) {
  pending_.append(text);
  return drain(false);
}

ReasoningParser::Delta ReasoningParser::finish() { return drain(true); }

ReasoningParser::Delta ReasoningParser::drain(bool final) {
  Delta out;
  for (;;) {
    switch (state_) {
    case State::Start: {
      // The model may open the block itself, after leading whitespace.
      size_t at = 0;
      while (at < pending_.size() && isSpace(pending_[at]))
        ++at;
      const std::string_view rest = std::string_view(pending_).substr(at);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        pending_.erase(0, at + kOpen.size());
        state_ = State::Reasoning;
        sawReasoning_ = true;
        continue;
      }
      if (!final && kOpen.substr(0, rest.size()) == rest)
        return out; // whitespace or a part of "<think>" so far
      state_ = State::Content;
      continue;
    }
    case State::Reasoning: {
      const size_t close = pending_.find(kClose);
      const size_t call = pending_.find(kToolCall);
      const size_t end = std::min(close, call);
      if (end != std::string::npos) {
        out.reasoning += pending_.substr(0, end);
        if (end == close) {
          pending_.erase(0, end + kClose.size());
          state_ = State::AfterReasoning;
        } else { // the tool call belongs to the answer
          pending_.erase(0, end);
          state_ = State::Content;
        }
        continue;
      }
      const size_t keep = final ? 0
                                : std::max(partialTag(pending_, kClose),
                                           partialTag(pending_, kToolCall));
      out.reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    case State::AfterReasoning: {
      size_t at = 0;
      while (at < pending_.size() && isSpace(pending_[at]))
        ++at;
      pending_.erase(0, at);
      if (pending_.empty())
        return out;
      state_ = State::Content;
      continue;
    }
    case State::Content:
      out.content += pending_;
      pending_.clear();
      return out;
    }
  }
}

} // namespace nfrun
