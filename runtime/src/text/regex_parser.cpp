// Parsing of the tokenizer's regex patterns into the node graph of Regex (see
// regex.h): the Oniguruma subset tokenizer.json patterns use; anything outside
// it is a compile error naming the offset.
#include "text/regex.h"

#include <cctype>
#include <string>

namespace nf::tok {

class Regex::Parser {
public:
  Parser(Regex &re, std::vector<char32_t> p) : re_(re), p_(std::move(p)) {}

  Status run() {
    Flags f;
    int root = -1;
    if (Status s = parseAlt(f, root); !s)
      return s;
    if (pos_ != p_.size())
      return err("unmatched ')'");
    re_.root_ = root;
    return Status::success();
  }

private:
  struct Flags {
    bool icase = false;
    bool dotAll = false;
  };

  Status err(const std::string &what) const {
    return Status::error(what + " at offset " + std::to_string(pos_));
  }
  bool atEnd() const { return pos_ >= p_.size(); }
  char32_t peek(size_t ahead = 0) const {
    return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : 0;
  }
  int add(Node n) {
    re_.nodes_.push_back(std::move(n));
    return static_cast<int>(re_.nodes_.size() - 1);
  }

  Status parseAlt(Flags &f, int &out) {
    std::vector<int> alts;
    int first = -1;
    if (Status s = parseConcat(f, first); !s)
      return s;
    alts.push_back(first);
    while (!atEnd() && peek() == '|') {
      ++pos_;
      int next = -1;
      if (Status s = parseConcat(f, next); !s)
        return s;
      alts.push_back(next);
    }
    if (alts.size() == 1) {
      out = alts[0];
    } else {
      Node n;
      n.kind = Kind::Alt;
      n.kids = std::move(alts);
      out = add(std::move(n));
    }
    return Status::success();
  }

  Status parseConcat(Flags &f, int &out) {
    std::vector<int> parts;
    while (!atEnd() && peek() != '|' && peek() != ')') {
      // Inline flags "(?i)" change the rest of the enclosing group.
      if (peek() == '(' && peek(1) == '?') {
        size_t save = pos_;
        Flags nf = f;
        pos_ += 2;
        if (parseFlagLetters(nf) && peek() == ')') {
          ++pos_;
          f = nf;
          continue;
        }
        pos_ = save;
      }
      int atom = -1;
      if (Status s = parseQuantified(f, atom); !s)
        return s;
      parts.push_back(atom);
    }
    if (parts.size() == 1) {
      out = parts[0];
    } else {
      Node n;
      n.kind = parts.empty() ? Kind::Empty : Kind::Concat;
      n.kids = std::move(parts);
      out = add(std::move(n));
    }
    return Status::success();
  }

  // Reads flag letters such as "i", "-i", "im"; false on anything else.
  bool parseFlagLetters(Flags &f) {
    bool on = true, any = false;
    while (!atEnd()) {
      char32_t c = peek();
      if (c == '-') {
        on = false;
      } else if (c == 'i') {
        f.icase = on;
      } else if (c == 'm') {
        f.dotAll = on; // Ruby syntax: (?m) lets '.' match newlines
      } else {
        break;
      }
      any = true;
      ++pos_;
    }
    return any;
  }

  bool readNumber(int &v) {
    if (atEnd() || peek() < '0' || peek() > '9')
      return false;
    long long x = 0;
    while (!atEnd() && peek() >= '0' && peek() <= '9') {
      x = x * 10 + (peek() - '0');
      if (x > 100000)
        x = 100000;
      ++pos_;
    }
    v = static_cast<int>(x);
    return true;
  }

  Status parseQuantified(Flags &f, int &out) {
    int atom = -1;
    if (Status s = parseAtom(f, atom); !s)
      return s;
    while (!atEnd()) {
      int lo = 0, hi = -1;
      char32_t c = peek();
      size_t save = pos_;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        lo = 1;
        ++pos_;
      } else if (c == '?') {
        hi = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        bool haveLo = readNumber(lo);
        bool comma = false, haveHi = false;
        if (peek() == ',') {
          comma = true;
          ++pos_;
          haveHi = readNumber(hi);
        }
        if ((!haveLo && !haveHi) || peek() != '}') {
          pos_ = save; // a literal '{'
          break;
        }
        ++pos_;
        if (!comma)
          hi = lo;
        else if (!haveHi)
          hi = -1;
        if (!haveLo)
          lo = 0;
        if (hi >= 0 && hi < lo)
          return err("bad repetition range");
      } else {
        break;
      }
      const Node &body = re_.nodes_[atom];
      if (body.kind == Kind::Look || body.kind == Kind::LineBegin ||
          body.kind == Kind::LineEnd || body.kind == Kind::TextBegin ||
          body.kind == Kind::TextEnd || body.kind == Kind::TextEndNl ||
          body.kind == Kind::WordBoundary || body.kind == Kind::NotWordBoundary)
        return err("quantifier on an assertion");
      Node r;
      r.kind = Kind::Repeat;
      r.kids = {atom};
      r.min = lo;
      r.max = hi;
      if (peek() == '?') {
        r.greedy = false;
        ++pos_;
      } else if (peek() == '+') {
        r.possessive = true;
        ++pos_;
      }
      atom = add(std::move(r));
    }
    out = atom;
    return Status::success();
  }

