#include "cli/number_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace petrel::cli::detail {
namespace {

// Beyond every option type (|v| > 2^64) a value needs no exact size: it is out of range.
constexpr __int128 kHuge = __int128(1) << 100;

std::string to_text(__int128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  unsigned __int128 u = negative ? -(unsigned __int128)v : (unsigned __int128)v;
  std::string digits;
  for (; u > 0; u /= 10) digits.insert(digits.begin(), char('0' + int(u % 10)));
  return negative ? "-" + digits : digits;
}

std::string to_text(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", v);
  return buffer;
}

// The value of an optionally signed run of decimal digits, saturated at +-kHuge; nullopt for
// anything else.
std::optional<__int128> parse_integer(const std::string& text) {
  size_t i = text.empty() || (text[0] != '-' && text[0] != '+') ? 0 : 1;
  if (i == text.size()) return std::nullopt;
  __int128 v = 0;
  for (; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    v = std::min(v * 10 + (text[i] - '0'), kHuge);
  }
  return text[0] == '-' ? -v : v;
}

// "an integer from 0 to 65535", "an integer >= 1", "a number > 0", "a number".
template <class Bound>
std::string range_text(const char* kind, Bound lo, Bound hi, bool lo_open, bool lo_is_type_min, bool hi_is_type_max) {
  const std::string low = (lo_open ? " > " : " >= ") + to_text(lo);
  if (lo_is_type_min && hi_is_type_max) return kind;
  if (hi_is_type_max) return kind + low;
  if (lo_is_type_min) return kind + std::string(" <= ") + to_text(hi);
  return std::string(kind) + " from " + to_text(lo) + " to " + to_text(hi);
}

// The error for a value outside the range; the type's own limit is named when it was crossed.
template <class Bound>
std::string out_of_range(const std::string& range, const std::string& input, Bound v, Bound lo, Bound hi,
                         bool lo_is_type_min, bool hi_is_type_max) {
  std::string note;
  if (v > hi && hi_is_type_max) note = " (the largest accepted is " + to_text(hi) + ")";
  if (v < lo && lo_is_type_min) note = " (the smallest accepted is " + to_text(lo) + ")";
  return "expected " + range + ", found " + input + note;
}

// The range in --help, after the type: "0..65535", ">=1", ">0", "" when only the type bounds it.
template <class Bound>
std::string help_text(Bound lo, Bound hi, bool lo_open, bool lo_is_type_min, bool hi_is_type_max) {
  if (lo_is_type_min && hi_is_type_max) return "";
  if (hi_is_type_max) return (lo_open ? ">" : ">=") + to_text(lo);
  if (lo_is_type_min) return "<=" + to_text(hi);
  return to_text(lo) + ".." + to_text(hi);
}

}  // namespace

CLI::Validator integer_check(const IntegerBounds& b) {
  const std::string range = range_text("an integer", b.lo, b.hi, false, b.lo_is_type_min, b.hi_is_type_max);
  return CLI::Validator(
      [b, range](std::string& input) -> std::string {
        const std::optional<__int128> v = parse_integer(input);
        if (!v) return "expected " + range + ", found '" + input + "'";
        if (*v < b.lo || *v > b.hi) return out_of_range(range, input, *v, b.lo, b.hi, b.lo_is_type_min, b.hi_is_type_max);
        return "";
      },
      help_text(b.lo, b.hi, false, b.lo_is_type_min, b.hi_is_type_max));
}

CLI::Validator number_check(const NumberBounds& b) {
  const std::string range = range_text("a number", b.lo, b.hi, b.lo_open, b.lo_is_type_min, b.hi_is_type_max);
  return CLI::Validator(
      [b, range](std::string& input) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(input.c_str(), &end);
        if (input.empty() || *end != '\0' || std::isnan(v)) return "expected " + range + ", found '" + input + "'";
        if (std::isinf(v) || v < b.lo || v > b.hi || (b.lo_open && v == b.lo))
          return out_of_range(range, input, v, b.lo, b.hi, b.lo_is_type_min, b.hi_is_type_max);
        return "";
      },
      help_text(b.lo, b.hi, b.lo_open, b.lo_is_type_min, b.hi_is_type_max));
}

}  // namespace petrel::cli::detail
