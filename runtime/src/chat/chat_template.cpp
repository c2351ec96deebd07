// Hugging Face chat templates (see chat_template.h): finding them next to a
// tokenizer and rendering them with the Jinja renderer (jinja_*.cpp).
#include "chat/chat_template.h"

#include "chat/jinja_interp.h"
#include "nf/file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <new>

namespace nf::chat {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct ChatTemplate::Impl {
  std::string sourceName;
  std::unique_ptr<jinja::Program> program;
};

namespace {

// Error details quote template text and values (a test name computed at
// render time, raise_exception's message): control characters are escaped
// so that the error stays one line.
std::string oneLine(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string describe(const std::string &source, const jinja::Error &e) {
  return source + ": chat template" +
         (e.line > 0 ? " line " + std::to_string(e.line) : std::string()) +
         ": " + oneLine(e.what());
}

} // namespace

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source,
                                           std::string sourceName) {
  try {
    auto impl = std::make_shared<Impl>();
    impl->sourceName = sourceName;
    try {
      impl->program = jinja::parseTemplate(source);
    } catch (const jinja::Error &e) {
      return Status::error(describe(impl->sourceName, e));
    }
    return ChatTemplate(std::move(impl));
  } catch (const std::bad_alloc &) {
    return Status::error(sourceName + ": chat template: out of memory");
  } catch (const std::exception &e) {
    return Status::error(sourceName + ": chat template: " + oneLine(e.what()));
  }
}

StatusOr<std::string>
ChatTemplate::render(const nlohmann::ordered_json &context) const {
  try {
    if (!context.is_object())
      return Status::error(impl_->sourceName +
                           ": chat template variables must be a JSON object");
    jinja::Value vars = jinja::fromJson(context);
    jinja::Limits limits;
    jinja::Interp interp(limits);
    return interp.render(*impl_->program, vars.dictData());
  } catch (const jinja::Error &e) {
    return Status::error(describe(impl_->sourceName, e));
  } catch (const std::bad_alloc &) {
    return Status::error(impl_->sourceName +
                         ": chat template: out of memory while rendering");
  } catch (const std::exception &e) {
    return Status::error(impl_->sourceName +
                         ": chat template: " + oneLine(e.what()));
  }
}

const std::string &ChatTemplate::sourceName() const {
  return impl_->sourceName;
}

ojson ChatConfig::context(const std::vector<Message> &messages,
                          bool addGenerationPrompt) const {
  ojson ctx = ojson::object();
  ojson list = ojson::array();
  for (const Message &m : messages)
    list.push_back(ojson{{"role", m.role}, {"content", m.content}});
  ctx["messages"] = std::move(list);
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = addGenerationPrompt;
  for (const auto &[name, text] : specialTokens)
    ctx[name] = text;
  return ctx;
}

StatusOr<std::string> ChatConfig::apply(const std::vector<Message> &messages,
                                        bool addGenerationPrompt,
                                        const ojson *variables) const {
  for (size_t i = 0; i < messages.size(); ++i)
    if (!jinja::validUtf8(messages[i].role) ||
        !jinja::validUtf8(messages[i].content))
      return Status::error("message " + std::to_string(i) +
                           ": role and content must be UTF-8 text");
  return applyJson(context(messages, addGenerationPrompt)["messages"],
                   addGenerationPrompt, variables);
}

StatusOr<std::string> ChatConfig::applyJson(const ojson &messages,
                                            bool addGenerationPrompt,
                                            const ojson *variables) const {
  if (!chatTemplate)
    return Status::error(templateError.empty()
                             ? "the model has no chat template"
                             : "the chat template cannot be used: " +
                                   templateError);
  if (!messages.is_array())
    return Status::error("messages must be a JSON array");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].is_object() || !messages[i].contains("role") ||
        !messages[i]["role"].is_string())
      return Status::error("message " + std::to_string(i) +
                           " must be an object with a \"role\" string");
  ojson ctx = context({}, addGenerationPrompt);
  ctx["messages"] = messages;
  if (variables && !variables->is_null()) {
    if (!variables->is_object())
      return Status::error("template variables must be a JSON object");
    for (const auto &item : variables->items()) {
      if (item.key() == "messages" || item.key() == "add_generation_prompt")
        return Status::error("template variable " + ojson(item.key()).dump() +
                             " is set by the request itself");
      ctx[item.key()] = item.value();
    }
  }
  return chatTemplate->render(ctx);
}

