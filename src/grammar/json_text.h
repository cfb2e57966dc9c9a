// The JSON text of values a schema leaves open: characters of strings (as UTF-8 or escapes),
// strings with length bounds, numbers with bounds, the whitespace the grammar allows.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "grammar/expr.h"

namespace petrel::grammar {

// Code point ranges, inclusive.
using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// How a string's characters are written: inside JSON quotes, or raw (the XML tool-call form's
// string parameters). Raw text has no '<' (so that it cannot close its tag) and no control
// characters but tab and newline.
enum class Spelling { Json, Raw };

// Every code point a JSON string may hold (surrogates excluded).
CodeRanges all_chars();
// The code points of `set` not in `minus`.
CodeRanges subtract(const CodeRanges& set, const CodeRanges& minus);
// One character of `set`: in JSON, printable characters as UTF-8, '"' and '\' and control
// characters as their escapes (\", \\, \n, \u0001, ...); raw, as UTF-8 (characters raw text
// cannot hold are left out).
Expr char_text(const CodeRanges& set, Spelling spelling);
// Any one character of a string, in any spelling (in JSON escapes such as \u00e9 included).
Expr any_char(Spelling spelling);
// A quoted string of min..max characters (max -1: no bound).
Expr string_text(int min, int max);
// Between tokens: nothing or one space. Output stays on one line and whitespace cannot run on.
Expr space();

// Most fraction digits a number may have (no bound would let digits run on).
constexpr int kMaxFractionDigits = 12;

// A JSON number; with bounds, one in [lo, hi] (exclusive where said). Bounded numbers are an
// integer in range, or an integer part I and a fraction such that every I.fraction is in range.
struct NumberBounds {
  std::optional<double> lo, hi;
  bool lo_exclusive = false, hi_exclusive = false;
};
Expr number_text(const NumberBounds& b, bool integer);

}  // namespace petrel::grammar
