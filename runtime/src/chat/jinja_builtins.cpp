// Builtins of the Jinja renderer: jinja2's filters and tests, the Python
// str / list / dict methods its sandbox lets templates call, the globals of
// jinja2 and transformers, and Python's arithmetic (see jinja_interp.h).
// Each follows the jinja2 3.1 / Python 3 function of the same name,
// including their quirks (|map and |select are lazy generators, |int of
// "4.2" is 4, |title splits words at - and brackets, ...).
#include "chat/jinja_interp.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <initializer_list>
#include <locale.h>
#include <system_error>
#include <unordered_map>

namespace nf::jinja {

namespace {

// ---------------------------------------------------------------------------
// Arguments

/// Call arguments bound to parameter names, as Python binds them.
struct Bound {
  std::vector<std::optional<Value>> v;
  bool has(size_t i) const { return v[i].has_value(); }
  Value get(size_t i, Value fallback = Value::none()) const {
    return v[i] ? *v[i] : fallback;
  }
};

Bound bind(const Args &a, std::initializer_list<std::string_view> names,
           const std::string &what) {
  const std::vector<std::string_view> n(names);
  Bound b;
  b.v.resize(n.size());
  if (a.pos.size() > n.size())
    throw Error(what + " takes at most " + std::to_string(n.size()) +
                " argument(s) (" + std::to_string(a.pos.size()) + " given)");
  for (size_t i = 0; i < a.pos.size(); ++i)
    b.v[i] = a.pos[i];
  for (const auto &[k, val] : a.kw) {
    auto it = std::find(n.begin(), n.end(), k);
    if (it == n.end())
      throw Error(what + " got an unexpected keyword argument '" + k + "'");
    const size_t i = static_cast<size_t>(it - n.begin());
    if (b.v[i])
      throw Error(what + " got multiple values for argument '" + k + "'");
    b.v[i] = val;
  }
  return b;
}

int64_t toInt(const Value &v) {
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool)
    return v.asInt();
  if (v.isUndefined())
    failUndefined(v);
  throw Error("'" + typeName(v) +
              "' object cannot be interpreted as an "
              "integer");
}

const std::string &strArg(const Value &v, const std::string &what) {
  if (!v.isString()) {
    if (v.isUndefined())
      failUndefined(v);
    throw Error(what + " must be str, not " + typeName(v));
  }
  return v.str();
}

Value str(std::string s) { return Value::string(std::move(s)); }
Value generator(std::vector<Value> items) {
  return Value::seq(std::move(items), SeqType::Generator);
}

// ---------------------------------------------------------------------------
// Text

bool isAsciiDigit(char c) { return c >= '0' && c <= '9'; }

std::string escapeHtml(const std::string &s) {
  // The size first: escaping can make a string five times longer.
  size_t size = s.size();
  for (char c : s)
    size += c == '&'                ? 4
            : c == '<' || c == '>'  ? 3
            : c == '\'' || c == '"' ? 4
                                    : 0;
  checkStringSize(size);
  std::string out;
  out.reserve(size);
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '\'':
      out += "&#39;";
      break;
    case '"':
      out += "&#34;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

bool isCased(char32_t c) {
  return toUpper(c) != c || toLower(c) != c || c == 0xdf;
}
bool isLowerChar(char32_t c) { return toUpper(c) != c || c == 0xdf; }
bool isUpperChar(char32_t c) { return toLower(c) != c; }

void appendUpper(std::string &out, char32_t c) {
  if (c == 0xdf)
    out += "SS";
  else
    appendUtf8(out, toUpper(c));
}

/// Python's str.title(): a cased character after an uncased one starts a
/// word.
std::string pyTitle(const std::string &s) {
  std::string out;
  bool prevCased = false;
  for (char32_t c : decodeUtf8(s)) {
    if (prevCased)
      appendUtf8(out, toLower(c));
    else if (c == 0xdf)
      out += "Ss";
    else
      appendUtf8(out, toUpper(c));
    prevCased = isCased(c);
  }
  return out;
}

std::string pyCapitalize(const std::string &s) {
  std::u32string u = decodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0 && u[0] == 0xdf)
      out += "Ss";
    else if (i == 0)
      appendUtf8(out, toUpper(u[0]));
    else
      appendUtf8(out, toLower(u[i]));
  }
  return out;
}

std::u32string stripSet(const Value *chars, const std::string &what,
                        bool &whitespace) {
  whitespace = !chars || chars->isNone();
  if (whitespace)
    return {};
  if (!chars->isString())
    throw Error(what + " arg must be None or str");
  return decodeUtf8(chars->str());
}

std::string pyStrip(const std::string &s, const Value *chars, bool left,
                    bool right, const std::string &what) {
  bool ws;
  const std::u32string set = stripSet(chars, what, ws);
  const std::u32string u = decodeUtf8(s);
  auto strip = [&](char32_t c) {
    return ws ? isPySpace(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip(u[b]))
      ++b;
  if (right)
    while (e > b && strip(u[e - 1]))
      --e;
  return encodeUtf8(u.substr(b, e - b));
}

/// Appends a part of a split, within the item limit.
void addPart(std::vector<std::string> &parts, std::string part) {
  checkItemCount(parts.size() + 1);
  parts.push_back(std::move(part));
}

std::vector<Value> pySplit(const std::string &s, const Value &sep,
                           int64_t maxsplit, bool fromRight) {
  std::vector<std::string> parts;
  if (sep.isNone()) {
    const std::u32string u = decodeUtf8(s);
    const int64_t n = static_cast<int64_t>(u.size());
    if (!fromRight) {
      int64_t i = 0;
      while (true) {
        while (i < n && isPySpace(u[static_cast<size_t>(i)]))
          ++i;
        if (i >= n)
          break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          addPart(parts, encodeUtf8(u.substr(static_cast<size_t>(i))));
          break;
        }
        int64_t j = i;
        while (j < n && !isPySpace(u[static_cast<size_t>(j)]))
          ++j;
        addPart(parts, encodeUtf8(u.substr(static_cast<size_t>(i),
                                           static_cast<size_t>(j - i))));
        i = j;
      }
    } else {
      int64_t i = n;
      while (true) {
        while (i > 0 && isPySpace(u[static_cast<size_t>(i - 1)]))
          --i;
        if (i <= 0)
          break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          addPart(parts, encodeUtf8(u.substr(0, static_cast<size_t>(i))));
          break;
        }
        int64_t j = i;
        while (j > 0 && !isPySpace(u[static_cast<size_t>(j - 1)]))
          --j;
        addPart(parts, encodeUtf8(u.substr(static_cast<size_t>(j),
                                           static_cast<size_t>(i - j))));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    const std::string &d = strArg(sep, "separator");
    if (d.empty())
      throw Error("empty separator");
    if (!fromRight) {
      size_t i = 0;
      while (true) {
        size_t at = s.find(d, i);
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          addPart(parts, s.substr(i));
          break;
        }
        addPart(parts, s.substr(i, at - i));
        i = at + d.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        size_t at =
            end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
        if (at == std::string::npos ||
            (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          addPart(parts, s.substr(0, end));
          break;
        }
        addPart(parts, s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string &p : parts)
    out.push_back(str(std::move(p)));
  return out;
}

bool isLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c ||
         c == 0x1d || c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::string> pySplitlines(const std::string &s, bool keepends) {
  const std::u32string u = decodeUtf8(s);
  std::vector<std::string> lines;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    while (j < u.size() && !isLineBreak(u[j]))
      ++j;
    size_t eol = j;
    if (j < u.size()) {
      eol = j + 1;
      if (u[j] == '\r' && j + 1 < u.size() && u[j + 1] == '\n')
        eol = j + 2;
    }
    checkItemCount(lines.size() + 1);
    lines.push_back(encodeUtf8(u.substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return lines;
}

std::string pyReplace(Interp &in, const std::string &s, const std::string &old,
                      const std::string &with, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::u32string u = decodeUtf8(s);
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < u.size())
        appendUtf8(out, u[i]);
      in.checkString(out.size());
    }
    return out;
  }
  size_t i = 0;
  in.checkString(s.size());
  while (true) {
    size_t at = s.find(old, i);
    if (at == std::string::npos || (count >= 0 && done >= count))
      break;
    in.checkString(out.size() + (at - i) + with.size() + (s.size() - at));
    out.append(s, i, at - i);
    out += with;
    ++done;
    i = at + old.size();
  }
  chargeBytes(s.size());
  out.append(s, i, std::string::npos);
  return out;
}

/// Python's slice clamping for a sequence of `len` items.
void adjustSlice(int64_t len, std::optional<int64_t> start,
                 std::optional<int64_t> stop, int64_t step, int64_t &b,
                 int64_t &e) {
  auto clamp = [&](std::optional<int64_t> v, bool isStart) {
    if (!v)
      return isStart ? (step < 0 ? len - 1 : 0) : (step < 0 ? -1 : len);
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0)
        x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  b = clamp(start, true);
  e = clamp(stop, false);
}

template <typename Seq>
Seq sliceOf(const Seq &s, std::optional<int64_t> start,
            std::optional<int64_t> stop, int64_t step) {
  int64_t b, e;
  adjustSlice(static_cast<int64_t>(s.size()), start, stop, step, b, e);
  Seq out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step)
    out.push_back(s[static_cast<size_t>(i)]);
  return out;
}

/// The code point range [start, end) of a str method's start/end arguments.
std::u32string window(const std::u32string &u, const Bound &b, size_t first) {
  std::optional<int64_t> start, end;
  if (b.has(first) && !b.v[first]->isNone())
    start = toInt(*b.v[first]);
  if (b.has(first + 1) && !b.v[first + 1]->isNone())
    end = toInt(*b.v[first + 1]);
  if (!start && !end)
    return u;
  int64_t s, e;
  adjustSlice(static_cast<int64_t>(u.size()), start, end, 1, s, e);
  if (e <= s)
    return {};
  return u.substr(static_cast<size_t>(s), static_cast<size_t>(e - s));
}

std::optional<double> parsePyFloat(const std::string &text) {
  std::string s = pyStrip(text, nullptr, true, true, "float");
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      // Only between digits.
      if (i == 0 || i + 1 >= s.size() || !isAsciiDigit(s[i - 1]) ||
          !isAsciiDigit(s[i + 1]))
        return std::nullopt;
      continue;
    }
    t += s[i];
  }
  std::string body = t;
  if (!body.empty() && (body[0] == '+' || body[0] == '-'))
    body.erase(0, 1);
  const std::string low = lower(body);
  if (low == "inf" || low == "infinity" || low == "nan") {
    const double v = low == "nan" ? NAN : INFINITY;
    return !t.empty() && t[0] == '-' ? -v : v;
  }
  // digits[.digits][e[+-]digits] or .digits[...]
  size_t i = 0, digits = 0;
  while (i < body.size() && isAsciiDigit(body[i]))
    ++i, ++digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && isAsciiDigit(body[i]))
      ++i, ++digits;
  }
  if (digits == 0)
    return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-'))
      ++i;
    size_t expDigits = 0;
    while (i < body.size() && isAsciiDigit(body[i]))
      ++i, ++expDigits;
    if (expDigits == 0)
      return std::nullopt;
  }
  if (i != body.size())
    return std::nullopt;
  const double d = parseDouble(body);
  return !t.empty() && t[0] == '-' ? -d : d;
}

