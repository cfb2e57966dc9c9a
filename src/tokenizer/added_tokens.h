// tokenizer.json "added_tokens": whole tokens found in the text before it is pre-tokenized.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/tokenizer.h"

namespace petrel::tokenizer {

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool single_word = false;  // only matches when not inside a word
  bool lstrip = false;       // absorbs the whitespace before it
  bool rstrip = false;       // absorbs the whitespace after it
  bool normalized = true;    // matched in normalized text rather than in the raw input
  bool special = false;      // dropped by decode(skip_special_tokens)
};

// A piece of text: either an added token (id set) or text still to be tokenized.
struct Segment {
  size_t begin = 0, end = 0;
  std::optional<uint32_t> id;
};

// Finds a set of added tokens in text: leftmost match first, the longest at that position,
// matches never overlapping (Hugging Face's LeftmostLongest Aho-Corasick semantics).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what `tokens[i]` looks like in the text this matcher scans.
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  AddedTokenMatcher() = default;

  bool empty() const { return tokens_.empty(); }

  // Splits `text` into segments covering it, in order. A special token overlapping a `literal`
  // range (sorted, disjoint) is not a match: the scan resumes after it when it begins inside the
  // range (as Hugging Face skips a match), one byte on otherwise (so that a token of the text
  // around can still begin inside it).
  void split(std::string_view text, std::vector<Segment>& out, std::span<const ByteRange> literal = {}) const;

 private:
  struct Match {
    size_t begin, end;
    size_t token;
  };
  std::optional<Match> next_match(std::string_view text, size_t from) const;
  // Where the scan resumes when `m` is a special token over literal text; nullopt when `m` counts.
  std::optional<size_t> skip_literal(const Match& m, std::span<const ByteRange> literal) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  std::array<std::vector<size_t>, 256> by_first_byte_;  // token indices, longest pattern first
};

}  // namespace petrel::tokenizer
