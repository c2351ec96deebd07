// C API: chat templates (nf_chat_apply_template, and with template
// variables nf_chat_apply_template_vars).
#include "capi/capi.h"

#include <nlohmann/json.hpp>

#include <cstring>

using namespace nf;
using nf::capi::fail;
using nf::capi::guard;

namespace {

/// NULL or "": none; else a JSON object.
StatusOr<nlohmann::ordered_json> parseVariables(const char *json) {
  if (!json || !*json)
    return nlohmann::ordered_json();
  auto v = nlohmann::ordered_json::parse(json, nullptr,
                                         /*allow_exceptions=*/false);
  if (v.is_discarded() || !v.is_object())
    return Status::error(
        "nf_chat_apply_template: the template variables are not a JSON "
        "object");
  return v;
}

/// The rendered text into the caller's buffer (see nf_chat_apply_template).
nf_status copyOut(const StatusOr<std::string> &text, char *out, size_t cap,
                  size_t *n_out) {
  if (!text)
    return fail(NF_ERR_INVALID_ARGUMENT, text.status());
  *n_out = text->size();
  if (text->size() > cap)
    return fail(NF_ERR_BUFFER_TOO_SMALL,
                "nf_chat_apply_template: " + std::to_string(text->size()) +
                    " bytes do not fit in a buffer of " + std::to_string(cap));
  if (!text->empty())
    std::memcpy(out, text->data(), text->size());
  if (cap > text->size())
    out[text->size()] = '\0';
  return NF_OK;
}

} // namespace

extern "C" {

nf_status nf_chat_apply_template(const nf_model *model,
                                 const nf_chat_message *messages,
                                 size_t n_messages, int add_generation_prompt,
                                 char *out, size_t cap, size_t *n_out) {
  return nf_chat_apply_template_vars(model, messages, n_messages,
                                     add_generation_prompt, nullptr, out, cap,
                                     n_out);
}

nf_status nf_chat_apply_template_vars(const nf_model *model,
                                      const nf_chat_message *messages,
                                      size_t n_messages,
                                      int add_generation_prompt,
                                      const char *variables_json, char *out,
                                      size_t cap, size_t *n_out) {
  return guard([&]() -> nf_status {
    if (!model || !n_out || (!messages && n_messages > 0) || (!out && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_chat_apply_template: NULL model, messages, out or n_out");
    if (!model->chat.chatTemplate)
      return fail(NF_ERR_UNSUPPORTED, model->noChatTemplateReason);
    std::vector<chat::Message> msgs(n_messages);
    for (size_t i = 0; i < n_messages; ++i) {
      if (!messages[i].role || !messages[i].content)
        return fail(NF_ERR_INVALID_ARGUMENT,
                    "nf_chat_apply_template: message " + std::to_string(i) +
                        " has a NULL role or content");
      msgs[i].role = messages[i].role;
      msgs[i].content = messages[i].content;
    }
    auto variables = parseVariables(variables_json);
    if (!variables)
      return fail(NF_ERR_INVALID_ARGUMENT, variables.status());
    return copyOut(
        model->chat.apply(msgs, add_generation_prompt != 0, &*variables), out,
        cap, n_out);
  });
}

nf_status nf_chat_apply_template_json(const nf_model *model,
                                      const char *messages_json,
                                      int add_generation_prompt,
                                      const char *variables_json, char *out,
                                      size_t cap, size_t *n_out) {
  return guard([&]() -> nf_status {
    if (!model || !messages_json || !n_out || (!out && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_chat_apply_template_json: NULL model, messages, out or "
                  "n_out");
    if (!model->chat.chatTemplate)
      return fail(NF_ERR_UNSUPPORTED, model->noChatTemplateReason);
    const auto messages = nlohmann::ordered_json::parse(
        messages_json, nullptr, /*allow_exceptions=*/false);
    if (messages.is_discarded() || !messages.is_array())
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_chat_apply_template_json: the messages are not a JSON "
                  "array");
    auto variables = parseVariables(variables_json);
    if (!variables)
      return fail(NF_ERR_INVALID_ARGUMENT, variables.status());
    return copyOut(model->chat.applyJson(messages, add_generation_prompt != 0,
                                         &*variables),
                   out, cap, n_out);
  });
}

} // extern "C"
