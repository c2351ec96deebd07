// Lexer and parser of the Jinja renderer: jinja2's lexer.py and parser.py
// for the syntax chat templates use, with transformers' environment
// (trim_blocks, lstrip_blocks, the loopcontrols extension and its
// {% generation %} tag).
//
// The lexer follows jinja2's rules step by step, because whitespace is
// output: newlines are normalised to \n and one trailing newline dropped;
// {%- / {{- / {#- strip all whitespace before the tag and -%} / -}} / -#}
// all after; trim_blocks drops the first newline after %} and #};
// lstrip_blocks drops spaces and tabs between a line start and {% or {#
// ({%+ keeps them, +%} keeps the newline). The parser is a recursive
// descent with jinja2's precedence; tags nf cannot render (include,
// extends, call, ...) are errors here, not at render time.
//
// Recursion is bounded: the parser's by kMaxNesting (it recurses only into
// parentheses, brackets, arguments, `not`, unary signs, conditional
// expressions and blocks), and the depth of every expression tree it
// builds by kMaxExprDepth (chains of binary operators, filters, tests,
// attributes, subscripts and calls are parsed in loops, but the trees they
// make are evaluated, searched and freed recursively).
#include "chat/jinja_ast.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <system_error>

namespace nf::jinja {

namespace {

// Deeper nesting than this (parentheses, not, unary minus, blocks) is an
// error: it bounds the recursion of the parser. Python itself gives up near
// 100 levels of parentheses.
constexpr int kMaxNesting = 100;

// Expression trees deeper than this are an error. jinja2 itself fails
// sooner: it compiles an expression into nested Python parentheses, of
// which Python allows 200.
constexpr int kMaxExprDepth = 256;

struct Token {
  enum class Type {
    Data,
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name,
    String,
    Integer,
    Float,
    Op,
    Eof
  };
  Type type;
  int line;
  std::string text; // data, name, string value or operator
  int64_t i = 0;
  double f = 0;
};

/// The code point at s[i] and its length in bytes (1 for invalid bytes;
/// the source is validated before lexing).
std::pair<char32_t, size_t> codePointAt(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 1;
  if (n == 1 || i + n > s.size())
    return {c, 1};
  char32_t cp = c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return {cp, n};
}

/// End of the run of (Unicode) whitespace starting at i: Python's \s*.
size_t skipSpace(std::string_view s, size_t i) {
  while (i < s.size()) {
    auto [cp, n] = codePointAt(s, i);
    if (!isPySpace(cp))
      break;
    i += n;
  }
  return i;
}

/// Python's str.rstrip() (Unicode whitespace).
std::string_view rstripSpace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80)
      --start;
    if (!isPySpace(codePointAt(s, start).first))
      break;
    end = start;
  }
  return s.substr(0, end);
}

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool isNameChar(char c) { return isNameStart(c) || isDigit(c); }

int countNewlines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

std::string quoteChar(std::string_view s, size_t i) {
  auto [cp, n] = codePointAt(s, i);
  (void)cp;
  return "'" + std::string(s.substr(i, n)) + "'";
}