std::optional<int64_t> parsePyInt(const std::string &text, int64_t base) {
  std::string s = pyStrip(text, nullptr, true, true, "int");
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-'))
    negative = s[i++] == '-';
  if ((base == 16 || base == 8 || base == 2 || base == 0) && i + 1 < s.size() &&
      s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int64_t b = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (b && (base == 0 || base == b)) {
      base = b;
      i += 2;
      if (i < s.size() && s[i] == '_')
        ++i;
    }
  }
  if (base == 0)
    base = 10;
  if (base < 2 || base > 36)
    throw Error("int() base must be >= 2 and <= 36, or 0");
  int64_t v = 0;
  size_t digits = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '_' && digits > 0 && i + 1 < s.size() && s[i + 1] != '_')
      continue;
    const char c = static_cast<char>(s[i] | 0x20);
    const int d = isAsciiDigit(s[i])       ? s[i] - '0'
                  : (c >= 'a' && c <= 'z') ? c - 'a' + 10
                                           : 99;
    if (d >= base)
      return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
      throw Error("integer overflow");
    ++digits;
  }
  if (digits == 0)
    return std::nullopt;
  return negative ? -v : v;
}

/// Python's round(x, ndigits) of a float: to nearest, ties to even, on the
/// exact binary value (as CPython's double_round does, with its bounds).
double pyRound(double x, int64_t digits) {
  if (!std::isfinite(x))
    return x;
  if (digits == 0)
    return std::nearbyint(x);
  if (digits > 0) {
    if (digits > 323) // past the digits any double has
      return x;
    // Exactly rounded decimal digits, then read back (to_chars and
    // parseDouble: no C locale).
    char buf[1024];
    const auto r =
        std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed,
                      static_cast<int>(digits));
    if (r.ec != std::errc())
      return x;
    return parseDouble(std::string_view(buf, static_cast<size_t>(r.ptr - buf)));
  }
  if (digits < -308) // 10**-digits is no double: every x rounds to 0
    return std::copysign(0.0, x);
  const double p = std::pow(10.0, static_cast<double>(-digits));
  const double r = std::nearbyint(x / p) * p;
  return std::isfinite(r) ? r : std::copysign(0.0, x);
}

/// Python's round(i, ndigits) of an int with ndigits < 0: exact, to the
/// nearest multiple of 10**-ndigits, ties to even.
int64_t pyRoundInt(int64_t x, int64_t digits) {
  if (digits <= -19) // 10**19 > every int64: all round to 0
    return 0;
  int64_t p = 1;
  for (int64_t k = 0; k < -digits; ++k)
    p *= 10;
  int64_t q = x / p, r = x % p; // truncated
  if (r < 0) {                  // floored
    q -= 1;
    r += p;
  }
  // r in [0, p): up when past half, or at half with q odd.
  if (r > p - r || (r == p - r && (q & 1)))
    q += 1;
  int64_t out;
  if (__builtin_mul_overflow(q, p, &out))
    throw Error("integer overflow");
  return out;
}

// Python's float floor division and modulo (floatobject.c's divmod).
void floatDivmod(double vx, double wx, double &floordiv, double &mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5)
      floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

// ---------------------------------------------------------------------------
// Attribute getters of map, selectattr, sort, ...

/// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
std::function<Value(const Value &)>
attrGetter(Interp &in, const Value &attribute, bool ignoreCase,
           std::optional<Value> fallback = std::nullopt) {
  std::vector<Value> parts;
  if (attribute.isString()) {
    size_t i = 0;
    const std::string &a = attribute.str();
    while (true) {
      size_t dot = a.find('.', i);
      std::string part = a.substr(i, dot == std::string::npos ? dot : dot - i);
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
            return c >= '0' && c <= '9';
          });
      int64_t index = 0;
      const bool isIndex =
          digits &&
          std::from_chars(part.data(), part.data() + part.size(), index).ec ==
              std::errc();
      // (Python's int of more digits than an int64 holds indexes nothing.)
      parts.push_back(isIndex ? Value::integer(index) : str(std::move(part)));
      if (dot == std::string::npos)
        break;
      i = dot + 1;
    }
  } else if (!attribute.isNone()) {
    parts.push_back(attribute);
  }
  return [&in, parts, ignoreCase, fallback](const Value &item) {
    Value v = item;
    for (const Value &p : parts) {
      v = in.getItem(v, p);
      if (fallback && !fallback->isNone() && v.isUndefined())
        v = *fallback;
    }
    if (ignoreCase && v.isString())
      return str(lower(v.str()));
    return v;
  };
}

Value ignoreCase(const Value &v) {
  return v.isString() ? str(lower(v.str())) : v;
}

bool pyLess(const Value &a, const Value &b) { return lessCompare(a, b, "<"); }

// ---------------------------------------------------------------------------
// Filters

#define FILTER(name)                                                           \
  Value name([[maybe_unused]] Interp &in, const Value &v, const Args &args)

FILTER(fAbs) {
  bind(args, {}, "filter 'abs'");
  if (v.kind() == Kind::Float)
    return Value::real(std::fabs(v.asFloat()));
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool) {
    if (v.asInt() == INT64_MIN)
      throw Error("integer overflow");
    return Value::integer(std::llabs(v.asInt()));
  }
  if (v.isUndefined())
    failUndefined(v);
  throw Error("bad operand type for abs(): '" + typeName(v) + "'");
}

FILTER(fAttr) {
  Bound b = bind(args, {"name"}, "filter 'attr'");
  if (!b.has(0))
    throw Error("filter 'attr' needs the attribute name");
  if (v.isUndefined())
    failUndefined(v);
  const std::string name = toStr(*b.v[0]);
  if (v.kind() == Kind::Object) {
    if (const Value *a = v.objectData().attrs.find(str(name)))
      return *a;
  } else if (std::optional<Value> a = pythonAttribute(v, name)) {
    return *a;
  }
  return Value::undefined("'" + objectTypeRepr(v) + "' has no attribute '" +
                          name + "'");
}

FILTER(fCapitalize) {
  bind(args, {}, "filter 'capitalize'");
  return str(pyCapitalize(toStr(v)));
}

