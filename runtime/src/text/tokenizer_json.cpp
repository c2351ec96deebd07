// Loading tokenizer.json into a Tokenizer::Impl: the model (BPE vocab and
// merges), added tokens, normalizer, pre-tokenizers, post-processor and
// decoder. Every input byte is untrusted: anything malformed or unsupported
// is a Status naming the file and the field, never silently ignored.
#include "text/tokenizer_impl.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

namespace nf::tok {

namespace {

using json = nlohmann::json;

// Typed accessors for optional fields: absent/null -> default; wrong type ->
// error.
Status getBool(const std::string &src, const json &obj, const char *key,
               const std::string &where, bool &out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return Status::success();
  if (!it->is_boolean())
    return fail(src, where + "." + key + " is not a boolean");
  out = it->get<bool>();
  return Status::success();
}

Status getOptString(const std::string &src, const json &obj, const char *key,
                    const std::string &where, std::optional<std::string> &out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return Status::success();
  if (!it->is_string())
    return fail(src, where + "." + key + " is not a string");
  out = it->get<std::string>();
  return Status::success();
}

std::string typeOf(const json &j) {
  auto it = j.find("type");
  if (it == j.end() || !it->is_string())
    return "";
  return it->get<std::string>();
}

Status parsePreTokenizer(const std::string &src, const json &j,
                         std::vector<PreTokenizer> &out) {
  if (j.is_null())
    return Status::success();
  if (!j.is_object())
    return fail(src, "pre_tokenizer is not an object");
  std::string type = typeOf(j);
  const std::string where = "pre_tokenizer \"" + type + "\"";
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      return fail(src, "pre_tokenizer Sequence has no \"pretokenizers\" list");
    for (const json &sub : *it)
      if (Status s = parsePreTokenizer(src, sub, out); !s)
        return s;
    return Status::success();
  }
  PreTokenizer pt;
  if (type == "ByteLevel") {
    pt.kind = PreTokenizer::Kind::ByteLevel;
    if (Status s =
            getBool(src, j, "add_prefix_space", where, pt.addPrefixSpace);
        !s)
      return s;
    if (Status s = getBool(src, j, "use_regex", where, pt.useRegex); !s)
      return s;
  } else if (type == "Split") {
    pt.kind = PreTokenizer::Kind::Split;
    auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object())
      return fail(src, "pre_tokenizer Split has no \"pattern\" object");
    if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      std::string re = r->get<std::string>();
      if (re == kGpt2Pattern) {
        pt.gpt2 = true;
      } else {
        StatusOr<Regex> compiled = Regex::compile(re);
        if (!compiled)
          return fail(src, "pre_tokenizer Split pattern " + json(re).dump() +
                               ": " + compiled.message());
        pt.regex = std::make_shared<const Regex>(std::move(*compiled));
      }
    } else if (auto st = pat->find("String");
               st != pat->end() && st->is_string()) {
      pt.literal = true;
      pt.literalText = st->get<std::string>();
    } else {
      return fail(src, "pre_tokenizer Split pattern must be {\"Regex\": ..} "
                       "or {\"String\": ..}");
    }
    auto beh = j.find("behavior");
    std::string b = (beh != j.end() && beh->is_string())
                        ? beh->get<std::string>()
                        : std::string("<missing>");
    if (b == "Removed")
      pt.behavior = Behavior::Removed;
    else if (b == "Isolated")
      pt.behavior = Behavior::Isolated;
    else if (b == "MergedWithPrevious")
      pt.behavior = Behavior::MergedWithPrevious;
    else if (b == "MergedWithNext")
      pt.behavior = Behavior::MergedWithNext;
    else if (b == "Contiguous")
      pt.behavior = Behavior::Contiguous;
    else
      return fail(src,
                  "pre_tokenizer Split has unknown behavior \"" + b + "\"");
    if (Status s = getBool(src, j, "invert", where, pt.invert); !s)
      return s;
  } else if (type == "Digits") {
    pt.kind = PreTokenizer::Kind::Digits;
    if (Status s =
            getBool(src, j, "individual_digits", where, pt.individualDigits);
        !s)
      return s;
  } else {
    return fail(src, "unsupported pre_tokenizer type \"" + type +
                         "\" (supported: ByteLevel, Split, Digits, "
                         "Sequence)");
  }
  out.push_back(std::move(pt));
  return Status::success();
}

Status parseNormalizer(const std::string &src, const json &j) {
  if (j.is_null())
    return Status::success();
  std::string type = j.is_object() ? typeOf(j) : "";
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it != j.end() && it->is_array()) {
      for (const json &sub : *it)
        if (Status s = parseNormalizer(src, sub); !s)
          return s;
      return Status::success();
    }
  }
  return fail(src, "unsupported normalizer \"" + type +
                       "\" (only a null normalizer is supported)");
}

