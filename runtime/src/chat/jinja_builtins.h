// Private to the builtins of the Jinja renderer (jinja_filters.cpp,
// jinja_tests_globals.cpp, jinja_methods.cpp, jinja_operators.cpp): Python's
// binding of call arguments, and the Python str and number operations that
// more than one of them uses.
#pragma once

#include "chat/jinja_interp.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf::jinja {

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

inline Bound bind(const Args &a, std::initializer_list<std::string_view> names,
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

inline int64_t toInt(const Value &v) {
  if (v.kind() == Kind::Int || v.kind() == Kind::Bool)
    return v.asInt();
  if (v.isUndefined())
    failUndefined(v);
  throw Error("'" + typeName(v) +
              "' object cannot be interpreted as an "
              "integer");
}

inline const std::string &strArg(const Value &v, const std::string &what) {
  if (!v.isString()) {
    if (v.isUndefined())
      failUndefined(v);
    throw Error(what + " must be str, not " + typeName(v));
  }
  return v.str();
}

inline Value str(std::string s) { return Value::string(std::move(s)); }
inline Value generator(std::vector<Value> items) {
  return Value::seq(std::move(items), SeqType::Generator);
}

// ---------------------------------------------------------------------------
// Python's str (jinja_methods.cpp)

/// markupsafe's escape(): & < > ' " as HTML character references.
std::string escapeHtml(const std::string &s);
/// Appends `c` upper-cased (ß as "SS").
void appendUpper(std::string &out, char32_t c);
/// str.title() and str.capitalize().
std::string pyTitle(const std::string &s);
std::string pyCapitalize(const std::string &s);
/// str.strip() (`left` and `right`), lstrip() or rstrip() of `chars` (null
/// or None: whitespace); `what` names the method in errors.
std::string pyStrip(const std::string &s, const Value *chars, bool left,
                    bool right, const std::string &what);
/// str.split() or rsplit() (`fromRight`) at `sep` (None: runs of
/// whitespace), at most `maxsplit` times (< 0: no limit).
std::vector<Value> pySplit(const std::string &s, const Value &sep,
                           int64_t maxsplit, bool fromRight);
/// str.splitlines().
std::vector<std::string> pySplitlines(const std::string &s, bool keepends);
/// str.replace(): the first `count` occurrences (< 0: all).
std::string pyReplace(Interp &in, const std::string &s, const std::string &old,
                      const std::string &with, int64_t count);
/// str.center() (mode 0), ljust() (< 0) or rjust() (> 0) to `width` code
/// points of `fill`.
std::string pyCenter(const std::string &s, int64_t width, char32_t fill,
                     int mode);
/// str.islower() / str.isupper() of toStr(v).
bool pyIsLower(const Value &v);
bool pyIsUpper(const Value &v);

// ---------------------------------------------------------------------------
// Python's numbers and slices (jinja_operators.cpp)

/// float() / int(text, base) of a str; nullopt where Python raises a
/// ValueError.
std::optional<double> parsePyFloat(const std::string &text);
std::optional<int64_t> parsePyInt(const std::string &text, int64_t base);
/// round(x, ndigits) of a float, and of an int with ndigits < 0.
double pyRound(double x, int64_t digits);
int64_t pyRoundInt(int64_t x, int64_t digits);
/// Python's slice clamping for a sequence of `len` items: [b, e) by `step`.
void adjustSlice(int64_t len, std::optional<int64_t> start,
                 std::optional<int64_t> stop, int64_t step, int64_t &b,
                 int64_t &e);

} // namespace nf::jinja
