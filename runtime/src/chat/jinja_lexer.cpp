// The lexer of the Jinja renderer (jinja_lexer.h): jinja2's lexer.py for
// the syntax chat templates use, with transformers' environment
// (trim_blocks, lstrip_blocks): data, tags with their whitespace control,
// comments, {% raw %} blocks, and the names, operators and Python literals
// inside tags.
//
// The lexer follows jinja2's rules step by step, because whitespace is
// output: newlines are normalised to \n and one trailing newline dropped;
// {%- / {{- / {#- strip all whitespace before the tag and -%} / -}} / -#}
// all after; trim_blocks drops the first newline after %} and #};
// lstrip_blocks drops spaces and tabs between a line start and {% or {#
// ({%+ keeps them, +%} keeps the newline).
#include "chat/jinja_lexer.h"

#include "chat/jinja_value.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <system_error>
#include <utility>

namespace nf::jinja {

namespace {

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

} // namespace

std::vector<Token> lexTemplate(std::string_view source) {
  return Lexer(source).run();
}

} // namespace nf::jinja
