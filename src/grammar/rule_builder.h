// Builds one Rule: a nondeterministic automaton written with states, epsilon moves and Exprs,
// made deterministic (subsets over bytes and calls) and trimmed of states that cannot end.
#pragma once
#include <string>
#include <vector>

#include "grammar/expr.h"
#include "grammar/grammar.h"

namespace petrel::grammar {

// Most automaton states one rule may have, before and after determinization: a schema that
// needs more (huge length bounds, explosive patterns) is refused instead of eating memory.
constexpr int kMaxRuleStates = 1 << 16;

class RuleBuilder {
 public:
  // State 0 exists: the start.
  RuleBuilder();
  int state();
  void eps(int from, int to);
  void bytes(int from, int to, const ByteSet& set);
  void call(int from, int to, int32_t rule);
  // Adds moves from `from` to `to` that match `e`.
  void add(const Expr& e, int from, int to);
  // The deterministic rule; `end` is the accepting state. Throws petrel::Error when the rule
  // matches nothing or grows past kMaxRuleStates.
  Rule build(std::string name, int end) const;

 private:
  struct Nfa {
    std::vector<std::pair<ByteSet, int>> bytes;
    std::vector<CallEdge> calls;
    std::vector<int> eps;
  };
  std::vector<int> closure(std::vector<int> states) const;
  std::vector<Nfa> nfa_;
};

// The rule whose body is `e`.
Rule build_rule(std::string name, const Expr& e);

}  // namespace petrel::grammar