class Lexer {
public:
  explicit Lexer(std::string_view source) {
    // jinja2: \r\n, \r and \n all end a line, are all written as \n, and
    // one newline at the end of the template is dropped.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n')
          ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n')
      src_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = src_;
    while (pos_ < s.size()) {
      size_t tag = s.find('{', pos_);
      while (tag != std::string_view::npos && tag + 1 < s.size() &&
             s[tag + 1] != '{' && s[tag + 1] != '%' && s[tag + 1] != '#')
        tag = s.find('{', tag + 1);
      if (tag == std::string_view::npos || tag + 1 >= s.size()) {
        emit(Token::Type::Data, s.substr(pos_));
        line_ += countNewlines(s.substr(pos_));
        break;
      }
      const char kind = s[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+'))
        sign = s[after++];
      // {% raw %} (any sign) is a tag of its own: its content is text.
      const size_t rawEnd = kind == '%' ? matchRawBegin(after) : 0;
      text(s.substr(pos_, tag - pos_), sign, kind != '{');
      pos_ = after;
      if (kind == '#')
        comment();
      else if (rawEnd)
        raw(rawEnd);
      else
        tag_(kind);
    }
    tokens_.push_back({Token::Type::Eof, line_, ""});
    return std::move(tokens_);
  }

private:
  [[noreturn]] void fail(const std::string &message) {
    throw Error(message, line_);
  }

  void emit(Token::Type type, std::string_view text) {
    tokens_.push_back({type, line_, std::string(text)});
  }

  /// Text before a tag, with the tag's whitespace control applied.
  void text(std::string_view t, char sign, bool lstrip) {
    const int lines = countNewlines(t);
    if (sign == '-') {
      t = rstripSpace(t);
    } else if (sign != '+' && lstrip) {
      const size_t lineStart = t.rfind('\n') + 1; // 0 when there is none
      if ((lineStart > 0 || lineStarting_) && lineStart < t.size() &&
          skipSpace(t, lineStart) == t.size())
        t = t.substr(0, lineStart);
    }
    if (!t.empty())
      emit(Token::Type::Data, t);
    line_ += lines;
  }

  /// After `{%` and its sign: the end of `\s*raw\s*(-%}\s*|%})` or 0.
  size_t matchRawBegin(size_t i) const {
    const std::string_view s = src_;
    i = skipSpace(s, i);
    if (s.compare(i, 3, "raw") != 0)
      return 0;
    i = skipSpace(s, i + 3);
    if (s.compare(i, 3, "-%}") == 0)
      return skipSpace(s, i + 3);
    if (s.compare(i, 2, "%}") == 0)
      return i + 2;
    return 0;
  }

  void comment() {
    const std::string_view s = src_;
    size_t end = s.find("#}", pos_);
    if (end == std::string_view::npos) {
      // jinja2 quietly ends the template at a {# with nothing after it.
      if (pos_ >= s.size())
        return;
      fail("Missing end of comment tag");
    }
    char sign = 0;
    if (end > pos_ && (s[end - 1] == '-' || s[end - 1] == '+'))
      sign = s[end - 1];
    line_ += countNewlines(s.substr(pos_, end - pos_));
    closeTag(end + 2, sign, true);
  }

  /// Past a tag's closing delimiter at `i` (its sign before it): -X} eats
  /// the whitespace after, X} with trim_blocks (blocks and comments) one
  /// newline.
  void closeTag(size_t i, char sign, bool trim) {
    const std::string_view s = src_;
    const size_t start = i;
    if (sign == '-')
      i = skipSpace(s, i);
    else if (sign != '+' && trim && i < s.size() && s[i] == '\n')
      ++i;
    line_ += countNewlines(s.substr(start, i - start));
    lineStarting_ = i > 0 && s[i - 1] == '\n';
    pos_ = i;
  }

  /// {% raw %}...{% endraw %}: the text between is data, as is.
  void raw(size_t contentStart) {
    const std::string_view s = src_;
    line_ += countNewlines(s.substr(pos_, contentStart - pos_));
    for (size_t at = s.find("{%", contentStart); at != std::string_view::npos;
         at = s.find("{%", at + 1)) {
      size_t i = at + 2;
      char sign = 0;
      if (i < s.size() && (s[i] == '-' || s[i] == '+'))
        sign = s[i++];
      i = skipSpace(s, i);
      if (s.compare(i, 6, "endraw") != 0)
        continue;
      i = skipSpace(s, i + 6);
      char endSign = 0;
      if (i < s.size() && (s[i] == '-' || s[i] == '+'))
        endSign = s[i++];
      if (s.compare(i, 2, "%}") != 0)
        continue;
      lineStarting_ = false;
      text(s.substr(contentStart, at - contentStart), sign, true);
      line_ += countNewlines(s.substr(at, i - at));
      closeTag(i + 2, endSign, true);
      return;
    }
    if (contentStart >= s.size()) { // as for {# at the very end
      pos_ = contentStart;
      return;
    }
    fail("Missing end of raw directive");
  }

  /// Tokens of a {{ }} or {% %} tag up to its end.
  void tag_(char kind) {
    const std::string_view s = src_;
    emit(kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin, "");
    std::vector<char> balance;
    while (true) {
      if (pos_ >= s.size())
        fail(std::string("unexpected end of template: the '") +
             (kind == '{' ? "{{" : "{%") + "' tag is not closed");
      if (balance.empty()) {
        const char close = kind == '{' ? '}' : '%';
        auto at = [&](size_t i, char c) { return i < s.size() && s[i] == c; };
        if ((at(pos_, '-') || (kind == '%' && at(pos_, '+'))) &&
            at(pos_ + 1, close) && at(pos_ + 2, '}')) {
          emit(kind == '{' ? Token::Type::VarEnd : Token::Type::BlockEnd, "");
          closeTag(pos_ + 3, s[pos_], kind == '%');
          return;
        }
        if (at(pos_, close) && at(pos_ + 1, '}')) {
          emit(kind == '{' ? Token::Type::VarEnd : Token::Type::BlockEnd, "");
          closeTag(pos_ + 2, 0, kind == '%');
          return;
        }
      }
      const char c = s[pos_];
      auto [cp, n] = codePointAt(s, pos_);
      if (isPySpace(cp)) {
        line_ += c == '\n';
        pos_ += n;
      } else if (size_t end = matchFloat(pos_)) {
        Token t{Token::Type::Float, line_, ""};
        std::string digits;
        for (size_t i = pos_; i < end; ++i)
          if (s[i] != '_')
            digits += s[i];
        t.f = parseDouble(digits);
        tokens_.push_back(t);
        pos_ = end;
      } else if (isDigit(c)) {
        integer();
      } else if (isNameStart(c)) {
        size_t end = pos_;
        while (end < s.size() && isNameChar(s[end]))
          ++end;
        emit(Token::Type::Name, s.substr(pos_, end - pos_));
        pos_ = end;
      } else if (c == '\'' || c == '"') {
        string(c);
      } else {
        static const std::array<std::string_view, 6> kTwo = {
            "//", "**", "==", "!=", ">=", "<="};
        std::string_view op;
        for (std::string_view t : kTwo)
          if (s.compare(pos_, 2, t) == 0)
            op = t;
        if (op.empty() && std::string_view("+-/*%~[](){}><=.:|,;").find(c) !=
                              std::string_view::npos)
          op = s.substr(pos_, 1);
        if (op.empty())
          fail("unexpected char " + quoteChar(s, pos_) + " at " +
               std::to_string(codePoints(s.substr(0, pos_))));
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty())
            fail("unexpected '" + std::string(op) + "'");
          if (balance.back() != op[0])
            fail("unexpected '" + std::string(op) + "', expected '" +
                 std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        emit(Token::Type::Op, op);
        pos_ += op.size();
      }
    }
  }

  /// End of `(\d+_)*\d+` at i, or 0.
  size_t digits(size_t i) const {
    const std::string_view s = src_;
    if (i >= s.size() || !isDigit(s[i]))
      return 0;
    while (i < s.size() && isDigit(s[i]))
      ++i;
    while (i + 1 < s.size() && s[i] == '_' && isDigit(s[i + 1])) {
      ++i;
      while (i < s.size() && isDigit(s[i]))
        ++i;
    }
    return i;
  }

  /// jinja2's float_re at i: digits, then an exponent (with an optional
  /// fraction before it) or a fraction; not right after a dot (x.0.1).
  size_t matchFloat(size_t i) const {
    const std::string_view s = src_;
    if (i > 0 && s[i - 1] == '.')
      return 0;
    const size_t intEnd = digits(i);
    if (!intEnd)
      return 0;
    auto exponent = [&](size_t j) -> size_t {
      if (j >= s.size() || (s[j] != 'e' && s[j] != 'E'))
        return 0;
      ++j;
      if (j < s.size() && (s[j] == '+' || s[j] == '-'))
        ++j;
      return digits(j);
    };
    size_t fracEnd = 0;
    if (intEnd < s.size() && s[intEnd] == '.')
      fracEnd = digits(intEnd + 1);
    if (fracEnd)
      if (size_t e = exponent(fracEnd))
        return e;
    if (size_t e = exponent(intEnd))
      return e;
    return fracEnd;
  }

  void integer() {
    const std::string_view s = src_;
    size_t end = pos_;
    int base = 10;
    auto prefixed = [&](char lower, int b, auto isDigitOf) {
      if (s[pos_] != '0' || pos_ + 1 >= s.size() ||
          (s[pos_ + 1] | 0x20) != lower)
        return false;
      size_t i = pos_ + 2;
      while (true) {
        size_t j = i < s.size() && s[i] == '_' ? i + 1 : i;
        if (j < s.size() && isDigitOf(s[j]))
          i = j + 1;
        else
          break;
      }
      if (i == pos_ + 2)
        return false;
      end = i;
      base = b;
      return true;
    };
    auto isHex = [](char c) {
      return isDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
    };
    if (!prefixed('b', 2, [](char c) { return c == '0' || c == '1'; }) &&
        !prefixed('o', 8, [](char c) { return c >= '0' && c <= '7'; }) &&
        !prefixed('x', 16, isHex)) {
      // [1-9](_?\d)* or 0(_?0)*
      const bool zero = s[pos_] == '0';
      end = pos_ + 1;
      while (true) {
        size_t j = end < s.size() && s[end] == '_' ? end + 1 : end;
        if (j < s.size() && (zero ? s[j] == '0' : isDigit(s[j])))
          end = j + 1;
        else
          break;
      }
    }
    std::string text;
    for (size_t i = pos_ + (base == 10 ? 0 : 2); i < end; ++i)
      if (s[i] != '_')
        text += s[i];
    int64_t v = 0;
    const auto [ptr, ec] =
        std::from_chars(text.data(), text.data() + text.size(), v, base);
    if (ec != std::errc() || ptr != text.data() + text.size())
      fail("integer literal " + std::string(s.substr(pos_, end - pos_)) +
           " is too large");
    Token t{Token::Type::Integer, line_, ""};
    t.i = v;
    tokens_.push_back(t);
    pos_ = end;
  }

  /// A quoted string, unescaped as Python's unicode-escape codec does.
  void string(char quote) {
    const std::string_view s = src_;
    size_t i = pos_ + 1;
    while (i < s.size() && s[i] != quote)
      i += s[i] == '\\' ? 2 : 1;
    if (i >= s.size())
      fail("unterminated string literal");
    const std::string_view body = s.substr(pos_ + 1, i - pos_ - 1);
    Token t{Token::Type::String, line_, unescape(body)};
    tokens_.push_back(t);
    line_ += countNewlines(body);
    pos_ = i + 1;
  }

  std::string unescape(std::string_view b) {
    std::string out;
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i] != '\\' || i + 1 >= b.size()) {
        out += b[i];
        continue;
      }
      const char e = b[++i];
      auto hex = [&](size_t count) {
        char32_t v = 0;
        for (size_t k = 1; k <= count; ++k) {
          if (i + k >= b.size())
            fail("truncated \\" + std::string(1, e) + " escape");
          const char h = b[i + k];
          int d = isDigit(h) ? h - '0'
                  : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f')
                      ? (h | 0x20) - 'a' + 10
                      : -1;
          if (d < 0)
            fail("truncated \\" + std::string(1, e) + " escape");
          v = v * 16 + static_cast<char32_t>(d);
        }
        i += count;
        if (v > 0x10ffff)
          fail("illegal Unicode character");
        if (v >= 0xd800 && v <= 0xdfff) // no UTF-8 for them (nor in Python)
          fail("a surrogate escape (\\" + std::string(1, e) +
               ") is not supported");
        appendUtf8(out, v);
      };
      switch (e) {
      case '\n':
        break; // line continuation
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      case 'N':
        fail("\\N{...} escapes are not supported");
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int k = 0;
               k < 2 && i + 1 < b.size() && b[i + 1] >= '0' && b[i + 1] <= '7';
               ++k)
            v = v * 8 + static_cast<char32_t>(b[++i] - '0');
          appendUtf8(out, v);
        } else {
          out += '\\'; // unknown escapes stay as written
          out += e;
        }
      }
    }
    return out;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool lineStarting_ = true;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------
