// C API: tokenizer entry points.
#include "capi/capi.h"

#include <cstring>

using namespace nf;
using nf::capi::fail;
using nf::capi::guard;

extern "C" {

nf_status nf_tokenize(const nf_model *model, const char *text, size_t len,
                      int add_special, int32_t *out, size_t cap,
                      size_t *n_out) {
  return guard([&]() -> nf_status {
    if (!model || !n_out || (!text && len > 0) || (!out && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_tokenize: NULL model, text, out or n_out");
    if (!model->tokenizer)
      return fail(NF_ERR_UNSUPPORTED, model->noTokenizerReason);
    std::vector<int32_t> ids = model->tokenizer->encode(
        std::string_view(text ? text : "", len), add_special != 0);
    *n_out = ids.size();
    if (ids.size() > cap)
      return fail(NF_ERR_BUFFER_TOO_SMALL,
                  "nf_tokenize: " + std::to_string(ids.size()) +
                      " tokens do not fit in a buffer of " +
                      std::to_string(cap));
    if (!ids.empty())
      std::memcpy(out, ids.data(), ids.size() * sizeof(int32_t));
    return NF_OK;
  });
}

nf_status nf_detokenize(const nf_model *model, const int32_t *tokens, size_t n,
                        int flags, char *out, size_t cap, size_t *n_out) {
  return guard([&]() -> nf_status {
    if (!model || !n_out || (!tokens && n > 0) || (!out && cap > 0))
      return fail(NF_ERR_INVALID_ARGUMENT,
                  "nf_detokenize: NULL model, tokens, out or n_out");
    if (!model->tokenizer)
      return fail(NF_ERR_UNSUPPORTED, model->noTokenizerReason);
    std::vector<int32_t> ids(tokens, tokens + n);
    const bool skipSpecial = (flags & NF_DETOKENIZE_SKIP_SPECIAL) != 0;
    std::string text = (flags & NF_DETOKENIZE_RAW_BYTES)
                           ? model->tokenizer->decodeBytes(ids, skipSpecial)
                           : model->tokenizer->decode(ids, skipSpecial);
    *n_out = text.size();
    if (text.size() > cap)
      return fail(NF_ERR_BUFFER_TOO_SMALL,
                  "nf_detokenize: " + std::to_string(text.size()) +
                      " bytes do not fit in a buffer of " +
                      std::to_string(cap));
    if (!text.empty())
      std::memcpy(out, text.data(), text.size());
    if (cap > text.size())
      out[text.size()] = '\0';
    return NF_OK;
  });
}

} // extern "C"
