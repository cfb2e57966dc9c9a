#include "grammar/number_range.h"

#include <algorithm>
#include <string>

namespace petrel::grammar {
namespace {

Expr digits(char lo, char hi) { return byte_range(uint8_t(lo), uint8_t(hi)); }

// Digit strings of equal length from a to b (a <= b), leading zeros allowed.
Expr same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return empty();
  // Every string of the length: one repeat (without it the recursion below doubles per digit).
  if (a.find_first_not_of('0') == std::string::npos && b.find_first_not_of('9') == std::string::npos)
    return repeat(digits('0', '9'), int(a.size()), int(a.size()));
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) return seq({digits(a[0], a[0]), same_length(ra, rb)});
  std::vector<Expr> options;
  options.push_back(seq({digits(a[0], a[0]), same_length(ra, std::string(ra.size(), '9'))}));
  if (b[0] - a[0] > 1)
    options.push_back(seq({digits(char(a[0] + 1), char(b[0] - 1)), repeat(digits('0', '9'), int(ra.size()), int(ra.size()))}));
  options.push_back(seq({digits(b[0], b[0]), same_length(std::string(rb.size(), '0'), rb)}));
  return alt(std::move(options));
}

uint64_t pow10(size_t n) {
  uint64_t p = 1;
  while (n--) p *= 10;
  return p;
}

// Natural numbers in [lo, hi], hi missing for no bound.
Expr naturals(uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<Expr> options;
  const size_t lo_len = std::to_string(lo).size();
  const size_t hi_len = hi ? std::to_string(*hi).size() : std::max(lo_len, size_t(kMaxFreeDigits));
  for (size_t len = lo_len; len <= hi_len; ++len) {
    const uint64_t first = std::max<uint64_t>(lo, len == 1 ? 0 : pow10(len - 1));
    const uint64_t last = hi && len == hi_len ? *hi : pow10(len) - 1;
    if (first <= last) options.push_back(same_length(std::to_string(first), std::to_string(last)));
  }
  return alt(std::move(options));
}

}  // namespace

Expr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return alt({});
  std::vector<Expr> options;
  if (!hi || *hi >= 0) {  // the non-negative part
    const uint64_t from = lo && *lo > 0 ? uint64_t(*lo) : 0;
    options.push_back(naturals(from, hi ? std::optional<uint64_t>(uint64_t(*hi)) : std::nullopt));
  }
  if (!lo || *lo < 0) {  // the negative part, as "-" and its magnitude
    const uint64_t from = hi && *hi < 0 ? uint64_t(-(*hi + 1)) + 1 : 1;
    std::optional<uint64_t> to;
    if (lo) to = uint64_t(-(*lo + 1)) + 1;
    options.push_back(seq({literal("-"), naturals(from, to)}));
  }
  return alt(std::move(options));
}

}  // namespace petrel::grammar
