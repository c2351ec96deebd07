// Python's str operations (strip, split, replace, title, ...) that filters
// and methods share, and the Python methods of str, list and dict values
// that jinja2's immutable sandbox lets templates call (pythonAttribute).
// Each follows the Python 3 method of the same name (str.isdigit / isalpha /
// isalnum: ASCII only).
#include "chat/jinja_builtins.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <system_error>

namespace nf::jinja {

namespace {

bool isCased(char32_t c) {
  return toUpper(c) != c || toLower(c) != c || c == 0xdf;
}
bool isLowerChar(char32_t c) { return toUpper(c) != c || c == 0xdf; }
bool isUpperChar(char32_t c) { return toLower(c) != c; }

std::u32string stripSet(const Value *chars, const std::string &what,
                        bool &whitespace) {
  whitespace = !chars || chars->isNone();
  if (whitespace)
    return {};
  if (!chars->isString())
    throw Error(what + " arg must be None or str");
  return decodeUtf8(chars->str());
}

/// Appends a part of a split, within the item limit.
void addPart(std::vector<std::string> &parts, std::string part) {
  checkItemCount(parts.size() + 1);
  parts.push_back(std::move(part));
}

bool isLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c ||
         c == 0x1d || c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
}

} // namespace

// ---------------------------------------------------------------------------
// Text

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

bool pyIsLower(const Value &v) {
  bool cased = false;
  for (char32_t c : decodeUtf8(toStr(v))) {
    if (isUpperChar(c))
      return false;
    cased = cased || isLowerChar(c);
  }
  return cased;
}

bool pyIsUpper(const Value &v) {
  bool cased = false;
  for (char32_t c : decodeUtf8(toStr(v))) {
    if (isLowerChar(c))
      return false;
    cased = cased || isUpperChar(c);
  }
  return cased;
}

// ---------------------------------------------------------------------------
// Python methods

namespace {

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
  if (name == "islower" || name == "isupper")
    return Value::boolean(name == "islower" ? pyIsLower(str(self))
                                            : pyIsUpper(str(self)));
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

} // namespace nf::jinja
