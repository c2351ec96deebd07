// The Jinja parser's entry point (parseTemplate), its messages about
// tokens, and its statements: the tags of jinja2's parser.py that chat
// templates use (for, if, set, macro, print, with, filter, generation,
// break, continue). Expressions are in jinja_parser_expr.cpp.
#include "chat/jinja_parser.h"

#include <memory>

namespace nf::jinja {

namespace {

bool referencesName(const Body &body, std::string_view name);

bool referencesName(const Expr *e, std::string_view name) {
  if (!e)
    return false;
  if (e->kind == Expr::Kind::Name && e->name == name)
    return true;
  for (const ExprPtr &a : e->args)
    if (referencesName(a.get(), name))
      return true;
  for (const auto &kw : e->kwargs)
    if (referencesName(kw.second.get(), name))
      return true;
  return false;
}

bool referencesName(const Body &body, std::string_view name) {
  for (const StmtPtr &s : body) {
    if (referencesName(s->expr.get(), name) ||
        referencesName(s->filter.get(), name) ||
        referencesName(s->body, name) || referencesName(s->elseBody, name))
      return true;
    for (const ExprPtr &e : s->exprs)
      if (referencesName(e.get(), name))
        return true;
    for (const ExprPtr &e : s->defaults)
      if (referencesName(e.get(), name))
        return true;
    for (const auto &[cond, b] : s->branches)
      if (referencesName(cond.get(), name) || referencesName(b, name))
        return true;
    for (const auto &a : s->assigns)
      if (referencesName(a.second.get(), name))
        return true;
  }
  return false;
}

} // namespace

std::string describe(const Token &t) {
  switch (t.type) {
  case Token::Type::Data:
    return "template data";
  case Token::Type::VarBegin:
    return "begin of print statement";
  case Token::Type::VarEnd:
    return "end of print statement";
  case Token::Type::BlockBegin:
    return "begin of statement block";
  case Token::Type::BlockEnd:
    return "end of statement block";
  case Token::Type::Name:
  case Token::Type::Op:
    return t.text;
  case Token::Type::String:
    return "string";
  case Token::Type::Integer:
    return "integer";
  case Token::Type::Float:
    return "float";
  case Token::Type::Eof:
    return "end of template";
  }
  return "token";
}

Body Parser::subparse(const Names &endTokens) {
  Body body;
  while (cur().type != Token::Type::Eof) {
    const Token &t = cur();
    if (t.type == Token::Type::Data) {
      auto s = std::make_unique<Stmt>(Stmt::Kind::Text, t.line);
      s->text = t.text;
      body.push_back(std::move(s));
      next();
    } else if (t.type == Token::Type::VarBegin) {
      auto s = std::make_unique<Stmt>(Stmt::Kind::Print, t.line);
      next();
      s->exprs.push_back(parseTuple(false, true, {}, false));
      expect(Token::Type::VarEnd, "end of print statement");
      body.push_back(std::move(s));
    } else if (t.type == Token::Type::BlockBegin) {
      next();
      if (!endTokens.empty() && isAny(cur(), endTokens))
        return body;
      body.push_back(parseStatement());
      expect(Token::Type::BlockEnd, "end of statement block");
    } else {
      fail("unexpected " + describe(t));
    }
  }
  return body;
}

[[noreturn]] void Parser::failEof(const Names &endTokens) {
  std::string expected;
  for (size_t k = 0; k < endTokens.size(); ++k)
    expected += (k ? " or '" : "'") + std::string(endTokens[k]) + "'";
  fail("unexpected end of template: Jinja was looking for " + expected +
       (openTags_.empty()
            ? std::string()
            : "; the innermost block that needs to be closed is '" +
                  openTags_.back() + "'"));
}

Body Parser::parseStatements(const Names &endTokens, bool dropNeedle) {
  skipOp(":");
  expect(Token::Type::BlockEnd, "end of statement block");
  Body body = subparse(endTokens);
  if (cur().type == Token::Type::Eof)
    failEof(endTokens);
  if (dropNeedle)
    next();
  return body;
}

StmtPtr Parser::parseStatement() {
  Nesting nesting(*this);
  const Token &t = cur();
  if (t.type != Token::Type::Name)
    fail("tag name expected");
  const std::string tag = t.text;
  openTags_.push_back(tag);
  StmtPtr s;
  if (tag == "for")
    s = parseFor();
  else if (tag == "if")
    s = parseIf();
  else if (tag == "set")
    s = parseSet();
  else if (tag == "macro")
    s = parseMacro();
  else if (tag == "print")
    s = parsePrint();
  else if (tag == "with")
    s = parseWith();
  else if (tag == "filter")
    s = parseFilterBlock();
  else if (tag == "generation")
    s = parseGeneration();
  else if (tag == "break" || tag == "continue")
    s = parseLoopControl();
  else if (tag == "block" || tag == "extends" || tag == "include" ||
           tag == "import" || tag == "from" || tag == "autoescape" ||
           tag == "call")
    fail("unsupported tag '" + tag + "'");
  else
    fail("unknown tag '" + tag + "'");
  openTags_.pop_back();
  return s;
}

Target Parser::parseAssignTarget(const Names &extraEnd, bool withNamespace) {
  Target target;
  while (true) {
    if (!target.names.empty())
      expectOp(",");
    if (isTupleEnd(extraEnd)) {
      if (target.names.empty())
        fail("expected an assignment target, got '" + describe(cur()) + "'");
      break;
    }
    const Token &t = cur();
    if (t.type != Token::Type::Name)
      fail(isOp(t, "(") ? "unsupported assignment target (nested tuple)"
                        : "can't assign to '" + describe(t) + "'");
    if (t.text == "true" || t.text == "false" || t.text == "True" ||
        t.text == "False" || t.text == "none" || t.text == "None")
      fail("can't assign to 'const'");
    target.names.push_back(t.text);
    next();
    if (withNamespace && isOp(cur(), ".")) {
      next();
      target.attr = expect(Token::Type::Name, "name").text;
      if (target.names.size() > 1 || isOp(cur(), ","))
        fail("unsupported assignment target (namespace attribute in a "
             "tuple)");
      break;
    }
    if (isOp(cur(), ","))
      target.tuple = true;
    else
      break;
  }
  return target;
}

StmtPtr Parser::parseFor() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::For, expectName("for").line);
  s->target = parseAssignTarget({"in"}, false);
  expectName("in");
  s->expr = parseTuple(false, false, {"recursive"}, false);
  if (skipName("if"))
    s->filter = parseExpression(true);
  if (isName(cur(), "recursive"))
    fail("recursive loops are not supported");
  ++loopDepth_;
  s->body = parseStatements({"endfor", "else"}, false);
  --loopDepth_;
  if (next().text != "endfor")
    s->elseBody = parseStatements({"endfor"}, true);
  s->usesLoop = referencesName(s->body, "loop");
  return s;
}

