// A small backtracking regex engine for the pre-tokenizer Split patterns of
// tokenizer.json (which `tokenizers` runs on Oniguruma). The matcher is in
// regex.cpp, the pattern parser in regex_parser.cpp.
//
// Covers the Oniguruma (Ruby syntax) subset that tokenizer.json patterns use:
// alternation, (?:..), (?i:..), (?i), (?m), lookahead, atomic groups,
// greedy/lazy/possessive quantifiers, classes with ranges, nesting and
// \s \S \d \D \w \W \h \H \p{..} \P{..}, anchors ^ $ \A \z \Z \b \B and the
// usual character escapes. Case-insensitive matching folds ASCII letters (and
// U+017F, U+212A). Anything else (backreferences, lookbehind, && classes,
// POSIX brackets, script properties) is a compile error, so that a pattern is
// never silently misread.
#pragma once

#include "nf/status.h"
#include "text/unicode.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::tok {

class Regex {
public:
  /// Compiles `pattern`; the error message (without a file name) is in the
  /// returned status.
  static StatusOr<Regex> compile(std::string_view pattern);

  /// Every match, in order, as code point index ranges [begin, end), found
  /// the way the onig crate's find_iter finds them.
  void findAll(const CpText &t,
               std::vector<std::pair<uint32_t, uint32_t>> &out) const;

private:
  enum class Kind : uint8_t {
    Empty,
    Set,
    Concat,
    Alt,
    Repeat,
    Look,
    Atomic,
    LineBegin,
    LineEnd,
    TextBegin,
    TextEnd,
    TextEndNl,
    WordBoundary,
    NotWordBoundary,
  };
  struct Item {
    enum Kind : uint8_t { Range, Cats, Space, Hex, Sub } kind;
    bool neg = false;
    char32_t lo = 0, hi = 0;
    uint32_t mask = 0;
    int sub = -1; // nested class node
  };
  struct Node {
    Kind kind = Kind::Empty;
    // Set
    std::vector<Item> items;
    bool negate = false;
    bool icase = false;
    bool dot = false;    // '.'
    bool dotAll = false; // '.' matches '\n' too
    // Concat / Alt / Repeat / Look / Atomic
    std::vector<int> kids;
    // Repeat
    int min = 0, max = -1; // max -1: unbounded
    bool greedy = true, possessive = false;
    // Look
    bool negLook = false;
  };

  struct Cont {
    bool (*fn)(const void *, size_t);
    const void *ctx;
    bool operator()(size_t i) const { return fn(ctx, i); }
  };
  template <class F> static Cont cont(const F &f) {
    return {
        [](const void *c, size_t i) { return (*static_cast<const F *>(c))(i); },
        &f};
  }

  struct Matcher {
    const Regex &re;
    const CpText &t;
    size_t depth = 0;
    bool match(int id, size_t i, Cont k);
    bool rep(int id, int count, size_t i, Cont k);
    bool seq(int id, size_t j, size_t i, Cont k);
    bool isWordAt(size_t i) const {
      return i < t.size() && ((bit(static_cast<GC>(t.cat[i])) & kWord) != 0);
    }
  };

  bool itemsMatch(const Node &n, char32_t c, uint8_t cat) const;
  bool setMatches(const Node &n, char32_t c, uint8_t cat) const;

  class Parser;

  std::vector<Node> nodes_;
  int root_ = -1;
};

} // namespace nf::tok
