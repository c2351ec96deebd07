// Encoding one pre-tokenized piece with the BPE model (see bpe.h).
#include "text/bpe.h"

#include "text/unicode.h"

#include <cstdio>
#include <queue>

namespace nf::tok {

template <class Sym> void Bpe::mergeAll(std::vector<Sym> &syms) const {
  if (syms.size() < 2 || merges.empty())
    return;
  struct Cand {
    int32_t rank;
    int32_t pos;
    int32_t newId;
  };
  // Lowest rank first, then leftmost.
  auto worse = [](const Cand &a, const Cand &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
  auto push = [&](int32_t pos) {
    const Sym &l = syms[pos];
    if (l.next < 0)
      return;
    auto it = merges.find(pairKey(l.id, syms[l.next].id));
    if (it != merges.end())
      queue.push({it->second.first, pos, it->second.second});
  };
  for (int32_t p = 0; p + 1 < static_cast<int32_t>(syms.size()); ++p)
    push(p);
  while (!queue.empty()) {
    Cand top = queue.top();
    queue.pop();
    Sym &l = syms[top.pos];
    if (l.removed || l.next < 0)
      continue;
    Sym &r = syms[l.next];
    auto it = merges.find(pairKey(l.id, r.id));
    if (it == merges.end() || it->second.second != top.newId)
      continue; // stale entry
    l.id = top.newId;
    r.removed = true;
    l.next = r.next;
    if (r.next >= 0)
      syms[r.next].prev = top.pos;
    if (l.prev >= 0)
      push(l.prev);
    push(top.pos);
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t> &out) const {
  if (word.empty())
    return;
  if (ignoreMerges) {
    if (auto id = lookup(word)) {
      out.push_back(*id);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  auto addSym = [&](int32_t id) {
    int32_t idx = static_cast<int32_t>(syms.size());
    if (idx > 0)
      syms.back().next = idx;
    syms.push_back({id, idx - 1, -1, false});
  };
  int32_t pendingUnk = -1; // an unk id waiting to be added (fuse_unk)
  std::string key;
  for (size_t i = 0; i < word.size();) {
    char32_t c;
    size_t len = decodeOne(word, i, c);
    const bool first = i == 0, last = i + len == word.size();
    std::string_view ch = word.substr(i, len);
    i += len;
    std::string_view s = ch;
    if ((!first && !prefix.empty()) || (last && !suffix.empty())) {
      key.clear();
      if (!first)
        key += prefix;
      key += ch;
      if (last)
        key += suffix;
      s = key;
    }
    if (auto id = lookup(s)) {
      if (pendingUnk >= 0) {
        addSym(pendingUnk);
        pendingUnk = -1;
      }
      addSym(*id);
      continue;
    }
    if (byteFallback) {
      std::vector<int32_t> bytes;
      for (char b : s) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>",
                      static_cast<unsigned char>(b));
        auto id = lookup(name);
        if (!id)
          break;
        bytes.push_back(*id);
      }
      if (bytes.size() == s.size()) {
        // (like `tokenizers`, a pending unk is kept for later)
        for (int32_t b : bytes)
          addSym(b);
        continue;
      }
    }
    if (unkId) {
      if (pendingUnk >= 0 && !fuseUnk)
        addSym(pendingUnk);
      pendingUnk = *unkId;
    }
  }
  if (pendingUnk >= 0)
    addSym(pendingUnk);
  mergeAll(syms);
  for (const Sym &s : syms)
    if (!s.removed)
      out.push_back(s.id);
}

} // namespace nf::tok