std::string pyCenter(const std::string &s, int64_t width, char32_t fill,
                     int mode) {
  const int64_t len = static_cast<int64_t>(codePoints(s));
  if (width <= len)
    return s;
  const int64_t marg = width - len;
  // mode 0: centred as Python's str.center; < 0: ljust; > 0: rjust.
  int64_t left = mode == 0  ? marg / 2 + (marg & width & 1)
                 : mode < 0 ? 0
                            : marg;
  std::string pad;
  appendUtf8(pad, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i)
    out += pad;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i)
    out += pad;
  return out;
}

FILTER(fCenter) {
  Bound b = bind(args, {"width"}, "filter 'center'");
  const int64_t width = b.has(0) ? toInt(*b.v[0]) : 80;
  in.checkString(static_cast<size_t>(std::max<int64_t>(width, 0)) * 4);
  return str(pyCenter(toStr(v), width, ' ', 0));
}

FILTER(fDefault) {
  Bound b = bind(args, {"default_value", "boolean"}, "filter 'default'");
  const bool boolean = b.has(1) && truthy(*b.v[1]);
  if (v.isUndefined() || (boolean && !truthy(v)))
    return b.get(0, str(""));
  return v;
}

std::vector<Value> sortedItems(Interp &in, std::vector<Value> items,
                               const std::function<Value(const Value &)> &key,
                               bool reverse) {
  in.tick(static_cast<int64_t>(items.size()));
  std::vector<std::pair<Value, Value>> keyed;
  for (Value &i : items)
    keyed.emplace_back(key(i), std::move(i));
  std::stable_sort(
      keyed.begin(), keyed.end(), [reverse](const auto &a, const auto &b) {
        return reverse ? pyLess(b.first, a.first) : pyLess(a.first, b.first);
      });
  std::vector<Value> out;
  for (auto &k : keyed)
    out.push_back(std::move(k.second));
  return out;
}

FILTER(fDictsort) {
  Bound b =
      bind(args, {"case_sensitive", "by", "reverse"}, "filter 'dictsort'");
  const bool caseSensitive = b.has(0) && truthy(*b.v[0]);
  const std::string by = b.has(1) ? toStr(*b.v[1]) : "key";
  if (by != "key" && by != "value")
    throw Error("You can only sort by either \"key\" or \"value\"");
  if (v.isUndefined())
    failUndefined(v);
  if (v.kind() != Kind::Dict)
    throw Error("'" + typeName(v) + "' object has no attribute 'items'");
  std::vector<Value> items;
  for (const auto &[k, val] : v.dictData().items)
    items.push_back(Value::seq({k, val}, SeqType::Tuple));
  const size_t pos = by == "key" ? 0 : 1;
  return Value::seq(sortedItems(
      in, std::move(items),
      [pos, caseSensitive](const Value &item) {
        const Value &x = item.items()[pos];
        return caseSensitive ? x : ignoreCase(x);
      },
      b.has(2) && truthy(*b.v[2])));
}

FILTER(fEscape) {
  bind(args, {}, "filter 'escape'");
  if (v.markup())
    return v;
  return Value::string(escapeHtml(toStr(v)), true);
}

/// The first / last character of a string (without one string per
/// character, as iterate makes).
Value endChar(const std::string &s, bool last) {
  if (s.empty())
    return Value::undefined(std::string("No ") + (last ? "last" : "first") +
                            " item, sequence was empty.");
  size_t begin = 0, end = s.size();
  if (last) {
    begin = end - 1;
    while (begin > 0 && (static_cast<unsigned char>(s[begin]) & 0xc0) == 0x80)
      --begin;
  } else {
    end = 1;
    while (end < s.size() &&
           (static_cast<unsigned char>(s[end]) & 0xc0) == 0x80)
      ++end;
  }
  return str(s.substr(begin, end - begin));
}

FILTER(fFirst) {
  bind(args, {}, "filter 'first'");
  if (v.isString())
    return endChar(v.str(), false);
  if (v.kind() == Kind::Seq) {
    if (v.items().empty())
      return Value::undefined("No first item, sequence was empty.");
    return v.items().front();
  }
  std::vector<Value> items = iterate(v);
  if (items.empty())
    return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

FILTER(fLast) {
  bind(args, {}, "filter 'last'");
  if (v.kind() == Kind::Seq && (v.seqType() == SeqType::Generator ||
                                v.seqType() == SeqType::ReverseIterator))
    throw Error("'" + typeName(v) + "' object is not reversible");
  if (v.kind() != Kind::Seq && v.kind() != Kind::String &&
      v.kind() != Kind::Dict && !v.isUndefined())
    throw Error("'" + typeName(v) + "' object is not reversible");
  if (v.isString())
    return endChar(v.str(), true);
  if (v.kind() == Kind::Seq) {
    if (v.items().empty())
      return Value::undefined("No last item, sequence was empty.");
    return v.items().back();
  }
  std::vector<Value> items = iterate(v);
  if (items.empty())
    return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

FILTER(fFloat) {
  Bound b = bind(args, {"default"}, "filter 'float'");
  const Value fallback = b.get(0, Value::real(0.0));
  switch (v.kind()) {
  case Kind::Float:
    return v;
  case Kind::Int:
  case Kind::Bool:
    return Value::real(static_cast<double>(v.asInt()));
  case Kind::String:
    if (std::optional<double> d = parsePyFloat(v.str()))
      return Value::real(*d);
    return fallback;
  case Kind::Undefined:
    failUndefined(v);
  default:
    return fallback;
  }
}

FILTER(fIndent) {
  Bound b = bind(args, {"width", "first", "blank"}, "filter 'indent'");
  std::string indention;
  if (b.has(0) && b.v[0]->isString()) {
    indention = b.v[0]->str();
  } else {
    const int64_t width = b.has(0) ? toInt(*b.v[0]) : 4;
    in.checkString(static_cast<size_t>(std::max<int64_t>(width, 0)));
    indention =
        std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  }
  const bool first = b.has(1) && truthy(*b.v[1]);
  const bool blank = b.has(2) && truthy(*b.v[2]);
  // jinja2 appends "\n" and splits lines: strings only.
  if (v.isUndefined())
    failUndefined(v);
  if (!v.isString())
    throw Error("filter 'indent' needs a string, not " + typeName(v));
  std::vector<std::string> lines = pySplitlines(v.str() + "\n", false);
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool indented = i > 0 && (blank || !lines[i].empty());
    in.checkString(rv.size() + 1 + (indented ? indention.size() : 0) +
                   lines[i].size());
    if (i > 0)
      rv += "\n";
    if (indented)
      rv += indention;
    rv += lines[i];
  }
  if (first) {
    in.checkString(indention.size() + rv.size());
    rv = indention + rv;
  }
  return str(std::move(rv));
}

FILTER(fInt) {
  Bound b = bind(args, {"default", "base"}, "filter 'int'");
  const Value fallback = b.get(0, Value::integer(0));
  const int64_t base = b.has(1) ? toInt(*b.v[1]) : 10;
  auto fromFloat = [&](double d) -> Value {
    if (std::isnan(d))
      return fallback; // ValueError, caught by jinja2
    if (std::isinf(d))
      throw Error("cannot convert float infinity to integer");
    if (d >= 9.2233720368547758e18 || d < -9.2233720368547758e18)
      throw Error("integer overflow");
    return Value::integer(static_cast<int64_t>(d));
  };
  switch (v.kind()) {
  case Kind::Int:
  case Kind::Bool:
    return Value::integer(v.asInt());
  case Kind::Float:
    return fromFloat(v.asFloat());
  case Kind::String:
    if (std::optional<int64_t> i = parsePyInt(v.str(), base))
      return Value::integer(*i);
    if (std::optional<double> d = parsePyFloat(v.str()))
      return fromFloat(*d);
    return fallback;
  case Kind::Undefined:
    failUndefined(v);
  default:
    return fallback;
  }
}

FILTER(fItems) {
  bind(args, {}, "filter 'items'");
  if (v.isUndefined())
    return generator({});
  if (v.kind() != Kind::Dict)
    throw Error("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto &[k, val] : v.dictData().items)
    items.push_back(Value::seq({k, val}, SeqType::Tuple));
  return generator(std::move(items));
}

FILTER(fJoin) {
  Bound b = bind(args, {"d", "attribute"}, "filter 'join'");
  const std::string sep = b.has(0) ? toStr(*b.v[0]) : "";
  std::vector<Value> items = iterate(v);
  std::function<Value(const Value &)> get;
  if (b.has(1) && !b.v[1]->isNone())
    get = attrGetter(in, *b.v[1], false);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    in.tick();
    const Value item = get ? get(items[i]) : items[i];
    const std::string text =
        item.isString() ? std::string() : toStr(item); // (strings: no copy)
    const std::string &piece = item.isString() ? item.str() : text;
    in.checkString(out.size() + (i ? sep.size() : 0) + piece.size());
    if (i)
      out += sep;
    out += piece;
  }
  return str(std::move(out));
}

FILTER(fLength) {
  bind(args, {}, "filter 'length'");
  return Value::integer(length(v));
}

FILTER(fList) {
  bind(args, {}, "filter 'list'");
  return Value::seq(iterate(v));
}

FILTER(fLower) {
  bind(args, {}, "filter 'lower'");
  return str(lower(toStr(v)));
}

FILTER(fUpper) {
  bind(args, {}, "filter 'upper'");
  return str(upper(toStr(v)));
}

FILTER(fMap) {
  if (!truthy(v))
    return generator({});
  std::function<Value(const Value &)> func;
  if (args.pos.empty() &&
      std::any_of(args.kw.begin(), args.kw.end(),
                  [](const auto &kv) { return kv.first == "attribute"; })) {
    Bound b = bind(args, {"attribute", "default"}, "filter 'map'");
    func = attrGetter(in, *b.v[0], false,
                      b.has(1) ? std::optional<Value>(*b.v[1]) : std::nullopt);
  } else {
    if (args.pos.empty())
      throw Error("map requires a filter argument");
    const std::string name = toStr(args.pos[0]);
    Args rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    func = [&in, name, rest](const Value &item) {
      return in.callFilter(name, item, rest);
    };
  }
  std::vector<Value> out;
  for (const Value &item : iterate(v)) {
    in.tick();
    out.push_back(func(item));
  }
  return generator(std::move(out));
}

Value selectOrReject(Interp &in, const Value &v, const Args &args, bool select,
                     bool byAttribute) {
  if (!truthy(v))
    return generator({});
  if (!args.kw.empty())
    throw Error("select/reject filters take no keyword arguments");
  size_t off = 0;
  std::function<Value(const Value &)> get = [](const Value &x) { return x; };
  if (byAttribute) {
    if (args.pos.empty())
      throw Error("Missing parameter for attribute name");
    get = attrGetter(in, args.pos[0], false);
    off = 1;
  }
  std::function<bool(const Value &)> test = [](const Value &x) {
    return truthy(x);
  };
  if (args.pos.size() > off) {
    const std::string name = toStr(args.pos[off]);
    Args rest;
    rest.pos.assign(args.pos.begin() + static_cast<ptrdiff_t>(off) + 1,
                    args.pos.end());
    test = [&in, name, rest](const Value &x) {
      return in.callTest(name, x, rest);
    };
  }
  std::vector<Value> out;
  for (const Value &item : iterate(v)) {
    in.tick();
    if (test(get(item)) == select)
      out.push_back(item);
  }
  return generator(std::move(out));
}

FILTER(fSelect) { return selectOrReject(in, v, args, true, false); }
FILTER(fReject) { return selectOrReject(in, v, args, false, false); }
FILTER(fSelectattr) { return selectOrReject(in, v, args, true, true); }
FILTER(fRejectattr) { return selectOrReject(in, v, args, false, true); }

Value minOrMax(Interp &in, const Value &v, const Args &args, bool max,
               const char *what) {
  Bound b = bind(args, {"case_sensitive", "attribute"}, what);
  std::vector<Value> items = iterate(v);
  if (items.empty())
    return Value::undefined("No aggregated item, sequence was empty.");
  auto key = attrGetter(in, b.get(1), !(b.has(0) && truthy(*b.v[0])));
  size_t best = 0;
  Value bestKey = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (max ? pyLess(bestKey, k) : pyLess(k, bestKey)) {
      best = i;
      bestKey = k;
    }
  }
  return items[best];
}

