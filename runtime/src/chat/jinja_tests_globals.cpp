// jinja2's tests (`x is defined`, `x is divisibleby 3`, ...), and the
// template globals of jinja2 and transformers (range, dict, namespace,
// raise_exception, strftime_now).
#include "chat/jinja_builtins.h"

#include <cmath>
#include <ctime>
#include <locale.h>
#include <memory>
#include <unordered_map>

namespace nf::jinja {

namespace {

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
  return pyIsLower(v);
}
TEST(tUpper) {
  noArgs(args, "upper");
  return pyIsUpper(v);
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

} // namespace

TestFn findTest(std::string_view name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

std::string missingTest(std::string_view name) {
  return "no test named '" + std::string(name) + "'";
}

// ---------------------------------------------------------------------------
// Globals

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