  Status parseGroup(Flags f, int &out) {
    // pos_ is just past '('.
    Kind kind = Kind::Empty; // Empty: plain group
    bool negLook = false;
    if (peek() == '?') {
      ++pos_;
      char32_t c = peek();
      if (c == ':') {
        ++pos_;
      } else if (c == '=' || c == '!') {
        kind = Kind::Look;
        negLook = c == '!';
        ++pos_;
      } else if (c == '>') {
        kind = Kind::Atomic;
        ++pos_;
      } else if (c == '<' && (peek(1) == '=' || peek(1) == '!')) {
        return err("lookbehind is not supported");
      } else if (c == '<' || (c == 'P' && peek(1) == '<')) {
        // Named group: matched like a plain group.
        while (!atEnd() && peek() != '>')
          ++pos_;
        if (atEnd())
          return err("unterminated group name");
        ++pos_;
      } else if (c == '#') {
        while (!atEnd() && peek() != ')')
          ++pos_;
        if (atEnd())
          return err("unterminated comment");
        ++pos_;
        Node e;
        out = add(e);
        return Status::success();
      } else {
        Flags nf = f;
        if (!parseFlagLetters(nf) || peek() != ':')
          return err("unsupported group syntax");
        ++pos_;
        f = nf;
      }
    }
    int body = -1;
    if (Status s = parseAlt(f, body); !s)
      return s;
    if (atEnd() || peek() != ')')
      return err("missing ')'");
    ++pos_;
    if (kind == Kind::Empty) {
      out = body;
      return Status::success();
    }
    Node n;
    n.kind = kind;
    n.kids = {body};
    n.negLook = negLook;
    out = add(std::move(n));
    return Status::success();
  }

  static std::string loose(const std::string &name) {
    std::string s;
    for (char c : name)
      if (c != '_' && c != ' ' && c != '-')
        s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }

  // \p{name}: general categories (short and long names) and a few binary
  // properties. Fills `item` (a Cats or Space item).
  static bool propertyItem(const std::string &rawName, Item &item) {
    static const std::pair<const char *, uint32_t> kNames[] = {
        {"l", kLetter},
        {"letter", kLetter},
        {"lu", bit(Lu)},
        {"uppercaseletter", bit(Lu)},
        {"ll", bit(Ll)},
        {"lowercaseletter", bit(Ll)},
        {"lt", bit(Lt)},
        {"titlecaseletter", bit(Lt)},
        {"lm", bit(Lm)},
        {"modifierletter", bit(Lm)},
        {"lo", bit(Lo)},
        {"otherletter", bit(Lo)},
        {"lc", bit(Lu) | bit(Ll) | bit(Lt)},
        {"l&", bit(Lu) | bit(Ll) | bit(Lt)},
        {"casedletter", bit(Lu) | bit(Ll) | bit(Lt)},
        {"m", kMark},
        {"mark", kMark},
        {"combiningmark", kMark},
        {"mn", bit(Mn)},
        {"nonspacingmark", bit(Mn)},
        {"mc", bit(Mc)},
        {"spacingmark", bit(Mc)},
        {"me", bit(Me)},
        {"enclosingmark", bit(Me)},
        {"n", kNumber},
        {"number", kNumber},
        {"nd", bit(Nd)},
        {"decimalnumber", bit(Nd)},
        {"digit", bit(Nd)},
        {"nl", bit(Nl)},
        {"letternumber", bit(Nl)},
        {"no", bit(No)},
        {"othernumber", bit(No)},
        {"p", kPunct},
        {"punctuation", kPunct},
        {"pc", bit(Pc)},
        {"connectorpunctuation", bit(Pc)},
        {"pd", bit(Pd)},
        {"dashpunctuation", bit(Pd)},
        {"ps", bit(Ps)},
        {"openpunctuation", bit(Ps)},
        {"pe", bit(Pe)},
        {"closepunctuation", bit(Pe)},
        {"pi", bit(Pi)},
        {"initialpunctuation", bit(Pi)},
        {"pf", bit(Pf)},
        {"finalpunctuation", bit(Pf)},
        {"po", bit(Po)},
        {"otherpunctuation", bit(Po)},
        {"s", kSymbol},
        {"symbol", kSymbol},
        {"sm", bit(Sm)},
        {"mathsymbol", bit(Sm)},
        {"sc", bit(Sc)},
        {"currencysymbol", bit(Sc)},
        {"sk", bit(Sk)},
        {"modifiersymbol", bit(Sk)},
        {"so", bit(So)},
        {"othersymbol", bit(So)},
        {"z", kSeparator},
        {"separator", kSeparator},
        {"zs", bit(Zs)},
        {"spaceseparator", bit(Zs)},
        {"zl", bit(Zl)},
        {"lineseparator", bit(Zl)},
        {"zp", bit(Zp)},
        {"paragraphseparator", bit(Zp)},
        {"c", kOther},
        {"other", kOther},
        {"cc", bit(Cc)},
        {"control", bit(Cc)},
        {"cf", bit(Cf)},
        {"format", bit(Cf)},
        {"cs", bit(Cs)},
        {"surrogate", bit(Cs)},
        {"co", bit(Co)},
        {"privateuse", bit(Co)},
        {"cn", bit(Cn)},
        {"unassigned", bit(Cn)},
        {"any", (1u << kNumGC) - 1},
        {"alnum", kLetter | kMark | kNumber},
        {"word", kWord},
    };
    std::string name = loose(rawName);
    if (name == "space" || name == "whitespace") {
      item.kind = Item::Space;
      return true;
    }
    for (const auto &[n, mask] : kNames) {
      if (name == n) {
        item.kind = Item::Cats;
        item.mask = mask;
        return true;
      }
    }
    return false;
  }