FILTER(fMax) { return minOrMax(in, v, args, true, "filter 'max'"); }
FILTER(fMin) { return minOrMax(in, v, args, false, "filter 'min'"); }

FILTER(fReplace) {
  Bound b = bind(args, {"old", "new", "count"}, "filter 'replace'");
  if (!b.has(0) || !b.has(1))
    throw Error("filter 'replace' needs the old and the new text");
  const int64_t count =
      b.has(2) && !b.v[2]->isNone() ? toInt(*b.v[2]) : int64_t{-1};
  return str(pyReplace(in, toStr(v), toStr(*b.v[0]), toStr(*b.v[1]), count));
}

FILTER(fReverse) {
  bind(args, {}, "filter 'reverse'");
  if (v.isString()) {
    std::u32string u = decodeUtf8(v.str());
    std::reverse(u.begin(), u.end());
    return str(encodeUtf8(u));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed() of a list is an iterator; of a generator, jinja2 makes a
  // list.
  const bool list = v.kind() == Kind::Seq && v.seqType() == SeqType::Generator;
  return Value::seq(std::move(items),
                    list ? SeqType::List : SeqType::ReverseIterator);
}

FILTER(fRound) {
  Bound b = bind(args, {"precision", "method"}, "filter 'round'");
  const int64_t precision = b.has(0) ? toInt(*b.v[0]) : 0;
  const std::string method = b.has(1) ? toStr(*b.v[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    throw Error("method must be common, ceil or floor");
  if (v.isUndefined())
    failUndefined(v);
  if (!v.isNumber())
    throw Error("type " + typeName(v) + " doesn't define __round__ method");
  if (method == "common") {
    // Python's round(): an int stays an int (rounded exactly), a float a
    // float.
    if (v.kind() != Kind::Float) {
      if (precision >= 0)
        return Value::integer(v.asInt());
      return Value::integer(pyRoundInt(v.asInt(), precision));
    }
    return Value::real(pyRound(v.asFloat(), precision));
  }
  // jinja2: math.ceil / math.floor of value * 10**precision, divided by
  // 10**precision; Python fails where that is no finite float.
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (!std::isfinite(scale))
    throw Error("int too large to convert to float");
  if (scale == 0.0)
    throw Error("float division by zero");
  const double x = v.asFloat() * scale;
  if (!std::isfinite(x))
    throw Error(std::isnan(x) ? "cannot convert float NaN to integer"
                              : "cannot convert float infinity to integer");
  return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

FILTER(fSafe) {
  bind(args, {}, "filter 'safe'");
  return Value::string(toStr(v), true);
}

FILTER(fSort) {
  Bound b =
      bind(args, {"reverse", "case_sensitive", "attribute"}, "filter 'sort'");
  const bool caseSensitive = b.has(1) && truthy(*b.v[1]);
  std::vector<std::function<Value(const Value &)>> keys;
  const Value attribute = b.get(2);
  if (attribute.isString() && attribute.str().find(',') != std::string::npos) {
    for (Value &part : pySplit(attribute.str(), str(","), -1, false))
      keys.push_back(attrGetter(in, part, !caseSensitive));
  } else {
    keys.push_back(attrGetter(in, attribute, !caseSensitive));
  }
  auto key = [keys](const Value &item) {
    if (keys.size() == 1)
      return keys[0](item);
    std::vector<Value> parts;
    for (const auto &k : keys)
      parts.push_back(k(item));
    return Value::seq(std::move(parts), SeqType::Tuple);
  };
  return Value::seq(
      sortedItems(in, iterate(v), key, b.has(0) && truthy(*b.v[0])));
}

FILTER(fString) {
  bind(args, {}, "filter 'string'");
  return v.isString() ? v : str(toStr(v));
}

FILTER(fSum) {
  Bound b = bind(args, {"attribute", "start"}, "filter 'sum'");
  Value total = b.get(1, Value::integer(0));
  auto get = attrGetter(in, b.get(0), false);
  for (const Value &item : iterate(v)) {
    in.tick();
    total = binaryOp(in, "+", total, get(item));
  }
  return total;
}

FILTER(fTitle) {
  bind(args, {}, "filter 'title'");
  // jinja2: re.split(r"([-\s({\[<]+)", s), each piece's first character
  // upper-cased and the rest lower-cased.
  std::string out;
  bool start = true;
  for (char32_t c : decodeUtf8(toStr(v))) {
    const bool sep = isPySpace(c) || c == '-' || c == '(' || c == '{' ||
                     c == '[' || c == '<';
    if (sep) {
      appendUtf8(out, c);
      start = true;
    } else if (start) {
      appendUpper(out, c);
      start = false;
    } else {
      appendUtf8(out, toLower(c));
    }
  }
  return str(std::move(out));
}

FILTER(fTojson) {
  Bound b = bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"},
                 "filter 'tojson'");
  JsonOptions o;
  o.ensureAscii = b.has(0) && truthy(*b.v[0]);
  if (b.has(1) && !b.v[1]->isNone()) {
    if (b.v[1]->isString())
      o.indent = b.v[1]->str();
    else
      o.indent = std::string(
          static_cast<size_t>(std::clamp<int64_t>(toInt(*b.v[1]), 0, 1024)),
          ' ');
  }
  if (b.has(2) && !b.v[2]->isNone()) {
    std::vector<Value> seps = iterate(*b.v[2]);
    if (seps.size() != 2 || !seps[0].isString() || !seps[1].isString())
      throw Error("tojson: separators must be two strings");
    o.separators = std::make_pair(seps[0].str(), seps[1].str());
  }
  o.sortKeys = b.has(3) && truthy(*b.v[3]);
  std::string out = toJson(v, o);
  in.checkString(out.size());
  return str(std::move(out));
}

FILTER(fTrim) {
  Bound b = bind(args, {"chars"}, "filter 'trim'");
  return str(
      pyStrip(toStr(v), b.has(0) ? &*b.v[0] : nullptr, true, true, "strip"));
}

FILTER(fUnique) {
  Bound b = bind(args, {"case_sensitive", "attribute"}, "filter 'unique'");
  auto key = attrGetter(in, b.get(1), !(b.has(0) && truthy(*b.v[0])));
  std::vector<Value> seen, out;
  for (const Value &item : iterate(v)) {
    Value k = key(item);
    if (k.kind() == Kind::Seq && k.seqType() == SeqType::List)
      throw Error("unhashable type: 'list'");
    if (k.kind() == Kind::Dict)
      throw Error("unhashable type: 'dict'");
    in.tick(static_cast<int64_t>(seen.size()) + 1);
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value &s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return generator(std::move(out));
}

#undef FILTER

const std::unordered_map<std::string_view, FilterFn> &filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", fAbs},
      {"attr", fAttr},
      {"capitalize", fCapitalize},
      {"center", fCenter},
      {"count", fLength},
      {"d", fDefault},
      {"default", fDefault},
      {"dictsort", fDictsort},
      {"e", fEscape},
      {"escape", fEscape},
      {"first", fFirst},
      {"float", fFloat},
      {"indent", fIndent},
      {"int", fInt},
      {"items", fItems},
      {"join", fJoin},
      {"last", fLast},
      {"length", fLength},
      {"list", fList},
      {"lower", fLower},
      {"map", fMap},
      {"max", fMax},
      {"min", fMin},
      {"reject", fReject},
      {"rejectattr", fRejectattr},
      {"replace", fReplace},
      {"reverse", fReverse},
      {"round", fRound},
      {"safe", fSafe},
      {"select", fSelect},
      {"selectattr", fSelectattr},
      {"sort", fSort},
      {"string", fString},
      {"sum", fSum},
      {"title", fTitle},
      {"tojson", fTojson},
      {"trim", fTrim},
      {"unique", fUnique},
      {"upper", fUpper},
  };
  return table;
}

// jinja2's filters nf does not implement: "unsupported", not "unknown".
constexpr std::string_view kUnsupportedFilters[] = {
    "batch",     "filesizeformat", "forceescape", "format",    "groupby",
    "pprint",    "random",         "slice",       "striptags", "truncate",
    "urlencode", "urlize",         "wordcount",   "wordwrap",  "xmlattr"};

// ---------------------------------------------------------------------------
// Tests

#define TEST(name)                                                             \
  bool name([[maybe_unused]] Interp &in, const Value &v, const Args &args)

Value oneArg(const Args &args, const char *what) {
  if (args.pos.size() != 1 || !args.kw.empty())
    throw Error(std::string("test '") + what + "' takes one argument");
  return args.pos[0];
}
void noArgs(const Args &args, const char *what) {
  if (!args.pos.empty() || !args.kw.empty())
    throw Error(std::string("test '") + what + "' takes no arguments");
}

TEST(tDefined) {
  noArgs(args, "defined");
  return !v.isUndefined();
}
TEST(tUndefined) {
  noArgs(args, "undefined");
  return v.isUndefined();
}
TEST(tNone) {
  noArgs(args, "none");
  return v.isNone();
}
TEST(tBoolean) {
  noArgs(args, "boolean");
  return v.kind() == Kind::Bool;
}
TEST(tTrue) {
  noArgs(args, "true");
  return v.kind() == Kind::Bool && v.asBool();
}
TEST(tFalse) {
  noArgs(args, "false");
  return v.kind() == Kind::Bool && !v.asBool();
}
TEST(tInteger) {
  noArgs(args, "integer");
  return v.kind() == Kind::Int;
}
TEST(tFloat) {
  noArgs(args, "float");
  return v.kind() == Kind::Float;
}
TEST(tNumber) {
  noArgs(args, "number");
  return v.isNumber();
}
TEST(tString) {
  noArgs(args, "string");
  return v.isString();
}
TEST(tMapping) {
  noArgs(args, "mapping");
  return v.kind() == Kind::Dict;
}
TEST(tIterable) {
  noArgs(args, "iterable");
  return v.isUndefined() || v.isString() || v.kind() == Kind::Seq ||
         v.kind() == Kind::Dict ||
         (v.kind() == Kind::Object && v.objectData().type == "LoopContext");
}
TEST(tSequence) {
  noArgs(args, "sequence");
  // len() and __getitem__: str, list, tuple, range, dict, Undefined.
  if (v.kind() == Kind::Seq)
    return v.seqType() == SeqType::List || v.seqType() == SeqType::Tuple ||
           v.seqType() == SeqType::Range;
  return v.isUndefined() || v.isString() || v.kind() == Kind::Dict;
}
TEST(tCallable) {
  noArgs(args, "callable");
  return v.kind() == Kind::Callable || v.isUndefined() ||
         (v.kind() == Kind::Object && v.objectData().type == "LoopContext");
}
TEST(tEscaped) {
  noArgs(args, "escaped");
  return v.markup();
}
TEST(tLower) {
  noArgs(args, "lower");
  bool cased = false;
  for (char32_t c : decodeUtf8(toStr(v))) {
    if (isUpperChar(c))
      return false;
    cased = cased || isLowerChar(c);
  }
  return cased;
}
TEST(tUpper) {
  noArgs(args, "upper");
  bool cased = false;
  for (char32_t c : decodeUtf8(toStr(v))) {
    if (isLowerChar(c))
      return false;
    cased = cased || isUpperChar(c);
  }
  return cased;
}
TEST(tOdd) {
  noArgs(args, "odd");
  return equals(binaryOp(in, "%", v, Value::integer(2)), Value::integer(1));
}
TEST(tEven) {
  noArgs(args, "even");
  return equals(binaryOp(in, "%", v, Value::integer(2)), Value::integer(0));
}
TEST(tDivisibleby) {
  return equals(binaryOp(in, "%", v, oneArg(args, "divisibleby")),
                Value::integer(0));
}
TEST(tEq) { return equals(v, oneArg(args, "eq")); }
TEST(tNe) { return !equals(v, oneArg(args, "ne")); }
TEST(tLt) { return lessCompare(v, oneArg(args, "lt"), "<"); }
TEST(tLe) { return lessCompare(v, oneArg(args, "le"), "<="); }
TEST(tGt) { return lessCompare(v, oneArg(args, "gt"), ">"); }
TEST(tGe) { return lessCompare(v, oneArg(args, "ge"), ">="); }
TEST(tIn) { return contains(oneArg(args, "in"), v); }
TEST(tSameas) {
  const Value other = oneArg(args, "sameas");
  if (v.kind() != other.kind())
    return false;
  switch (v.kind()) {
  case Kind::None:
    return true;
  case Kind::Bool:
    return v.asBool() == other.asBool();
  case Kind::Int: // CPython caches small ints
    return v.asInt() == other.asInt() && v.asInt() >= -5 && v.asInt() <= 256;
  case Kind::Float:
  case Kind::Undefined:
    return false;
  default:
    return v.identity() == other.identity();
  }
}
TEST(tFilter) {
  noArgs(args, "filter");
  return v.isString() && findFilter(v.str()) != nullptr;
}
TEST(tTest) {
  noArgs(args, "test");
  return v.isString() && findTest(v.str()) != nullptr;
}

#undef TEST

const std::unordered_map<std::string_view, TestFn> &tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"boolean", tBoolean},
      {"callable", tCallable},
      {"defined", tDefined},
      {"divisibleby", tDivisibleby},
      {"eq", tEq},
      {"equalto", tEq},
      {"==", tEq},
      {"escaped", tEscaped},
      {"even", tEven},
      {"false", tFalse},
      {"filter", tFilter},
      {"float", tFloat},
      {"ge", tGe},
      {">=", tGe},
      {"gt", tGt},
      {">", tGt},
      {"greaterthan", tGt},
      {"in", tIn},
      {"integer", tInteger},
      {"iterable", tIterable},
      {"le", tLe},
      {"<=", tLe},
      {"lower", tLower},
      {"lt", tLt},
      {"<", tLt},
      {"lessthan", tLt},
      {"mapping", tMapping},
      {"ne", tNe},
      {"!=", tNe},
      {"none", tNone},
      {"number", tNumber},
      {"odd", tOdd},
      {"sameas", tSameas},
      {"sequence", tSequence},
      {"string", tString},
      {"test", tTest},
      {"true", tTrue},
      {"undefined", tUndefined},
      {"upper", tUpper},
  };
  return table;
}

