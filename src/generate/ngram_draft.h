// Prompt-lookup drafting: guess the next tokens by finding the latest earlier occurrence of the
// sequence's last n tokens and copying what followed it. Free to compute, and right surprisingly
// often (code edits, quoting the prompt, lists, repetition).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace petrel {

class NgramDrafter {
 public:
  // Tries n-grams from max_ngram down to min_ngram tokens; the longest match wins.
  NgramDrafter(int min_ngram, int max_ngram);

  // Appends the next token of the sequence (prompt and generated alike). O(max_ngram).
  void append(int32_t token);
  int size() const { return int(tokens_.size()); }

  // Up to k tokens guessed to follow the sequence; empty when no n-gram recurs.
  std::vector<int32_t> draft(int k) const;

 private:
  uint64_t hash(int end, int n) const;  // of tokens_[end - n + 1 .. end]
  bool same(int end_a, int end_b, int n) const;

  int min_n_, max_n_;
  std::vector<int32_t> tokens_;
  // Per n (index n - min_n_): n-gram hash -> end index of its latest occurrence. Holds the
  // n-grams ending before the last token, so a lookup of the current suffix finds an earlier one.
  std::vector<std::unordered_map<uint64_t, int>> latest_;
};

}  // namespace petrel
