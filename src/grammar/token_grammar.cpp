#include "grammar/token_grammar.h"

namespace petrel::grammar {

TokenGrammar::TokenGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), stepper_(grammar_) {}

const StateMasks& TokenGrammar::masks(Frame top) const {
  std::lock_guard lock(mutex_);
  auto& entry = cache_[top];
  if (!entry) entry = std::make_unique<StateMasks>(compute(top));
  return *entry;
}

// One walk over the sorted tokens: level[d] holds the stacks after a token's first d bytes, and
// a token reuses the levels of the prefix it shares with the one before it.
StateMasks TokenGrammar::compute(Frame top) const {
  const TokenVocab& v = *vocab_;
  StateMasks m;
  m.accepted.assign(v.words(), 0);
  std::vector<std::vector<Stack>> level(v.longest + 1);
  std::vector<char> ran_out(v.longest + 1, 0);  // ran_out[d]: some path left the rule within d bytes
  level[0] = {{top}};
  size_t valid = 0;  // levels [0, valid] belong to the current token's prefix
  for (size_t i = 0; i < v.ids.size(); ++i) {
    const std::string& bytes = v.bytes[i];
    size_t d = std::min<size_t>(valid, v.shared[i]);
    while (d < bytes.size() && !level[d].empty()) {
      bool out = false;
      level[d + 1].clear();
      for (const Stack& s : level[d]) stepper_.step(s, uint8_t(bytes[d]), level[d + 1], &out);
      dedup(level[d + 1]);
      ran_out[d + 1] = ran_out[d] || out;
      ++d;
    }
    valid = d;
    const int32_t id = v.ids[i];
    if (d == bytes.size() && !level[d].empty()) m.accepted[size_t(id) / 32] |= 1u << (id % 32);
    else if (ran_out[d]) m.uncertain.push_back(id);
  }
  return m;
}

}  // namespace petrel::grammar
