// nfrun serve's tool-call parser for Nemotron 3 (vLLM's qwen3_coder
// format): the model answers a request with tools by writing, after any
// text,
//   <tool_call>
//   <function=NAME>
//   <parameter=P>
//   VALUE
//   </parameter>
//   ...
//   </function>
//   </tool_call>
// possibly several times. Each VALUE (without the one newline after its
// tag and the one before the closing tag) is typed by the tool's JSON
// schema for P: strings stay strings; integers, numbers, booleans, objects
// and arrays are parsed, and stay strings when they do not parse; a
// parameter the schema does not name is a string. A missing closing tag
// ends at the next opening one or at the end of the text (max_tokens).
// Markup without a `<function=NAME>` is not a call: the text is the answer.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace nfrun {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments; // an object
};

struct ToolCallOutput {
  std::string content; // the text before the first call (all: no calls)
  std::vector<ToolCall> calls;
};

/// The calls in `text`; `tools` is the request's tools (their schemas).
ToolCallOutput parseToolCalls(std::string_view text,
                              const nlohmann::ordered_json &tools);

/// A new call id: "call_" and 24 random hex digits.
std::string newToolCallId();

/// Streaming: text before the first `<tool_call>` goes out as it comes
/// (a piece that may begin the tag is held back); from the tag on, the text
/// is kept for finish().
class ToolCallStream {
public:
  /// The content of `text` that can be sent now.
  std::string feed(std::string_view text);
  /// The end: what was kept, parsed (its content is what is left to send).
  ToolCallOutput finish(const nlohmann::ordered_json &tools);

private:
  std::string pending_;
  bool inCalls_ = false;
};

} // namespace nfrun
