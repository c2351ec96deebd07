// nfrun serve's chat request parsing: the messages of
// /v1/chat/completions (text parts, tool calls and results), the chat
// template's variables, tools and tool_choice, rendered with the model's
// chat template into the prompt, then the fields shared with
// /v1/completions (serve_request.cpp).
#include "reasoning_parser.h"
#include "serve_request.h"
#include "serve_request_util.h"
#include "serve_structured.h"

#include <algorithm>
#include <utility>

namespace nfrun {

using namespace detail;

/// The messages of a chat request as the chat template gets them: each an
/// object with a `role` and a `content` (a string, or text parts,
/// concatenated; null or absent for an assistant message with tool calls),
/// and as OpenAI's API gives them an assistant's `tool_calls` (each
/// {"id", "type": "function", "function": {"name", "arguments"}}, its
/// arguments a JSON text that the template gets as an object, as vLLM
/// passes them), a tool result's `tool_call_id`, a `name`, and an
/// assistant's `reasoning_content`. No string may hold a NUL character
/// (JSON's "\u0000").
std::variant<nlohmann::ordered_json, std::string>
detail::parseMessages(const json &body) {
  using ojson = nlohmann::ordered_json;
  if (!body.contains("messages"))
    return std::string("'messages' is required");
  const json &list = body["messages"];
  if (!list.is_array() || list.empty())
    return std::string("'messages' must be a non-empty array");
  ojson messages = ojson::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const json &m = list[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      return where + " must be an object";
    if (!m.contains("role") || !m["role"].is_string())
      return where + ": 'role' must be a string";
    const std::string role = m["role"].get<std::string>();
    if (role.find('\0') != std::string::npos)
      return where + ": role must not contain NUL characters";
    ojson msg = {{"role", role}};
    const json content = m.value("content", json());
    const bool hasCalls = m.contains("tool_calls") &&
                          !m["tool_calls"].is_null() &&
                          !m["tool_calls"].empty();
    std::string text;
    if (content.is_string()) {
      text = content.get<std::string>();
    } else if (content.is_array()) {
      for (size_t k = 0; k < content.size(); ++k) {
        const json &part = content[k];
        const std::string at = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object() || !part.contains("type") ||
            !part["type"].is_string())
          return at + " must be an object with a 'type'";
        if (part["type"] != "text")
          return at + ": only text parts are supported, not " +
                 quoted(part["type"].get<std::string>());
        if (!part.contains("text") || !part["text"].is_string())
          return at + ": 'text' must be a string";
        text += part["text"].get<std::string>();
      }
    } else if (!(content.is_null() && hasCalls)) {
      return where + ": 'content' must be a string or an array of text parts";
    }
    if (text.find('\0') != std::string::npos)
      return where + ": content must not contain NUL characters";
    msg["content"] = content.is_null() ? ojson() : ojson(text);
    if (hasCalls) {
      if (role != "assistant")
        return where + ": only assistant messages have 'tool_calls'";
      const json &calls = m["tool_calls"];
      if (!calls.is_array())
        return where + ": 'tool_calls' must be an array";
      ojson out = ojson::array();
      for (size_t k = 0; k < calls.size(); ++k) {
        const json &c = calls[k];
        const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!c.is_object() || !c.contains("function") ||
            !c["function"].is_object())
          return at + " must be an object with a 'function'";
        const json &f = c["function"];
        if (!f.contains("name") || !f["name"].is_string())
          return at + ".function: 'name' must be a string";
        ojson args = ojson::object();
        if (f.contains("arguments") && !f["arguments"].is_null()) {
          if (!f["arguments"].is_string())
            return at + ".function: 'arguments' must be a JSON text";
          args = ojson::parse(f["arguments"].get<std::string>(), nullptr,
                              /*allow_exceptions=*/false);
          if (args.is_discarded() || !args.is_object())
            return at + ".function: 'arguments' must be a JSON object text";
        }
        ojson call = {{"type", "function"},
                      {"function",
                       {{"name", f["name"].get<std::string>()},
                        {"arguments", std::move(args)}}}};
        if (c.contains("id") && c["id"].is_string())
          call["id"] = c["id"].get<std::string>();
        out.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(out);
    }
    for (const char *key : {"tool_call_id", "name", "reasoning_content"})
      if (m.contains(key) && !m[key].is_null()) {
        if (!m[key].is_string())
          return where + ": '" + key + "' must be a string";
        if (m[key].get<std::string>().find('\0') != std::string::npos)
          return where + ": " + key + " must not contain NUL characters";
        msg[key] = m[key].get<std::string>();
      }
    messages.push_back(std::move(msg));
  }
  return messages;
}

