// Running a Grammar on bytes: a matcher state is a set of stacks of frames, the top frame the
// rule being matched and the frames below the callers waiting to continue. A byte either moves
// the top frame, enters a called rule (pushing it), or ends the top rule (popping it) first.
#pragma once
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace petrel::grammar {

using Stack = std::vector<Frame>;

// Deepest stack a match may reach: deeper nesting is not generated (the server reads tool-call
// JSON up to 64 levels, and a rule may take a frame or two a level).
constexpr size_t kMaxStackDepth = 100;

class Stepper {
 public:
  explicit Stepper(const Grammar& g) : g_(g) {}

  // Appends to `out` every stack `s` becomes by consuming `byte`. The bottom frame is never
  // popped: where that would be needed, *ran_out is set (when not null) instead.
  void step(const Stack& s, uint8_t byte, std::vector<Stack>& out, bool* ran_out = nullptr) const;
  // `stacks` after consuming `bytes`, duplicates removed (empty: the bytes are not allowed).
  std::vector<Stack> advance(std::vector<Stack> stacks, std::string_view bytes, bool* ran_out = nullptr) const;
  // Whether the text matched so far may end here: every frame of some stack may end.
  bool can_end(const std::vector<Stack>& stacks) const;

 private:
  void step_from(Stack& s, uint8_t byte, std::vector<Stack>& out, bool* ran_out, int calls) const;
  const Grammar& g_;
};

// Sorts and removes duplicate stacks.
void dedup(std::vector<Stack>& stacks);

}  // namespace petrel::grammar
