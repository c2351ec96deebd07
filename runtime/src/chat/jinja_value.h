// Values of the Jinja renderer (chat_template.h): Python's data model as far
// as chat templates see it, since jinja2 evaluates templates with Python
// objects and prints them with str().
//
// Strings are UTF-8 and indexed by code point, ints are 64-bit (overflow is
// an error, not a big integer), lists and dicts are immutable once built
// (the sandbox transformers renders in forbids mutating them) and cheap to
// copy (shared). Sequences remember which Python type they stand for (list,
// tuple, generator, dict view, ...) because that changes what a template can
// do with them: a generator has no length and is always true, a
// list_reverseiterator cannot be indexed, repr() spells each differently.
#pragma once

#include "utf8.h" // appendUtf8

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::jinja {

/// A template that cannot be parsed or rendered: the message (Python's or
/// jinja2's wording where there is one) and the template line, 0 while not
/// yet known (the evaluator fills in the line of the innermost node).
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message, int line = 0)
      : std::runtime_error(message), line(line) {}
  int line;
  /// Raised by the template itself (raise_exception).
  bool raised = false;
};

class Value;
class Interp;

/// Bounds on one render, so that a hostile template fails cleanly instead of
/// exhausting memory, time or the stack. Generous for real chat templates.
struct Limits {
  size_t maxStringBytes = size_t{16} << 20; // the output, and any string
  size_t maxItems = size_t{1} << 20;        // elements of one list or dict
  /// Work in all, in steps: a loop iteration, a filter step, a comparison
  /// or a string made is one, an item made (of a list, dict or namespace,
  /// or a function) kStepsPerItem, and text made, copied or scanned one per
  /// kBytesPerStep bytes. At most about a second of CPU, and what a render
  /// can make (so hold) bounded to a few hundred MB.
  int64_t maxSteps = 5'000'000;
  int maxCallDepth = 100; // nested macro calls
  /// Nested statements, expressions and macro calls while rendering (the
  /// parser bounds one expression's depth, this their sum through macros).
  int maxEvalDepth = 1000;
};
inline constexpr int64_t kBytesPerStep = 32;
inline constexpr int64_t kStepsPerItem = 2;
/// Values nested deeper than this (lists in lists, ...) cannot be printed,
/// compared or converted: an error, as Python's RecursionError.
inline constexpr int kMaxValueDepth = 512;

/// What one render has used of its Limits. Interp::render makes it its
/// thread's budget (BudgetScope) while it runs, so that the functions of
/// this header (Value::string, Value::seq, toStr, repr, toJson, iterate,
/// equals, decodeUtf8, ...) charge their work to it and check the sizes of
/// what they make as they go, before a runaway result exists. Outside a
/// render nothing is charged or limited.
class Budget {
public:
  explicit Budget(const Limits &limits) : limits_(limits) {}
  const Limits &limits() const { return limits_; }
  /// Charges work; an Error past maxSteps.
  void steps(int64_t n) { charge(static_cast<uint64_t>(n) * kBytesPerStep); }
  void bytes(uint64_t n) { charge(n); }
  /// Errors when a string of `bytes` / a sequence of `items` would pass
  /// the limits.
  void checkString(size_t bytes) const {
    if (bytes > limits_.maxStringBytes)
      failString();
  }
  void checkItems(size_t items) const {
    if (items > limits_.maxItems)
      failItems();
  }

private:
  void charge(uint64_t units) {
    used_ += units;
    if (used_ > static_cast<uint64_t>(limits_.maxSteps) * kBytesPerStep)
      failSteps();
  }
  [[noreturn]] void failString() const;
  [[noreturn]] void failItems() const;
  [[noreturn]] void failSteps() const;

  const Limits &limits_;
  uint64_t used_ = 0; // in bytes (a step is kBytesPerStep)
};

/// The budget of the render running on this thread; nullptr when none.
Budget *currentBudget();

