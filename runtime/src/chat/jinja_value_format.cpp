// Python's text forms of the Jinja renderer's values (see jinja_value.h):
// str() and repr() (with Python's [...] / {...} for a container met
// inside itself), json.dumps for tojson, and floats written and read as
// Python writes and reads them. Strings grow under the render's limits as
// they are built.
#include "chat/jinja_value_impl.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <utility>
#include <vector>

namespace nf::jinja {

namespace {

/// The most bytes a string may have in the current render.
size_t stringCap() {
  const Budget *b = tBudget;
  return b ? b->limits().maxStringBytes : SIZE_MAX;
}

/// Errors once `out` has grown past the string limit (checked while
/// appending, so that nothing much larger is ever built).
inline void checkGrowth(const std::string &out) {
  if (out.size() > stringCap())
    tBudget->checkString(out.size()); // throws
}

/// Python's repr() quoting of a string.
void appendStrRepr(std::string &out, const std::string &s) {
  const bool hasSingle = s.find('\'') != std::string::npos;
  const bool hasDouble = s.find('"') != std::string::npos;
  const char quote = hasSingle && !hasDouble ? '"' : '\'';
  out += quote;
  char buf[16];
  for (char32_t c : decodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0) || c == 0xad) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if ((c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
               (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff ||
               c == 0x1680 || (c >= 0xd800 && c <= 0xdfff) ||
               (c >= 0xe000 && c <= 0xf8ff)) {
      // Separators, format characters, surrogates and private use: not
      // printable for Python's repr.
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      appendUtf8(out, c);
    }
    checkGrowth(out);
  }
  out += quote;
}

/// repr() of nested values, as Python writes it: a list, dict or namespace
/// met again inside itself (only a namespace can make such a cycle) is
/// written as Python's Py_ReprEnter does, [...] or {...}.
class Repr {
public:
  explicit Repr(std::string &out) : out_(out) {}

  void value(const Value &v) {
    switch (v.kind()) {
    case Kind::Undefined:
      out_ += "Undefined";
      return;
    case Kind::String:
      if (v.markup()) {
        out_ += "Markup(";
        appendStrRepr(out_, v.str());
        out_ += ")";
      } else {
        appendStrRepr(out_, v.str());
      }
      return;
    case Kind::Seq:
      seq(v);
      return;
    case Kind::Dict:
      dict(v.dictData());
      return;
    case Kind::Object:
      object(v);
      return;
    default:
      out_ += toStr(v);
      checkGrowth(out_);
    }
  }

  void object(const Value &v) {
    const ObjectData &o = v.objectData();
    if (o.type == "LoopContext") {
      const Value *index = o.attrs.find(Value::string("index"));
      const Value *len = o.attrs.find(Value::string("length"));
      out_ += "<LoopContext " + (index ? toStr(*index) : "?") + "/" +
              (len ? toStr(*len) : "?") + ">";
      return;
    }
    // jinja2's Namespace.__repr__: f"<Namespace {self.__attrs!r}>".
    out_ += "<" + o.type + " ";
    ++objects_;
    dict(o.attrs);
    --objects_;
    out_ += ">";
  }

private:
  /// Enters a container; false (and its [...] / {...} written) when it is
  /// already being written.
  bool enter(const void *id, const char *recurring) {
    // A container can only recur inside itself through a namespace (lists
    // and dicts do not change): with none open, no search.
    if (objects_ > 0 &&
        std::find(open_.begin(), open_.end(), id) != open_.end()) {
      out_ += recurring;
      return false;
    }
    open_.push_back(id);
    return true;
  }

  void items(const std::vector<Value> &items) {
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out_ += ", ";
      value(items[i]);
      checkGrowth(out_);
    }
  }

