// Fuzz target: the chat-template renderer (runtime/src/chat): parsing a
// Jinja template and rendering it with a conversation.
//
// The input is NUL-separated: "<template>\0<context JSON>\0<role>\0<content>
// \0<role>\0<content>...". The template is parsed; one that parses is
// rendered with the messages (as transformers' apply_chat_template passes
// them, with bos_token / eos_token) and, when the context part is a JSON
// object, its keys on top (any value the template may meet: numbers, lists,
// nested objects). An odd part left over sets add_generation_prompt.
#include "chat/chat_template.h"
#include "fuzz_util.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::vector<std::string_view> parts = nf::fuzz::split(
      std::string_view(reinterpret_cast<const char *>(data), size),
      std::string_view("\0", 1));
  const std::string source = "chat_template.jinja";
  nf::StatusOr<nf::chat::ChatTemplate> tmpl =
      nf::chat::ChatTemplate::parse(parts[0], source);
  if (!tmpl) {
    nf::fuzz::checkError(tmpl.message(), source);
    return 0;
  }

  nf::chat::ChatConfig config;
  config.chatTemplate = std::move(*tmpl);
  config.specialTokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::vector<nf::chat::Message> messages;
  size_t i = 2;
  for (; i + 1 < parts.size(); i += 2)
    messages.push_back({std::string(parts[i]), std::string(parts[i + 1])});
  const bool addGenerationPrompt = i < parts.size();

  nlohmann::ordered_json extra;
  if (parts.size() > 1 && !parts[1].empty())
    extra = nlohmann::ordered_json::parse(parts[1], nullptr,
                                          /*allow_exceptions=*/false);
  if (!extra.is_object()) {
    nf::StatusOr<std::string> out = config.apply(messages, addGenerationPrompt);
    if (!out)
      nf::fuzz::checkError(out.message(), "");
    return 0;
  }
  nlohmann::ordered_json context =
      config.context(messages, addGenerationPrompt);
  for (auto it = extra.begin(); it != extra.end(); ++it)
    context[it.key()] = it.value();
  nf::StatusOr<std::string> out = config.chatTemplate->render(context);
  if (!out)
    nf::fuzz::checkError(out.message(), source);
  return 0;
}
