// The vocabulary as constrained decoding sees it: each token's bytes, sorted, so that a walk
// over all tokens shares the matching of common prefixes (the sorted order is a trie's order).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "petrel/tokenizer.h"

namespace petrel::grammar {

struct TokenVocab {
  int rows = 0;                    // the model's vocabulary rows: the mask covers ids [0, rows)
  std::vector<int32_t> ids;        // tokens with text, sorted by their bytes
  std::vector<std::string> bytes;  // bytes[i]: the bytes of ids[i]
  std::vector<uint32_t> shared;    // shared[i]: bytes ids[i] has in common with ids[i - 1]
  std::vector<int32_t> position;   // position[id]: where token id is in `ids`, -1 if it has no text
  size_t longest = 0;

  // Mask words for `rows` tokens, one bit a token.
  size_t words() const { return (size_t(rows) + 31) / 32; }
  const std::string& text(int32_t id) const { return bytes[size_t(position[size_t(id)])]; }
};

// Every token below `rows` that has text and is not special (special tokens, such as
// end-of-turn, are allowed or not by the matcher itself).
TokenVocab make_token_vocab(const Tokenizer& tokenizer, int rows);
// A vocabulary of the given token texts, ids their positions (tests).
TokenVocab make_token_vocab(const std::vector<std::string>& tokens);

}  // namespace petrel::grammar
