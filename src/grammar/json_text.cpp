#include "grammar/json_text.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "grammar/number_range.h"

namespace petrel::grammar {
namespace {

constexpr uint32_t kMaxCode = 0x10FFFF;
constexpr double kMaxBound = 1e15;  // bounds beyond this are not exact integers in a double's reach

// The UTF-8 of code points [lo, hi], which must encode to the same length and differ only in
// their last bytes: one byte range per position.
Expr utf8_block(uint32_t lo, uint32_t hi, int len) {
  std::vector<Expr> parts;
  for (int i = 0; i < len; ++i) {
    const int shift = 6 * (len - 1 - i);
    const auto byte = [&](uint32_t cp) -> uint8_t {
      if (i == 0) return uint8_t(len == 1 ? cp : (0xF00u >> len) | (cp >> shift));
      return uint8_t(0x80 | ((cp >> shift) & 0x3F));
    };
    parts.push_back(byte_range(byte(lo), byte(hi)));
  }
  return seq(std::move(parts));
}

// Splits [lo, hi] (one encoded length) until each piece is a utf8_block (as RE2 does).
void utf8_ranges(uint32_t lo, uint32_t hi, int len, std::vector<Expr>& out) {
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_ranges(lo, lo | m, len, out);
      utf8_ranges((lo | m) + 1, hi, len, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_ranges(lo, (hi & ~m) - 1, len, out);
      utf8_ranges(hi & ~m, hi, len, out);
      return;
    }
  }
  out.push_back(utf8_block(lo, hi, len));
}

std::string escape_of(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
  }
  static const char* hex = "0123456789abcdef";
  std::string out = "\\u00";
  out += hex[cp >> 4];
  out += hex[cp & 15];
  return out;
}

Expr digits(int min, int max) { return repeat(byte_range('0', '9'), min, max); }

int64_t bound(double v, const char* what) {
  check(std::fabs(v) <= kMaxBound, std::string(what) + ": bounds beyond +-1e15 are not supported, found " +
                                       std::to_string(v));
  return int64_t(v);
}

// An integer part in [lo, hi] (either may be open) followed by a fraction.
Expr decimals(std::optional<int64_t> lo, std::optional<int64_t> hi, bool negative) {
  lo = std::max<int64_t>(lo.value_or(0), 0);
  if (hi && *hi < *lo) return alt({});
  const Expr fraction = seq({literal("."), digits(1, kMaxFractionDigits)});
  return seq({negative ? literal("-") : empty(), integer_range(lo, hi), fraction});
}

// I.f with a fraction that is not zero: above I, for an exclusive integer bound at I.
Expr above(int64_t i, bool negative) {
  const Expr fraction = seq({literal("."), digits(0, kMaxFractionDigits - 1), byte_range('1', '9')});
  std::string whole = negative ? "-" : "";
  whole += std::to_string(i);
  return seq({literal(whole), fraction});
}

}  // namespace

CodeRanges all_chars() { return {{0, 0xD7FF}, {0xE000, kMaxCode}}; }

CodeRanges subtract(const CodeRanges& set, const CodeRanges& minus) {
  CodeRanges out = set;
  for (const auto& [mlo, mhi] : minus) {
    CodeRanges next;
    for (const auto& [lo, hi] : out) {
      if (mhi < lo || mlo > hi) {
        next.push_back({lo, hi});
        continue;
      }
      if (lo < mlo) next.push_back({lo, mlo - 1});
      if (hi > mhi) next.push_back({mhi + 1, hi});
    }
    out = std::move(next);
  }
  return out;
}

Expr char_text(const CodeRanges& set, Spelling spelling) {
  std::vector<Expr> options;
  const CodeRanges escaped = spelling == Spelling::Json ? CodeRanges{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}
                                                        : CodeRanges{{0, 8}, {0x0B, 0x1F}, {'<', '<'}};
  if (spelling == Spelling::Json)
    for (const auto& [lo, hi] : set)
      for (const auto& [elo, ehi] : escaped)
        for (uint32_t cp = std::max(lo, elo); cp <= std::min(hi, ehi); ++cp) options.push_back(literal(escape_of(cp)));
  const CodeRanges plain = subtract(subtract(set, escaped), {{0xD800, 0xDFFF}, {kMaxCode + 1, 0xFFFFFFFF}});
  const uint32_t ends[] = {0x7F, 0x7FF, 0xFFFF, kMaxCode};
  for (const auto& [lo, hi] : plain) {
    uint32_t start = lo;
    for (int len = 1; len <= 4 && start <= hi; ++len) {
      if (start > ends[len - 1]) continue;
      const uint32_t stop = std::min(hi, ends[len - 1]);
      utf8_ranges(start, stop, len, options);
      start = stop + 1;
    }
  }
  return alt(std::move(options));
}