/// Makes `budget` this thread's budget for its lifetime.
class BudgetScope {
public:
  explicit BudgetScope(Budget &budget);
  ~BudgetScope();
  BudgetScope(const BudgetScope &) = delete;
  BudgetScope &operator=(const BudgetScope &) = delete;

private:
  Budget *previous_;
};

/// The current budget's operations; nothing without one.
inline void chargeSteps(int64_t n) {
  if (Budget *b = currentBudget())
    b->steps(n);
}
inline void chargeBytes(uint64_t n) {
  if (Budget *b = currentBudget())
    b->bytes(n);
}
inline void checkStringSize(size_t bytes) {
  if (Budget *b = currentBudget())
    b->checkString(bytes);
}
inline void checkItemCount(size_t items) {
  if (Budget *b = currentBudget())
    b->checkItems(items);
}

/// Positional and keyword arguments of a call, filter or test.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

using Function = std::function<Value(Interp &, const Args &)>;

enum class Kind : uint8_t {
  Undefined,
  None,
  Bool,
  Int,
  Float,
  String,
  Seq,
  Dict,
  Callable,
  Object
};

/// The Python type a sequence value stands for.
enum class SeqType : uint8_t {
  List,
  Tuple,
  Range,
  Generator,       // map, select, selectattr, unique, items, ...
  ReverseIterator, // list|reverse
  DictKeys,
  DictValues,
  DictItems
};

// The payloads of lists, dicts and namespaces free what they hold without
// recursion (values nested a million deep would overflow the stack): see
// disposeValues in jinja_value.cpp.
struct SeqData {
  SeqData() = default;
  SeqData(const SeqData &) = default;
  SeqData(SeqData &&) noexcept = default;
  SeqData &operator=(const SeqData &) = default;
  SeqData &operator=(SeqData &&) noexcept = default;
  ~SeqData();

  SeqType type = SeqType::List;
  std::vector<Value> items;
  int64_t range[3] = {0, 0, 1}; // start, stop, step of a Range (for repr)
};

/// An insertion-ordered dict (Python 3.7+ order; JSON objects keep theirs).
/// Lookups are linear: chat template dicts are small.
struct DictData {
  DictData() = default;
  DictData(const DictData &) = default;
  DictData(DictData &&) noexcept = default;
  DictData &operator=(const DictData &) = default;
  DictData &operator=(DictData &&) noexcept = default;
  ~DictData();

  std::vector<std::pair<Value, Value>> items;
  const Value *find(const Value &key) const;
  /// Sets `key` (replacing an equal key in place, as Python does).
  void set(const Value &key, Value value);
};

struct CallableData {
  std::string name;
  Function fn;
  bool macro = false; // a template macro (repr <Macro 'name'>)
};

/// Attribute bags: jinja2's Namespace (mutable through {% set ns.a %}) and
/// the LoopContext behind `loop`.
struct ObjectData {
  std::string type; // "Namespace", "LoopContext"
  DictData attrs;
};

class Value {
public:
  /// Undefined (jinja2's default Undefined), with the message an operation
  /// that needs a value raises ("'foo' is undefined").
  Value() = default;
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);
  /// `markup`: a markupsafe.Markup (from |safe or |escape).
  static Value string(std::string s, bool markup = false);
  static Value seq(std::vector<Value> items, SeqType type = SeqType::List);
  static Value range(int64_t start, int64_t stop, int64_t step);
  static Value dict(DictData d);
  static Value callable(std::string name, Function fn, bool macro = false);
  static Value object(std::shared_ptr<ObjectData> o);

  Kind kind() const { return kind_; }
  bool isUndefined() const { return kind_ == Kind::Undefined; }
  bool isNone() const { return kind_ == Kind::None; }
  bool isString() const { return kind_ == Kind::String; }
  bool isNumber() const {
    return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool;
  }

  bool asBool() const { return b_; }
  int64_t asInt() const { return i_; } // Int; Bool as 0/1
  double asFloat() const { return kind_ == Kind::Float ? f_ : double(i_); }
  const std::string &str() const; // String; "" for other kinds
  bool markup() const { return b_ && kind_ == Kind::String; }
  const std::string &undefinedHint() const { return str(); }
  const SeqData &seqData() const;
  const std::vector<Value> &items() const { return seqData().items; }
  SeqType seqType() const { return seqData().type; }
  const DictData &dictData() const;
  const CallableData &callableData() const;
  ObjectData &objectData() const;
  /// Identity of shared payloads (the `sameas` test).
  const void *identity() const { return ptr_.get(); }
  /// Whether destroying this value may destroy other values (a list, dict,
  /// namespace or function that nothing else holds).
  bool ownsValues() const {
    return (kind_ == Kind::Seq || kind_ == Kind::Dict ||
            kind_ == Kind::Object || kind_ == Kind::Callable) &&
           ptr_.use_count() == 1;
  }

