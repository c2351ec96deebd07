// Hugging Face chat templates (see chat_template.h): finding them next to a
// tokenizer and rendering them with the Jinja renderer (jinja_*.cpp).
#include "chat/chat_template.h"

#include "chat/jinja_interp.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace nf::chat {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct ChatTemplate::Impl {
  std::string sourceName;
  std::unique_ptr<jinja::Program> program;
};

namespace {

std::string describe(const std::string &source, const jinja::Error &e) {
  return source + ": chat template" +
         (e.line > 0 ? " line " + std::to_string(e.line) : std::string()) +
         ": " + e.what();
}

StatusOr<std::string> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return Status::error(path + ": read error");
  return ss.str();
}

} // namespace

StatusOr<ChatTemplate> ChatTemplate::parse(std::string_view source,
                                           std::string sourceName) {
  auto impl = std::make_shared<Impl>();
  impl->sourceName = std::move(sourceName);
  try {
    impl->program = jinja::parseTemplate(source);
  } catch (const jinja::Error &e) {
    return Status::error(describe(impl->sourceName, e));
  }
  return ChatTemplate(std::move(impl));
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
                                        bool addGenerationPrompt) const {
  if (!chatTemplate)
    return Status::error("the model has no chat template");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!jinja::validUtf8(messages[i].role) ||
        !jinja::validUtf8(messages[i].content))
      return Status::error("message " + std::to_string(i) +
                           ": role and content must be UTF-8 text");
  return chatTemplate->render(context(messages, addGenerationPrompt));
}

StatusOr<ChatConfig> loadChatConfig(const std::string &dir,
                                    const std::string &templatePath) {
  ChatConfig cfg;
  const std::string configPath =
      (fs::path(dir.empty() ? "." : dir) / "tokenizer_config.json").string();
  std::error_code ec;
  ojson config;
  if (fs::exists(configPath, ec)) {
    StatusOr<std::string> text = readFile(configPath);
    if (!text)
      return text.status();
    config = ojson::parse(*text, nullptr, false);
    if (config.is_discarded() || !config.is_object())
      return Status::error(configPath + ": not a JSON object");
    // The special tokens transformers passes to templates.
    for (const char *name : {"bos_token", "eos_token", "unk_token", "pad_token",
                             "sep_token", "cls_token", "mask_token"}) {
      if (!config.contains(name) || config[name].is_null())
        continue;
      const ojson &t = config[name];
      if (t.is_string())
        cfg.specialTokens.emplace_back(name, t.get<std::string>());
      else if (t.is_object() && t.contains("content") &&
               t["content"].is_string())
        cfg.specialTokens.emplace_back(name, t["content"].get<std::string>());
      else
        return Status::error(configPath + ": '" + name +
                             "' must be a string or an object with a "
                             "string 'content'");
    }
  }

  std::string source, sourceName;
  const std::string jinjaPath =
      (fs::path(dir.empty() ? "." : dir) / "chat_template.jinja").string();
  if (!templatePath.empty() || fs::exists(jinjaPath, ec)) {
    sourceName = templatePath.empty() ? jinjaPath : templatePath;
    StatusOr<std::string> text = readFile(sourceName);
    if (!text)
      return text.status();
    source = std::move(*text);
  } else if (config.is_object() && config.contains("chat_template") &&
             !config["chat_template"].is_null()) {
    sourceName = configPath;
    const ojson &t = config["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      bool found = false;
      for (const ojson &entry : t)
        if (entry.is_object() && entry.value("name", "") == "default" &&
            entry.contains("template") && entry["template"].is_string()) {
          source = entry["template"].get<std::string>();
          found = true;
          break;
        }
      if (!found)
        return Status::error(configPath +
                             ": 'chat_template' has no template named "
                             "'default'");
    } else {
      return Status::error(configPath +
                           ": 'chat_template' must be a string or a list of "
                           "{\"name\", \"template\"} objects");
    }
  } else {
    return cfg; // no template: not an error
  }
  StatusOr<ChatTemplate> parsed = ChatTemplate::parse(source, sourceName);
  if (!parsed)
    return parsed.status();
  cfg.chatTemplate = std::move(*parsed);
  return cfg;
}

} // namespace nf::chat
