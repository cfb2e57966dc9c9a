#include "grammar/expr.h"

namespace petrel::grammar {

ByteSet range_set(uint8_t lo, uint8_t hi) {
  ByteSet set;
  for (int b = lo; b <= hi; ++b) set.set(size_t(b));
  return set;
}

Expr empty() { return Expr{}; }

Expr byte_set(const ByteSet& set) {
  Expr e;
  e.kind = Expr::Kind::Bytes;
  e.bytes = set;
  return e;
}

Expr byte_range(uint8_t lo, uint8_t hi) { return byte_set(range_set(lo, hi)); }

Expr literal(std::string_view text) {
  std::vector<Expr> parts;
  for (char c : text) parts.push_back(byte_range(uint8_t(c), uint8_t(c)));
  return seq(std::move(parts));
}

Expr seq(std::vector<Expr> parts) {
  if (parts.size() == 1) return std::move(parts[0]);
  Expr e;
  e.parts = std::move(parts);
  return e;
}

Expr alt(std::vector<Expr> parts) {
  if (parts.size() == 1) return std::move(parts[0]);
  Expr e;
  e.kind = Expr::Kind::Alt;
  e.parts = std::move(parts);
  return e;
}

Expr repeat(Expr part, int min, int max) {
  Expr e;
  e.kind = Expr::Kind::Repeat;
  e.parts.push_back(std::move(part));
  e.min = min;
  e.max = max;
  return e;
}

Expr optional(Expr part) { return repeat(std::move(part), 0, 1); }

Expr call(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::Call;
  e.rule = rule;
  return e;
}

}  // namespace petrel::grammar