namespace {

/// Reads `dir`/tokenizer_config.json (when there is one) into `config`
/// and its special tokens into `cfg`; an error for a file that cannot be
/// read or is malformed.
Status readTokenizerConfig(const std::string &configPath, ojson &config,
                           ChatConfig &cfg) {
  StatusOr<std::string> text = readWholeFile(configPath);
  if (!text)
    return text.status();
  config = ojson::parse(*text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    config = ojson();
    return Status::error(configPath + ": not a JSON object");
  }
  // The special tokens transformers passes to templates.
  for (const char *name : {"bos_token", "eos_token", "unk_token", "pad_token",
                           "sep_token", "cls_token", "mask_token"}) {
    if (!config.contains(name) || config[name].is_null())
      continue;
    const ojson &t = config[name];
    if (t.is_string())
      cfg.specialTokens.emplace_back(name, t.get<std::string>());
    else if (t.is_object() && t.contains("content") && t["content"].is_string())
      cfg.specialTokens.emplace_back(name, t["content"].get<std::string>());
    else
      return Status::error(configPath + ": '" + name +
                           "' must be a string or an object with a "
                           "string 'content'");
  }
  return Status::success();
}

/// The template source of tokenizer_config.json's "chat_template" (a
/// string, or the "default" of a list of {"name", "template"}); nullopt
/// when it has none.
StatusOr<std::optional<std::string>>
configTemplate(const std::string &configPath, const ojson &config) {
  if (!config.is_object() || !config.contains("chat_template") ||
      config["chat_template"].is_null())
    return std::optional<std::string>();
  const ojson &t = config["chat_template"];
  if (t.is_string())
    return std::optional<std::string>(t.get<std::string>());
  if (t.is_array()) {
    for (const ojson &entry : t)
      if (entry.is_object() && entry.contains("name") &&
          entry["name"].is_string() && entry["name"] == "default" &&
          entry.contains("template") && entry["template"].is_string())
        return std::optional<std::string>(entry["template"].get<std::string>());
    return Status::error(configPath + ": 'chat_template' has no template named "
                                      "'default'");
  }
  return Status::error(configPath +
                       ": 'chat_template' must be a string or a list of "
                       "{\"name\", \"template\"} objects");
}

} // namespace

StatusOr<ChatConfig> loadChatConfig(const std::string &dir,
                                    const std::string &templatePath) {
  ChatConfig cfg;
  const fs::path base(dir.empty() ? "." : dir);
  const std::string configPath = (base / "tokenizer_config.json").string();
  const std::string jinjaPath = (base / "chat_template.jinja").string();
  const bool given = !templatePath.empty();
  std::error_code ec;

  // A given template fails the load when it (or the tokenizer_config.json
  // its special tokens come from) cannot be used: it was asked for. A
  // template found next to the tokenizer that cannot be used is only noted
  // (cfg.templateError): the model works without it.
  auto unusable = [&](const Status &why) -> StatusOr<ChatConfig> {
    if (given)
      return why;
    cfg.chatTemplate.reset();
    cfg.templateError = why.message();
    return cfg;
  };

  ojson config;
  if (fs::exists(configPath, ec))
    if (Status s = readTokenizerConfig(configPath, config, cfg); !s.ok()) {
      cfg.specialTokens.clear();
      return unusable(s);
    }

  std::string source, sourceName;
  if (given || fs::exists(jinjaPath, ec)) {
    sourceName = given ? templatePath : jinjaPath;
    StatusOr<std::string> text = readWholeFile(sourceName);
    if (!text)
      return unusable(text.status());
    source = std::move(*text);
  } else {
    StatusOr<std::optional<std::string>> fromConfig =
        configTemplate(configPath, config);
    if (!fromConfig)
      return unusable(fromConfig.status());
    if (!fromConfig->has_value())
      return cfg; // no template: not an error
    sourceName = configPath;
    source = std::move(**fromConfig);
  }
  StatusOr<ChatTemplate> parsed = ChatTemplate::parse(source, sourceName);
  if (!parsed)
    return unusable(parsed.status());
  cfg.chatTemplate = std::move(*parsed);
  return cfg;
}

} // namespace nf::chat