  void seq(const Value &v) {
    const SeqData &s = v.seqData();
    if (s.type == SeqType::Generator || s.type == SeqType::ReverseIterator)
      throw Error("cannot print a " + typeName(v) +
                  " (Python prints its address): convert it with |list");
    if (s.type == SeqType::Range) {
      out_ += "range(" + std::to_string(s.range[0]) + ", " +
              std::to_string(s.range[1]);
      if (s.range[2] != 1)
        out_ += ", " + std::to_string(s.range[2]);
      out_ += ')';
      return;
    }
    ValueDepth depth("repr");
    const bool view = s.type == SeqType::DictKeys ||
                      s.type == SeqType::DictValues ||
                      s.type == SeqType::DictItems;
    if (view)
      out_ += typeName(v) + "(";
    if (!enter(&s, s.type == SeqType::Tuple ? "(...)" : "[...]")) {
      if (view)
        out_ += ")";
      return;
    }
    const bool tuple = s.type == SeqType::Tuple;
    out_ += tuple ? '(' : '[';
    items(s.items);
    out_ += tuple ? (s.items.size() == 1 ? ",)" : ")") : "]";
    if (view)
      out_ += ")";
    open_.pop_back();
  }

  void dict(const DictData &d) {
    ValueDepth depth("repr");
    if (!enter(&d, "{...}"))
      return;
    out_ += '{';
    for (size_t i = 0; i < d.items.size(); ++i) {
      if (i)
        out_ += ", ";
      value(d.items[i].first);
      out_ += ": ";
      value(d.items[i].second);
      checkGrowth(out_);
    }
    out_ += '}';
    open_.pop_back();
  }

  std::string &out_;
  std::vector<const void *> open_; // the containers being written
  int objects_ = 0;                // namespaces among them
};

// Python json.dumps's string escaping.
void appendJsonString(std::string &out, const std::string &s,
                      bool ensureAscii) {
  out += '"';
  char buf[16];
  for (char32_t c : decodeUtf8(s)) {
    switch (c) {
    case '"':
      out += "\\\"";
      continue;
    case '\\':
      out += "\\\\";
      continue;
    case '\n':
      out += "\\n";
      continue;
    case '\r':
      out += "\\r";
      continue;
    case '\t':
      out += "\\t";
      continue;
    case '\b':
      out += "\\b";
      continue;
    case '\f':
      out += "\\f";
      continue;
    default:
      break;
    }
    if (c < 0x20 || (ensureAscii && c >= 0x7f)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x",
                      static_cast<unsigned>(0xd800 + (v >> 10)),
                      static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      appendUtf8(out, c);
    }
    checkGrowth(out);
  }
  out += '"';
}

std::string jsonFloat(double d) {
  if (std::isnan(d))
    return "NaN";
  if (std::isinf(d))
    return d > 0 ? "Infinity" : "-Infinity";
  return floatRepr(d);
}

/// A dict key as json.dumps converts it (str, int, float, bool, None).
std::string jsonKey(const Value &k) {
  switch (k.kind()) {
  case Kind::String:
    return k.str();
  case Kind::Bool:
    return k.asBool() ? "true" : "false";
  case Kind::Int:
    return std::to_string(k.asInt());
  case Kind::Float:
    return jsonFloat(k.asFloat());
  case Kind::None:
    return "null";
  default:
    throw Error("keys must be str, int, float, bool or None, not " +
                typeName(k));
  }
}

void appendJson(std::string &out, const Value &v, const JsonOptions &o,
                int depth) {
  const std::string itemSep =
      o.separators ? o.separators->first : (o.indent ? "," : ", ");
  const std::string keySep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int level) {
    if (!o.indent)
      return;
    // The size first: deep values with a wide indent grow quadratically.
    const size_t more = 1 + static_cast<size_t>(level) * o.indent->size();
    if (out.size() + more > stringCap())
      tBudget->checkString(out.size() + more); // throws
    out += '\n';
    for (int i = 0; i < level; ++i)
      out += *o.indent;
  };
  switch (v.kind()) {
  case Kind::None:
    out += "null";
    return;
  case Kind::Bool:
    out += v.asBool() ? "true" : "false";
    return;
  case Kind::Int:
    out += std::to_string(v.asInt());
    return;
  case Kind::Float:
    out += jsonFloat(v.asFloat());
    return;
  case Kind::String:
    appendJsonString(out, v.str(), o.ensureAscii);
    return;
  case Kind::Seq:
    if (v.seqType() == SeqType::List || v.seqType() == SeqType::Tuple) {
      const auto &items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      ValueDepth guard("tojson");
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i)
          out += itemSep;
        newline(depth + 1);
        appendJson(out, items[i], o, depth + 1);
        checkGrowth(out);
      }
      newline(depth);
      out += ']';
      return;
    }
    break;
  case Kind::Dict: {
    const auto &items = v.dictData().items;
    if (items.empty()) {
      out += "{}";
      return;
    }
    ValueDepth guard("tojson");
    std::vector<std::pair<std::string, const Value *>> entries;
    for (const auto &[k, val] : items)
      entries.emplace_back(jsonKey(k), &val);
    if (o.sortKeys) {
      for (const auto &[k, val] : items)
        if (!k.isString())
          throw Error("tojson: sort_keys needs string keys, not " +
                      typeName(k));
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto &a, const auto &b) {
                         chargeSteps(1);
                         return a.first < b.first;
                       });
    }
    out += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i)
        out += itemSep;
      newline(depth + 1);
      appendJsonString(out, entries[i].first, o.ensureAscii);
      out += keySep;
      appendJson(out, *entries[i].second, o, depth + 1);
      checkGrowth(out);
    }
    newline(depth);
    out += '}';
    return;
  }
  default:
    break;
  }
  throw Error("Object of type " + typeName(v) + " is not JSON serializable");
}

} // namespace