  // Parses an escape (pos_ just past '\'). Either yields a character (`isChar`)
  // or a class item.
  Status parseEscape(bool inClass, bool &isChar, char32_t &ch, Item &item,
                     Kind &assertion) {
    isChar = false;
    assertion = Kind::Empty;
    if (atEnd())
      return err("trailing backslash");
    char32_t c = p_[pos_++];
    auto hexValue = [](char32_t h) -> int {
      if (h >= '0' && h <= '9')
        return static_cast<int>(h - '0');
      if (h >= 'a' && h <= 'f')
        return static_cast<int>(h - 'a' + 10);
      if (h >= 'A' && h <= 'F')
        return static_cast<int>(h - 'A' + 10);
      return -1;
    };
    switch (c) {
    case 's':
    case 'S':
      item.kind = Item::Space;
      item.neg = c == 'S';
      return Status::success();
    case 'd':
    case 'D':
      item.kind = Item::Cats;
      item.mask = bit(Nd);
      item.neg = c == 'D';
      return Status::success();
    case 'w':
    case 'W':
      item.kind = Item::Cats;
      item.mask = kWord;
      item.neg = c == 'W';
      return Status::success();
    case 'h':
    case 'H':
      item.kind = Item::Hex;
      item.neg = c == 'H';
      return Status::success();
    case 'p':
    case 'P': {
      if (peek() != '{')
        return err("expected '{' after \\p");
      ++pos_;
      bool neg = c == 'P';
      if (peek() == '^') {
        neg = !neg;
        ++pos_;
      }
      std::string name;
      while (!atEnd() && peek() != '}') {
        if (peek() > 0x7f)
          return err("bad property name");
        name += static_cast<char>(peek());
        ++pos_;
      }
      if (atEnd())
        return err("unterminated \\p{");
      ++pos_;
      if (!propertyItem(name, item))
        return err("unsupported property \\p{" + name + "}");
      item.neg = neg;
      return Status::success();
    }
    case 'n':
      ch = '\n';
      break;
    case 'r':
      ch = '\r';
      break;
    case 't':
      ch = '\t';
      break;
    case 'f':
      ch = '\f';
      break;
    case 'v':
      ch = '\v';
      break;
    case 'a':
      ch = 0x07;
      break;
    case 'e':
      ch = 0x1b;
      break;
    case '0':
      ch = 0;
      break;
    case 'x': {
      char32_t v = 0;
      if (peek() == '{') {
        ++pos_;
        int digits = 0;
        while (!atEnd() && peek() != '}') {
          int h = hexValue(peek());
          if (h < 0 || ++digits > 8)
            return err("bad \\x{...} escape");
          v = v * 16 + static_cast<char32_t>(h);
          ++pos_;
        }
        if (atEnd() || digits == 0)
          return err("bad \\x{...} escape");
        ++pos_;
      } else {
        int digits = 0;
        while (digits < 2 && hexValue(peek()) >= 0) {
          v = v * 16 + static_cast<char32_t>(hexValue(peek()));
          ++pos_;
          ++digits;
        }
        if (digits == 0)
          return err("bad \\x escape");
      }
      if (v > 0x10ffff)
        return err("code point out of range");
      ch = v;
      break;
    }
    case 'u': {
      char32_t v = 0;
      for (int k = 0; k < 4; ++k) {
        int h = hexValue(peek());
        if (h < 0)
          return err("bad \\u escape");
        v = v * 16 + static_cast<char32_t>(h);
        ++pos_;
      }
      ch = v;
      break;
    }
    case 'b':
      if (inClass) {
        ch = 0x08;
        break;
      }
      assertion = Kind::WordBoundary;
      return Status::success();
    case 'B':
    case 'A':
    case 'z':
    case 'Z':
      if (inClass)
        return err(std::string("\\") + static_cast<char>(c) +
                   " inside a class");
      assertion = c == 'B'   ? Kind::NotWordBoundary
                  : c == 'A' ? Kind::TextBegin
                  : c == 'z' ? Kind::TextEnd
                             : Kind::TextEndNl;
      return Status::success();
    default:
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '1' && c <= '9'))
        return err(std::string("unsupported escape \\") + static_cast<char>(c));
      ch = c; // escaped punctuation or any other literal
      break;
    }
    isChar = true;
    return Status::success();
  }

  Status parseClass(const Flags &f, int &out) {
    // pos_ is just past '['.
    Node n;
    n.kind = Kind::Set;
    n.icase = f.icase;
    if (peek() == '^') {
      n.negate = true;
      ++pos_;
    }
    bool first = true;
    while (true) {
      if (atEnd())
        return err("unterminated character class");
      char32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[') {
        if (peek(1) == ':')
          return err("POSIX bracket expressions are not supported");
        ++pos_;
        int sub = -1;
        if (Status s = parseClass(f, sub); !s)
          return s;
        Item it;
        it.kind = Item::Sub;
        it.sub = sub;
        n.items.push_back(it);
        continue;
      }
      if (c == '&' && peek(1) == '&')
        return err("class intersection '&&' is not supported");
      // A single character (possibly the start of a range) or a class item.
      char32_t lo;
      ++pos_;
      if (c == '\\') {
        bool isChar;
        Item it;
        Kind assertion;
        if (Status s = parseEscape(true, isChar, lo, it, assertion); !s)
          return s;
        if (!isChar) {
          n.items.push_back(it);
          continue;
        }
      } else {
        lo = c;
      }
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < p_.size()) {
        size_t save = pos_;
        ++pos_;
        char32_t c2 = p_[pos_++];
        if (c2 == '\\') {
          bool isChar;
          Item it;
          Kind assertion;
          if (Status s = parseEscape(true, isChar, hi, it, assertion); !s)
            return s;
          if (!isChar)
            return err("bad range in character class");
        } else if (c2 == '[') {
          pos_ = save; // '-' is a literal before a nested class
          hi = lo;
        } else {
          hi = c2;
        }
        if (hi < lo)
          return err("bad range in character class");
      }
      Item it;
      it.kind = Item::Range;
      it.lo = lo;
      it.hi = hi;
      n.items.push_back(it);
    }
    out = add(std::move(n));
    return Status::success();
  }

  Status parseAtom(Flags &f, int &out) {
    char32_t c = p_[pos_++];
    Node n;
    switch (c) {
    case '(':
      return parseGroup(f, out);
    case '[':
      return parseClass(f, out);
    case '.':
      n.kind = Kind::Set;
      n.dot = true;
      n.dotAll = f.dotAll;
      break;
    case '^':
      n.kind = Kind::LineBegin;
      break;
    case '$':
      n.kind = Kind::LineEnd;
      break;
    case '*':
    case '+':
    case '?':
      return err("quantifier without a target");
    case '\\': {
      bool isChar;
      char32_t ch = 0;
      Item it;
      Kind assertion;
      if (Status s = parseEscape(false, isChar, ch, it, assertion); !s)
        return s;
      if (assertion != Kind::Empty) {
        n.kind = assertion;
        break;
      }
      n.kind = Kind::Set;
      n.icase = f.icase;
      if (isChar) {
        it = Item();
        it.kind = Item::Range;
        it.lo = it.hi = ch;
      }
      n.items.push_back(it);
      break;
    }
    default: {
      n.kind = Kind::Set;
      n.icase = f.icase;
      Item it;
      it.kind = Item::Range;
      it.lo = it.hi = c;
      n.items.push_back(it);
      break;
    }
    }
    out = add(std::move(n));
    return Status::success();
  }

  Regex &re_;
  std::vector<char32_t> p_;
  size_t pos_ = 0;
};

StatusOr<Regex> Regex::compile(std::string_view pattern) {
  std::vector<char32_t> cps;
  for (size_t i = 0; i < pattern.size();) {
    char32_t c;
    i += decodeOne(pattern, i, c);
    if (c >= kInvalidByteBase)
      return Status::error("pattern is not valid UTF-8");
    cps.push_back(c);
  }
  Regex re;
  Parser p(re, std::move(cps));
  if (Status s = p.run(); !s)
    return s;
  return re;
}

} // namespace nf::tok
