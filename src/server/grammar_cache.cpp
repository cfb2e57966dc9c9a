#include "server/grammar_cache.h"

namespace petrel::server {

std::shared_ptr<const grammar::TokenGrammar> GrammarCache::get(const std::string& key, const grammar::Grammar& g) {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first != key) continue;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().second;
  }
  entries_.emplace_front(key, std::make_shared<grammar::TokenGrammar>(g, vocab_));
  if (entries_.size() > capacity_) entries_.pop_back();
  return entries_.front().second;
}

}  // namespace petrel::server
