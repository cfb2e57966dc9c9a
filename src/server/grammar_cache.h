// Recent requests' grammars joined to the model's vocabulary, by what they were compiled from, so
// that a schema sent again reuses the token masks its earlier requests computed (the token-mask
// cache fills as a grammar's states are reached, grammar/token_grammar.h).
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "grammar/token_grammar.h"

namespace petrel::server {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const grammar::TokenVocab> vocab, size_t capacity)
      : vocab_(std::move(vocab)), capacity_(capacity) {}

  // The grammar kept under `key`, else `g` joined to the vocabulary and kept (the least recently
  // used one goes). Equal keys must mean equal grammars. Thread-safe.
  std::shared_ptr<const grammar::TokenGrammar> get(const std::string& key, const grammar::Grammar& g);

 private:
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  size_t capacity_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const grammar::TokenGrammar>>> entries_;  // most recent first
};

}  // namespace petrel::server
