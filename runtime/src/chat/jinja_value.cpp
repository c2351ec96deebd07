// Values of the Jinja renderer: Python semantics (see jinja_value.h).
#include "chat/jinja_value.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace nf::jinja {

// ---------------------------------------------------------------------------
// Budgets

namespace {
thread_local Budget *tBudget = nullptr;
} // namespace

Budget *currentBudget() { return tBudget; }

BudgetScope::BudgetScope(Budget &budget) : previous_(tBudget) {
  tBudget = &budget;
}
BudgetScope::~BudgetScope() { tBudget = previous_; }

void Budget::failString() const {
  throw Error("the template makes a string longer than " +
              std::to_string(limits_.maxStringBytes) + " bytes");
}

void Budget::failItems() const {
  throw Error("the template makes a sequence of more than " +
              std::to_string(limits_.maxItems) + " items");
}

void Budget::failSteps() const {
  throw Error("the template does too much work: more than " +
              std::to_string(limits_.maxSteps) +
              " steps (a loop iteration, filter step, comparison or string "
              "made is a step, an item made " +
              std::to_string(kStepsPerItem) + ", and " +
              std::to_string(kBytesPerStep) +
              " bytes of text made or scanned one)");
}

namespace {

const std::string kEmpty;

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

// The walkers of nested values (repr, tojson, ==, <) stop at
// kMaxValueDepth levels instead of overflowing the stack.
thread_local int tValueDepth = 0;

class ValueDepth {
public:
  explicit ValueDepth(const char *what) {
    if (++tValueDepth > kMaxValueDepth) {
      --tValueDepth;
      throw Error(std::string(what) +
                  ": the value is nested too deeply (more than " +
                  std::to_string(kMaxValueDepth) + " levels)");
    }
  }
  ~ValueDepth() { --tValueDepth; }
  ValueDepth(const ValueDepth &) = delete;
  ValueDepth &operator=(const ValueDepth &) = delete;
};

// Freeing values without recursion: the values a list, dict or namespace
// held are destroyed one at a time by the outermost payload destructor of
// the thread (values nested a million deep would otherwise take a million
// nested destructor calls); the inner ones only hand theirs over.
struct Reaper {
  std::vector<Value> pending;
  bool active = false;
};
thread_local Reaper tReaper;

/// Takes the values of `v` that may free other values; true when taken.
bool defer(Reaper &r, Value &v) noexcept {
  if (!v.ownsValues())
    return false;
  try {
    r.pending.push_back(std::move(v));
    return true;
  } catch (...) {
    return false; // out of memory: freed in place (recursively) instead
  }
}

template <typename Hand> void disposeValues(Hand handOver) noexcept {
  Reaper &r = tReaper;
  if (r.active) {
    handOver(r);
    return;
  }
  r.active = true;
  handOver(r);
  while (!r.pending.empty()) {
    Value v = std::move(r.pending.back());
    r.pending.pop_back();
  } // v's payload, destroyed here, hands its own values over
  if (r.pending.capacity() > 4096)
    std::vector<Value>().swap(r.pending);
  r.active = false;
}

std::shared_ptr<void> strPayload(std::string s) {
  return std::make_shared<std::string>(std::move(s));
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

bool seqEquals(const std::vector<Value> &a, const std::vector<Value> &b) {
  if (a.size() != b.size())
    return false;
  ValueDepth guard("==");
  for (size_t i = 0; i < a.size(); ++i)
    if (!equals(a[i], b[i]))
      return false;
  return true;
}

} // namespace

// ---------------------------------------------------------------------------
// Value

SeqData::~SeqData() {
  disposeValues([this](Reaper &r) {
    for (Value &v : items)
      defer(r, v);
  });
}

DictData::~DictData() {
  disposeValues([this](Reaper &r) {
    for (auto &[k, v] : items) {
      defer(r, k);
      defer(r, v);
    }
  });
}

const Value *DictData::find(const Value &key) const {
  for (const auto &[k, v] : items)
    if (equals(k, key))
      return &v;
  return nullptr;
}

void DictData::set(const Value &key, Value value) {
  for (auto &[k, v] : items)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string hint) {
  Value v;
  v.ptr_ = strPayload(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}

Value Value::real(double d) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = d;
  return v;
}

Value Value::string(std::string s, bool markup) {
  if (Budget *b = tBudget) {
    b->checkString(s.size());
    b->bytes(s.size() + kBytesPerStep); // the text, and a step to hold it
  }
  Value v;
  v.kind_ = Kind::String;
  v.b_ = markup;
  v.ptr_ = strPayload(std::move(s));
  return v;
}

Value Value::seq(std::vector<Value> items, SeqType type) {
  if (Budget *b = tBudget) {
    b->checkItems(items.size());
    b->steps(static_cast<int64_t>(items.size()) * kStepsPerItem);
  }
  auto d = std::make_shared<SeqData>();
  d->type = type;
  d->items = std::move(items);
  Value v;
  v.kind_ = Kind::Seq;
  v.ptr_ = std::move(d);
  return v;
}

Value Value::range(int64_t start, int64_t stop, int64_t step) {
  auto d = std::make_shared<SeqData>();
  d->type = SeqType::Range;
  d->range[0] = start;
  d->range[1] = stop;
  d->range[2] = step;
  // The item count without overflow (range() bounds it).
  const __int128 span = static_cast<__int128>(stop) - start;
  const __int128 n = step > 0 ? (span > 0 ? (span + step - 1) / step : 0)
                              : (span < 0 ? (-span - step - 1) / -step : 0);
  if (Budget *b = tBudget) {
    b->checkItems(n > static_cast<__int128>(SIZE_MAX) ? SIZE_MAX
                                                      : static_cast<size_t>(n));
    b->steps(static_cast<int64_t>(n) * kStepsPerItem);
  }
  d->items.reserve(static_cast<size_t>(n));
  for (__int128 i = 0; i < n; ++i)
    d->items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  Value v;
  v.kind_ = Kind::Seq;
  v.ptr_ = std::move(d);
  return v;
}

Value Value::dict(DictData d) {
  if (Budget *b = tBudget) {
    b->checkItems(d.items.size());
    b->steps(static_cast<int64_t>(d.items.size()) * kStepsPerItem);
  }
  Value v;
  v.kind_ = Kind::Dict;
  v.ptr_ = std::make_shared<DictData>(std::move(d));
  return v;
}

Value Value::callable(std::string name, Function fn, bool macro) {
  chargeSteps(kStepsPerItem);
  auto d = std::make_shared<CallableData>();
  d->name = std::move(name);
  d->fn = std::move(fn);
  d->macro = macro;
  Value v;
  v.kind_ = Kind::Callable;
  v.ptr_ = std::move(d);
  return v;
}

Value Value::object(std::shared_ptr<ObjectData> o) {
  chargeSteps(kStepsPerItem *
              (1 + static_cast<int64_t>(o->attrs.items.size())));
  Value v;
  v.kind_ = Kind::Object;
  v.ptr_ = std::move(o);
  return v;
}

const std::string &Value::str() const {
  if ((kind_ == Kind::String || kind_ == Kind::Undefined) && ptr_)
    return *static_cast<const std::string *>(ptr_.get());
  return kEmpty;
}

const SeqData &Value::seqData() const {
  return *static_cast<const SeqData *>(ptr_.get());
}
const DictData &Value::dictData() const {
  return *static_cast<const DictData *>(ptr_.get());
}
const CallableData &Value::callableData() const {
  return *static_cast<const CallableData *>(ptr_.get());
}
ObjectData &Value::objectData() const {
  return *static_cast<ObjectData *>(ptr_.get());
}

// ---------------------------------------------------------------------------
// Python semantics

std::string typeName(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
    return "Undefined";
  case Kind::None:
    return "NoneType";
  case Kind::Bool:
    return "bool";
  case Kind::Int:
    return "int";
  case Kind::Float:
    return "float";
  case Kind::String:
    return v.markup() ? "Markup" : "str";
  case Kind::Seq:
    switch (v.seqType()) {
    case SeqType::List:
      return "list";
    case SeqType::Tuple:
      return "tuple";
    case SeqType::Range:
      return "range";
    case SeqType::Generator:
      return "generator";
    case SeqType::ReverseIterator:
      return "list_reverseiterator";
    case SeqType::DictKeys:
      return "dict_keys";
    case SeqType::DictValues:
      return "dict_values";
    case SeqType::DictItems:
      return "dict_items";
    }
    break;
  case Kind::Dict:
    return "dict";
  case Kind::Callable:
    return v.callableData().macro ? "Macro" : "function";
  case Kind::Object:
    return v.objectData().type;
  }
  return "object";
}

