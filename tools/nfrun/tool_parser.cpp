// nfrun serve's tool-call parser (see tool_parser.h).
#include "tool_parser.h"

#include <cerrno>
#include <cstdlib>
#include <random>

namespace nfrun {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kCall = "<tool_call>", kCallEnd = "</tool_call>";
constexpr std::string_view kFunction = "<function=",
                           kFunctionEnd = "</function>";
constexpr std::string_view kParam = "<parameter=", kParamEnd = "</parameter>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' ||
                        s.front() == '\r' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' ||
                        s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

/// The JSON schema type of parameter `param` of tool `name` ("" unknown).
std::string schemaType(const ojson &tools, const std::string &name,
                       const std::string &param) {
  if (!tools.is_array())
    return "";
  for (const ojson &t : tools) {
    if (!t.is_object() || !t.contains("function"))
      continue;
    const ojson &f = t["function"];
    if (!f.is_object() || f.value("name", ojson()) != name ||
        !f.contains("parameters") || !f["parameters"].is_object())
      continue;
    const ojson &props = f["parameters"].value("properties", ojson());
    if (!props.is_object() || !props.contains(param) ||
        !props[param].is_object())
      return "";
    const ojson type = props[param].value("type", ojson());
    if (type.is_string())
      return type.get<std::string>();
    if (type.is_array()) // ["integer", "null"]: the first that is not null
      for (const ojson &t2 : type)
        if (t2.is_string() && t2 != "null")
          return t2.get<std::string>();
    return "";
  }
  return "";
}

ojson typed(const std::string &value, const std::string &type) {
  if (type == "integer") {
    errno = 0;
    char *end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    if (!value.empty() && *end == '\0' && errno == 0)
      return v;
  } else if (type == "number") {
    errno = 0;
    char *end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (!value.empty() && *end == '\0' && errno == 0)
      return v;
  } else if (type == "boolean") {
    if (value == "true" || value == "True")
      return true;
    if (value == "false" || value == "False")
      return false;
  } else if (type == "object" || type == "array" || type == "null") {
    ojson v = ojson::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!v.is_discarded() && (type == "object"  ? v.is_object()
                              : type == "array" ? v.is_array()
                                                : v.is_null()))
      return v;
  }
  return value;
}

/// The end of a section that starts at `from`: the first of `ends` found,
/// or the end of the text.
size_t sectionEnd(std::string_view text, size_t from,
                  std::initializer_list<std::string_view> ends) {
  size_t end = text.size();
  for (std::string_view e : ends)
    end = std::min(end, text.find(e, from));
  return end;
}

} // namespace

ToolCallOutput parseToolCalls(std::string_view text, const ojson &tools) {
  ToolCallOutput out;
  const size_t first = text.find(kCall);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  for (size_t at = first; at < text.size();) {
    at = text.find(kCall, at);
    if (at == std::string_view::npos)
      break;
    const size_t start = at + kCall.size();
    const size_t end = sectionEnd(text, start, {kCallEnd, kCall});
    const std::string_view block = text.substr(start, end - start);
    at = end +
         (text.substr(end, kCallEnd.size()) == kCallEnd ? kCallEnd.size() : 0);
    const size_t f = block.find(kFunction);
    const size_t nameEnd = f == std::string_view::npos ? f : block.find('>', f);
    if (nameEnd == std::string_view::npos) { // not a call: all is the answer
      out.calls.clear();
      out.content = std::string(text);
      return out;
    }
    ToolCall call;
    call.name = std::string(trim(
        block.substr(f + kFunction.size(), nameEnd - f - kFunction.size())));
    call.arguments = ojson::object();
    const size_t bodyEnd = sectionEnd(block, nameEnd, {kFunctionEnd});
    const std::string_view body =
        block.substr(nameEnd + 1, bodyEnd - nameEnd - 1);
    for (size_t p = body.find(kParam); p != std::string_view::npos;) {
      const size_t pEnd = body.find('>', p);
      if (pEnd == std::string_view::npos)
        break;
      const std::string param = std::string(
          trim(body.substr(p + kParam.size(), pEnd - p - kParam.size())));
      const size_t vEnd = sectionEnd(body, pEnd + 1, {kParamEnd, kParam});
      std::string_view value = body.substr(pEnd + 1, vEnd - pEnd - 1);
      if (!value.empty() && value.front() == '\n')
        value.remove_prefix(1);
      if (!value.empty() && value.back() == '\n')
        value.remove_suffix(1);
      call.arguments[param] =
          typed(std::string(value), schemaType(tools, call.name, param));
      p = body.find(kParam, vEnd);
    }
    out.calls.push_back(std::move(call));
  }
  out.content = std::string(text.substr(0, first));
  return out;
}

std::string newToolCallId() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char hex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i)
    id += hex[rng() % 16];
  return id;
}

std::string ToolCallStream::feed(std::string_view text) {
  pending_.append(text);
  if (inCalls_)
    return "";
  const size_t at = pending_.find(kCall);
  if (at != std::string::npos) {
    std::string out = pending_.substr(0, at);
    pending_.erase(0, at);
    inCalls_ = true;
    return out;
  }
  // Hold back a suffix that may begin the tag.
  size_t keep = 0;
  for (size_t n = std::min(pending_.size(), kCall.size() - 1); n > 0; --n)
    if (std::string_view(pending_).substr(pending_.size() - n) ==
        kCall.substr(0, n)) {
      keep = n;
      break;
    }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

ToolCallOutput ToolCallStream::finish(const ojson &tools) {
  ToolCallOutput out = parseToolCalls(pending_, tools);
  pending_.clear();
  return out;
}

} // namespace nfrun
