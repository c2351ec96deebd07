// Fuzz target: tokenizer.json loading (runtime/src/text/) and
// encode/decode with the tokenizer loaded.
//
// The input is "<tokenizer.json text>\0<text>": the JSON is loaded, and a
// tokenizer that loads encodes the text (with and without the
// post-processor) and decodes the ids it gave and ids read from the text's
// bytes. Without a NUL the whole input is the JSON and the text is empty.
#include "fuzz_util.h"
#include "nf/tokenizer.h"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json = in.substr(0, nul);
  const std::string_view text =
      nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  const std::string source = "tokenizer.json";

  nf::StatusOr<nf::Tokenizer> tok = nf::Tokenizer::fromJson(json, source);
  if (!tok) {
    nf::fuzz::checkError(tok.message(), source);
    return 0;
  }
  const int32_t vocab = tok->vocabSize();
  for (bool addSpecial : {false, true}) {
    std::vector<int32_t> ids = tok->encode(text, addSpecial);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab)
        nf::fuzz::violated("encode gave id " + std::to_string(id) +
                           " outside the vocabulary of " +
                           std::to_string(vocab));
    (void)tok->decode(ids, /*skipSpecial=*/false);
    (void)tok->decodeBytes(ids, /*skipSpecial=*/true);
  }
  // Arbitrary ids: negative, unknown, special.
  std::vector<int32_t> ids(text.size() / 4);
  if (!ids.empty())
    std::memcpy(ids.data(), text.data(), ids.size() * 4);
  (void)tok->decode(ids, false);
  (void)tok->decode(ids, true);
  for (int32_t id : ids) {
    (void)tok->tokenText(id);
    (void)tok->isSpecial(id);
  }
  (void)tok->tokenId(text);
  return 0;
}
