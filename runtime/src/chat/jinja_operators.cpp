// Python's numbers and operators as templates use them: float() and int()
// of a str, round(), the arithmetic operators (binaryOp), `in` (contains)
// and slicing (sliceValue).
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

namespace nf::jinja {

namespace {

bool isAsciiDigit(char c) { return c >= '0' && c <= '9'; }

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

} // namespace

// ---------------------------------------------------------------------------
// Numbers

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

// ---------------------------------------------------------------------------
// Operators

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

// ---------------------------------------------------------------------------
// Slices

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

} // namespace nf::jinja
