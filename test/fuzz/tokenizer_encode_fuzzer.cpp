// Fuzz target: encode/decode of arbitrary bytes with real tokenizers
// (runtime/src/text/): examples/pydoc-moe/tokenizer.json and the
// variants of test/data/tokenizer/variants (Split regexes, byte fallback,
// added tokens with lstrip/rstrip/single_word, template post-processors).
//
// The input is one option byte and the text: byte % 5 picks the tokenizer,
// bit 0x10 adds special tokens, bit 0x20 skips them when decoding. The text
// is encoded and decoded; its bytes are also decoded as little-endian ids.
// pydoc-moe's tokenizer is byte-level without a normalizer or
// post-processor, so there decoding must give back the text exactly.
#include "fuzz_util.h"
#include "nf/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

const std::vector<nf::Tokenizer> &tokenizers() {
  static const std::vector<nf::Tokenizer> all = [] {
    std::vector<nf::Tokenizer> out;
    for (const char *path :
         {NF_SOURCE_DIR "/examples/pydoc-moe/tokenizer.json",
          NF_SOURCE_DIR "/test/data/tokenizer/variants/"
                        "bytefallback-unk.tokenizer.json",
          NF_SOURCE_DIR "/test/data/tokenizer/variants/"
                        "bytelevel-prefix-suffix.tokenizer.json",
          NF_SOURCE_DIR "/test/data/tokenizer/variants/"
                        "split-llama3.tokenizer.json",
          NF_SOURCE_DIR "/test/data/tokenizer/variants/"
                        "split-tekken.tokenizer.json"}) {
      nf::StatusOr<nf::Tokenizer> t = nf::Tokenizer::fromFile(path);
      if (!t) {
        std::fprintf(stderr, "nf fuzz: %s\n", t.message().c_str());
        std::abort();
      }
      out.push_back(std::move(*t));
    }
    return out;
  }();
  return all;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const auto &all = tokenizers();
  const uint8_t opt = data[0];
  const size_t which = opt % all.size();
  const bool addSpecial = opt & 0x10, skipSpecial = opt & 0x20;
  const nf::Tokenizer &tok = all[which];
  const std::string_view text(reinterpret_cast<const char *>(data + 1),
                              size - 1);

  const std::vector<int32_t> ids = tok.encode(text, addSpecial);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocabSize())
      nf::fuzz::violated("encode gave id " + std::to_string(id));
  const std::string bytes = tok.decodeBytes(ids, skipSpecial);
  (void)tok.decode(ids, skipSpecial);
  // Kept special tokens decode to their text, and pydoc-moe has no
  // post-processor: the text comes back byte for byte.
  if (which == 0 && !skipSpecial && bytes != text)
    nf::fuzz::violated("pydoc-moe: decodeBytes(encode(text)) != text");

  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty())
    std::memcpy(raw.data(), text.data(), raw.size() * 4);
  (void)tok.decode(raw, skipSpecial);
  return 0;
}
