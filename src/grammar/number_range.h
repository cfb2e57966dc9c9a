// Decimal integers between two bounds as an Expr that matches exactly those numbers, written as
// JSON writes them (no leading zeros, no "-0").
#pragma once
#include <cstdint>
#include <optional>

#include "grammar/expr.h"

namespace petrel::grammar {

// Most digits an integer without an upper bound may have: an unbounded run of digits would let a
// model write digits forever.
constexpr int kMaxFreeDigits = 16;

// Integers in [lo, hi]; a missing bound is open (kMaxFreeDigits digits at most on that side).
// Matches nothing when lo > hi.
Expr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace petrel::grammar