std::string objectTypeRepr(const Value &v) {
  switch (v.kind()) {
  case Kind::None:
    return "None";
  case Kind::Undefined:
    return "jinja2.runtime.Undefined object";
  case Kind::Callable:
    if (v.callableData().macro)
      return "jinja2.runtime.Macro object";
    break;
  case Kind::Object:
    return (v.objectData().type == "Namespace" ? "jinja2.utils."
                                               : "jinja2.runtime.") +
           v.objectData().type + " object";
  case Kind::String:
    if (v.markup())
      return "markupsafe.Markup object";
    break;
  default:
    break;
  }
  return typeName(v) + " object";
}

void failUndefined(const Value &v) {
  throw Error(v.undefinedHint().empty() ? "undefined value"
                                        : v.undefinedHint());
}

bool truthy(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
  case Kind::None:
    return false;
  case Kind::Bool:
    return v.asBool();
  case Kind::Int:
    return v.asInt() != 0;
  case Kind::Float:
    return v.asFloat() != 0.0;
  case Kind::String:
    return !v.str().empty();
  case Kind::Seq:
    if (v.seqType() == SeqType::Generator ||
        v.seqType() == SeqType::ReverseIterator)
      return true; // Python objects without __len__ or __bool__
    return !v.items().empty();
  case Kind::Dict:
    return !v.dictData().items.empty();
  default:
    return true;
  }
}

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