/// The chat template's variables of a chat request: the server's defaults
/// (--default-chat-template-kwargs) under the request's
/// chat_template_kwargs, as vLLM passes them to apply_chat_template.
std::variant<nlohmann::ordered_json, std::string>
detail::templateVariables(const json &body, const ServePolicy &policy) {
  nlohmann::ordered_json variables = policy.chatTemplateKwargs;
  if (!body.contains("chat_template_kwargs") ||
      body["chat_template_kwargs"].is_null())
    return variables;
  const json &kwargs = body["chat_template_kwargs"];
  if (!kwargs.is_object())
    return std::string("'chat_template_kwargs' must be an object");
  for (const auto &item : kwargs.items()) {
    const std::string &key = item.key();
    if (key == "messages" || key == "add_generation_prompt" || key == "tools" ||
        key == "documents" || key == "chat_template" || key == "tokenize")
      return "chat_template_kwargs: " + quoted(key) +
             " is not a template variable a request may set";
    variables[key] = nlohmann::ordered_json::parse(item.value().dump());
  }
  return variables;
}

namespace {

/// `tools` (functions: {"type": "function", "function": {"name",
/// "description", "parameters"}}), `tool_choice` ("auto", the default with
/// tools, or "none": the template does not get them) and
/// `parallel_tool_calls` (false: the first call only). "required" and a
/// named function would need constrained decoding: refused for now.
std::optional<std::string> parseTools(const json &body, ParsedRequest &r) {
  if (body.contains("parallel_tool_calls") &&
      !body["parallel_tool_calls"].is_null()) {
    if (!body["parallel_tool_calls"].is_boolean())
      return std::string("'parallel_tool_calls' must be true or false");
    r.parallelToolCalls = body["parallel_tool_calls"].get<bool>();
  }
  const bool given = body.contains("tools") && !body["tools"].is_null();
  std::string choice = given ? "auto" : "none";
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json &c = body["tool_choice"];
    if (c.is_object()) {
      // {"type": "function", "function": {"name": F}}
      if (c.value("type", json()) != "function" || !c.contains("function") ||
          !c["function"].is_object() || !c["function"].contains("name") ||
          !c["function"]["name"].is_string())
        return std::string("'tool_choice' must be \"auto\", \"none\", "
                           "\"required\" or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}");
      choice = "named";
      r.namedTool = c["function"]["name"].get<std::string>();
    } else if (c.is_string()) {
      choice = c.get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return "'tool_choice' must be \"auto\", \"none\", \"required\" "
               "or a named function, not " +
               quoted(std::as_const(choice));
    } else {
      return std::string("'tool_choice' must be a string or an object");
    }
  }
  if (!given)
    return choice != "none"
               ? std::optional<std::string>("'tool_choice' needs 'tools'")
               : std::nullopt;
  const json &tools = body["tools"];
  if (!tools.is_array())
    return std::string("'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json &t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", json()) != "function" ||
        !t.contains("function") || !t["function"].is_object())
      return where + " must be {\"type\": \"function\", \"function\": "
                     "{...}}";
    const json &f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() ||
        f["name"].get<std::string>().empty())
      return where + ".function: 'name' must be a non-empty string";
    if (f.contains("parameters") && !f["parameters"].is_null() &&
        !f["parameters"].is_object())
      return where + ".function: 'parameters' must be a JSON schema object";
  }
  r.tools = nlohmann::ordered_json::parse(tools.dump());
  if (choice == "named" &&
      std::none_of(tools.begin(), tools.end(), [&](const json &t) {
        return t["function"]["name"] == r.namedTool;
      }))
    return "'tool_choice' names " + quoted(std::as_const(r.namedTool)) +
           ", which is not in 'tools'";
  if (choice == "required" && tools.empty())
    return std::string("'tool_choice' \"required\" needs at least one tool");
  r.toolCalls = tools.empty() || choice == "none" ? ToolCalls::None
                : choice == "auto"                ? ToolCalls::Auto
                : choice == "required"            ? ToolCalls::Required
                                                  : ToolCalls::Named;
  return std::nullopt;
}

} // namespace

