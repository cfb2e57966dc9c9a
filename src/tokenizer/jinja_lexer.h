// Splits a template into text and the tokens inside its {{ }} / {% %} tags, applying Jinja2's
// whitespace control as Hugging Face configures it (trim_blocks, lstrip_blocks, no trailing newline).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace petrel::jinja {

enum class Tok { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;  // Text content, name, operator, or decoded string literal
  int line;
  int64_t integer = 0;
  double number = 0;
};

std::vector<Token> lex(std::string_view source);

}  // namespace petrel::jinja
