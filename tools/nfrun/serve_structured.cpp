#include "serve_structured.h"

namespace nfrun {

using nlohmann::json;

namespace {

/// One constraint of the body, named by the field it came from.
struct Constraint {
  std::string field;
  nf_grammar_kind kind = NF_GRAMMAR_NONE;
  std::string grammar;
};

/// A schema given as an object or as its JSON text.
std::optional<std::string> schemaText(const json &v, const std::string &field,
                                      std::string &out) {
  if (v.is_object() || v.is_boolean()) {
    out = v.dump();
    return std::nullopt;
  }
  if (v.is_string()) {
    const json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      return "'" + field + "' is not a JSON schema (an object)";
    out = parsed.dump();
    return std::nullopt;
  }
  return "'" + field + "' must be a JSON schema (an object)";
}

std::optional<std::string> stringField(const json &v, const std::string &field,
                                       std::string &out) {
  if (!v.is_string() || v.get_ref<const std::string &>().empty())
    return "'" + field + "' must be a non-empty string";
  out = v.get<std::string>();
  return std::nullopt;
}

std::optional<std::string> choiceField(const json &v, const std::string &field,
                                       std::string &out) {
  if (!v.is_array() || v.empty())
    return "'" + field + "' must be a non-empty array of strings";
  std::vector<std::string> choices;
  for (const json &c : v) {
    if (!c.is_string() || c.get_ref<const std::string &>().empty())
      return "'" + field + "' must be a non-empty array of non-empty strings";
    choices.push_back(c.get<std::string>());
  }
  out = choiceGrammar(choices);
  return std::nullopt;
}

/// OpenAI's response_format.
std::optional<std::string> responseFormat(const json &v,
                                          std::vector<Constraint> &out) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    return std::string("'response_format' must be an object with a 'type'");
  const std::string type = v["type"];
  if (type == "text")
    return std::nullopt;
  if (type == "json_object") {
    out.push_back({"response_format", NF_GRAMMAR_JSON, ""});
    return std::nullopt;
  }
  if (type == "json_schema") {
    const json *spec = v.contains("json_schema") ? &v["json_schema"] : nullptr;
    if (!spec || !spec->is_object())
      return std::string("'response_format' of type json_schema needs a "
                         "'json_schema' object");
    if (!spec->contains("schema") || (*spec)["schema"].is_null())
      return std::string("'response_format.json_schema' needs a 'schema'");
    Constraint c{"response_format", NF_GRAMMAR_JSON_SCHEMA, ""};
    if (auto err = schemaText((*spec)["schema"],
                              "response_format.json_schema.schema", c.grammar))
      return err;
    out.push_back(std::move(c));
    return std::nullopt;
  }
  if (type == "structural_tag") {
    // XGrammar's structural tag ({"type": "structural_tag", "format": ...});
    // the older {"structures", "triggers"} form is refused.
    if (!v.contains("format"))
      return std::string("'response_format' of type structural_tag needs a "
                         "'format' (XGrammar's structural tag); the "
                         "'structures'/'triggers' form is not supported");
    out.push_back({"response_format", NF_GRAMMAR_STRUCTURAL_TAG, v.dump()});
    return std::nullopt;
  }
  return "'response_format' type " + json(type).dump() +
         " is not text, json_object, json_schema or structural_tag";
}

/// vLLM's structured_outputs object.
std::optional<std::string> structuredOutputs(const json &v,
                                             std::vector<Constraint> &out,
                                             uint32_t &flags) {
  if (!v.is_object())
    return std::string("'structured_outputs' must be an object");
  for (const auto &item : v.items()) {
    const std::string &key = item.key();
    const json &value = item.value();
    const std::string field = "structured_outputs." + key;
    if (value.is_null())
      continue;
    Constraint c{field, NF_GRAMMAR_NONE, ""};
    std::optional<std::string> err;
    if (key == "json") {
      c.kind = NF_GRAMMAR_JSON_SCHEMA;
      err = schemaText(value, field, c.grammar);
    } else if (key == "regex") {
      c.kind = NF_GRAMMAR_REGEX;
      err = stringField(value, field, c.grammar);
    } else if (key == "choice") {
      c.kind = NF_GRAMMAR_EBNF;
      err = choiceField(value, field, c.grammar);
    } else if (key == "grammar") {
      c.kind = NF_GRAMMAR_EBNF;
      err = stringField(value, field, c.grammar);
    } else if (key == "structural_tag") {
      c.kind = NF_GRAMMAR_STRUCTURAL_TAG;
      err = stringField(value, field, c.grammar);
    } else if (key == "json_object") {
      if (!value.is_boolean())
        return "'" + field + "' must be true or false";
      if (!value.get<bool>())
        continue;
      c.kind = NF_GRAMMAR_JSON;
    } else if (key == "disable_any_whitespace") {
      if (!value.is_boolean())
        return "'" + field + "' must be true or false";
      if (value.get<bool>())
        flags |= NF_GRAMMAR_FLAG_NO_WHITESPACE;
      continue;
    } else if (key == "backend") {
      if (!value.is_string() || !(value == "auto" || value == "xgrammar"))
        return "'" + field + "' must be \"auto\" or \"xgrammar\"";
      continue;
    } else if (key == "disable_fallback") {
      continue; // nothing to fall back to
    } else {
      // disable_additional_properties, whitespace_pattern, ...: not read.
      return "'" + field + "' is not supported";
    }
    if (err)
      return err;
    out.push_back(std::move(c));
  }
  return std::nullopt;
}

} // namespace

