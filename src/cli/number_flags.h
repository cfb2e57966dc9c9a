// Checks for numeric flags whose messages name the accepted range and give the value as typed:
// "--port: expected an integer from 0 to 65535, found 70000". CLI11's own (CLI::Range,
// PositiveNumber) print a bound of numeric_limits<double>::max in full, 309 digits, and a value
// beyond the option's type fails as "Could not convert" without a range. These run on the text,
// before CLI11 converts it.
#pragma once
#include <CLI/CLI.hpp>
#include <limits>
#include <type_traits>

namespace petrel::cli {

namespace detail {
// Bounds as given, and whether each is the option type's own limit (named only when crossed).
struct IntegerBounds {
  __int128 lo, hi;
  bool lo_is_type_min, hi_is_type_max;
};
struct NumberBounds {
  double lo, hi;
  bool lo_open;  // lo itself is refused
  bool lo_is_type_min, hi_is_type_max;
};
CLI::Validator integer_check(const IntegerBounds& b);
CLI::Validator number_check(const NumberBounds& b);
}  // namespace detail

// An integer option of type T in [lo, hi] (hi: T's largest value unless given), decimal digits only.
template <class T>
CLI::Validator integer_in(T lo, T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>);
  // An unsigned type's 0 is still named: "an integer >= 0".
  return detail::integer_check({__int128(lo), __int128(hi), std::is_signed_v<T> && lo == std::numeric_limits<T>::min(),
                                hi == std::numeric_limits<T>::max()});
}

// A finite floating-point option of type T in [lo, hi] (hi: T's largest value unless given).
template <class T>
CLI::Validator number_in(T lo, T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_floating_point_v<T>);
  return detail::number_check(
      {double(lo), double(hi), false, lo == std::numeric_limits<T>::lowest(), hi == std::numeric_limits<T>::max()});
}

// A finite floating-point option of type T above lo (at most T's largest value).
template <class T>
CLI::Validator number_above(T lo) {
  static_assert(std::is_floating_point_v<T>);
  return detail::number_check({double(lo), double(std::numeric_limits<T>::max()), true, false, true});
}

}  // namespace petrel::cli
