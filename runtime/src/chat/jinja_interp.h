// The evaluator of the Jinja renderer (jinja_render.cpp) and the builtins it
// calls: filters (jinja_filters.cpp), tests and globals
// (jinja_tests_globals.cpp), Python methods (jinja_methods.cpp) and Python's
// operators (jinja_operators.cpp).
#pragma once

#include "chat/jinja_ast.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::jinja {

/// Objects of a render that may end up in a reference cycle (a namespace
/// holding itself, loop.changed() remembering its own loop): emptied when
/// the render ends, so that no cycle outlives it. Held weakly, so that the
/// others are freed as usual (expired entries go as the list grows).
template <typename T> class CycleBreaker {
public:
  CycleBreaker() = default;
  CycleBreaker(const CycleBreaker &) = delete;
  CycleBreaker &operator=(const CycleBreaker &) = delete;
  void add(const std::shared_ptr<T> &p) {
    if (items_.size() >= purgeAt_) {
      std::erase_if(items_,
                    [](const std::weak_ptr<T> &w) { return w.expired(); });
      purgeAt_ = std::max<size_t>(1024, 2 * items_.size());
    }
    items_.push_back(p);
  }
  /// Calls `empty` on every object still alive.
  template <typename F> void emptyAll(F empty) {
    for (const std::weak_ptr<T> &w : items_)
      if (std::shared_ptr<T> p = w.lock())
        empty(*p);
  }

private:
  std::vector<std::weak_ptr<T>> items_;
  size_t purgeAt_ = 1024;
};

/// Variables of one scope (the template, a loop iteration, a macro call),
/// looked up through the enclosing scopes as jinja2 resolves names.
struct Scope {
  explicit Scope(std::shared_ptr<Scope> parent = nullptr)
      : parent(std::move(parent)) {}
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  Value *find(std::string_view name);
  void set(const std::string &name, Value value);
};
using ScopePtr = std::shared_ptr<Scope>;

/// Renders one template once. Every render is bounded by its Limits (see
/// Budget in jinja_value.h): the work it does, the strings and sequences
/// it makes, and how deeply it recurses (the parser bounds each
/// expression's depth; eval and execStmt count the nesting of the whole
/// render, macro calls included).
class Interp {
public:
  explicit Interp(const Limits &limits) : limits_(limits), budget_(limits) {}
  ~Interp();
  Interp(const Interp &) = delete;
  Interp &operator=(const Interp &) = delete;

  /// Renders `program` with the template variables `vars` (over the
  /// globals: range, namespace, dict, raise_exception, strftime_now, ...).
  std::string render(const Program &program, const DictData &vars);

  // Used by the builtins.
  Value call(const Value &callee, const Args &args);
  Value callFilter(const std::string &name, const Value &subject,
                   const Args &args);
  bool callTest(const std::string &name, const Value &subject,
                const Args &args);
  /// jinja2's sandboxed environment.getattr / getitem.
  Value getAttr(const Value &obj, const std::string &name);
  Value getItem(const Value &obj, const Value &key);
  /// Errors out when a string of `bytes` or a sequence of `items` would
  /// pass the limits; charges `steps` of work to the budget.
  void checkString(size_t bytes) const { budget_.checkString(bytes); }
  void checkItems(size_t items) const { budget_.checkItems(items); }
  void tick(int64_t steps = 1) { budget_.steps(steps); }
  /// A namespace() of this render (it may come to hold itself).
  void track(const std::shared_ptr<ObjectData> &ns) { namespaces_.add(ns); }

private:
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body &body, const ScopePtr &scope, std::string &out);
  Flow execStmt(const Stmt &s, const ScopePtr &scope, std::string &out);
  Flow execFor(const Stmt &s, const ScopePtr &scope, std::string &out);
  void assign(const Target &target, const Value &value, const ScopePtr &scope);
  /// `v` through a {% filter %} / {% set x | f %} chain (null: none).
  Value applyFilters(const Expr *chain, Value v, const ScopePtr &scope);
  Value callMacro(const Stmt &macro, const std::weak_ptr<Scope> &closure,
                  const Args &args);
  Value eval(const Expr &e, const ScopePtr &scope);
  Value evalImpl(const Expr &e, const ScopePtr &scope);
  Args evalArgs(const Expr &e, size_t first, const ScopePtr &scope);
  void append(std::string &out, std::string_view text) const;

  /// Counts one level of nesting for its lifetime (an Error past
  /// Limits::maxEvalDepth).
  class Nesting {
  public:
    explicit Nesting(Interp &in);
    ~Nesting() { --in_.depth_; }
    Nesting(const Nesting &) = delete;
    Nesting &operator=(const Nesting &) = delete;

  private:
    Interp &in_;
  };

  const Limits &limits_;
  mutable Budget budget_; // charged by const helpers too (append)
  int depth_ = 0;
  int callDepth_ = 0;
  CycleBreaker<ObjectData> namespaces_;
  CycleBreaker<std::optional<Value>> changedMemories_;
};

using FilterFn = Value (*)(Interp &, const Value &subject, const Args &);
using TestFn = bool (*)(Interp &, const Value &subject, const Args &);

/// The builtin filter / test of that name; nullptr when nf has none.
FilterFn findFilter(std::string_view name);
TestFn findTest(std::string_view name);
/// Why there is none: "unsupported filter 'xmlattr'" for jinja2's filters
/// nf does not implement, "no filter named 'foo'" otherwise.
std::string missingFilter(std::string_view name);
std::string missingTest(std::string_view name);

/// The Python attribute `name` of a str, list or dict value as jinja2's
/// immutable sandbox exposes it (a bound method, or an Undefined that fails
/// on use for methods that would mutate); nullopt when there is none.
std::optional<Value> pythonAttribute(const Value &obj, const std::string &name);

/// Binary arithmetic of Python (+ - * / // % **).
Value binaryOp(Interp &in, std::string_view op, const Value &a, const Value &b);
/// Python's `item in container`.
bool contains(const Value &container, const Value &item);
/// Python slicing obj[start:stop:step] of a str, list, tuple or range.
Value sliceValue(const Value &obj, const Value &start, const Value &stop,
                 const Value &step);

/// The template globals jinja2 and transformers define.
void addGlobals(Scope &scope);

} // namespace nf::jinja