// A ["<s>", 1] pair (RobertaProcessing / BertProcessing cls and sep).
Status pairId(const std::string &src, const json &j, const std::string &where,
              std::vector<int32_t> &ids) {
  if (j.is_array() && j.size() == 2 && j[1].is_number_integer() &&
      j[1].get<int64_t>() >= 0 && j[1].get<int64_t>() <= INT32_MAX - 1) {
    ids.push_back(static_cast<int32_t>(j[1].get<int64_t>()));
    return Status::success();
  }
  return fail(src, where + " is not a [token, id] pair");
}

Status parsePostProcessor(const std::string &src, const json &j,
                          Tokenizer::Impl &impl) {
  if (j.is_null())
    return Status::success();
  if (!j.is_object())
    return fail(src, "post_processor is not an object");
  std::string type = typeOf(j);
  std::vector<int32_t> tmpl; // -1: the sequence
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      return fail(src, "post_processor Sequence has no \"processors\" list");
    for (const json &sub : *it)
      if (Status s = parsePostProcessor(src, sub, impl); !s)
        return s;
    return Status::success();
  }
  if (type == "ByteLevel") {
    return Status::success(); // offsets only
  } else if (type == "TemplateProcessing") {
    auto single = j.find("single");
    auto specials = j.find("special_tokens");
    if (single == j.end() || !single->is_array())
      return fail(src, "post_processor TemplateProcessing has no \"single\"");
    for (const json &piece : *single) {
      if (piece.contains("Sequence")) {
        const json &seq = piece["Sequence"];
        if (!seq.is_object() || seq.value("id", std::string()) != "A")
          return fail(src, "post_processor TemplateProcessing: unsupported "
                           "single-sequence template item " +
                               piece.dump());
        tmpl.push_back(-1);
      } else if (piece.contains("SpecialToken")) {
        const json &st = piece["SpecialToken"];
        std::string name = st.is_object() ? st.value("id", std::string()) : "";
        if (specials == j.end() || !specials->is_object() ||
            !specials->contains(name))
          return fail(src, "post_processor TemplateProcessing: special token "
                           "\"" +
                               name + "\" is not in \"special_tokens\"");
        const json &def = (*specials)[name];
        auto idsIt = def.find("ids");
        if (idsIt == def.end() || !idsIt->is_array())
          return fail(src, "post_processor TemplateProcessing: special token "
                           "\"" +
                               name + "\" has no \"ids\"");
        for (const json &id : *idsIt) {
          // Range-checked before narrowing: -1 marks the sequence in
          // `tmpl`, and a wider id must not wrap into another token's.
          if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
              id.get<int64_t>() > INT32_MAX - 1)
            return fail(src, "post_processor TemplateProcessing: bad id for "
                             "\"" +
                                 name + "\"");
          tmpl.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
      } else {
        return fail(src, "post_processor TemplateProcessing: unknown template "
                         "item " +
                             piece.dump());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto cls = j.find("cls"), sep = j.find("sep");
    if (cls == j.end() || sep == j.end())
      return fail(src, "post_processor " + type + " needs \"cls\" and \"sep\"");
    if (Status s = pairId(src, *cls, "post_processor " + type + ".cls", tmpl);
        !s)
      return s;
    tmpl.push_back(-1);
    if (Status s = pairId(src, *sep, "post_processor " + type + ".sep", tmpl);
        !s)
      return s;
  } else {
    return fail(src, "unsupported post_processor type \"" + type +
                         "\" (supported: ByteLevel, TemplateProcessing, "
                         "RobertaProcessing, BertProcessing, Sequence)");
  }
  // Compose with what earlier processors produced: the new template wraps
  // the old one.
  if (impl.postTemplate.empty()) {
    impl.postTemplate = std::move(tmpl);
  } else {
    std::vector<int32_t> composed;
    for (int32_t t : tmpl) {
      if (t == -1)
        composed.insert(composed.end(), impl.postTemplate.begin(),
                        impl.postTemplate.end());
      else
        composed.push_back(t);
    }
    impl.postTemplate = std::move(composed);
  }
  return Status::success();
}

Status parseDecoder(const std::string &src, const json &j,
                    Tokenizer::Impl &impl) {
  if (j.is_null())
    return Status::success();
  std::string type = j.is_object() ? typeOf(j) : "";
  if (type == "ByteLevel") {
    impl.byteLevelDecoder = true;
    return Status::success();
  }
  return fail(src, "unsupported decoder type \"" + type +
                       "\" (supported: ByteLevel or null)");
}

Status parseModel(const std::string &src, const json &root,
                  Tokenizer::Impl &impl) {
  auto mit = root.find("model");
  if (mit == root.end() || mit->is_null())
    return fail(src, "no \"model\" section");
  const json &m = *mit;
  if (!m.is_object())
    return fail(src, "\"model\" is not an object");
  std::string type = typeOf(m);
  if (type.empty() && m.contains("type"))
    return fail(src, "model.type is not a string");
  if (type.empty() && !(m.contains("vocab") && m.contains("merges")))
    return fail(src, "model has no \"type\"");
  if (!type.empty() && type != "BPE")
    return fail(src, "unsupported model type \"" + type +
                         "\" (only BPE is supported)");
  Bpe &bpe = impl.bpe;

  if (auto d = m.find("dropout"); d != m.end() && !d->is_null()) {
    if (!d->is_number())
      return fail(src, "model.dropout is not a number");
    if (d->get<double>() > 0.0)
      return fail(src, "model.dropout " + d->dump() +
                           " is not supported (encoding would be random)");
  }
  if (Status s = getBool(src, m, "fuse_unk", "model", bpe.fuseUnk); !s)
    return s;
  if (Status s = getBool(src, m, "byte_fallback", "model", bpe.byteFallback);
      !s)
    return s;
  if (Status s = getBool(src, m, "ignore_merges", "model", bpe.ignoreMerges);
      !s)
    return s;
  std::optional<std::string> prefix, suffix, unk;
  if (Status s =
          getOptString(src, m, "continuing_subword_prefix", "model", prefix);
      !s)
    return s;
  if (Status s = getOptString(src, m, "end_of_word_suffix", "model", suffix);
      !s)
    return s;
  if (Status s = getOptString(src, m, "unk_token", "model", unk); !s)
    return s;
  bpe.prefix = prefix.value_or("");
  bpe.suffix = suffix.value_or("");

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object())
    return fail(src, "model.vocab is missing or not an object");
  bpe.vocab.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > INT32_MAX - 1)
      return fail(src, "model.vocab entry " + json(it.key()).dump() +
                           " has a bad id " + it->dump());
    bpe.vocab.emplace(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  if (unk) {
    auto id = bpe.lookup(*unk);
    if (!id)
      return fail(src, "model.unk_token " + json(*unk).dump() +
                           " is not in the vocabulary");
    bpe.unkId = *id;
  }

  auto merges = m.find("merges");
  if (merges != m.end() && !merges->is_null()) {
    if (!merges->is_array())
      return fail(src, "model.merges is not a list");
    int32_t rank = 0;
    const size_t prefixLen = bpe.prefix.size();
    for (const json &entry : *merges) {
      std::string a, b;
      if (entry.is_string()) {
        const std::string &line = entry.get_ref<const std::string &>();
        size_t sp = line.find(' ');
        if (sp == std::string::npos ||
            line.find(' ', sp + 1) != std::string::npos)
          return fail(src, "model.merges[" + std::to_string(rank) + "] " +
                               entry.dump() +
                               " is not two tokens separated by a space");
        a = line.substr(0, sp);
        b = line.substr(sp + 1);
      } else if (entry.is_array() && entry.size() == 2 &&
                 entry[0].is_string() && entry[1].is_string()) {
        a = entry[0].get<std::string>();
        b = entry[1].get<std::string>();
      } else {
        return fail(src, "model.merges[" + std::to_string(rank) + "] " +
                             entry.dump() + " is not a merge");
      }
      auto ia = bpe.lookup(a), ib = bpe.lookup(b);
      if (!ia || !ib)
        return fail(src, "model.merges[" + std::to_string(rank) + "]: token " +
                             json(!ia ? a : b).dump() +
                             " is not in the vocabulary");
      std::string merged =
          a + (b.size() >= prefixLen && b.compare(0, prefixLen, bpe.prefix) == 0
                   ? b.substr(prefixLen)
                   : b);
      auto im = bpe.lookup(merged);
      if (!im)
        return fail(src, "model.merges[" + std::to_string(rank) +
                             "]: merged token " + json(merged).dump() +
                             " is not in the vocabulary");
      // A repeated pair takes the later rank, as in `tokenizers`.
      bpe.merges[pairKey(*ia, *ib)] = {rank, *im};
      ++rank;
    }
  }
  return Status::success();
}