bool equals(const Value &a, const Value &b) {
  chargeSteps(1);
  if (a.isNumber() && b.isNumber()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float)
      return a.asFloat() == b.asFloat();
    return a.asInt() == b.asInt();
  }
  if (a.kind() != b.kind())
    return false;
  switch (a.kind()) {
  case Kind::Undefined:
  case Kind::None:
    return true;
  case Kind::String:
    if (a.str().size() != b.str().size())
      return false;
    chargeBytes(a.str().size());
    return a.str() == b.str();
  case Kind::Seq: {
    const SeqType ta = a.seqType(), tb = b.seqType();
    if (ta == SeqType::DictKeys && tb == SeqType::DictKeys) {
      if (a.items().size() != b.items().size())
        return false;
      ValueDepth guard("==");
      for (const Value &k : a.items())
        if (std::none_of(b.items().begin(), b.items().end(),
                         [&](const Value &x) { return equals(k, x); }))
          return false;
      return true;
    }
    if (ta != tb || ta == SeqType::Generator ||
        ta == SeqType::ReverseIterator || ta == SeqType::DictValues ||
        ta == SeqType::DictItems)
      return ta == tb && a.identity() == b.identity();
    return seqEquals(a.items(), b.items());
  }
  case Kind::Dict: {
    const DictData &da = a.dictData(), &db = b.dictData();
    if (da.items.size() != db.items.size())
      return false;
    ValueDepth guard("==");
    for (const auto &[k, v] : da.items) {
      const Value *other = db.find(k);
      if (!other || !equals(v, *other))
        return false;
    }
    return true;
  }
  default:
    return a.identity() == b.identity();
  }
}