std::string choiceGrammar(const std::vector<std::string> &choices) {
  // JSON's string escapes are XGrammar's EBNF string literals'.
  std::string g = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i)
    g += (i ? " | " : "") + json(choices[i]).dump();
  return g;
}

namespace {

/// A function's parameter schema (none: an object without properties).
nlohmann::ordered_json parametersOf(const nlohmann::ordered_json &function) {
  if (function.contains("parameters") && function["parameters"].is_object())
    return function["parameters"];
  return {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
}

} // namespace

std::string namedToolSchema(const nlohmann::ordered_json &tools,
                            const std::string &name) {
  for (const auto &t : tools)
    if (t["function"]["name"] == name)
      return parametersOf(t["function"]).dump();
  return parametersOf(nlohmann::ordered_json::object()).dump();
}

std::string requiredToolsSchema(const nlohmann::ordered_json &tools,
                                bool parallel) {
  nlohmann::ordered_json anyOf = nlohmann::ordered_json::array();
  for (const auto &t : tools)
    anyOf.push_back(
        {{"type", "object"},
         {"properties",
          {{"name",
            {{"type", "string"},
             {"enum", nlohmann::ordered_json::array({t["function"]["name"]})}}},
           {"parameters", parametersOf(t["function"])}}},
         {"required", nlohmann::ordered_json::array({"name", "parameters"})}});
  nlohmann::ordered_json schema = {
      {"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", anyOf}}}};
  if (!parallel)
    schema["maxItems"] = 1;
  return schema.dump();
}

std::optional<std::string> parseStructuredOutput(const json &body,
                                                 nf::RequestParams &params) {
  std::vector<Constraint> found;
  uint32_t flags = 0;
  auto has = [&](const char *key) {
    return body.contains(key) && !body[key].is_null();
  };
  if (has("response_format"))
    if (auto err = responseFormat(body["response_format"], found))
      return err;
  if (has("structured_outputs"))
    if (auto err = structuredOutputs(body["structured_outputs"], found, flags))
      return err;
  // vLLM's older fields: the field, its kind, and how its value reads.
  using Reader = std::optional<std::string> (*)(
      const json &, const std::string &, std::string &);
  const struct {
    const char *field;
    nf_grammar_kind kind;
    Reader read;
  } guided[] = {{"guided_json", NF_GRAMMAR_JSON_SCHEMA, schemaText},
                {"guided_regex", NF_GRAMMAR_REGEX, stringField},
                {"guided_choice", NF_GRAMMAR_EBNF, choiceField},
                {"guided_grammar", NF_GRAMMAR_EBNF, stringField}};
  for (const auto &g : guided) {
    if (!has(g.field))
      continue;
    Constraint c{g.field, g.kind, ""};
    if (auto err = g.read(body[g.field], c.field, c.grammar))
      return err;
    found.push_back(std::move(c));
  }
  if (has("guided_decoding_backend")) {
    const json &b = body["guided_decoding_backend"];
    if (!b.is_string() || !(b == "auto" || b == "xgrammar"))
      return std::string("'guided_decoding_backend' must be \"auto\" or "
                         "\"xgrammar\"");
  }
  if (has("guided_whitespace_pattern"))
    return std::string("'guided_whitespace_pattern' is not supported");
  if (found.size() > 1)
    return "only one structured-output constraint a request: '" +
           found[0].field + "' and '" + found[1].field + "'";
  // The flags also apply to a forced tool_choice's grammar.
  params.grammarFlags = flags;
  if (found.empty())
    return std::nullopt;
  params.grammarKind = found[0].kind;
  params.grammar = std::move(found[0].grammar);
  return std::nullopt;
}

} // namespace nfrun