Status parseAddedTokens(const std::string &src, const json &root,
                        Tokenizer::Impl &impl) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null())
    return Status::success();
  if (!it->is_array())
    return fail(src, "added_tokens is not a list");
  size_t index = 0;
  for (const json &t : *it) {
    const std::string where = "added_tokens[" + std::to_string(index++) + "]";
    if (!t.is_object())
      return fail(src, where + " is not an object");
    AddedToken a;
    auto id = t.find("id");
    auto content = t.find("content");
    if (id == t.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX - 1)
      return fail(src, where + " has no valid \"id\"");
    if (content == t.end() || !content->is_string())
      return fail(src, where + " has no \"content\" string");
    a.id = static_cast<int32_t>(id->get<int64_t>());
    a.content = content->get<std::string>();
    // `tokenizers` defaults: normalized = !special.
    if (Status s = getBool(src, t, "special", where, a.special); !s)
      return s;
    a.normalized = !a.special;
    for (auto [key, field] :
         {std::pair{"single_word", &a.singleWord},
          std::pair{"lstrip", &a.lstrip}, std::pair{"rstrip", &a.rstrip},
          std::pair{"normalized", &a.normalized}})
      if (Status s = getBool(src, t, key, where, *field); !s)
        return s;
    impl.added.push_back(std::move(a));
  }
  return Status::success();
}

} // namespace