bool lessCompare(const Value &a, const Value &b, std::string_view op) {
  auto apply = [&](auto x, auto y) {
    if (op == "<")
      return x < y;
    if (op == "<=")
      return x <= y;
    if (op == ">")
      return x > y;
    return x >= y;
  };
  if (a.isUndefined())
    failUndefined(a);
  if (b.isUndefined())
    failUndefined(b);
  chargeSteps(1);
  if (a.isNumber() && b.isNumber()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float)
      return apply(a.asFloat(), b.asFloat());
    return apply(a.asInt(), b.asInt());
  }
  if (a.isString() && b.isString()) {
    chargeBytes(std::min(a.str().size(), b.str().size()));
    return apply(a.str().compare(b.str()), 0);
  }
  if (a.kind() == Kind::Seq && b.kind() == Kind::Seq &&
      a.seqType() == b.seqType() &&
      (a.seqType() == SeqType::List || a.seqType() == SeqType::Tuple)) {
    ValueDepth guard("comparison");
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i]))
        return lessCompare(x[i], y[i], op);
    return apply(x.size(), y.size());
  }
  throw Error("'" + std::string(op) + "' not supported between instances of '" +
              typeName(a) + "' and '" + typeName(b) + "'");
}

int64_t length(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
    return 0;
  case Kind::String:
    return static_cast<int64_t>(codePoints(v.str()));
  case Kind::Seq:
    if (v.seqType() != SeqType::Generator &&
        v.seqType() != SeqType::ReverseIterator)
      return static_cast<int64_t>(v.items().size());
    break;
  case Kind::Dict:
    return static_cast<int64_t>(v.dictData().items.size());
  case Kind::Object:
    if (const Value *n = v.objectData().attrs.find(Value::string("length"));
        n && v.objectData().type == "LoopContext")
      return n->asInt();
    break;
  default:
    break;
  }
  throw Error("object of type '" + typeName(v) + "' has no len()");
}

std::vector<Value> iterate(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
    return {};
  case Kind::String: {
    // One string per character: counted before any is made.
    const size_t n = codePoints(v.str());
    checkItemCount(n);
    chargeSteps(static_cast<int64_t>(n) * kStepsPerItem);
    std::vector<Value> out;
    out.reserve(n);
    const std::string &s = v.str();
    for (size_t i = 0; i < s.size();) {
      size_t len = 1;
      while (i + len < s.size() &&
             (static_cast<unsigned char>(s[i + len]) & 0xc0) == 0x80)
        ++len;
      out.push_back(Value::string(s.substr(i, len)));
      i += len;
    }
    return out;
  }
  case Kind::Seq:
    chargeSteps(static_cast<int64_t>(v.items().size()));
    return v.items();
  case Kind::Dict: {
    chargeSteps(static_cast<int64_t>(v.dictData().items.size()));
    std::vector<Value> keys;
    keys.reserve(v.dictData().items.size());
    for (const auto &kv : v.dictData().items)
      keys.push_back(kv.first);
    return keys;
  }
  default:
    throw Error("'" + typeName(v) + "' object is not iterable");
  }
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

Value fromJson(const nlohmann::ordered_json &j, int maxDepth) {
  if (maxDepth < 0)
    throw Error("the value is nested too deeply");
  switch (j.type()) {
  case nlohmann::ordered_json::value_t::null:
    return Value::none();
  case nlohmann::ordered_json::value_t::boolean:
    return Value::boolean(j.get<bool>());
  case nlohmann::ordered_json::value_t::number_integer:
    return Value::integer(j.get<int64_t>());
  case nlohmann::ordered_json::value_t::number_unsigned: {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      throw Error("integer " + std::to_string(u) + " is out of range");
    return Value::integer(static_cast<int64_t>(u));
  }
  case nlohmann::ordered_json::value_t::number_float:
    return Value::real(j.get<double>());
  case nlohmann::ordered_json::value_t::string:
    return Value::string(j.get<std::string>());
  case nlohmann::ordered_json::value_t::array: {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto &e : j)
      items.push_back(fromJson(e, maxDepth - 1));
    return Value::seq(std::move(items));
  }
  case nlohmann::ordered_json::value_t::object: {
    DictData d;
    for (const auto &[k, e] : j.items())
      d.set(Value::string(k), fromJson(e, maxDepth - 1));
    return Value::dict(std::move(d));
  }
  default:
    throw Error("unsupported JSON value");
  }
}

