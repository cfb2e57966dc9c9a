// A grammar as Petrel's constrained decoding runs it: rules that are small automata over bytes
// whose edges either consume a byte range or call another rule (a recursive transition network,
// run by a pushdown matcher: stacks.h). Rules are deterministic over bytes and calls, so a
// matcher's state is a short list of stacks. Built by rule_builder.h; json_schema.h makes them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace petrel::grammar {

struct ByteEdge {
  uint8_t lo, hi;  // inclusive
  int32_t to;
};

struct CallEdge {
  int32_t rule;  // the rule to run
  int32_t to;    // where the caller continues once that rule has ended
};

struct RuleState {
  std::vector<ByteEdge> bytes;  // disjoint ranges
  std::vector<CallEdge> calls;
  bool accepting = false;  // the rule may end here
};

struct Rule {
  std::string name;               // for messages: the schema path it came from
  std::vector<RuleState> states;  // state 0 is the start
};

struct Grammar {
  std::vector<Rule> rules;
  int32_t root = 0;  // the text matched is one run of this rule
};

// Adds `part`'s rules to `into` (their calls renumbered) and returns the id `part`'s root has
// there: how grammars compiled apart (one per tool) are joined under a new root.
int32_t include(Grammar& into, Grammar part);

// A rule's state: what a stack frame holds.
struct Frame {
  int32_t rule = 0, state = 0;
  auto operator<=>(const Frame&) const = default;
};

}  // namespace petrel::grammar