/// A validated /v1/chat/completions request: the messages rendered with the
/// model's chat template (and the generation prompt), tokenized without
/// special tokens (the template writes them, BOS included), then the same
/// fields as /v1/completions.
Parsed parseChat(const json &body, const RequestModel &model,
                 const TrafficHeaders &headers, const ServePolicy &policy) {
  if (!body.is_object())
    return std::string("the body must be a JSON object");
  if (auto err = unsupportedField(body, /*chat=*/true))
    return *err;
  if (!model.hasChatTemplate()) {
    // Why, with the file's path, is in the server's log only.
    if (!model.chatTemplateError().empty())
      return std::string(
          "this model's chat template cannot be used (the server's log "
          "says why): start nfrun serve with --chat-template FILE (a Jinja "
          "chat template), or fix it; /v1/completions takes plain prompts");
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
  auto messages = parseMessages(body);
  if (auto *err = std::get_if<std::string>(&messages))
    return *err;
  auto variables = templateVariables(body, policy);
  if (auto *err = std::get_if<std::string>(&variables))
    return *err;
  ParsedRequest r;
  if (auto err = parseTools(body, r))
    return *err;
  auto &vars = std::get<nlohmann::ordered_json>(variables);
  if (r.toolCalls != ToolCalls::None)
    vars["tools"] = r.tools;
  auto text = model.applyChatTemplate(
      std::get<nlohmann::ordered_json>(messages), true, vars);
  if (!text)
    return withoutTemplatePath(text.message());
  r.chat = true;
  r.promptOpensReasoning = promptOpensReasoning(*text);
  auto ids = model.tokenize(*text, false);
  if (!ids)
    return "prompt: " + ids.message();
  r.params.prompt = std::move(*ids);
  if (auto err = parseSampling(body, model, policy, r))
    return *err;
  if (auto err = parseStructuredOutput(body, r.params))
    return *err;
  if (r.toolCalls == ToolCalls::Required || r.toolCalls == ToolCalls::Named) {
    if (r.params.grammarKind != NF_GRAMMAR_NONE)
      return std::string("'tool_choice' \"required\" or a named function "
                         "and a structured-output constraint: only one");
    r.params.grammarKind = NF_GRAMMAR_JSON_SCHEMA;
    r.params.grammar = r.toolCalls == ToolCalls::Named
                           ? namedToolSchema(r.tools, r.namedTool)
                           : requiredToolsSchema(r.tools, r.parallelToolCalls);
  }
  if (r.params.grammarKind != NF_GRAMMAR_NONE &&
      !policy.reasoningParser.empty() && r.promptOpensReasoning) {
    // As vLLM with a reasoning parser: the model reasons freely, and its
    // answer after the block follows the grammar.
    auto end = model.tokenize("</think>", false);
    if (!end)
      return "'</think>': " + end.message();
    r.params.grammarAfter = std::move(*end);
  }
  if (auto err = parseTraffic(body, headers, policy, r))
    return *err;
  // logprobs: true, with top_logprobs alternatives (OpenAI's chat shape).
  bool logprobs = false;
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    if (!body["logprobs"].is_boolean())
      return std::string("'logprobs' must be true or false");
    logprobs = body["logprobs"].get<bool>();
  }
  int32_t top = -1;
  if (auto err = topLogprobs(body, "top_logprobs", top))
    return *err;
  if (top >= 0 && !logprobs)
    return std::string("'top_logprobs' needs 'logprobs': true");
  if (logprobs)
    r.params.logprobs = std::max(top, 0);
  return r;
}

} // namespace nfrun