// Parser

bool isName(const Token &t, std::string_view name) {
  return t.type == Token::Type::Name && t.text == name;
}
bool isOp(const Token &t, std::string_view op) {
  return t.type == Token::Type::Op && t.text == op;
}

std::string describe(const Token &t) {
  switch (t.type) {
  case Token::Type::Data:
    return "template data";
  case Token::Type::VarBegin:
    return "begin of print statement";
  case Token::Type::VarEnd:
    return "end of print statement";
  case Token::Type::BlockBegin:
    return "begin of statement block";
  case Token::Type::BlockEnd:
    return "end of statement block";
  case Token::Type::Name:
  case Token::Type::Op:
    return t.text;
  case Token::Type::String:
    return "string";
  case Token::Type::Integer:
    return "integer";
  case Token::Type::Float:
    return "float";
  case Token::Type::Eof:
    return "end of template";
  }
  return "token";
}

bool referencesName(const Body &body, std::string_view name);

bool referencesName(const Expr *e, std::string_view name) {
  if (!e)
    return false;
  if (e->kind == Expr::Kind::Name && e->name == name)
    return true;
  for (const ExprPtr &a : e->args)
    if (referencesName(a.get(), name))
      return true;
  for (const auto &kw : e->kwargs)
    if (referencesName(kw.second.get(), name))
      return true;
  return false;
}

