// Regular expressions over bytes, with calls of other rules: the form rule bodies are written in
// before rule_builder.h turns them into automata.
#pragma once
#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

namespace petrel::grammar {

using ByteSet = std::bitset<256>;

struct Expr {
  enum class Kind { Bytes, Seq, Alt, Repeat, Call };
  Kind kind = Kind::Seq;  // an empty Seq matches the empty string
  ByteSet bytes;           // Bytes: one byte from the set
  std::vector<Expr> parts; // Seq, Alt; Repeat: its one part
  int min = 0, max = -1;   // Repeat: count bounds, max -1 for no bound
  int32_t rule = -1;       // Call
};

Expr empty();
Expr byte_set(const ByteSet& set);
Expr byte_range(uint8_t lo, uint8_t hi);
Expr literal(std::string_view text);
Expr seq(std::vector<Expr> parts);
Expr alt(std::vector<Expr> parts);
Expr repeat(Expr part, int min, int max);
Expr optional(Expr part);
Expr call(int32_t rule);

ByteSet range_set(uint8_t lo, uint8_t hi);

}  // namespace petrel::grammar