// ---------------------------------------------------------------------------
// Python methods

/// str.format with automatic and numbered fields, names and !r / !s; format
/// specs and attribute or index access in fields are not supported.
std::string pyFormat(Interp &in, const std::string &fmt, const Args &args) {
  std::string out;
  int autoIndex = 0;
  bool manual = false, automatic = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      throw Error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t end = fmt.find('}', i);
    if (end == std::string::npos)
      throw Error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, end - i - 1);
    i = end;
    char conversion = 0;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      throw Error("str.format: format spec '" + field.substr(colon) +
                  "' is not supported");
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size() ||
          (field[bang + 1] != 'r' && field[bang + 1] != 's'))
        throw Error("str.format: unsupported conversion in '{" + field + "}'");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find_first_of(".[") != std::string::npos)
      throw Error("str.format: attribute and index access in '{" + field +
                  "}' is not supported");
    Value v;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char ch) {
          return ch >= '0' && ch <= '9';
        })) {
      size_t index;
      if (field.empty()) {
        if (manual)
          throw Error("cannot switch from manual field specification to "
                      "automatic field numbering");
        automatic = true;
        index = static_cast<size_t>(autoIndex++);
      } else {
        if (automatic)
          throw Error("cannot switch from automatic field numbering to "
                      "manual field specification");
        manual = true;
        if (std::from_chars(field.data(), field.data() + field.size(), index)
                .ec != std::errc())
          throw Error("Too many decimal digits in format string");
      }
      if (index >= args.pos.size())
        throw Error("Replacement index " + std::to_string(index) +
                    " out of range for positional args tuple");
      v = args.pos[index];
    } else {
      auto it = std::find_if(args.kw.begin(), args.kw.end(),
                             [&](const auto &kv) { return kv.first == field; });
      if (it == args.kw.end())
        throw Error("'" + field + "'");
      v = it->second;
    }
    const std::string text = conversion == 'r' ? repr(v) : toStr(v);
    in.checkString(out.size() + text.size());
    out += text;
  }
  return out;
}

