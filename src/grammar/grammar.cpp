#include "grammar/grammar.h"

namespace petrel::grammar {

int32_t include(Grammar& into, Grammar part) {
  const auto offset = int32_t(into.rules.size());
  for (Rule& rule : part.rules) {
    for (RuleState& st : rule.states)
      for (CallEdge& c : st.calls) c.rule += offset;
    into.rules.push_back(std::move(rule));
  }
  return part.root + offset;
}

}  // namespace petrel::grammar