bool referencesName(const Body &body, std::string_view name) {
  for (const StmtPtr &s : body) {
    if (referencesName(s->expr.get(), name) ||
        referencesName(s->filter.get(), name) ||
        referencesName(s->body, name) || referencesName(s->elseBody, name))
      return true;
    for (const ExprPtr &e : s->exprs)
      if (referencesName(e.get(), name))
        return true;
    for (const ExprPtr &e : s->defaults)
      if (referencesName(e.get(), name))
        return true;
    for (const auto &[cond, b] : s->branches)
      if (referencesName(cond.get(), name) || referencesName(b, name))
        return true;
    for (const auto &a : s->assigns)
      if (referencesName(a.second.get(), name))
        return true;
  }
  return false;
}

class Parser {
public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parseTemplate() {
    Body body = subparse({});
    return body;
  }

private:
  using Names = std::vector<std::string_view>;

  struct Nesting {
    explicit Nesting(Parser &p) : p(p) {
      if (++p.depth_ > kMaxNesting)
        p.fail("the template nests more than " + std::to_string(kMaxNesting) +
               " levels deep");
    }
    ~Nesting() { --p.depth_; }
    Parser &p;
  };

  const Token &cur() const { return t_[i_]; }
  const Token &look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token &next() {
    const Token &t = t_[i_];
    if (i_ + 1 < t_.size())
      ++i_;
    return t;
  }
  int line() const { return cur().line; }

  [[noreturn]] void fail(const std::string &message, int line = 0) const {
    throw Error(message, line ? line : cur().line);
  }

  const Token &expect(Token::Type type, std::string_view what) {
    if (cur().type != type)
      fail("expected token '" + std::string(what) + "', got '" +
           describe(cur()) + "'");
    return next();
  }
  const Token &expectOp(std::string_view op) {
    if (!isOp(cur(), op))
      fail("expected token '" + std::string(op) + "', got '" + describe(cur()) +
           "'");
    return next();
  }
  const Token &expectName(std::string_view name) {
    if (!isName(cur(), name))
      fail("expected token '" + std::string(name) + "', got '" +
           describe(cur()) + "'");
    return next();
  }
  bool skipOp(std::string_view op) {
    if (!isOp(cur(), op))
      return false;
    next();
    return true;
  }
  bool skipName(std::string_view name) {
    if (!isName(cur(), name))
      return false;
    next();
    return true;
  }
  static bool isAny(const Token &t, const Names &names) {
    return t.type == Token::Type::Name &&
           std::find(names.begin(), names.end(), t.text) != names.end();
  }

  // Statements ------------------------------------------------------------

