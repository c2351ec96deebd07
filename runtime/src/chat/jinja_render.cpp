// The evaluator of the Jinja renderer: statements, expressions and scopes
// with jinja2's semantics (see jinja_interp.h).
//
// Scopes follow jinja2's: {% set %} at the top level sets a template
// variable; every iteration of a loop, a macro call and a {% with %} block
// get a scope of their own, so what they set is gone afterwards (that is
// what namespace() is for); {% if %} has none. A macro sees the scope it
// was defined in as it is when called.
#include "chat/jinja_interp.h"

#include <algorithm>

namespace nf::jinja {

Value *Scope::find(std::string_view name) {
  for (Scope *s = this; s; s = s->parent.get())
    for (auto &[k, v] : s->vars)
      if (k == name)
        return &v;
  return nullptr;
}

void Scope::set(const std::string &name, Value value) {
  for (auto &[k, v] : vars)
    if (k == name) {
      v = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

Interp::~Interp() {
  namespaces_.emptyAll([](ObjectData &ns) { ns.attrs.items.clear(); });
  changedMemories_.emptyAll([](std::optional<Value> &m) { m.reset(); });
}

std::string Interp::render(const Program &program, const DictData &vars) {
  BudgetScope budget(budget_);
  auto globals = std::make_shared<Scope>();
  addGlobals(*globals);
  auto top = std::make_shared<Scope>(globals);
  for (const auto &[k, v] : vars.items)
    top->set(toStr(k), v);
  std::string out;
  exec(program.body, top, out);
  return out;
}

Interp::Nesting::Nesting(Interp &in) : in_(in) {
  if (++in_.depth_ > in_.limits_.maxEvalDepth) {
    --in_.depth_;
    throw Error("the template nests more than " +
                std::to_string(in_.limits_.maxEvalDepth) +
                " levels deep when rendered (statements, expressions and "
                "macro calls)");
  }
}

void Interp::append(std::string &out, std::string_view text) const {
  checkString(out.size() + text.size());
  out += text;
  budget_.bytes(text.size());
}

Interp::Flow Interp::exec(const Body &body, const ScopePtr &scope,
                          std::string &out) {
  for (const StmtPtr &s : body)
    if (Flow f = execStmt(*s, scope, out); f != Flow::Normal)
      return f;
  return Flow::Normal;
}

Interp::Flow Interp::execStmt(const Stmt &s, const ScopePtr &scope,
                              std::string &out) {
  try {
    Nesting nesting(*this);
    switch (s.kind) {
    case Stmt::Kind::Text:
      append(out, s.text);
      return Flow::Normal;
    case Stmt::Kind::Print:
      for (const ExprPtr &e : s.exprs)
        append(out, toStr(eval(*e, scope)));
      return Flow::Normal;
    case Stmt::Kind::If:
      for (const auto &[cond, body] : s.branches)
        if (!cond || truthy(eval(*cond, scope)))
          return exec(body, scope, out);
      return Flow::Normal;
    case Stmt::Kind::For:
      return execFor(s, scope, out);
    case Stmt::Kind::Set:
      assign(s.target, eval(*s.expr, scope), scope);
      return Flow::Normal;
    case Stmt::Kind::SetBlock: {
      std::string text;
      exec(s.body, std::make_shared<Scope>(scope), text);
      assign(
          s.target,
          applyFilters(s.filter.get(), Value::string(std::move(text)), scope),
          scope);
      return Flow::Normal;
    }
    case Stmt::Kind::Macro: {
      // The macro sees its scope, held weakly: the scope holds the macro.
      const Stmt *macro = &s;
      std::weak_ptr<Scope> closure = scope;
      scope->set(s.name, Value::callable(
                             s.name,
                             [macro, closure](Interp &in, const Args &args) {
                               return in.callMacro(*macro, closure, args);
                             },
                             true));
      return Flow::Normal;
    }
    case Stmt::Kind::With: {
      auto inner = std::make_shared<Scope>(scope);
      std::vector<Value> values;
      for (const auto &a : s.assigns)
        values.push_back(eval(*a.second, scope));
      for (size_t i = 0; i < values.size(); ++i)
        assign(s.assigns[i].first, values[i], inner);
      return exec(s.body, inner, out);
    }
    case Stmt::Kind::FilterBlock: {
      std::string text;
      exec(s.body, std::make_shared<Scope>(scope), text);
      append(out, toStr(applyFilters(s.filter.get(),
                                     Value::string(std::move(text)), scope)));
      return Flow::Normal;
    }
    case Stmt::Kind::Block:
      exec(s.body, std::make_shared<Scope>(scope), out);
      return Flow::Normal;
    case Stmt::Kind::Break:
      return Flow::Break;
    case Stmt::Kind::Continue:
      return Flow::Continue;
    }
  } catch (Error &e) {
    if (!e.line)
      e.line = s.line;
    throw;
  }
  return Flow::Normal;
}

namespace {

/// The items of a `for` target's unpacking (Python's messages).
std::vector<Value> unpack(const Value &v, size_t want) {
  std::vector<Value> items = iterate(v);
  if (items.size() < want)
    throw Error("not enough values to unpack (expected " +
                std::to_string(want) + ", got " + std::to_string(items.size()) +
                ")");
  if (items.size() > want)
    throw Error("too many values to unpack (expected " + std::to_string(want) +
                ")");
  return items;
}

} // namespace

void Interp::assign(const Target &target, const Value &value,
                    const ScopePtr &scope) {
  if (!target.attr.empty()) {
    Value *ns = scope->find(target.names[0]);
    if (!ns || ns->kind() != Kind::Object ||
        ns->objectData().type != "Namespace")
      throw Error("cannot assign attribute on non-namespace object");
    ns->objectData().attrs.set(Value::string(target.attr), value);
    return;
  }
  if (!target.tuple) {
    scope->set(target.names[0], value);
    return;
  }
  std::vector<Value> items = unpack(value, target.names.size());
  for (size_t i = 0; i < items.size(); ++i)
    scope->set(target.names[i], items[i]);
}

Interp::Flow Interp::execFor(const Stmt &s, const ScopePtr &scope,
                             std::string &out) {
  std::vector<Value> items = iterate(eval(*s.expr, scope));
  if (s.filter) {
    // `for x in xs if cond`: the loop (and `loop`) sees the kept items.
    std::vector<Value> kept;
    for (Value &item : items) {
      tick();
      auto test = std::make_shared<Scope>(scope);
      assign(s.target, item, test);
      if (truthy(eval(*s.filter, test)))
        kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(s.elseBody, scope, out);
    return Flow::Normal;
  }
  // loop.changed() compares with the previous call's arguments.
  // Allocated apart from its control block, which outlives it while
  // changedMemories_ holds it weakly.
  std::shared_ptr<std::optional<Value>> lastChanged(new std::optional<Value>);
  changedMemories_.add(lastChanged);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    tick();
    auto iteration = std::make_shared<Scope>(scope);
    assign(s.target, items[static_cast<size_t>(i)], iteration);
    if (!s.usesLoop) {
      if (exec(s.body, iteration, out) == Flow::Break)
        break;
      continue;
    }
    auto loop = std::make_shared<ObjectData>();
    loop->type = "LoopContext";
    DictData &a = loop->attrs;
    auto set = [&](const char *k, Value v) {
      a.items.emplace_back(Value::string(k), std::move(v));
    };
    set("index", Value::integer(i + 1));
    set("index0", Value::integer(i));
    set("revindex", Value::integer(n - i));
    set("revindex0", Value::integer(n - i - 1));
    set("first", Value::boolean(i == 0));
    set("last", Value::boolean(i == n - 1));
    set("length", Value::integer(n));
    set("depth", Value::integer(1));
    set("depth0", Value::integer(0));
    set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                          : Value::undefined("there is no previous item"));
    set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                              : Value::undefined("there is no next item"));
    set("cycle", Value::callable("cycle", [i](Interp &, const Args &args) {
          if (!args.kw.empty())
            throw Error("loop.cycle() takes no keyword arguments");
          if (args.pos.empty())
            throw Error("no items for cycling given");
          return args.pos[static_cast<size_t>(i) % args.pos.size()];
        }));
    set("changed",
        Value::callable("changed", [lastChanged](Interp &, const Args &args) {
          Value now = Value::seq(args.pos, SeqType::Tuple);
          if (*lastChanged && equals(**lastChanged, now))
            return Value::boolean(false);
          *lastChanged = now;
          return Value::boolean(true);
        }));
    iteration->set("loop", Value::object(loop));
    if (exec(s.body, iteration, out) == Flow::Break)
      break;
  }
  return Flow::Normal;
}

Value Interp::applyFilters(const Expr *chain, Value v, const ScopePtr &scope) {
  // The chain is nested innermost-first ({% filter a | b %}: b(a(block)));
  // the innermost subject is null and stands for `v`.
  std::vector<const Expr *> filters;
  for (const Expr *f = chain; f; f = f->args[0].get())
    filters.push_back(f);
  for (auto it = filters.rbegin(); it != filters.rend(); ++it)
    v = callFilter((*it)->name, v, evalArgs(**it, 1, scope));
  return v;
}

Value Interp::callMacro(const Stmt &m, const std::weak_ptr<Scope> &closure,
                        const Args &args) {
  ScopePtr defined = closure.lock();
  if (!defined)
    throw Error("macro '" + m.name +
                "' is called after the block that defined it has ended (not "
                "supported)");
  if (callDepth_ >= limits_.maxCallDepth)
    throw Error("macro calls nest more than " +
                std::to_string(limits_.maxCallDepth) + " deep");
  struct Depth {
    int &d;
    explicit Depth(int &d) : d(d) { ++d; }
    ~Depth() { --d; }
  } depth(callDepth_);

  const size_t np = m.params.size();
  if (args.pos.size() > np && !m.usesVarargs)
    throw Error("macro '" + m.name + "' takes not more than " +
                std::to_string(np) + " argument(s)");
  auto scope = std::make_shared<Scope>(defined);
  std::vector<std::optional<Value>> given(np);
  for (size_t i = 0; i < std::min(np, args.pos.size()); ++i)
    given[i] = args.pos[i];
  DictData extraKw;
  for (const auto &[k, v] : args.kw) {
    auto it = std::find(m.params.begin(), m.params.end(), k);
    const size_t idx = static_cast<size_t>(it - m.params.begin());
    if (it != m.params.end() && args.pos.size() < np && !given[idx]) {
      given[idx] = v;
    } else if (m.usesKwargs) {
      extraKw.set(Value::string(k), v);
    } else {
      throw Error("macro '" + m.name + "' takes no keyword argument '" + k +
                  "'");
    }
  }
  const size_t firstDefault = np - m.defaults.size();
  for (size_t i = 0; i < np; ++i) {
    Value v;
    if (given[i])
      v = *given[i];
    else if (i >= firstDefault)
      v = eval(*m.defaults[i - firstDefault], scope);
    else
      v = Value::undefined("parameter '" + m.params[i] + "' was not provided");
    scope->set(m.params[i], v);
  }
  if (m.usesVarargs) {
    std::vector<Value> rest;
    for (size_t i = np; i < args.pos.size(); ++i)
      rest.push_back(args.pos[i]);
    scope->set("varargs", Value::seq(std::move(rest), SeqType::Tuple));
  }
  if (m.usesKwargs)
    scope->set("kwargs", Value::dict(std::move(extraKw)));
  std::string out;
  exec(m.body, scope, out);
  return Value::string(std::move(out));
}

Value Interp::call(const Value &callee, const Args &args) {
  if (callee.kind() == Kind::Callable)
    return callee.callableData().fn(*this, args);
  if (callee.isUndefined())
    failUndefined(callee);
  throw Error("'" + typeName(callee) + "' object is not callable");
}

Value Interp::callFilter(const std::string &name, const Value &subject,
                         const Args &args) {
  FilterFn f = findFilter(name);
  if (!f)
    throw Error(missingFilter(name));
  return f(*this, subject, args);
}

bool Interp::callTest(const std::string &name, const Value &subject,
                      const Args &args) {
  TestFn t = findTest(name);
  if (!t)
    throw Error(missingTest(name));
  return t(*this, subject, args);
}

Value Interp::getAttr(const Value &obj, const std::string &name) {
  if (obj.isUndefined())
    failUndefined(obj);
  if (obj.kind() == Kind::Object) {
    if (const Value *v = obj.objectData().attrs.find(Value::string(name)))
      return *v;
  } else if (std::optional<Value> attr = pythonAttribute(obj, name)) {
    return *attr;
  }
  if (obj.kind() == Kind::Dict)
    if (const Value *v = obj.dictData().find(Value::string(name)))
      return *v;
  return Value::undefined("'" + objectTypeRepr(obj) + "' has no attribute '" +
                          name + "'");
}

Value Interp::getItem(const Value &obj, const Value &key) {
  if (obj.isUndefined())
    failUndefined(obj);
  const bool intKey = key.kind() == Kind::Int || key.kind() == Kind::Bool;
  switch (obj.kind()) {
  case Kind::String:
    if (intKey) {
      const std::u32string s = decodeUtf8(obj.str());
      int64_t i = key.asInt();
      if (i < 0)
        i += static_cast<int64_t>(s.size());
      if (i >= 0 && i < static_cast<int64_t>(s.size()))
        return Value::string(encodeUtf8(s.substr(static_cast<size_t>(i), 1)));
    }
    break;
  case Kind::Seq: {
    const SeqType t = obj.seqType();
    if (intKey &&
        (t == SeqType::List || t == SeqType::Tuple || t == SeqType::Range)) {
      const auto &items = obj.items();
      int64_t i = key.asInt();
      if (i < 0)
        i += static_cast<int64_t>(items.size());
      if (i >= 0 && i < static_cast<int64_t>(items.size()))
        return items[static_cast<size_t>(i)];
    }
    break;
  }
  case Kind::Dict:
    if (const Value *v = obj.dictData().find(key))
      return *v;
    break;
  default:
    break;
  }
  // Not an item: jinja2 then tries the attribute of that name.
  if (key.isString()) {
    if (obj.kind() == Kind::Object) {
      if (const Value *v = obj.objectData().attrs.find(key))
        return *v;
    } else if (std::optional<Value> attr = pythonAttribute(obj, key.str())) {
      return *attr;
    }
    return Value::undefined("'" + objectTypeRepr(obj) + "' has no attribute '" +
                            key.str() + "'");
  }
  return Value::undefined(objectTypeRepr(obj) + " has no element " + repr(key));
}

Args Interp::evalArgs(const Expr &e, size_t first, const ScopePtr &scope) {
  Args a;
  for (size_t i = first; i < e.args.size(); ++i)
    a.pos.push_back(eval(*e.args[i], scope));
  for (const auto &[k, v] : e.kwargs)
    a.kw.emplace_back(k, eval(*v, scope));
  return a;
}

Value Interp::eval(const Expr &e, const ScopePtr &scope) {
  try {
    Nesting nesting(*this);
    return evalImpl(e, scope);
  } catch (Error &err) {
    if (!err.line)
      err.line = e.line;
    throw;
  }
}

Value Interp::evalImpl(const Expr &e, const ScopePtr &scope) {
  switch (e.kind) {
  case Expr::Kind::Const:
    return e.value;
  case Expr::Kind::Name:
    if (Value *v = scope->find(e.name))
      return *v;
    return Value::undefined("'" + e.name + "' is undefined");
  case Expr::Kind::List:
  case Expr::Kind::Tuple: {
    std::vector<Value> items;
    for (const ExprPtr &a : e.args)
      items.push_back(eval(*a, scope));
    return Value::seq(std::move(items), e.kind == Expr::Kind::List
                                            ? SeqType::List
                                            : SeqType::Tuple);
  }
  case Expr::Kind::Dict: {
    DictData d;
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      Value k = eval(*e.args[i], scope);
      if (k.kind() == Kind::Seq || k.kind() == Kind::Dict)
        throw Error("unhashable type: '" + typeName(k) + "'");
      d.set(k, eval(*e.args[i + 1], scope));
    }
    return Value::dict(std::move(d));
  }
  case Expr::Kind::GetAttr:
    return getAttr(eval(*e.args[0], scope), e.name);
  case Expr::Kind::GetItem: {
    Value obj = eval(*e.args[0], scope);
    const Expr &key = *e.args[1];
    if (key.kind == Expr::Kind::Slice) {
      auto part = [&](size_t i) {
        return key.args[i] ? eval(*key.args[i], scope) : Value::none();
      };
      Value start = part(0), stop = part(1), step = part(2);
      if (obj.isUndefined())
        failUndefined(obj);
      return sliceValue(obj, start, stop, step);
    }
    return getItem(obj, eval(key, scope));
  }
  case Expr::Kind::Slice:
    throw Error("a slice is only valid in a subscript");
  case Expr::Kind::Call: {
    Value callee = eval(*e.args[0], scope);
    return call(callee, evalArgs(e, 1, scope));
  }
  case Expr::Kind::Filter: {
    Value subject = eval(*e.args[0], scope);
    return callFilter(e.name, subject, evalArgs(e, 1, scope));
  }
  case Expr::Kind::Test: {
    Value subject = eval(*e.args[0], scope);
    return Value::boolean(callTest(e.name, subject, evalArgs(e, 1, scope)));
  }
  case Expr::Kind::Neg:
  case Expr::Kind::Pos: {
    Value v = eval(*e.args[0], scope);
    if (v.isUndefined())
      failUndefined(v);
    const bool neg = e.kind == Expr::Kind::Neg;
    if (v.kind() == Kind::Float)
      return Value::real(neg ? -v.asFloat() : v.asFloat());
    if (v.kind() == Kind::Int || v.kind() == Kind::Bool) {
      if (neg && v.asInt() == INT64_MIN)
        throw Error("integer overflow");
      return Value::integer(neg ? -v.asInt() : v.asInt());
    }
    throw Error(std::string("bad operand type for unary ") + (neg ? "-" : "+") +
                ": '" + typeName(v) + "'");
  }
  case Expr::Kind::Not:
    return Value::boolean(!truthy(eval(*e.args[0], scope)));
  case Expr::Kind::Binary: {
    Value a = eval(*e.args[0], scope);
    Value b = eval(*e.args[1], scope);
    return binaryOp(*this, e.name, a, b);
  }
  case Expr::Kind::Compare: {
    Value left = eval(*e.args[0], scope);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.args[i + 1], scope);
      const std::string &op = e.ops[i];
      bool ok;
      if (op == "==")
        ok = equals(left, right);
      else if (op == "!=")
        ok = !equals(left, right);
      else if (op == "in")
        ok = contains(right, left);
      else if (op == "notin")
        ok = !contains(right, left);
      else
        ok = lessCompare(left, right, op);
      if (!ok)
        return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }
  case Expr::Kind::And: {
    Value a = eval(*e.args[0], scope);
    return truthy(a) ? eval(*e.args[1], scope) : a;
  }
  case Expr::Kind::Or: {
    Value a = eval(*e.args[0], scope);
    return truthy(a) ? a : eval(*e.args[1], scope);
  }
  case Expr::Kind::Concat: {
    std::string s;
    for (const ExprPtr &a : e.args) {
      const std::string piece = toStr(eval(*a, scope));
      checkString(s.size() + piece.size());
      s += piece;
    }
    return Value::string(std::move(s));
  }
  case Expr::Kind::Cond:
    if (truthy(eval(*e.args[0], scope)))
      return eval(*e.args[1], scope);
    if (e.args[2])
      return eval(*e.args[2], scope);
    return Value::undefined("the inline if-expression on line " +
                            std::to_string(e.line) +
                            " evaluated to false and no else section was "
                            "defined.");
  }
  throw Error("internal error: unknown expression");
}

} // namespace nf::jinja
