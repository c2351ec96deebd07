// Matching of the tokenizer's backtracking regex engine (see regex.h):
// continuation-passing backtracking over a compiled node graph, and the
// onig-style iteration over all matches.
#include "text/regex.h"

#include <algorithm>

namespace nf::tok {

bool Regex::itemsMatch(const Node &n, char32_t c, uint8_t cat) const {
  for (const Item &it : n.items) {
    bool m = false;
    switch (it.kind) {
    case Item::Range:
      m = c >= it.lo && c <= it.hi;
      break;
    case Item::Cats:
      m = (bit(static_cast<GC>(cat)) & it.mask) != 0;
      break;
    case Item::Space:
      m = isWhiteSpace(c);
      break;
    case Item::Hex:
      m = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
          (c >= 'A' && c <= 'F');
      break;
    case Item::Sub:
      m = setMatches(nodes_[it.sub], c, cat);
      break;
    }
    if (m != it.neg)
      return true;
  }
  return false;
}

bool Regex::setMatches(const Node &n, char32_t c, uint8_t cat) const {
  if (n.dot)
    return n.dotAll || c != '\n';
  bool m = itemsMatch(n, c, cat);
  if (!m && n.icase) {
    char32_t lower = foldLower(c), upper = foldUpper(c);
    if (lower != c)
      m = itemsMatch(n, lower, generalCategory(lower));
    if (!m && upper != c)
      m = itemsMatch(n, upper, generalCategory(upper));
  }
  return m != n.negate;
}

namespace {

// Deep recursion only comes from general (non single-character) repetitions
// over long inputs; give up on such a match rather than overflow the stack.
constexpr size_t kMaxDepth = 4000;

} // namespace

bool Regex::Matcher::seq(int id, size_t j, size_t i, Cont k) {
  const Node &n = re.nodes_[id];
  if (j == n.kids.size())
    return k(i);
  auto next = [&](size_t p) { return seq(id, j + 1, p, k); };
  return match(n.kids[j], i, cont(next));
}

bool Regex::Matcher::rep(int id, int count, size_t i, Cont k) {
  const Node &n = re.nodes_[id];
  auto more = [&]() {
    if (n.max >= 0 && count >= n.max)
      return false;
    auto next = [&](size_t p) {
      if (p == i && count >= n.min)
        return false; // an empty iteration cannot make progress
      return rep(id, count + 1, p, k);
    };
    return match(n.kids[0], i, cont(next));
  };
  if (n.greedy) {
    if (more())
      return true;
    return count >= n.min && k(i);
  }
  if (count >= n.min && k(i))
    return true;
  return more();
}

bool Regex::Matcher::match(int id, size_t i, Cont k) {
  struct DepthGuard {
    size_t &depth;
    explicit DepthGuard(size_t &counter) : depth(counter) { ++depth; }
    ~DepthGuard() { --depth; }
  } guard(depth);
  if (depth > kMaxDepth)
    return false;
  const Node &n = re.nodes_[id];
  const size_t size = t.size();
  switch (n.kind) {
  case Kind::Empty:
    return k(i);
  case Kind::Set:
    return i < size && re.setMatches(n, t.cp[i], t.cat[i]) && k(i + 1);
  case Kind::Concat:
    return seq(id, 0, i, k);
  case Kind::Alt:
    for (int kid : n.kids)
      if (match(kid, i, k))
        return true;
    return false;
  case Kind::Repeat: {
    const Node &kid = re.nodes_[n.kids[0]];
    if (kid.kind != Kind::Set) {
      if (!n.possessive)
        return rep(id, 0, i, k);
      // Possessive: take every iteration that matches, never give one back.
      size_t pos = i;
      int count = 0;
      while (n.max < 0 || count < n.max) {
        size_t e = 0;
        auto accept = [&](size_t p) {
          e = p;
          return true;
        };
        if (!match(n.kids[0], pos, cont(accept)))
          break;
        if (e == pos) { // an empty iteration satisfies any minimum
          count = std::max(count, n.min);
          break;
        }
        pos = e;
        ++count;
      }
      return count >= n.min && k(pos);
    }
    // Single-character body: count the run, then back off.
    size_t limit = size - i;
    if (n.max >= 0 && static_cast<size_t>(n.max) < limit)
      limit = static_cast<size_t>(n.max);
    size_t c = 0;
    while (c < limit && re.setMatches(kid, t.cp[i + c], t.cat[i + c]))
      ++c;
    const size_t lo = static_cast<size_t>(n.min);
    if (c < lo)
      return false;
    if (n.possessive)
      return k(i + c);
    if (n.greedy) {
      for (size_t j = c;; --j) {
        if (k(i + j))
          return true;
        if (j == lo)
          return false;
      }
    }
    for (size_t j = lo; j <= c; ++j)
      if (k(i + j))
        return true;
    return false;
  }
  case Kind::Look: {
    auto accept = [](size_t) { return true; };
    bool m = match(n.kids[0], i, cont(accept));
    return m != n.negLook && k(i);
  }
  case Kind::Atomic: {
    size_t end = 0;
    auto accept = [&](size_t p) {
      end = p;
      return true;
    };
    return match(n.kids[0], i, cont(accept)) && k(end);
  }
  case Kind::LineBegin:
    return (i == 0 || t.cp[i - 1] == '\n') && k(i);
  case Kind::LineEnd:
    return (i == size || t.cp[i] == '\n') && k(i);
  case Kind::TextBegin:
    return i == 0 && k(i);
  case Kind::TextEnd:
    return i == size && k(i);
  case Kind::TextEndNl:
    return (i == size || (i + 1 == size && t.cp[i] == '\n')) && k(i);
  case Kind::WordBoundary:
  case Kind::NotWordBoundary: {
    bool b = (i > 0 && isWordAt(i - 1)) != isWordAt(i);
    return (b == (n.kind == Kind::WordBoundary)) && k(i);
  }
  }
  return false;
}

void Regex::findAll(const CpText &t,
                    std::vector<std::pair<uint32_t, uint32_t>> &out) const {
  const size_t n = t.size();
  size_t lastEnd = 0;
  bool haveLast = false;
  size_t lastMatchEnd = 0;
  Matcher m{*this, t};
  while (lastEnd <= n) {
    size_t s = lastEnd, e = 0;
    bool found = false;
    auto accept = [&](size_t p) {
      e = p;
      return true;
    };
    for (; s <= n; ++s) {
      if (m.match(root_, s, cont(accept))) {
        found = true;
        break;
      }
    }
    if (!found)
      return;
    if (e == s && haveLast && lastMatchEnd == e) {
      ++lastEnd; // no empty match right after the previous match
      continue;
    }
    lastEnd = e;
    lastMatchEnd = e;
    haveLast = true;
    out.emplace_back(static_cast<uint32_t>(s), static_cast<uint32_t>(e));
  }
}

} // namespace nf::tok