private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false; // Bool value; String: markup
  int64_t i_ = 0;  // Int; Bool as 0/1
  double f_ = 0;
  std::shared_ptr<void> ptr_; // string (also the Undefined hint), payloads
};

// ---------------------------------------------------------------------------
// Python semantics

/// Python's name for the value's type ('str', 'int', 'NoneType', 'dict',
/// 'generator', ...): used in error messages, as Python words them.
std::string typeName(const Value &v);
/// jinja2's object_type_repr: "dict object", "None", ...
std::string objectTypeRepr(const Value &v);
/// Throws the Undefined's error ("'foo' is undefined").
[[noreturn]] void failUndefined(const Value &v);

bool truthy(const Value &v);
/// str(v) as jinja2 prints it ({{ v }}, ~, |string, |join). Undefined: "".
/// Generators and functions print their address in Python: an error here.
/// A list, dict or namespace that holds itself prints as Python prints it
/// ([...], {...} where it recurs).
std::string toStr(const Value &v);
std::string repr(const Value &v);
/// Python ==.
bool equals(const Value &a, const Value &b);
/// Python <, <=, >, >= (`op` is one of them): TypeError between unordered
/// types.
bool lessCompare(const Value &a, const Value &b, std::string_view op);
/// Python len(); TypeError for values without one.
int64_t length(const Value &v);
/// The items Python's iter() yields: str -> characters, dict -> keys,
/// Undefined -> none; TypeError for what is not iterable.
std::vector<Value> iterate(const Value &v);

/// repr() of a float as Python 3 writes it (shortest round trip).
std::string floatRepr(double d);
/// A decimal number (an optional '-', digits with an optional '.', an
/// optional exponent) as Python's float() reads it: correctly rounded, too
/// large is inf and too small 0. Like floatRepr, independent of the C
/// locale (a host with a comma as its decimal point renders alike).
double parseDouble(std::string_view text);

/// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python
/// writes it; `indent` is nullopt for None, else the indent string.
struct JsonOptions {
  bool ensureAscii = false;
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sortKeys = false;
};
std::string toJson(const Value &v, const JsonOptions &options);

/// A value from JSON (objects keep their key order); nesting deeper than
/// `maxDepth` is an Error.
Value fromJson(const nlohmann::ordered_json &j, int maxDepth = 256);

// ---------------------------------------------------------------------------
// UTF-8 text as Python sees it (sequences of code points)

std::u32string decodeUtf8(std::string_view s);
std::string encodeUtf8(std::u32string_view s);
/// Code points in s (s is valid UTF-8).
size_t codePoints(std::string_view s);
bool validUtf8(std::string_view s);
/// str.isspace() of one code point.
bool isPySpace(char32_t c);
/// Simple case mappings: ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic,
/// Armenian and fullwidth Latin (other letters are left unchanged).
char32_t toUpper(char32_t c);
char32_t toLower(char32_t c);
/// str.upper() / str.lower() (with the mappings above; ß -> SS).
std::string upper(std::string_view s);
std::string lower(std::string_view s);

} // namespace nf::jinja
