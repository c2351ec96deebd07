// Hugging Face tokenizer.json byte-level BPE tokenizers (see nf/tokenizer.h).
//
// The pipeline mirrors the `tokenizers` library step by step so that ids are
// identical: added tokens are cut out of the text first, each remaining
// segment goes through the pre-tokenizers (ByteLevel / Split / Digits), every
// resulting piece through BPE (with a per-call cache), and the post-processor
// may wrap the result in special tokens. Every input byte of tokenizer.json is
// untrusted: errors are Status values naming the file; nlohmann::json
// exceptions are caught at the public boundary.
//
// This file: encoding and decoding with a loaded tokenizer (Tokenizer::Impl)
// and the public methods. The parts live beside it in runtime/src/text/:
// unicode (categories, UTF-8), byte_level, regex, pre_tokenizer, bpe,
// added_tokens and tokenizer_json (loading).
#include "nf/tokenizer.h"
#include "nf/file.h"
#include "text/byte_level.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

#include <exception>
#include <unordered_map>
#include <utility>

namespace nf {

// The parts this file puts together (runtime/src/text/).
using tok::ByteMap;
using tok::byteMap;
using tok::CpText;
using tok::decodeOne;
using tok::fail;
using tok::load;
using tok::preTokenize;
using tok::PreTokenizer;
using tok::Segment;
using tok::splitAdded;
using tok::utf8Lossy;

void Tokenizer::Impl::encodeInto(std::string_view text,
                                 std::vector<int32_t> &ids) const {
  std::vector<Segment> first, segments;
  splitAdded(text, added, rawMatcher, first);
  for (const Segment &seg : first) {
    if (seg.id >= 0)
      segments.push_back(seg);
    else
      splitAdded(seg.text, added, normalizedMatcher, segments);
  }
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  CpText scratch;
  std::vector<std::string> pieces;
  for (const Segment &seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.text.empty())
      continue;
    pieces.clear();
    pieces.emplace_back(seg.text);
    for (const PreTokenizer &pt : preTokenizers)
      preTokenize(pt, pieces, scratch);
    for (const std::string &piece : pieces) {
      auto it = cache.find(piece);
      if (it == cache.end()) {
        std::vector<int32_t> out;
        bpe.tokenize(piece, out);
        it = cache.emplace(piece, std::move(out)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  }
}

std::string Tokenizer::Impl::decodeRaw(const std::vector<int32_t> &ids,
                                       bool skipSpecial) const {
  std::string out;
  const ByteMap &bm = byteMap();
  bool firstToken = true;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= idToToken.size() || !known[id])
      continue;
    if (skipSpecial && special[id])
      continue;
    const std::string &tok = idToToken[id];
    if (!byteLevelDecoder) {
      if (!firstToken)
        out += ' ';
      out += tok;
      firstToken = false;
      continue;
    }
    // ByteLevel: every char mapped back to its byte, or the token verbatim
    // if any char is outside the byte alphabet.
    std::string bytes;
    bool ok = true;
    for (size_t i = 0; i < tok.size();) {
      char32_t c;
      i += decodeOne(tok, i, c);
      if (c >= bm.toByte.size() || bm.toByte[c] < 0) {
        ok = false;
        break;
      }
      bytes += static_cast<char>(bm.toByte[c]);
    }
    out += ok ? bytes : tok;
  }
  return out;
}

StatusOr<Tokenizer> Tokenizer::fromJson(std::string_view jsonText,
                                        const std::string &sourceName) {
  try {
    StatusOr<std::shared_ptr<Impl>> impl = load(jsonText, sourceName);
    if (!impl)
      return impl.status();
    return Tokenizer(std::move(*impl));
  } catch (const std::exception &e) {
    return fail(sourceName, std::string("cannot load tokenizer: ") + e.what());
  }
}

StatusOr<Tokenizer> Tokenizer::fromFile(const std::string &path) {
  StatusOr<std::string> text = readWholeFile(path);
  if (!text)
    return text.status();
  return fromJson(*text, path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text,
                                       bool addSpecial) const {
  std::vector<int32_t> ids;
  try {
    impl_->encodeInto(text, ids);
    if (addSpecial && !impl_->postTemplate.empty()) {
      std::vector<int32_t> wrapped;
      wrapped.reserve(ids.size() + impl_->postTemplate.size());
      for (int32_t t : impl_->postTemplate) {
        if (t == -1)
          wrapped.insert(wrapped.end(), ids.begin(), ids.end());
        else
          wrapped.push_back(t);
      }
      ids = std::move(wrapped);
    }
  } catch (const std::exception &) {
    // Only std::bad_alloc can get here; nothing may escape the API.
    ids.clear();
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids,
                              bool skipSpecial) const {
  try {
    std::string raw = impl_->decodeRaw(ids, skipSpecial);
    return impl_->byteLevelDecoder ? utf8Lossy(raw) : raw;
  } catch (const std::exception &) {
    return std::string();
  }
}

std::string Tokenizer::decodeBytes(const std::vector<int32_t> &ids,
                                   bool skipSpecial) const {
  try {
    return impl_->decodeRaw(ids, skipSpecial);
  } catch (const std::exception &) {
    return std::string();
  }
}

std::string Tokenizer::tokenText(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->idToToken.size())
    return std::string();
  return impl_->idToToken[id];
}

std::optional<int32_t> Tokenizer::tokenId(std::string_view token) const {
  if (auto it = impl_->addedByContent.find(token);
      it != impl_->addedByContent.end())
    return it->second;
  return impl_->bpe.lookup(token);
}

int32_t Tokenizer::vocabSize() const {
  return static_cast<int32_t>(impl_->idToToken.size());
}

bool Tokenizer::isSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[id];
}

std::optional<int32_t> Tokenizer::bosId() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eosId() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::padId() const { return impl_->pad; }
const std::string &Tokenizer::source() const { return impl_->source; }

} // namespace nf
