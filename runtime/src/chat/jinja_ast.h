// The syntax tree of a parsed Jinja template (jinja_parser.cpp and
// jinja_parser_expr.cpp build it from jinja_lexer.cpp's tokens,
// jinja_render.cpp walks it). Node kinds follow jinja2's nodes.py.
#pragma once

#include "chat/jinja_value.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Const,   // value
    Name,    // name
    List,    // args: items
    Tuple,   // args: items
    Dict,    // args: key0, value0, key1, value1, ...
    GetAttr, // args[0].name
    GetItem, // args[0][args[1]] (args[1] may be a Slice)
    Slice,   // args: start, stop, step (null when absent)
    Call,    // args[0](args[1:], kwargs)
    Filter,  // args[0] | name(args[1:], kwargs); args[0] null in a filter
             // block
    Test,    // args[0] is name(args[1:], kwargs)
    Neg,
    Pos,
    Not,     // args[0]
    Binary,  // args[0] name args[1]; name: + - * / // % **
    Compare, // args[0] ops[0] args[1] ops[1] args[2] ...
    And,
    Or,
    Concat, // args joined with ~
    Cond    // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  /// 1 for a leaf, else one more than the deepest operand: the parser keeps
  /// it bounded, as eval, referencesName and the destructor recurse.
  int depth = 1;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops; // Compare: == != < <= > >= in notin

  Expr(Kind kind, int line) : kind(kind), line(line) {}
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// An assignment target: a name, a namespace attribute (`ns.attr`) or a
/// tuple of names (`for k, v in ...`).
struct Target {
  std::vector<std::string> names; // one name, or the names of a tuple
  bool tuple = false;
  std::string attr; // non-empty: names[0].attr (namespace assignment)
};

struct Stmt {
  enum class Kind {
    Text,        // text
    Print,       // exprs: printed one after the other
    If,          // branches: (condition, body); condition null for else
    For,         // target in expr [if filter]: body, elseBody
    Set,         // target = expr
    SetBlock,    // {% set target [| filter] %}body{% endset %}
    Macro,       // name(params = defaults): body
    With,        // {% with target = expr, ... %}body: assigns
    FilterBlock, // {% filter f %}body: expr is the filter chain (subject
                 // null)
    Block,       // transformers' {% generation %}: body, rendered as is
    Break,
    Continue
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::vector<ExprPtr> exprs;
  ExprPtr expr;
  ExprPtr filter;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<Target, ExprPtr>> assigns;
  Body body, elseBody;
  // Macros.
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults; // for the last defaults.size() params
  bool usesVarargs = false, usesKwargs = false;
  // Loops: whether the body refers to `loop` (else it is not built).
  bool usesLoop = true;

  Stmt(Kind kind, int line) : kind(kind), line(line) {}
};

struct Program {
  std::string name; // the template's name in messages
  Body body;
};

/// Parses Jinja source as jinja2 with trim_blocks and lstrip_blocks does;
/// throws Error (with the line) on a syntax error or an unsupported tag.
std::unique_ptr<Program> parseTemplate(std::string_view source);

} // namespace nf::jinja
