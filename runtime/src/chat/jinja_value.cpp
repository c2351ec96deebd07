// Values of the Jinja renderer (see jinja_value.h): render budgets, the
// value model (construction, payloads freed without recursion, access)
// and its Python semantics: type names, truthiness, equality, ordering,
// len(), iteration, and values from JSON. Their text forms (str(),
// repr(), json.dumps, floats) are in jinja_value_format.cpp, UTF-8 text in
// jinja_utf8.cpp.
#include "chat/jinja_value_impl.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>

namespace nf::jinja {

// ---------------------------------------------------------------------------
// Budgets

thread_local constinit Budget *tBudget = nullptr;

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

thread_local constinit int tValueDepth = 0;

namespace {

const std::string kEmpty;

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

} // namespace nf::jinja
