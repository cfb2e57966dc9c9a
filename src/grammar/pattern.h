// JSON-schema "pattern" regular expressions (ECMA-262 syntax), a subset: literals, ".", classes
// ([a-z], [^"], \d \w \s and their negations), groups ((...), (?:...)), alternation, the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms too; counts up to 1000), ^ at the start and $ at
// the end. Without ^ or $ the match may have any text before or after, as "pattern" means.
// Backreferences, lookaround, \b, \p{...} and named groups are refused.
#pragma once
#include <string_view>

#include "grammar/expr.h"

namespace petrel::grammar {

constexpr int kMaxPatternCount = 1000;

// The content of a JSON string (without quotes) whose value matches `pattern`, as JSON text.
// Throws petrel::Error naming what is not supported.
Expr pattern_text(std::string_view pattern);

}  // namespace petrel::grammar