bool asciiOnly(const std::string &s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x80;
  });
}

/// str.isdigit / isalpha / isalnum: exact for ASCII text (nf has no Unicode
/// character database for the rest).
Value charClass(const std::string &self, const std::string &name) {
  if (!asciiOnly(self))
    throw Error("str." + name + "() of non-ASCII text is not supported");
  if (self.empty())
    return Value::boolean(false);
  auto ok = [&](char c) {
    const bool digit = c >= '0' && c <= '9';
    const bool alpha = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
    return name == "isdigit"   ? digit
           : name == "isalpha" ? alpha
                               : digit || alpha;
  };
  return Value::boolean(std::all_of(self.begin(), self.end(), ok));
}

Value strMethod(Interp &in, const std::string &self, const std::string &name,
                const Args &args) {
  const std::string what = "str." + name + "()";
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Bound b = bind(args, {"chars"}, what);
    return str(pyStrip(self, b.has(0) ? &*b.v[0] : nullptr, name != "rstrip",
                       name != "lstrip", name));
  }
  if (name == "split" || name == "rsplit") {
    Bound b = bind(args, {"sep", "maxsplit"}, what);
    return Value::seq(pySplit(self, b.get(0),
                              b.has(1) ? toInt(*b.v[1]) : int64_t{-1},
                              name == "rsplit"));
  }
  if (name == "splitlines") {
    Bound b = bind(args, {"keepends"}, what);
    std::vector<Value> out;
    for (std::string &l : pySplitlines(self, b.has(0) && truthy(*b.v[0])))
      out.push_back(str(std::move(l)));
    return Value::seq(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    Bound b = bind(args, {"prefix", "start", "end"}, what);
    if (!b.has(0))
      throw Error(what + " takes at least 1 argument (0 given)");
    const std::u32string u = window(decodeUtf8(self), b, 1);
    std::vector<Value> options =
        b.v[0]->kind() == Kind::Seq && b.v[0]->seqType() == SeqType::Tuple
            ? b.v[0]->items()
            : std::vector<Value>{*b.v[0]};
    for (const Value &o : options) {
      const std::u32string p = decodeUtf8(strArg(o, what + " argument"));
      if (p.size() <= u.size() &&
          (name == "startswith"
               ? u.compare(0, p.size(), p) == 0
               : u.compare(u.size() - p.size(), p.size(), p) == 0))
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper" || name == "lower" || name == "title" ||
      name == "capitalize") {
    bind(args, {}, what);
    return str(name == "upper"   ? upper(self)
               : name == "lower" ? lower(self)
               : name == "title" ? pyTitle(self)
                                 : pyCapitalize(self));
  }
  if (name == "replace") {
    Bound b = bind(args, {"old", "new", "count"}, what);
    if (!b.has(0) || !b.has(1))
      throw Error(what + " needs the old and the new text");
    return str(pyReplace(in, self, strArg(*b.v[0], what + " argument 1"),
                         strArg(*b.v[1], what + " argument 2"),
                         b.has(2) ? toInt(*b.v[2]) : int64_t{-1}));
  }
  if (name == "find" || name == "rfind" || name == "index" ||
      name == "rindex" || name == "count") {
    Bound b = bind(args, {"sub", "start", "end"}, what);
    if (!b.has(0))
      throw Error(what + " takes at least 1 argument (0 given)");
    const std::u32string whole = decodeUtf8(self);
    const std::u32string sub = decodeUtf8(strArg(*b.v[0], what + " argument"));
    // The window's offset in the whole string.
    int64_t offset = 0;
    if (b.has(1) && !b.v[1]->isNone()) {
      int64_t s, e;
      adjustSlice(static_cast<int64_t>(whole.size()), toInt(*b.v[1]),
                  std::nullopt, 1, s, e);
      offset = s;
    }
    const std::u32string u = window(whole, b, 1);
    if (name == "count") {
      if (sub.empty())
        return Value::integer(static_cast<int64_t>(u.size()) + 1);
      int64_t n = 0;
      for (size_t at = u.find(sub); at != std::u32string::npos;
           at = u.find(sub, at + sub.size()))
        ++n;
      return Value::integer(n);
    }
    const size_t at = name[0] == 'r' ? u.rfind(sub) : u.find(sub);
    if (at == std::u32string::npos) {
      if (name == "index" || name == "rindex")
        throw Error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(at) + offset);
  }
  if (name == "join") {
    Bound b = bind(args, {"iterable"}, what);
    if (!b.has(0))
      throw Error(what + " takes exactly one argument (0 given)");
    std::vector<Value> items = iterate(*b.v[0]);
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].isString())
        throw Error("sequence item " + std::to_string(i) +
                    ": expected str instance, " + typeName(items[i]) +
                    " found");
      in.checkString(out.size() + (i ? self.size() : 0) +
                     items[i].str().size());
      if (i)
        out += self;
      out += items[i].str();
    }
    return str(std::move(out));
  }
  if (name == "format")
    return str(pyFormat(in, self, args));
  if (name == "isdigit" || name == "isalpha" || name == "isalnum") {
    bind(args, {}, what);
    return charClass(self, name);
  }
  if (name == "isspace") {
    bind(args, {}, what);
    const std::u32string u = decodeUtf8(self);
    return Value::boolean(!u.empty() &&
                          std::all_of(u.begin(), u.end(), isPySpace));
  }
  if (name == "islower" || name == "isupper") {
    Args none;
    return Value::boolean(name == "islower" ? tLower(in, str(self), none)
                                            : tUpper(in, str(self), none));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Bound b = bind(args, {"fix"}, what);
    if (!b.has(0))
      throw Error(what + " takes exactly one argument (0 given)");
    const std::string &fix = strArg(*b.v[0], what + " argument");
    if (name == "removeprefix" && self.compare(0, fix.size(), fix) == 0)
      return str(self.substr(fix.size()));
    if (name == "removesuffix" && !fix.empty() && self.size() >= fix.size() &&
        self.compare(self.size() - fix.size(), fix.size(), fix) == 0)
      return str(self.substr(0, self.size() - fix.size()));
    return str(self);
  }
  if (name == "partition" || name == "rpartition") {
    Bound b = bind(args, {"sep"}, what);
    if (!b.has(0))
      throw Error(what + " takes exactly one argument (0 given)");
    const std::string &sep = strArg(*b.v[0], what + " argument");
    if (sep.empty())
      throw Error("empty separator");
    const size_t at = name == "partition" ? self.find(sep) : self.rfind(sep);
    if (at == std::string::npos)
      return Value::seq(name == "partition"
                            ? std::vector<Value>{str(self), str(""), str("")}
                            : std::vector<Value>{str(""), str(""), str(self)},
                        SeqType::Tuple);
    return Value::seq(
        {str(self.substr(0, at)), str(sep), str(self.substr(at + sep.size()))},
        SeqType::Tuple);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    Bound b = bind(args, {"width", "fillchar"}, what);
    if (!b.has(0))
      throw Error(what + " takes at least 1 argument (0 given)");
    char32_t fill = ' ';
    if (b.has(1)) {
      const std::u32string f = decodeUtf8(strArg(*b.v[1], what + " fillchar"));
      if (f.size() != 1)
        throw Error("The fill character must be exactly one character long");
      fill = f[0];
    }
    const int64_t width = toInt(*b.v[0]);
    in.checkString(static_cast<size_t>(std::max<int64_t>(width, 0)) * 4);
    return str(pyCenter(self, width, fill,
                        name == "center"  ? 0
                        : name == "ljust" ? -1
                                          : 1));
  }
  throw Error("unsupported method " + what);
}

