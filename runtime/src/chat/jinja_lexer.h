// Private to the parser of the Jinja renderer (jinja_lexer.cpp,
// jinja_parser.cpp, jinja_parser_expr.cpp): the tokens of a template, and
// the lexer that makes them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nf::jinja {

struct Token {
  enum class Type {
    Data,
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name,
    String,
    Integer,
    Float,
    Op,
    Eof
  };
  Type type;
  int line;
  std::string text; // data, name, string value or operator
  int64_t i = 0;
  double f = 0;
};

/// The tokens of `source` (valid UTF-8) as jinja2's lexer makes them with
/// trim_blocks and lstrip_blocks, ending with an Eof token; throws Error
/// (with the line) on a lexical error.
std::vector<Token> lexTemplate(std::string_view source);

} // namespace nf::jinja
