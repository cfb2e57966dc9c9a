// JSON-schema "pattern" regular expressions (ECMA-262 syntax), a subset: literals, ".", classes
// ([a-z], [^"], \d \w \s and their negations), groups ((...), (?:...)), alternation, the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms too; counts up to 1000), ^ at the start and $ at
// the end. Without ^ or $ the match may have any text before or after, as "pattern" means.
// Backreferences, lookaround, \b, \p{...} and named groups are refused.
#pragma once
#include <string_view>

#include "grammar/expr.h"
#include "grammar/json_text.h"

namespace petrel::grammar {

constexpr int kMaxPatternCount = 1000;

// The characters of a string (without quotes) that matches `pattern`, spelled as said (a
// character raw text cannot hold is never matched). Throws petrel::Error naming what is not
// supported.
Expr pattern_text(std::string_view pattern, Spelling spelling);

}  // namespace petrel::grammar
