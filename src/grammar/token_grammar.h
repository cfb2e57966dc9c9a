// A grammar joined to a vocabulary, with the adaptive token-mask cache that keeps each decode
// step cheap. For a grammar state as the top of a stack, most tokens are decided by that state
// alone: accepted (the token ends inside the rule, whatever called it) or rejected. Only tokens
// that run past the rule's end depend on the frames below; those are listed and checked against
// the whole stack at each step. Entries are computed the first time a state is reached, by one
// walk over the sorted vocabulary, and kept for every later step and request using the grammar.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stacks.h"
#include "grammar/token_vocab.h"

namespace petrel::grammar {

struct StateMasks {
  std::vector<uint32_t> accepted;  // a bit per token: accepted from this state whatever lies below
  std::vector<int32_t> uncertain;  // tokens that run past the rule's end: check with the whole stack
};

class TokenGrammar {
 public:
  TokenGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  const Stepper& stepper() const { return stepper_; }
  // The cache entry of `top`; thread-safe.
  const StateMasks& masks(Frame top) const;

 private:
  StateMasks compute(Frame top) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  Stepper stepper_;
  mutable std::mutex mutex_;
  mutable std::map<Frame, std::unique_ptr<StateMasks>> cache_;
};

}  // namespace petrel::grammar
