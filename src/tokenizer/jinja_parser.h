// Parses the tokens of a template into statements; unsupported constructs are errors naming
// the construct and its line.
#pragma once
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace petrel::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace petrel::jinja