// ---------------------------------------------------------------------------
// Python semantics: str(), repr(), floats, json.dumps

std::string toStr(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
    return "";
  case Kind::None:
    return "None";
  case Kind::Bool:
    return v.asBool() ? "True" : "False";
  case Kind::Int:
    return std::to_string(v.asInt());
  case Kind::Float:
    return floatRepr(v.asFloat());
  case Kind::String:
    return v.str();
  case Kind::Callable:
    if (v.callableData().macro)
      return "<Macro '" + v.callableData().name + "'>";
    throw Error("cannot print the function '" + v.callableData().name +
                "' (Python prints its address): call it");
  case Kind::Object: {
    std::string out;
    Repr(out).object(v);
    chargeBytes(out.size());
    return out;
  }
  default:
    return repr(v);
  }
}

std::string repr(const Value &v) {
  std::string out;
  Repr(out).value(v);
  chargeBytes(out.size());
  return out;
}

std::string floatRepr(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d > 0 ? "inf" : "-inf";
  if (d == 0)
    return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: positional when the
  // decimal exponent is in [-4, 16), else d.ddde+XX.
  char buf[64];
  auto res =
      std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool negative = sci[0] == '-';
  if (negative)
    sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1)
      out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+',
                  std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0)
    return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') +
           digits;
  const size_t intDigits = static_cast<size_t>(exp) + 1;
  if (digits.size() <= intDigits)
    return out + digits + std::string(intDigits - digits.size(), '0') + ".0";
  return out + digits.substr(0, intDigits) + "." + digits.substr(intDigits);
}

double parseDouble(std::string_view text) {
  double d = 0;
  const char *begin = text.data(), *end = begin + text.size();
  const auto [ptr, ec] =
      std::from_chars(begin, end, d, std::chars_format::general);
  if (ec != std::errc::result_out_of_range)
    return d;
  // Out of range: inf or 0 by the decimal exponent of the first non-zero
  // digit (only the far ends of the exponent range get here).
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  i += negative;
  auto digit = [&](size_t k) {
    return k < text.size() && text[k] >= '0' && text[k] <= '9';
  };
  int64_t intDigits = 0, leadingZeros = 0;
  bool nonZero = false;
  for (; digit(i); ++i)
    if (nonZero || text[i] != '0') {
      nonZero = true;
      ++intDigits;
    }
  if (i < text.size() && text[i] == '.')
    for (++i; digit(i); ++i)
      if (!nonZero) {
        if (text[i] == '0')
          ++leadingZeros;
        else
          nonZero = true;
      }
  int64_t exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    const bool negExp = i < text.size() && text[i] == '-';
    if (i < text.size() && (text[i] == '-' || text[i] == '+'))
      ++i;
    for (; digit(i); ++i)
      exponent = std::min<int64_t>(exponent * 10 + (text[i] - '0'), 1 << 30);
    if (negExp)
      exponent = -exponent;
  }
  const int64_t magnitude =
      (intDigits > 0 ? intDigits : -leadingZeros) + exponent;
  const double r = magnitude > 0 ? HUGE_VAL : 0.0;
  return negative ? -r : r;
}

std::string toJson(const Value &v, const JsonOptions &options) {
  std::string out;
  appendJson(out, v, options, 0);
  chargeBytes(out.size());
  return out;
}

} // namespace nf::jinja