  Body subparse(const Names &endTokens) {
    Body body;
    while (cur().type != Token::Type::Eof) {
      const Token &t = cur();
      if (t.type == Token::Type::Data) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Token::Type::VarBegin) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Print, t.line);
        next();
        s->exprs.push_back(parseTuple(false, true, {}, false));
        expect(Token::Type::VarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == Token::Type::BlockBegin) {
        next();
        if (!endTokens.empty() && isAny(cur(), endTokens))
          return body;
        body.push_back(parseStatement());
        expect(Token::Type::BlockEnd, "end of statement block");
      } else {
        fail("unexpected " + describe(t));
      }
    }
    return body;
  }

  [[noreturn]] void failEof(const Names &endTokens) {
    std::string expected;
    for (size_t k = 0; k < endTokens.size(); ++k)
      expected += (k ? " or '" : "'") + std::string(endTokens[k]) + "'";
    fail("unexpected end of template: Jinja was looking for " + expected +
         (openTags_.empty()
              ? std::string()
              : "; the innermost block that needs to be closed is '" +
                    openTags_.back() + "'"));
  }

  Body parseStatements(const Names &endTokens, bool dropNeedle) {
    skipOp(":");
    expect(Token::Type::BlockEnd, "end of statement block");
    Body body = subparse(endTokens);
    if (cur().type == Token::Type::Eof)
      failEof(endTokens);
    if (dropNeedle)
      next();
    return body;
  }

  StmtPtr parseStatement() {
    Nesting nesting(*this);
    const Token &t = cur();
    if (t.type != Token::Type::Name)
      fail("tag name expected");
    const std::string tag = t.text;
    openTags_.push_back(tag);
    StmtPtr s;
    if (tag == "for")
      s = parseFor();
    else if (tag == "if")
      s = parseIf();
    else if (tag == "set")
      s = parseSet();
    else if (tag == "macro")
      s = parseMacro();
    else if (tag == "print")
      s = parsePrint();
    else if (tag == "with")
      s = parseWith();
    else if (tag == "filter")
      s = parseFilterBlock();
    else if (tag == "generation")
      s = parseGeneration();
    else if (tag == "break" || tag == "continue")
      s = parseLoopControl();
    else if (tag == "block" || tag == "extends" || tag == "include" ||
             tag == "import" || tag == "from" || tag == "autoescape" ||
             tag == "call")
      fail("unsupported tag '" + tag + "'");
    else
      fail("unknown tag '" + tag + "'");
    openTags_.pop_back();
    return s;
  }

  Target parseAssignTarget(const Names &extraEnd, bool withNamespace) {
    Target target;
    while (true) {
      if (!target.names.empty())
        expectOp(",");
      if (isTupleEnd(extraEnd)) {
        if (target.names.empty())
          fail("expected an assignment target, got '" + describe(cur()) + "'");
        break;
      }
      const Token &t = cur();
      if (t.type != Token::Type::Name)
        fail(isOp(t, "(") ? "unsupported assignment target (nested tuple)"
                          : "can't assign to '" + describe(t) + "'");
      if (t.text == "true" || t.text == "false" || t.text == "True" ||
          t.text == "False" || t.text == "none" || t.text == "None")
        fail("can't assign to 'const'");
      target.names.push_back(t.text);
      next();
      if (withNamespace && isOp(cur(), ".")) {
        next();
        target.attr = expect(Token::Type::Name, "name").text;
        if (target.names.size() > 1 || isOp(cur(), ","))
          fail("unsupported assignment target (namespace attribute in a "
               "tuple)");
        break;
      }
      if (isOp(cur(), ","))
        target.tuple = true;
      else
        break;
    }
    return target;
  }

  StmtPtr parseFor() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::For, expectName("for").line);
    s->target = parseAssignTarget({"in"}, false);
    expectName("in");
    s->expr = parseTuple(false, false, {"recursive"}, false);
    if (skipName("if"))
      s->filter = parseExpression(true);
    if (isName(cur(), "recursive"))
      fail("recursive loops are not supported");
    ++loopDepth_;
    s->body = parseStatements({"endfor", "else"}, false);
    --loopDepth_;
    if (next().text != "endfor")
      s->elseBody = parseStatements({"endfor"}, true);
    s->usesLoop = referencesName(s->body, "loop");
    return s;
  }

  StmtPtr parseIf() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::If, expectName("if").line);
    while (true) {
      ExprPtr cond = parseTuple(false, false, {}, false);
      Body body = parseStatements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const Token &t = next();
      if (t.text == "elif")
        continue;
      if (t.text == "else")
        s->branches.emplace_back(nullptr, parseStatements({"endif"}, true));
      break;
    }
    return s;
  }

  StmtPtr parseSet() {
    const int line = next().line;
    Target target = parseAssignTarget({}, true);
    if (skipOp("=")) {
      auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
      s->target = std::move(target);
      s->expr = parseTuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<Stmt>(Stmt::Kind::SetBlock, line);
    s->target = std::move(target);
    if (s->target.tuple || !s->target.attr.empty())
      fail("a {% set %} block assigns one name");
    s->filter = parseFilter(nullptr, false);
    s->body = parseStatements({"endset"}, true);
    return s;
  }

  StmtPtr parseMacro() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Macro, next().line);
    s->name = expect(Token::Type::Name, "name").text;
    expectOp("(");
    while (!isOp(cur(), ")")) {
      if (!s->params.empty())
        expectOp(",");
      s->params.push_back(expect(Token::Type::Name, "name").text);
      if (skipOp("="))
        s->defaults.push_back(parseExpression(true));
      else if (!s->defaults.empty())
        fail("non-default argument follows default argument");
    }
    expectOp(")");
    const int loops = loopDepth_;
    loopDepth_ = 0;
    s->body = parseStatements({"endmacro"}, true);
    loopDepth_ = loops;
    s->usesVarargs = referencesName(s->body, "varargs");
    s->usesKwargs = referencesName(s->body, "kwargs");
    return s;
  }

  StmtPtr parsePrint() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Print, next().line);
    while (cur().type != Token::Type::BlockEnd) {
      if (!s->exprs.empty())
        expectOp(",");
      s->exprs.push_back(parseExpression(true));
    }
    return s;
  }

  StmtPtr parseWith() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::With, next().line);
    while (cur().type != Token::Type::BlockEnd) {
      if (!s->assigns.empty())
        expectOp(",");
      Target target = parseAssignTarget({}, false);
      expectOp("=");
      s->assigns.emplace_back(std::move(target), parseExpression(true));
    }
    s->body = parseStatements({"endwith"}, true);
    return s;
  }

  StmtPtr parseFilterBlock() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::FilterBlock, next().line);
    s->filter = parseFilter(nullptr, true);
    s->body = parseStatements({"endfilter"}, true);
    return s;
  }

  StmtPtr parseGeneration() {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Block, next().line);
    s->body = parseStatements({"endgeneration"}, true);
    return s;
  }

  StmtPtr parseLoopControl() {
    const Token &t = next();
    if (loopDepth_ == 0)
      fail("'" + t.text + "' outside of a loop", t.line);
    return std::make_unique<Stmt>(
        t.text == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, t.line);
  }

  // Expressions -----------------------------------------------------------

  ExprPtr node(Expr::Kind kind, int line) {
    return std::make_unique<Expr>(kind, line);
  }

  /// `n` with its operands in place: records its depth and refuses trees
  /// deeper than kMaxExprDepth. Every node with operands passes here.
  ExprPtr sealed(ExprPtr n) {
    int deepest = 0;
    for (const ExprPtr &a : n->args)
      if (a)
        deepest = std::max(deepest, a->depth);
    for (const auto &kw : n->kwargs)
      deepest = std::max(deepest, kw.second->depth);
    n->depth = deepest + 1;
    if (n->depth > kMaxExprDepth)
      fail("expression nested too deeply (more than " +
               std::to_string(kMaxExprDepth) +
               " levels of operators, filters, tests, attributes, subscripts "
               "and calls)",
           n->line);
    return n;
  }

  bool isTupleEnd(const Names &extraEnd) const {
    const Token &t = cur();
    if (t.type == Token::Type::VarEnd || t.type == Token::Type::BlockEnd ||
        isOp(t, ")"))
      return true;
    return isAny(t, extraEnd);
  }

  ExprPtr parseExpression(bool withCondexpr) {
    return withCondexpr ? parseCondexpr() : parseOr();
  }

  ExprPtr parseCondexpr() {
    Nesting nesting(*this);
    int line = this->line();
    ExprPtr expr1 = parseOr();
    while (skipName("if")) {
      ExprPtr expr2 = parseOr();
      ExprPtr expr3 = skipName("else") ? parseCondexpr() : nullptr;
      ExprPtr n = node(Expr::Kind::Cond, line);
      n->args.push_back(std::move(expr2));
      n->args.push_back(std::move(expr1));
      n->args.push_back(std::move(expr3));
      expr1 = sealed(std::move(n));
      line = this->line();
    }
    return expr1;
  }

  ExprPtr binary(Expr::Kind kind, int line, ExprPtr a, ExprPtr b,
                 std::string name = {}) {
    ExprPtr n = node(kind, line);
    n->name = std::move(name);
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return sealed(std::move(n));
  }

  ExprPtr parseOr() {
    int line = this->line();
    ExprPtr left = parseAnd();
    while (skipName("or")) {
      left = binary(Expr::Kind::Or, line, std::move(left), parseAnd());
      line = this->line();
    }
    return left;
  }

  ExprPtr parseAnd() {
    int line = this->line();
    ExprPtr left = parseNot();
    while (skipName("and")) {
      left = binary(Expr::Kind::And, line, std::move(left), parseNot());
      line = this->line();
    }
    return left;
  }

  ExprPtr parseNot() {
    if (isName(cur(), "not")) {
      Nesting nesting(*this);
      ExprPtr n = node(Expr::Kind::Not, next().line);
      n->args.push_back(parseNot());
      return sealed(std::move(n));
    }
    return parseCompare();
  }

  ExprPtr parseCompare() {
    int line = this->line();
    ExprPtr expr = parseMath1();
    ExprPtr cmp;
    while (true) {
      const Token &t = cur();
      std::string op;
      if (t.type == Token::Type::Op &&
          (t.text == "==" || t.text == "!=" || t.text == "<" ||
           t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        next();
      } else if (skipName("in")) {
        op = "in";
      } else if (isName(t, "not") && isName(look(), "in")) {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::Compare, line);
        cmp->args.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parseMath1());
      line = this->line();
    }
    if (!cmp)
      return expr;
    cmp->line = line;
    return sealed(std::move(cmp));
  }

  ExprPtr parseMath1() {
    int line = this->line();
    ExprPtr left = parseConcat();
    while (isOp(cur(), "+") || isOp(cur(), "-")) {
      std::string op = next().text;
      left =
          binary(Expr::Kind::Binary, line, std::move(left), parseConcat(), op);
      line = this->line();
    }
    return left;
  }

  ExprPtr parseConcat() {
    const int line = this->line();
    ExprPtr first = parseMath2();
    if (!isOp(cur(), "~"))
      return first;
    ExprPtr n = node(Expr::Kind::Concat, line);
    n->args.push_back(std::move(first));
    while (skipOp("~"))
      n->args.push_back(parseMath2());
    return sealed(std::move(n));
  }

  ExprPtr parseMath2() {
    int line = this->line();
    ExprPtr left = parsePow();
    while (isOp(cur(), "*") || isOp(cur(), "/") || isOp(cur(), "//") ||
           isOp(cur(), "%")) {
      std::string op = next().text;
      left = binary(Expr::Kind::Binary, line, std::move(left), parsePow(), op);
      line = this->line();
    }
    return left;
  }

  ExprPtr parsePow() {
    int line = this->line();
    ExprPtr left = parseUnary(true);
    while (skipOp("**")) {
      left = binary(Expr::Kind::Binary, line, std::move(left), parseUnary(true),
                    "**");
      line = this->line();
    }
    return left;
  }

  ExprPtr parseUnary(bool withFilter) {
    Nesting nesting(*this);
    const int line = this->line();
    ExprPtr n;
    if (isOp(cur(), "-") || isOp(cur(), "+")) {
      const bool neg = next().text == "-";
      n = node(neg ? Expr::Kind::Neg : Expr::Kind::Pos, line);
      n->args.push_back(parseUnary(false));
      n = sealed(std::move(n));
    } else {
      n = parsePrimary();
    }
    n = parsePostfix(std::move(n));
    if (withFilter)
      n = parseFilterExpr(std::move(n));
    return n;
  }

  ExprPtr constant(Value v, int line) {
    ExprPtr n = node(Expr::Kind::Const, line);
    n->value = std::move(v);
    return n;
  }

  ExprPtr parsePrimary() {
    const Token &t = cur();
    switch (t.type) {
    case Token::Type::Name: {
      next();
      if (t.text == "true" || t.text == "True")
        return constant(Value::boolean(true), t.line);
      if (t.text == "false" || t.text == "False")
        return constant(Value::boolean(false), t.line);
      if (t.text == "none" || t.text == "None")
        return constant(Value::none(), t.line);
      ExprPtr n = node(Expr::Kind::Name, t.line);
      n->name = t.text;
      return n;
    }
    case Token::Type::String: {
      const int line = t.line;
      std::string s;
      while (cur().type == Token::Type::String)
        s += next().text;
      return constant(Value::string(std::move(s)), line);
    }
    case Token::Type::Integer:
      next();
      return constant(Value::integer(t.i), t.line);
    case Token::Type::Float:
      next();
      return constant(Value::real(t.f), t.line);
    default:
      break;
    }
    if (isOp(t, "(")) {
      next();
      ExprPtr n = parseTuple(false, true, {}, true);
      expectOp(")");
      return n;
    }
    if (isOp(t, "["))
      return parseList();
    if (isOp(t, "{"))
      return parseDict();
    fail("unexpected '" + describe(t) + "'");
  }

  ExprPtr parseTuple(bool simplified, bool withCondexpr, const Names &extraEnd,
                     bool explicitParentheses) {
    int line = this->line();
    std::vector<ExprPtr> args;
    bool isTuple = false;
    while (true) {
      if (!args.empty())
        expectOp(",");
      if (isTupleEnd(extraEnd))
        break;
      args.push_back(simplified ? parsePrimary()
                                : parseExpression(withCondexpr));
      if (isOp(cur(), ","))
        isTuple = true;
      else
        break;
      line = this->line();
    }
    if (!isTuple) {
      if (!args.empty())
        return std::move(args[0]);
      if (!explicitParentheses)
        fail("expected an expression, got '" + describe(cur()) + "'");
    }
    ExprPtr n = node(Expr::Kind::Tuple, line);
    n->args = std::move(args);
    return sealed(std::move(n));
  }

  ExprPtr parseList() {
    ExprPtr n = node(Expr::Kind::List, expectOp("[").line);
    while (!isOp(cur(), "]")) {
      if (!n->args.empty())
        expectOp(",");
      if (isOp(cur(), "]"))
        break;
      n->args.push_back(parseExpression(true));
    }
    expectOp("]");
    return sealed(std::move(n));
  }

  ExprPtr parseDict() {
    ExprPtr n = node(Expr::Kind::Dict, expectOp("{").line);
    while (!isOp(cur(), "}")) {
      if (!n->args.empty())
        expectOp(",");
      if (isOp(cur(), "}"))
        break;
      n->args.push_back(parseExpression(true));
      expectOp(":");
      n->args.push_back(parseExpression(true));
    }
    expectOp("}");
    return sealed(std::move(n));
  }

  ExprPtr parsePostfix(ExprPtr n) {
    while (true) {
      if (isOp(cur(), ".") || isOp(cur(), "["))
        n = parseSubscript(std::move(n));
      else if (isOp(cur(), "("))
        n = parseCall(std::move(n));
      else
        return n;
    }
  }

  ExprPtr parseFilterExpr(ExprPtr n) {
    while (true) {
      if (isOp(cur(), "|"))
        n = parseFilter(std::move(n), false);
      else if (isName(cur(), "is"))
        n = parseTest(std::move(n));
      else if (isOp(cur(), "("))
        n = parseCall(std::move(n));
      else
        return n;
    }
  }

  ExprPtr parseSubscript(ExprPtr subject) {
    const Token &t = next();
    if (t.text == ".") {
      const Token &attr = cur();
      if (attr.type == Token::Type::Name) {
        next();
        ExprPtr n = node(Expr::Kind::GetAttr, t.line);
        n->name = attr.text;
        n->args.push_back(std::move(subject));
        return sealed(std::move(n));
      }
      if (attr.type != Token::Type::Integer)
        fail("expected name or number");
      next();
      ExprPtr n = node(Expr::Kind::GetItem, t.line);
      n->args.push_back(std::move(subject));
      n->args.push_back(constant(Value::integer(attr.i), attr.line));
      return sealed(std::move(n));
    }
    std::vector<ExprPtr> args;
    while (!isOp(cur(), "]")) {
      if (!args.empty())
        expectOp(",");
      args.push_back(parseSubscribed());
    }
    expectOp("]");
    ExprPtr n = node(Expr::Kind::GetItem, t.line);
    n->args.push_back(std::move(subject));
    if (args.size() == 1) {
      n->args.push_back(std::move(args[0]));
    } else {
      ExprPtr tuple = node(Expr::Kind::Tuple, t.line);
      tuple->args = std::move(args);
      n->args.push_back(sealed(std::move(tuple)));
    }
    return sealed(std::move(n));
  }

  ExprPtr parseSubscribed() {
    const int line = this->line();
    ExprPtr start;
    if (!skipOp(":")) {
      ExprPtr e = parseExpression(true);
      if (!isOp(cur(), ":"))
        return e;
      next();
      start = std::move(e);
    }
    ExprPtr n = node(Expr::Kind::Slice, line);
    n->args.push_back(std::move(start));
    if (isOp(cur(), ":") || isOp(cur(), "]") || isOp(cur(), ","))
      n->args.push_back(nullptr);
    else
      n->args.push_back(parseExpression(true));
    if (skipOp(":") && !isOp(cur(), "]") && !isOp(cur(), ","))
      n->args.push_back(parseExpression(true));
    else
      n->args.push_back(nullptr);
    return sealed(std::move(n));
  }

  /// `(args, key=value, ...)` into n->args (after what is already there)
  /// and n->kwargs.
  void parseCallArgs(Expr &n) {
    expectOp("(");
    bool requireComma = false;
    while (!isOp(cur(), ")")) {
      if (requireComma) {
        expectOp(",");
        if (isOp(cur(), ")"))
          break;
      }
      if (isOp(cur(), "*") || isOp(cur(), "**"))
        fail("*args and **kwargs in calls are not supported");
      if (cur().type == Token::Type::Name && isOp(look(), "=")) {
        std::string key = next().text;
        next();
        n.kwargs.emplace_back(std::move(key), parseExpression(true));
      } else {
        if (!n.kwargs.empty())
          fail("invalid syntax for function call expression");
        n.args.push_back(parseExpression(true));
      }
      requireComma = true;
    }
    expectOp(")");
  }

  ExprPtr parseCall(ExprPtr callee) {
    ExprPtr n = node(Expr::Kind::Call, line());
    n->args.push_back(std::move(callee));
    parseCallArgs(*n);
    return sealed(std::move(n));
  }

  ExprPtr parseFilter(ExprPtr subject, bool startInline) {
    while (isOp(cur(), "|") || startInline) {
      if (!startInline)
        next();
      const Token &name = expect(Token::Type::Name, "name");
      ExprPtr n = node(Expr::Kind::Filter, name.line);
      n->name = name.text;
      while (skipOp("."))
        n->name += "." + expect(Token::Type::Name, "name").text;
      n->args.push_back(std::move(subject));
      if (isOp(cur(), "("))
        parseCallArgs(*n);
      subject = sealed(std::move(n));
      startInline = false;
    }
    return subject;
  }

  ExprPtr parseTest(ExprPtr subject) {
    const int line = next().line;
    const bool negated = skipName("not");
    ExprPtr n = node(Expr::Kind::Test, line);
    n->name = expect(Token::Type::Name, "name").text;
    while (skipOp("."))
      n->name += "." + expect(Token::Type::Name, "name").text;
    n->args.push_back(std::move(subject));
    const Token &t = cur();
    if (isOp(t, "(")) {
      parseCallArgs(*n);
    } else if ((t.type == Token::Type::Name || t.type == Token::Type::String ||
                t.type == Token::Type::Integer ||
                t.type == Token::Type::Float || isOp(t, "(") || isOp(t, "[") ||
                isOp(t, "{")) &&
               !isName(t, "else") && !isName(t, "or") && !isName(t, "and")) {
      if (isName(t, "is"))
        fail("You cannot chain multiple tests with is");
      n->args.push_back(parsePostfix(parsePrimary()));
    }
    n = sealed(std::move(n));
    if (!negated)
      return n;
    ExprPtr notNode = node(Expr::Kind::Not, line);
    notNode->args.push_back(std::move(n));
    return sealed(std::move(notNode));
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loopDepth_ = 0;
  std::vector<std::string> openTags_;
};

} // namespace

std::unique_ptr<Program> parseTemplate(std::string_view source) {
  if (!validUtf8(source))
    throw Error("the template is not valid UTF-8", 1);
  auto program = std::make_unique<Program>();
  Parser parser(Lexer(source).run());
  program->body = parser.parseTemplate();
  return program;
}

} // namespace nf::jinja
