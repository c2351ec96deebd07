// jinja2's filters (|trim, |map, |tojson, ...): those nf has, and the
// error for those it lacks. Each follows the jinja2 3.1 filter of the same
// name, including its quirks (|map and |select are lazy generators, |int of
// "4.2" is 4, |title splits words at - and brackets, ...).
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <system_error>
#include <unordered_map>

namespace nf::jinja {

namespace {

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

} // namespace

FilterFn findFilter(std::string_view name) {
  auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

std::string missingFilter(std::string_view name) {
  for (std::string_view f : kUnsupportedFilters)
    if (f == name)
      return "unsupported filter '" + std::string(name) + "'";
  return "no filter named '" + std::string(name) + "'";
}

} // namespace nf::jinja
