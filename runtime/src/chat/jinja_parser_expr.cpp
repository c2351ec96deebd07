// Expressions of the Jinja parser (see jinja_parser.h), with jinja2's
// precedence: conditional expressions, or / and / not, comparisons and
// tests, arithmetic and ~, unary signs, filters, subscripts, slices,
// calls, literals, lists, tuples and dicts. Every node with operands
// passes through sealed(), which bounds the tree's depth.
#include "chat/jinja_parser.h"

#include <memory>

namespace nf::jinja {

namespace {

// Expression trees deeper than this are an error. jinja2 itself fails
// sooner: it compiles an expression into nested Python parentheses, of
// which Python allows 200.
constexpr int kMaxExprDepth = 256;

} // namespace

ExprPtr Parser::node(Expr::Kind kind, int line) {
  return std::make_unique<Expr>(kind, line);
}

ExprPtr Parser::sealed(ExprPtr n) {
  int deepest = 0;
  for (const ExprPtr &a : n->args)
    if (a)
      deepest = std::max(deepest, a->depth);
  for (const auto &kw : n->kwargs)
    deepest = std::max(deepest, kw.second->depth);
  n->depth = deepest + 1;
  if (n->depth > kMaxExprDepth)
    fail("expression nested too deeply (more than " +
             std::to_string(kMaxExprDepth) +
             " levels of operators, filters, tests, attributes, subscripts "
             "and calls)",
         n->line);
  return n;
}

bool Parser::isTupleEnd(const Names &extraEnd) const {
  const Token &t = cur();
  if (t.type == Token::Type::VarEnd || t.type == Token::Type::BlockEnd ||
      isOp(t, ")"))
    return true;
  return isAny(t, extraEnd);
}

ExprPtr Parser::parseExpression(bool withCondexpr) {
  return withCondexpr ? parseCondexpr() : parseOr();
}

ExprPtr Parser::parseCondexpr() {
  Nesting nesting(*this);
  int line = this->line();
  ExprPtr expr1 = parseOr();
  while (skipName("if")) {
    ExprPtr expr2 = parseOr();
    ExprPtr expr3 = skipName("else") ? parseCondexpr() : nullptr;
    ExprPtr n = node(Expr::Kind::Cond, line);
    n->args.push_back(std::move(expr2));
    n->args.push_back(std::move(expr1));
    n->args.push_back(std::move(expr3));
    expr1 = sealed(std::move(n));
    line = this->line();
  }
  return expr1;
}

ExprPtr Parser::binary(Expr::Kind kind, int line, ExprPtr a, ExprPtr b,
                       std::string name) {
  ExprPtr n = node(kind, line);
  n->name = std::move(name);
  n->args.push_back(std::move(a));
  n->args.push_back(std::move(b));
  return sealed(std::move(n));
}

ExprPtr Parser::parseOr() {
  int line = this->line();
  ExprPtr left = parseAnd();
  while (skipName("or")) {
    left = binary(Expr::Kind::Or, line, std::move(left), parseAnd());
    line = this->line();
  }
  return left;
}

ExprPtr Parser::parseAnd() {
  int line = this->line();
  ExprPtr left = parseNot();
  while (skipName("and")) {
    left = binary(Expr::Kind::And, line, std::move(left), parseNot());
    line = this->line();
  }
  return left;
}

ExprPtr Parser::parseNot() {
  if (isName(cur(), "not")) {
    Nesting nesting(*this);
    ExprPtr n = node(Expr::Kind::Not, next().line);
    n->args.push_back(parseNot());
    return sealed(std::move(n));
  }
  return parseCompare();
}

ExprPtr Parser::parseCompare() {
  int line = this->line();
  ExprPtr expr = parseMath1();
  ExprPtr cmp;
  while (true) {
    const Token &t = cur();
    std::string op;
    if (t.type == Token::Type::Op &&
        (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" ||
         t.text == ">" || t.text == ">=")) {
      op = t.text;
      next();
    } else if (skipName("in")) {
      op = "in";
    } else if (isName(t, "not") && isName(look(), "in")) {
      next();
      next();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(Expr::Kind::Compare, line);
      cmp->args.push_back(std::move(expr));
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(parseMath1());
    line = this->line();
  }
  if (!cmp)
    return expr;
  cmp->line = line;
  return sealed(std::move(cmp));
}

ExprPtr Parser::parseMath1() {
  int line = this->line();
  ExprPtr left = parseConcat();
  while (isOp(cur(), "+") || isOp(cur(), "-")) {
    std::string op = next().text;
    left = binary(Expr::Kind::Binary, line, std::move(left), parseConcat(), op);
    line = this->line();
  }
  return left;
}

ExprPtr Parser::parseConcat() {
  const int line = this->line();
  ExprPtr first = parseMath2();
  if (!isOp(cur(), "~"))
    return first;
  ExprPtr n = node(Expr::Kind::Concat, line);
  n->args.push_back(std::move(first));
  while (skipOp("~"))
    n->args.push_back(parseMath2());
  return sealed(std::move(n));
}

ExprPtr Parser::parseMath2() {
  int line = this->line();
  ExprPtr left = parsePow();
  while (isOp(cur(), "*") || isOp(cur(), "/") || isOp(cur(), "//") ||
         isOp(cur(), "%")) {
    std::string op = next().text;
    left = binary(Expr::Kind::Binary, line, std::move(left), parsePow(), op);
    line = this->line();
  }
  return left;
}

ExprPtr Parser::parsePow() {
  int line = this->line();
  ExprPtr left = parseUnary(true);
  while (skipOp("**")) {
    left = binary(Expr::Kind::Binary, line, std::move(left), parseUnary(true),
                  "**");
    line = this->line();
  }
  return left;
}

ExprPtr Parser::parseUnary(bool withFilter) {
  Nesting nesting(*this);
  const int line = this->line();
  ExprPtr n;
  if (isOp(cur(), "-") || isOp(cur(), "+")) {
    const bool neg = next().text == "-";
    n = node(neg ? Expr::Kind::Neg : Expr::Kind::Pos, line);
    n->args.push_back(parseUnary(false));
    n = sealed(std::move(n));
  } else {
    n = parsePrimary();
  }
  n = parsePostfix(std::move(n));
  if (withFilter)
    n = parseFilterExpr(std::move(n));
  return n;
}

ExprPtr Parser::constant(Value v, int line) {
  ExprPtr n = node(Expr::Kind::Const, line);
  n->value = std::move(v);
  return n;
}

ExprPtr Parser::parsePrimary() {
  const Token &t = cur();
  switch (t.type) {
  case Token::Type::Name: {
    next();
    if (t.text == "true" || t.text == "True")
      return constant(Value::boolean(true), t.line);
    if (t.text == "false" || t.text == "False")
      return constant(Value::boolean(false), t.line);
    if (t.text == "none" || t.text == "None")
      return constant(Value::none(), t.line);
    ExprPtr n = node(Expr::Kind::Name, t.line);
    n->name = t.text;
    return n;
  }
  case Token::Type::String: {
    const int line = t.line;
    std::string s;
    while (cur().type == Token::Type::String)
      s += next().text;
    return constant(Value::string(std::move(s)), line);
  }
  case Token::Type::Integer:
    next();
    return constant(Value::integer(t.i), t.line);
  case Token::Type::Float:
    next();
    return constant(Value::real(t.f), t.line);
  default:
    break;
  }
  if (isOp(t, "(")) {
    next();
    ExprPtr n = parseTuple(false, true, {}, true);
    expectOp(")");
    return n;
  }
  if (isOp(t, "["))
    return parseList();
  if (isOp(t, "{"))
    return parseDict();
  fail("unexpected '" + describe(t) + "'");
}

ExprPtr Parser::parseTuple(bool simplified, bool withCondexpr,
                           const Names &extraEnd, bool explicitParentheses) {
  int line = this->line();
  std::vector<ExprPtr> args;
  bool isTuple = false;
  while (true) {
    if (!args.empty())
      expectOp(",");
    if (isTupleEnd(extraEnd))
      break;
    args.push_back(simplified ? parsePrimary() : parseExpression(withCondexpr));
    if (isOp(cur(), ","))
      isTuple = true;
    else
      break;
    line = this->line();
  }
  if (!isTuple) {
    if (!args.empty())
      return std::move(args[0]);
    if (!explicitParentheses)
      fail("expected an expression, got '" + describe(cur()) + "'");
  }
  ExprPtr n = node(Expr::Kind::Tuple, line);
  n->args = std::move(args);
  return sealed(std::move(n));
}

ExprPtr Parser::parseList() {
  ExprPtr n = node(Expr::Kind::List, expectOp("[").line);
  while (!isOp(cur(), "]")) {
    if (!n->args.empty())
      expectOp(",");
    if (isOp(cur(), "]"))
      break;
    n->args.push_back(parseExpression(true));
  }
  expectOp("]");
  return sealed(std::move(n));
}

ExprPtr Parser::parseDict() {
  ExprPtr n = node(Expr::Kind::Dict, expectOp("{").line);
  while (!isOp(cur(), "}")) {
    if (!n->args.empty())
      expectOp(",");
    if (isOp(cur(), "}"))
      break;
    n->args.push_back(parseExpression(true));
    expectOp(":");
    n->args.push_back(parseExpression(true));
  }
  expectOp("}");
  return sealed(std::move(n));
}

ExprPtr Parser::parsePostfix(ExprPtr n) {
  while (true) {
    if (isOp(cur(), ".") || isOp(cur(), "["))
      n = parseSubscript(std::move(n));
    else if (isOp(cur(), "("))
      n = parseCall(std::move(n));
    else
      return n;
  }
}

ExprPtr Parser::parseFilterExpr(ExprPtr n) {
  while (true) {
    if (isOp(cur(), "|"))
      n = parseFilter(std::move(n), false);
    else if (isName(cur(), "is"))
      n = parseTest(std::move(n));
    else if (isOp(cur(), "("))
      n = parseCall(std::move(n));
    else
      return n;
  }
}

ExprPtr Parser::parseSubscript(ExprPtr subject) {
  const Token &t = next();
  if (t.text == ".") {
    const Token &attr = cur();
    if (attr.type == Token::Type::Name) {
      next();
      ExprPtr n = node(Expr::Kind::GetAttr, t.line);
      n->name = attr.text;
      n->args.push_back(std::move(subject));
      return sealed(std::move(n));
    }
    if (attr.type != Token::Type::Integer)
      fail("expected name or number");
    next();
    ExprPtr n = node(Expr::Kind::GetItem, t.line);
    n->args.push_back(std::move(subject));
    n->args.push_back(constant(Value::integer(attr.i), attr.line));
    return sealed(std::move(n));
  }
  std::vector<ExprPtr> args;
  while (!isOp(cur(), "]")) {
    if (!args.empty())
      expectOp(",");
    args.push_back(parseSubscribed());
  }
  expectOp("]");
  ExprPtr n = node(Expr::Kind::GetItem, t.line);
  n->args.push_back(std::move(subject));
  if (args.size() == 1) {
    n->args.push_back(std::move(args[0]));
  } else {
    ExprPtr tuple = node(Expr::Kind::Tuple, t.line);
    tuple->args = std::move(args);
    n->args.push_back(sealed(std::move(tuple)));
  }
  return sealed(std::move(n));
}

ExprPtr Parser::parseSubscribed() {
  const int line = this->line();
  ExprPtr start;
  if (!skipOp(":")) {
    ExprPtr e = parseExpression(true);
    if (!isOp(cur(), ":"))
      return e;
    next();
    start = std::move(e);
  }
  ExprPtr n = node(Expr::Kind::Slice, line);
  n->args.push_back(std::move(start));
  if (isOp(cur(), ":") || isOp(cur(), "]") || isOp(cur(), ","))
    n->args.push_back(nullptr);
  else
    n->args.push_back(parseExpression(true));
  if (skipOp(":") && !isOp(cur(), "]") && !isOp(cur(), ","))
    n->args.push_back(parseExpression(true));
  else
    n->args.push_back(nullptr);
  return sealed(std::move(n));
}

void Parser::parseCallArgs(Expr &n) {
  expectOp("(");
  bool requireComma = false;
  while (!isOp(cur(), ")")) {
    if (requireComma) {
      expectOp(",");
      if (isOp(cur(), ")"))
        break;
    }
    if (isOp(cur(), "*") || isOp(cur(), "**"))
      fail("*args and **kwargs in calls are not supported");
    if (cur().type == Token::Type::Name && isOp(look(), "=")) {
      std::string key = next().text;
      next();
      n.kwargs.emplace_back(std::move(key), parseExpression(true));
    } else {
      if (!n.kwargs.empty())
        fail("invalid syntax for function call expression");
      n.args.push_back(parseExpression(true));
    }
    requireComma = true;
  }
  expectOp(")");
}

ExprPtr Parser::parseCall(ExprPtr callee) {
  ExprPtr n = node(Expr::Kind::Call, line());
  n->args.push_back(std::move(callee));
  parseCallArgs(*n);
  return sealed(std::move(n));
}

ExprPtr Parser::parseFilter(ExprPtr subject, bool startInline) {
  while (isOp(cur(), "|") || startInline) {
    if (!startInline)
      next();
    const Token &name = expect(Token::Type::Name, "name");
    ExprPtr n = node(Expr::Kind::Filter, name.line);
    n->name = name.text;
    while (skipOp("."))
      n->name += "." + expect(Token::Type::Name, "name").text;
    n->args.push_back(std::move(subject));
    if (isOp(cur(), "("))
      parseCallArgs(*n);
    subject = sealed(std::move(n));
    startInline = false;
  }
  return subject;
}

ExprPtr Parser::parseTest(ExprPtr subject) {
  const int line = next().line;
  const bool negated = skipName("not");
  ExprPtr n = node(Expr::Kind::Test, line);
  n->name = expect(Token::Type::Name, "name").text;
  while (skipOp("."))
    n->name += "." + expect(Token::Type::Name, "name").text;
  n->args.push_back(std::move(subject));
  const Token &t = cur();
  if (isOp(t, "(")) {
    parseCallArgs(*n);
  } else if ((t.type == Token::Type::Name || t.type == Token::Type::String ||
              t.type == Token::Type::Integer || t.type == Token::Type::Float ||
              isOp(t, "(") || isOp(t, "[") || isOp(t, "{")) &&
             !isName(t, "else") && !isName(t, "or") && !isName(t, "and")) {
    if (isName(t, "is"))
      fail("You cannot chain multiple tests with is");
    n->args.push_back(parsePostfix(parsePrimary()));
  }
  n = sealed(std::move(n));
  if (!negated)
    return n;
  ExprPtr notNode = node(Expr::Kind::Not, line);
  notNode->args.push_back(std::move(n));
  return sealed(std::move(notNode));
}

} // namespace nf::jinja
