// The parser of the Jinja renderer (parseTemplate in jinja_ast.h): jinja2's
// parser.py for the syntax chat templates use, with transformers'
// environment (the loopcontrols extension and its {% generation %} tag).
// Private to the files that define the Parser's methods: jinja_parser.cpp
// (the entry point and statements) and jinja_parser_expr.cpp
// (expressions); its tokens come from jinja_lexer.h.
//
// The parser is a recursive descent with jinja2's precedence; tags nf
// cannot render (include, extends, call, ...) are errors here, not at
// render time.
//
// Recursion is bounded: the parser's by kMaxNesting (it recurses only into
// parentheses, brackets, arguments, `not`, unary signs, conditional
// expressions and blocks), and the depth of every expression tree it
// builds by kMaxExprDepth (chains of binary operators, filters, tests,
// attributes, subscripts and calls are parsed in loops, but the trees they
// make are evaluated, searched and freed recursively).
#pragma once

#include "chat/jinja_ast.h"
#include "chat/jinja_lexer.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nf::jinja {

// Deeper nesting than this (parentheses, not, unary minus, blocks) is an
// error: it bounds the recursion of the parser. Python itself gives up near
// 100 levels of parentheses.
constexpr int kMaxNesting = 100;

inline bool isName(const Token &t, std::string_view name) {
  return t.type == Token::Type::Name && t.text == name;
}
inline bool isOp(const Token &t, std::string_view op) {
  return t.type == Token::Type::Op && t.text == op;
}

/// The token as jinja2's messages name it ("end of print statement").
std::string describe(const Token &t);

class Parser {
public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parseTemplate() {
    Body body = subparse({});
    return body;
  }

private:
  using Names = std::vector<std::string_view>;

  struct Nesting {
    explicit Nesting(Parser &p) : p(p) {
      if (++p.depth_ > kMaxNesting)
        p.fail("the template nests more than " + std::to_string(kMaxNesting) +
               " levels deep");
    }
    ~Nesting() { --p.depth_; }
    Parser &p;
  };

  const Token &cur() const { return t_[i_]; }
  const Token &look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token &next() {
    const Token &t = t_[i_];
    if (i_ + 1 < t_.size())
      ++i_;
    return t;
  }
  int line() const { return cur().line; }

  [[noreturn]] void fail(const std::string &message, int line = 0) const {
    throw Error(message, line ? line : cur().line);
  }

  const Token &expect(Token::Type type, std::string_view what) {
    if (cur().type != type)
      fail("expected token '" + std::string(what) + "', got '" +
           describe(cur()) + "'");
    return next();
  }
  const Token &expectOp(std::string_view op) {
    if (!isOp(cur(), op))
      fail("expected token '" + std::string(op) + "', got '" + describe(cur()) +
           "'");
    return next();
  }
  const Token &expectName(std::string_view name) {
    if (!isName(cur(), name))
      fail("expected token '" + std::string(name) + "', got '" +
           describe(cur()) + "'");
    return next();
  }
  bool skipOp(std::string_view op) {
    if (!isOp(cur(), op))
      return false;
    next();
    return true;
  }
  bool skipName(std::string_view name) {
    if (!isName(cur(), name))
      return false;
    next();
    return true;
  }
  static bool isAny(const Token &t, const Names &names) {
    return t.type == Token::Type::Name &&
           std::find(names.begin(), names.end(), t.text) != names.end();
  }

  // Statements (jinja_parser.cpp) --------------------------------------------

  Body subparse(const Names &endTokens);
  [[noreturn]] void failEof(const Names &endTokens);
  Body parseStatements(const Names &endTokens, bool dropNeedle);
  StmtPtr parseStatement();
  Target parseAssignTarget(const Names &extraEnd, bool withNamespace);
  StmtPtr parseFor();
  StmtPtr parseIf();
  StmtPtr parseSet();
  StmtPtr parseMacro();
  StmtPtr parsePrint();
  StmtPtr parseWith();
  StmtPtr parseFilterBlock();
  StmtPtr parseGeneration();
  StmtPtr parseLoopControl();

  // Expressions (jinja_parser_expr.cpp) --------------------------------------

  ExprPtr node(Expr::Kind kind, int line);
  /// `n` with its operands in place: records its depth and refuses trees
  /// deeper than kMaxExprDepth. Every node with operands passes here.
  ExprPtr sealed(ExprPtr n);
  bool isTupleEnd(const Names &extraEnd) const;
  ExprPtr parseExpression(bool withCondexpr);
  ExprPtr parseCondexpr();
  ExprPtr binary(Expr::Kind kind, int line, ExprPtr a, ExprPtr b,
                 std::string name = {});
  ExprPtr parseOr();
  ExprPtr parseAnd();
  ExprPtr parseNot();
  ExprPtr parseCompare();
  ExprPtr parseMath1();
  ExprPtr parseConcat();
  ExprPtr parseMath2();
  ExprPtr parsePow();
  ExprPtr parseUnary(bool withFilter);
  ExprPtr constant(Value v, int line);
  ExprPtr parsePrimary();
  ExprPtr parseTuple(bool simplified, bool withCondexpr, const Names &extraEnd,
                     bool explicitParentheses);
  ExprPtr parseList();
  ExprPtr parseDict();
  ExprPtr parsePostfix(ExprPtr n);
  ExprPtr parseFilterExpr(ExprPtr n);
  ExprPtr parseSubscript(ExprPtr subject);
  ExprPtr parseSubscribed();
  /// `(args, key=value, ...)` into n->args (after what is already there)
  /// and n->kwargs.
  void parseCallArgs(Expr &n);
  ExprPtr parseCall(ExprPtr callee);
  ExprPtr parseFilter(ExprPtr subject, bool startInline);
  ExprPtr parseTest(ExprPtr subject);

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loopDepth_ = 0;
  std::vector<std::string> openTags_;
};

} // namespace nf::jinja
