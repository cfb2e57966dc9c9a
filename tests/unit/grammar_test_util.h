// Whether a grammar matches a whole text, by running its stacks byte by byte (no vocabulary).
#pragma once
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/stacks.h"

namespace petrel::test {

inline bool grammar_matches(const grammar::Grammar& g, std::string_view text) {
  const grammar::Stepper stepper(g);
  const auto stacks = stepper.advance({{grammar::Frame{g.root, 0}}}, text);
  return !stacks.empty() && stepper.can_end(stacks);
}

}  // namespace petrel::test
