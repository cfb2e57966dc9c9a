#include "grammar/stacks.h"

#include <algorithm>

namespace petrel::grammar {
namespace {

// Calls entered before one byte is consumed; more means a rule calls itself without consuming
// anything (a left-recursive $ref), which this stops.
constexpr int kMaxCallsPerByte = 32;

}  // namespace

void dedup(std::vector<Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
}

// `s` is worked on in place and left as it came.
void Stepper::step_from(Stack& s, uint8_t byte, std::vector<Stack>& out, bool* ran_out, int calls) const {
  const Frame top = s.back();
  const RuleState& st = g_.rules[size_t(top.rule)].states[size_t(top.state)];
  for (const ByteEdge& e : st.bytes) {
    if (byte < e.lo || byte > e.hi) continue;
    out.push_back(s);
    out.back().back().state = e.to;
  }
  if (calls < kMaxCallsPerByte && s.size() < kMaxStackDepth) {
    for (const CallEdge& c : st.calls) {
      s.back().state = c.to;
      s.push_back({c.rule, 0});
      step_from(s, byte, out, ran_out, calls + 1);
      s.pop_back();
    }
    s.back() = top;
  }
  if (!st.accepting) return;
  if (s.size() == 1) {
    if (ran_out) *ran_out = true;
    return;
  }
  s.pop_back();
  step_from(s, byte, out, ran_out, calls);
  s.push_back(top);
}

void Stepper::step(const Stack& s, uint8_t byte, std::vector<Stack>& out, bool* ran_out) const {
  Stack work = s;
  step_from(work, byte, out, ran_out, 0);
}

std::vector<Stack> Stepper::advance(std::vector<Stack> stacks, std::string_view bytes, bool* ran_out) const {
  std::vector<Stack> next;
  for (char c : bytes) {
    next.clear();
    for (const Stack& s : stacks) step(s, uint8_t(c), next, ran_out);
    dedup(next);
    stacks.swap(next);
    if (stacks.empty()) break;
  }
  return stacks;
}

bool Stepper::can_end(const std::vector<Stack>& stacks) const {
  return std::any_of(stacks.begin(), stacks.end(), [&](const Stack& s) {
    return std::all_of(s.begin(), s.end(), [&](const Frame& f) {
      return g_.rules[size_t(f.rule)].states[size_t(f.state)].accepting;
    });
  });
}

}  // namespace petrel::grammar