// ---------------------------------------------------------------------------
// UTF-8

bool validUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size())
      return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static const char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}

std::u32string decodeUtf8(std::string_view s) {
  chargeBytes(s.size());
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 0 || i + n > s.size()) {
      out += U'\ufffd'; // not reached for validated text
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += cp;
    i += n;
  }
  return out;
}

std::string encodeUtf8(std::u32string_view s) {
  chargeBytes(s.size());
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s)
    appendUtf8(out, c);
  return out;
}

size_t codePoints(std::string_view s) {
  chargeBytes(s.size());
  size_t n = 0;
  for (char c : s)
    n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool isPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
         c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

namespace {

// Blocks where upper and lower case alternate code point by code point.
bool inPairs(char32_t c, char32_t lo, char32_t hi) {
  return c >= lo && c <= hi;
}

} // namespace

char32_t toUpper(char32_t c) {
  if (c < 0x80)
    return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c == 0xb5)
    return 0x39c;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7)
    return c - 32;
  if (c == 0xff)
    return 0x178;
  if (c == 0x131)
    return 'I';
  if (c == 0x17f)
    return 'S';
  if (inPairs(c, 0x100, 0x137) || inPairs(c, 0x14a, 0x177))
    return c & ~char32_t(1);
  if (inPairs(c, 0x139, 0x148) || inPairs(c, 0x179, 0x17e))
    return (c & 1) ? c : c - 1;
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2)
    return c - 32;
  if (c == 0x3c2)
    return 0x3a3;
  if (c == 0x3ac)
    return 0x386;
  if (c >= 0x3ad && c <= 0x3af)
    return c - 37;
  if (c == 0x3cc)
    return 0x38c;
  if (c == 0x3cd || c == 0x3ce)
    return c - 63;
  if (c >= 0x430 && c <= 0x44f)
    return c - 32;
  if (c >= 0x450 && c <= 0x45f)
    return c - 80;
  if (inPairs(c, 0x460, 0x481) || inPairs(c, 0x48a, 0x4bf) ||
      inPairs(c, 0x4d0, 0x52f))
    return c & ~char32_t(1);
  if (inPairs(c, 0x4c1, 0x4ce))
    return (c & 1) ? c : c - 1;
  if (c >= 0x561 && c <= 0x586)
    return c - 48;
  if (c >= 0xff41 && c <= 0xff5a)
    return c - 32;
  return c;
}

char32_t toLower(char32_t c) {
  if (c < 0x80)
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7)
    return c + 32;
  if (c == 0x178)
    return 0xff;
  if (c == 0x130)
    return 'i';
  if (inPairs(c, 0x100, 0x137) || inPairs(c, 0x14a, 0x177))
    return c | 1;
  if (inPairs(c, 0x139, 0x148) || inPairs(c, 0x179, 0x17e))
    return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2)
    return c + 32;
  if (c == 0x386)
    return 0x3ac;
  if (c >= 0x388 && c <= 0x38a)
    return c + 37;
  if (c == 0x38c)
    return 0x3cc;
  if (c == 0x38e || c == 0x38f)
    return c + 63;
  if (c >= 0x410 && c <= 0x42f)
    return c + 32;
  if (c >= 0x400 && c <= 0x40f)
    return c + 80;
  if (inPairs(c, 0x460, 0x481) || inPairs(c, 0x48a, 0x4bf) ||
      inPairs(c, 0x4d0, 0x52f))
    return c | 1;
  if (inPairs(c, 0x4c1, 0x4ce))
    return (c & 1) ? c + 1 : c;
  if (c >= 0x531 && c <= 0x556)
    return c + 48;
  if (c >= 0xff21 && c <= 0xff3a)
    return c + 32;
  return c;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decodeUtf8(s)) {
    if (c == 0xdf)
      out += "SS";
    else
      appendUtf8(out, toUpper(c));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : decodeUtf8(s))
    appendUtf8(out, toLower(c));
  return out;
}

} // namespace nf::jinja