// Every method of Python's str (those strMethod lacks are errors on call).
constexpr std::string_view kStrMethods[] = {
    "capitalize",   "casefold",     "center",    "count",     "encode",
    "endswith",     "expandtabs",   "find",      "format",    "format_map",
    "index",        "isalnum",      "isalpha",   "isascii",   "isdecimal",
    "isdigit",      "isidentifier", "islower",   "isnumeric", "isprintable",
    "isspace",      "istitle",      "isupper",   "join",      "ljust",
    "lower",        "lstrip",       "maketrans", "partition", "removeprefix",
    "removesuffix", "replace",      "rfind",     "rindex",    "rjust",
    "rpartition",   "rsplit",       "rstrip",    "split",     "splitlines",
    "startswith",   "strip",        "swapcase",  "title",     "translate",
    "upper",        "zfill"};

Value unsafe(const std::string &name, const Value &obj) {
  return Value::undefined("access to attribute '" + name + "' of '" +
                          typeName(obj) + "' object is unsafe.");
}

Value method(std::string name,
             std::function<Value(Interp &, const Args &)> fn) {
  return Value::callable(std::move(name), std::move(fn));
}

} // namespace

FilterFn findFilter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn findTest(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

std::string missingFilter(std::string_view name) {
  for (std::string_view f : kUnsupportedFilters)
    if (f == name)
      return "unsupported filter '" + std::string(name) + "'";
  return "no filter named '" + std::string(name) + "'";
}

std::string missingTest(std::string_view name) {
  return "no test named '" + std::string(name) + "'";
}

std::optional<Value> pythonAttribute(const Value &obj,
                                     const std::string &name) {
  switch (obj.kind()) {
  case Kind::String: {
    if (std::find(std::begin(kStrMethods), std::end(kStrMethods), name) ==
        std::end(kStrMethods))
      return std::nullopt;
    // The string itself, shared (not a copy per attribute lookup).
    return method("str." + name, [obj, name](Interp &in, const Args &args) {
      return strMethod(in, obj.str(), name, args);
    });
  }
  case Kind::Dict: {
    if (name == "clear" || name == "pop" || name == "popitem" ||
        name == "setdefault" || name == "update")
      return unsafe(name, obj);
    auto view = [obj](SeqType type) {
      std::vector<Value> items;
      for (const auto &[k, v] : obj.dictData().items)
        items.push_back(type == SeqType::DictKeys ? k
                        : type == SeqType::DictValues
                            ? v
                            : Value::seq({k, v}, SeqType::Tuple));
      return Value::seq(std::move(items), type);
    };
    if (name == "items" || name == "keys" || name == "values") {
      const SeqType type = name == "items"  ? SeqType::DictItems
                           : name == "keys" ? SeqType::DictKeys
                                            : SeqType::DictValues;
      return method("dict." + name,
                    [view, type, name](Interp &, const Args &args) {
                      bind(args, {}, "dict." + name + "()");
                      return view(type);
                    });
    }
    if (name == "get")
      return method("dict.get", [obj](Interp &, const Args &args) {
        Bound b = bind(args, {"key", "default"}, "dict.get()");
        if (!b.has(0))
          throw Error("get expected at least 1 argument, got 0");
        const Value *v = obj.dictData().find(*b.v[0]);
        return v ? *v : b.get(1);
      });
    if (name == "copy")
      return method("dict.copy", [obj](Interp &, const Args &args) {
        bind(args, {}, "dict.copy()");
        return Value::dict(obj.dictData());
      });
    if (name == "fromkeys")
      return method("dict.fromkeys", [](Interp &, const Args &) -> Value {
        throw Error("unsupported method dict.fromkeys()");
      });
    return std::nullopt;
  }
  case Kind::Seq: {
    const SeqType t = obj.seqType();
    if (t == SeqType::List &&
        (name == "append" || name == "clear" || name == "extend" ||
         name == "insert" || name == "pop" || name == "remove" ||
         name == "reverse" || name == "sort"))
      return unsafe(name, obj);
    if (t == SeqType::Range &&
        (name == "start" || name == "stop" || name == "step"))
      return Value::integer(obj.seqData().range[name == "start"  ? 0
                                                : name == "stop" ? 1
                                                                 : 2]);
    const bool sequence =
        t == SeqType::List || t == SeqType::Tuple || t == SeqType::Range;
    if (sequence && (name == "index" || name == "count"))
      return method(
          typeName(obj) + "." + name, [obj, name](Interp &, const Args &args) {
            Bound b = bind(args, {"value"}, typeName(obj) + "." + name + "()");
            if (!b.has(0))
              throw Error(name + " expected 1 argument, got 0");
            int64_t n = 0;
            const auto &items = obj.items();
            for (size_t i = 0; i < items.size(); ++i)
              if (equals(items[i], *b.v[0])) {
                if (name == "index")
                  return Value::integer(static_cast<int64_t>(i));
                ++n;
              }
            if (name == "index")
              throw Error(repr(*b.v[0]) + " is not in " + typeName(obj));
            return Value::integer(n);
          });
    if (t == SeqType::List && name == "copy")
      return method("list.copy", [obj](Interp &, const Args &args) {
        bind(args, {}, "list.copy()");
        return Value::seq(obj.items());
      });
    return std::nullopt;
  }
  default:
    return std::nullopt;
  }
}

Value binaryOp(Interp &in, std::string_view op, const Value &a,
               const Value &b) {
  if (a.isUndefined())
    failUndefined(a);
  if (b.isUndefined())
    failUndefined(b);
  auto unsupported = [&]() -> Error {
    return Error("unsupported operand type(s) for " + std::string(op) + ": '" +
                 typeName(a) + "' and '" + typeName(b) + "'");
  };
  const bool ints = (a.kind() == Kind::Int || a.kind() == Kind::Bool) &&
                    (b.kind() == Kind::Int || b.kind() == Kind::Bool);
  const bool numbers = a.isNumber() && b.isNumber();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.asInt(), b.asInt(), &r))
        throw Error("integer overflow");
      return Value::integer(r);
    }
    if (numbers)
      return Value::real(a.asFloat() + b.asFloat());
    if (a.isString() && b.isString()) {
      // markupsafe.Markup escapes the plain str it is added to.
      const bool markup = a.markup() || b.markup();
      if (!markup) {
        in.checkString(a.str().size() + b.str().size());
        return Value::string(a.str() + b.str());
      }
      std::string s = !a.markup() ? escapeHtml(a.str()) : a.str();
      const std::string right = !b.markup() ? escapeHtml(b.str()) : b.str();
      in.checkString(s.size() + right.size());
      s += right;
      return Value::string(std::move(s), markup);
    }
    if (a.kind() == Kind::Seq && b.kind() == Kind::Seq &&
        a.seqType() == b.seqType() &&
        (a.seqType() == SeqType::List || a.seqType() == SeqType::Tuple)) {
      in.checkItems(a.items().size() + b.items().size());
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::seq(std::move(items), a.seqType());
    }
    if (a.isString() ||
        (a.kind() == Kind::Seq &&
         (a.seqType() == SeqType::List || a.seqType() == SeqType::Tuple)))
      throw Error("can only concatenate " + typeName(a) + " (not \"" +
                  typeName(b) + "\") to " + typeName(a));
    throw unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.asInt(), b.asInt(), &r))
        throw Error("integer overflow");
      return Value::integer(r);
    }
    if (numbers)
      return Value::real(a.asFloat() - b.asFloat());
    throw unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.asInt(), b.asInt(), &r))
        throw Error("integer overflow");
      return Value::integer(r);
    }
    if (numbers)
      return Value::real(a.asFloat() * b.asFloat());
    // Repetition: str * int, int * str, list * int, ...
    const Value *seq = &a, *count = &b;
    if (a.kind() == Kind::Int || a.kind() == Kind::Bool)
      std::swap(seq, count);
    if (count->kind() == Kind::Int || count->kind() == Kind::Bool) {
      const int64_t n = std::max<int64_t>(count->asInt(), 0);
      if (seq->isString()) {
        if (n > 0 && seq->str().size() > 0)
          in.checkString(seq->str().size() *
                         static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
        std::string s;
        for (int64_t i = 0; i < n && !seq->str().empty(); ++i)
          s += seq->str();
        return Value::string(std::move(s), seq->markup());
      }
      if (seq->kind() == Kind::Seq && (seq->seqType() == SeqType::List ||
                                       seq->seqType() == SeqType::Tuple)) {
        if (n > 0 && !seq->items().empty())
          in.checkItems(seq->items().size() *
                        static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
        std::vector<Value> items;
        for (int64_t i = 0; i < n && !seq->items().empty(); ++i)
          items.insert(items.end(), seq->items().begin(), seq->items().end());
        return Value::seq(std::move(items), seq->seqType());
      }
    }
    throw Error("can't multiply sequence by non-int of type '" +
                typeName(*count) + "'");
  }
  if (!numbers) {
    if (op == "%" && a.isString())
      throw Error("printf-style string formatting ('...' % values) is not "
                  "supported: use ~ or str.format()");
    throw unsupported();
  }
  if (op == "/") {
    if (b.asFloat() == 0.0)
      throw Error("division by zero");
    return Value::real(a.asFloat() / b.asFloat());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      const int64_t x = a.asInt(), y = b.asInt();
      if (y == 0)
        throw Error("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1)
        throw Error("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (b.asFloat() == 0.0)
      throw Error(op == "//" ? "float floor division by zero" : "float modulo");
    double div, mod;
    floatDivmod(a.asFloat(), b.asFloat(), div, mod);
    return Value::real(op == "//" ? div : mod);
  }
  if (op == "**") {
    if (ints && b.asInt() >= 0) {
      int64_t r = 1, base = a.asInt();
      for (int64_t e = b.asInt(); e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r))
          throw Error("integer overflow");
        if (e > 1 && __builtin_mul_overflow(base, base, &base))
          throw Error("integer overflow");
      }
      return Value::integer(r);
    }
    const double x = a.asFloat(), y = b.asFloat();
    if (x == 0.0 && y < 0)
      throw Error("0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y))
      throw Error("a negative number to a fractional power is complex: not "
                  "supported");
    return Value::real(std::pow(x, y));
  }
  throw Error("unknown operator " + std::string(op));
}

bool contains(const Value &container, const Value &item) {
  switch (container.kind()) {
  case Kind::Undefined:
    return false;
  case Kind::String:
    if (!item.isString())
      throw Error("'in <string>' requires string as left operand, not " +
                  typeName(item));
    chargeBytes(container.str().size());
    return container.str().find(item.str()) != std::string::npos;
  case Kind::Seq:
    return std::any_of(container.items().begin(), container.items().end(),
                       [&](const Value &x) { return equals(x, item); });
  case Kind::Dict:
    return container.dictData().find(item) != nullptr;
  default:
    throw Error("argument of type '" + typeName(container) +
                "' is not iterable");
  }
}

Value sliceValue(const Value &obj, const Value &start, const Value &stop,
                 const Value &step) {
  auto index = [](const Value &v) -> std::optional<int64_t> {
    if (v.isNone())
      return std::nullopt;
    if (v.kind() != Kind::Int && v.kind() != Kind::Bool)
      throw Error("slice indices must be integers or None or have an "
                  "__index__ method");
    return v.asInt();
  };
  const std::optional<int64_t> b = index(start), e = index(stop),
                               s = index(step);
  const int64_t st = s.value_or(1);
  if (st == 0)
    throw Error("slice step cannot be zero");
  if (obj.isString())
    return Value::string(encodeUtf8(sliceOf(decodeUtf8(obj.str()), b, e, st)));
  if (obj.kind() == Kind::Seq && obj.seqType() == SeqType::Range) {
    // A slice of a range is a range.
    const int64_t *r = obj.seqData().range;
    int64_t bi, ei;
    adjustSlice(static_cast<int64_t>(obj.items().size()), b, e, st, bi, ei);
    return Value::range(r[0] + bi * r[2], r[0] + ei * r[2], r[2] * st);
  }
  if (obj.kind() == Kind::Seq &&
      (obj.seqType() == SeqType::List || obj.seqType() == SeqType::Tuple))
    return Value::seq(sliceOf(obj.items(), b, e, st), obj.seqType());
  // jinja2 slices with Python's [] directly: no Undefined fallback.
  if (obj.kind() == Kind::Dict)
    throw Error("unhashable type: 'slice'");
  throw Error("'" + typeName(obj) + "' object is not subscriptable");
}

namespace {

/// dict(*args, **kwargs) for namespace() and dict().
DictData dictArgs(const Args &args, const char *what) {
  DictData d;
  if (args.pos.size() > 1)
    throw Error(std::string(what) + " expected at most 1 argument, got " +
                std::to_string(args.pos.size()));
  if (!args.pos.empty()) {
    const Value &a = args.pos[0];
    if (a.kind() == Kind::Dict) {
      d = a.dictData();
    } else {
      for (const Value &pair : iterate(a)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2)
          throw Error(std::string(what) +
                      ": dictionary update sequence element has length " +
                      std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto &[k, v] : args.kw)
    d.set(Value::string(k), v);
  return d;
}

Value unsupportedGlobal(const std::string &name) {
  return Value::callable(name, [name](Interp &, const Args &) -> Value {
    throw Error("unsupported function '" + name + "'");
  });
}

} // namespace

void addGlobals(Scope &scope) {
  scope.set(
      "range", Value::callable("range", [](Interp &in, const Args &args) {
        if (!args.kw.empty())
          throw Error("range() takes no keyword arguments");
        if (args.pos.empty() || args.pos.size() > 3)
          throw Error("range expected 1 to 3 arguments, got " +
                      std::to_string(args.pos.size()));
        int64_t start = 0, stop, step = 1;
        if (args.pos.size() == 1) {
          stop = toInt(args.pos[0]);
        } else {
          start = toInt(args.pos[0]);
          stop = toInt(args.pos[1]);
          if (args.pos.size() == 3)
            step = toInt(args.pos[2]);
        }
        if (step == 0)
          throw Error("range() arg 3 must not be zero");
        // jinja2's sandbox refuses ranges of more than MAX_RANGE items.
        const double n =
            std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                      static_cast<double>(step));
        if (n > 100000)
          throw Error("Range too big. The sandbox blocks ranges larger than "
                      "MAX_RANGE (100000).");
        (void)in; // Value::range charges the items
        return Value::range(start, stop, step);
      }));
  scope.set("dict", Value::callable("dict", [](Interp &, const Args &args) {
              return Value::dict(dictArgs(args, "dict"));
            }));
  scope.set("namespace",
            Value::callable("namespace", [](Interp &in, const Args &args) {
              // Apart from its control block: see CycleBreaker.
              std::shared_ptr<ObjectData> ns(new ObjectData);
              ns->type = "Namespace";
              ns->attrs = dictArgs(args, "namespace");
              in.track(ns);
              return Value::object(std::move(ns));
            }));
  scope.set("raise_exception",
            Value::callable(
                "raise_exception", [](Interp &, const Args &args) -> Value {
                  Bound b = bind(args, {"message"}, "raise_exception()");
                  Error e(b.has(0) ? toStr(*b.v[0]) : "");
                  e.raised = true;
                  throw e;
                }));
  scope.set("strftime_now",
            Value::callable("strftime_now", [](Interp &, const Args &args) {
              Bound b = bind(args, {"format"}, "strftime_now()");
              if (!b.has(0))
                throw Error("strftime_now() needs a format");
              const std::string &fmt = strArg(*b.v[0], "strftime_now() format");
              const std::time_t now = std::time(nullptr);
              std::tm local{};
              localtime_r(&now, &local);
              // Python formats in the C locale (it never sets LC_TIME):
              // English names whatever the host's locale.
              static const locale_t cLocale =
                  newlocale(LC_ALL_MASK, "C", static_cast<locale_t>(nullptr));
              // A non-empty suffix tells an empty result from a too small
              // buffer.
              const std::string f = fmt + "\x01";
              for (size_t cap = 128; cap <= (size_t{1} << 20); cap *= 4) {
                std::string buf(cap, '\0');
                const size_t n =
                    cLocale ? strftime_l(buf.data(), cap, f.c_str(), &local,
                                         cLocale)
                            : std::strftime(buf.data(), cap, f.c_str(), &local);
                if (n > 0) {
                  buf.resize(n - 1);
                  return Value::string(std::move(buf));
                }
              }
              throw Error("strftime_now(): the formatted time is too long");
            }));
  for (const char *name : {"lipsum", "cycler", "joiner"})
    scope.set(name, unsupportedGlobal(name));
}

} // namespace nf::jinja