StmtPtr Parser::parseIf() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::If, expectName("if").line);
  while (true) {
    ExprPtr cond = parseTuple(false, false, {}, false);
    Body body = parseStatements({"elif", "else", "endif"}, false);
    s->branches.emplace_back(std::move(cond), std::move(body));
    const Token &t = next();
    if (t.text == "elif")
      continue;
    if (t.text == "else")
      s->branches.emplace_back(nullptr, parseStatements({"endif"}, true));
    break;
  }
  return s;
}

StmtPtr Parser::parseSet() {
  const int line = next().line;
  Target target = parseAssignTarget({}, true);
  if (skipOp("=")) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
    s->target = std::move(target);
    s->expr = parseTuple(false, true, {}, false);
    return s;
  }
  auto s = std::make_unique<Stmt>(Stmt::Kind::SetBlock, line);
  s->target = std::move(target);
  if (s->target.tuple || !s->target.attr.empty())
    fail("a {% set %} block assigns one name");
  s->filter = parseFilter(nullptr, false);
  s->body = parseStatements({"endset"}, true);
  return s;
}

StmtPtr Parser::parseMacro() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::Macro, next().line);
  s->name = expect(Token::Type::Name, "name").text;
  expectOp("(");
  while (!isOp(cur(), ")")) {
    if (!s->params.empty())
      expectOp(",");
    s->params.push_back(expect(Token::Type::Name, "name").text);
    if (skipOp("="))
      s->defaults.push_back(parseExpression(true));
    else if (!s->defaults.empty())
      fail("non-default argument follows default argument");
  }
  expectOp(")");
  const int loops = loopDepth_;
  loopDepth_ = 0;
  s->body = parseStatements({"endmacro"}, true);
  loopDepth_ = loops;
  s->usesVarargs = referencesName(s->body, "varargs");
  s->usesKwargs = referencesName(s->body, "kwargs");
  return s;
}

StmtPtr Parser::parsePrint() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::Print, next().line);
  while (cur().type != Token::Type::BlockEnd) {
    if (!s->exprs.empty())
      expectOp(",");
    s->exprs.push_back(parseExpression(true));
  }
  return s;
}

StmtPtr Parser::parseWith() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::With, next().line);
  while (cur().type != Token::Type::BlockEnd) {
    if (!s->assigns.empty())
      expectOp(",");
    Target target = parseAssignTarget({}, false);
    expectOp("=");
    s->assigns.emplace_back(std::move(target), parseExpression(true));
  }
  s->body = parseStatements({"endwith"}, true);
  return s;
}

StmtPtr Parser::parseFilterBlock() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::FilterBlock, next().line);
  s->filter = parseFilter(nullptr, true);
  s->body = parseStatements({"endfilter"}, true);
  return s;
}

StmtPtr Parser::parseGeneration() {
  auto s = std::make_unique<Stmt>(Stmt::Kind::Block, next().line);
  s->body = parseStatements({"endgeneration"}, true);
  return s;
}

StmtPtr Parser::parseLoopControl() {
  const Token &t = next();
  if (loopDepth_ == 0)
    fail("'" + t.text + "' outside of a loop", t.line);
  return std::make_unique<Stmt>(
      t.text == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, t.line);
}

std::unique_ptr<Program> parseTemplate(std::string_view source) {
  if (!validUtf8(source))
    throw Error("the template is not valid UTF-8", 1);
  auto program = std::make_unique<Program>();
  Parser parser(lexTemplate(source));
  program->body = parser.parseTemplate();
  return program;
}

} // namespace nf::jinja