StatusOr<std::shared_ptr<Tokenizer::Impl>> load(std::string_view text,
                                                const std::string &src) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error &e) {
    return fail(src, "not valid JSON (error at byte " + std::to_string(e.byte) +
                         ")");
  }
  if (!root.is_object())
    return fail(src, "not a JSON object");
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->source = src;

  if (auto t = root.find("truncation"); t != root.end() && !t->is_null())
    return fail(src, "truncation is not supported (it must be null)");
  if (auto p = root.find("padding"); p != root.end() && !p->is_null())
    return fail(src, "padding is not supported (it must be null)");
  if (Status s = parseModel(src, root, *impl); !s)
    return s;
  if (Status s = parseAddedTokens(src, root, *impl); !s)
    return s;
  if (auto n = root.find("normalizer"); n != root.end())
    if (Status s = parseNormalizer(src, *n); !s)
      return s;
  if (auto p = root.find("pre_tokenizer"); p != root.end())
    if (Status s = parsePreTokenizer(src, *p, impl->preTokenizers); !s)
      return s;
  if (auto p = root.find("post_processor"); p != root.end())
    if (Status s = parsePostProcessor(src, *p, *impl); !s)
      return s;
  if (auto d = root.find("decoder"); d != root.end())
    if (Status s = parseDecoder(src, *d, *impl); !s)
      return s;

  // Id tables: the model vocabulary, then added tokens (which win). They
  // have one entry per id up to the largest, so an id far beyond any real
  // vocabulary (the largest have about 262K tokens) is refused instead of
  // allocating gigabytes.
  constexpr int32_t kMaxTokenId = (1 << 22) - 1;
  int32_t size = 0;
  for (const auto &[tok, id] : impl->bpe.vocab)
    size = std::max(size, id + 1);
  for (const AddedToken &a : impl->added)
    size = std::max(size, a.id + 1);
  if (size - 1 > kMaxTokenId)
    return fail(src, "token id " + std::to_string(size - 1) +
                         " is too large (ids up to " +
                         std::to_string(kMaxTokenId) + " are supported)");
  impl->idToToken.resize(static_cast<size_t>(size));
  impl->known.assign(static_cast<size_t>(size), 0);
  impl->special.assign(static_cast<size_t>(size), 0);
  for (const auto &[tok, id] : impl->bpe.vocab) {
    // Two strings with one id: keep the smaller, deterministically.
    if (!impl->known[id] || tok < impl->idToToken[id])
      impl->idToToken[id] = tok;
    impl->known[id] = 1;
  }
  for (const AddedToken &a : impl->added) {
    impl->idToToken[a.id] = a.content;
    impl->known[a.id] = 1;
    impl->special[a.id] = a.special ? 1 : 0;
    impl->addedByContent[a.content] = a.id;
  }
  for (const int32_t id : impl->postTemplate)
    if (id >= size)
      return fail(src, "post_processor uses id " + std::to_string(id) +
                           " outside the vocabulary");
  impl->rawMatcher.build(impl->added, false);
  impl->normalizedMatcher.build(impl->added, true);

  auto find =
      [&](std::initializer_list<const char *> names) -> std::optional<int32_t> {
    for (const char *n : names) {
      if (auto it = impl->addedByContent.find(std::string_view(n));
          it != impl->addedByContent.end())
        return it->second;
      if (auto id = impl->bpe.lookup(n))
        return id;
    }
    return std::nullopt;
  };
  impl->bos = find({"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"});
  impl->eos = find({"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"});
  impl->pad = find({"<pad>", "<|pad|>", "[PAD]"});
  return impl;
}

} // namespace nf::tok