Expr any_char(Spelling spelling) {
  if (spelling == Spelling::Raw) return char_text(all_chars(), Spelling::Raw);
  const Expr hex = byte_set(range_set('0', '9') | range_set('a', 'f') | range_set('A', 'F'));
  const Expr hex_no_surrogate = byte_set(range_set('0', '9') | range_set('a', 'c') | range_set('A', 'C') |
                                         range_set('e', 'f') | range_set('E', 'F'));
  // \u escapes of a lone surrogate (\ud800-\udfff) are left out: strict parsers refuse them.
  const Expr unicode = seq({literal("\\u"), alt({seq({hex_no_surrogate, hex, hex, hex}),
                                                 seq({byte_set(range_set('d', 'd') | range_set('D', 'D')),
                                                      byte_range('0', '7'), hex, hex})})});
  const Expr short_escape = seq({literal("\\"), byte_set(range_set('"', '"') | range_set('\\', '\\') |
                                                        range_set('/', '/') | range_set('b', 'b') |
                                                        range_set('f', 'f') | range_set('n', 'n') |
                                                        range_set('r', 'r') | range_set('t', 't'))});
  return alt({char_text(subtract(all_chars(), {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}), Spelling::Json), short_escape, unicode});
}

Expr string_text(int min, int max) { return seq({literal("\""), repeat(any_char(Spelling::Json), min, max), literal("\"")}); }

Expr space() { return optional(literal(" ")); }

Expr number_text(const NumberBounds& b, bool integer) {
  if (!b.lo && !b.hi) {
    const Expr whole = integer_range(std::nullopt, std::nullopt);
    if (integer) return whole;
    const Expr fraction = optional(seq({literal("."), digits(1, kMaxFractionDigits)}));
    const Expr exponent = optional(seq({byte_set(range_set('e', 'e') | range_set('E', 'E')),
                                        optional(byte_set(range_set('+', '+') | range_set('-', '-'))), digits(1, 3)}));
    return seq({alt({whole, literal("-0")}), fraction, exponent});
  }
  // The smallest and largest integers in range.
  std::optional<int64_t> lo, hi;
  if (b.lo) lo = b.lo_exclusive ? bound(std::floor(*b.lo), "minimum") + 1 : bound(std::ceil(*b.lo), "minimum");
  if (b.hi) hi = b.hi_exclusive ? bound(std::ceil(*b.hi), "maximum") - 1 : bound(std::floor(*b.hi), "maximum");
  std::vector<Expr> options{integer_range(lo, hi)};
  if (!integer) {
    // I.f (I >= 0) lies in [I, I + 1): in range when I >= lo and I + 1 <= hi.
    const std::optional<int64_t> top = b.hi ? std::optional<int64_t>(bound(std::floor(*b.hi), "maximum") - 1) : std::nullopt;
    options.push_back(decimals(lo, top, false));
    // -I.f lies in (-(I + 1), -I]: in range when -(I + 1) >= lo and -I is at most (below) hi.
    std::optional<int64_t> neg_lo, neg_hi;
    if (b.hi) neg_lo = b.hi_exclusive ? bound(std::floor(-*b.hi), "maximum") + 1 : bound(std::ceil(-*b.hi), "maximum");
    if (b.lo) neg_hi = bound(std::floor(-*b.lo), "minimum") - 1;
    options.push_back(decimals(neg_lo, neg_hi, true));
    // An exclusive integer bound leaves out the integer, not the numbers just past it.
    if (b.lo && b.lo_exclusive && *b.lo == std::floor(*b.lo) && *b.lo >= 0 && (!b.hi || *b.lo + 1 <= *b.hi))
      options.push_back(above(bound(*b.lo, "minimum"), false));
    if (b.hi && b.hi_exclusive && *b.hi == std::floor(*b.hi) && *b.hi <= 0 && (!b.lo || *b.hi - 1 >= *b.lo))
      options.push_back(above(bound(-*b.hi, "maximum"), true));
  }
  return alt(std::move(options));
}

}  // namespace petrel::grammar
