#include "grammar/rule_builder.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace petrel::grammar {
namespace {

using StateSet = std::vector<int>;

std::string label(const std::string& name) { return name.empty() ? "the schema" : name; }

void check_size(size_t states, const std::string& name) {
  check(states <= size_t(kMaxRuleStates), "the grammar for " + label(name) + " needs more than " +
                                              std::to_string(kMaxRuleStates) + " automaton states");
}

// States of `rule` from which an accepting state can be reached (calls count as moves).
std::vector<bool> can_end(const Rule& rule) {
  std::vector<bool> live(rule.states.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < rule.states.size(); ++s) {
      if (live[s]) continue;
      const RuleState& st = rule.states[s];
      bool l = st.accepting;
      for (const ByteEdge& e : st.bytes) l = l || live[size_t(e.to)];
      for (const CallEdge& c : st.calls) l = l || live[size_t(c.to)];
      if (l) live[s] = changed = true;
    }
  }
  return live;
}

// Drops the states that cannot end and the moves into them, renumbering the rest.
Rule trim(Rule rule) {
  const std::vector<bool> live = can_end(rule);
  check(live[0], "the grammar for " + label(rule.name) + " matches nothing");
  std::vector<int32_t> id(rule.states.size(), -1);
  Rule out{rule.name, {}};
  for (size_t s = 0; s < rule.states.size(); ++s)
    if (live[s]) id[s] = int32_t(out.states.size()), out.states.emplace_back();
  for (size_t s = 0; s < rule.states.size(); ++s) {
    if (!live[s]) continue;
    RuleState& st = out.states[size_t(id[s])];
    st.accepting = rule.states[s].accepting;
    for (const ByteEdge& e : rule.states[s].bytes)
      if (id[size_t(e.to)] >= 0) st.bytes.push_back({e.lo, e.hi, id[size_t(e.to)]});
    for (const CallEdge& c : rule.states[s].calls)
      if (id[size_t(c.to)] >= 0) st.calls.push_back({c.rule, id[size_t(c.to)]});
  }
  return out;
}

}  // namespace

RuleBuilder::RuleBuilder() : nfa_(1) {}

int RuleBuilder::state() {
  nfa_.emplace_back();
  return int(nfa_.size()) - 1;
}

void RuleBuilder::eps(int from, int to) { nfa_[size_t(from)].eps.push_back(to); }
void RuleBuilder::bytes(int from, int to, const ByteSet& set) { nfa_[size_t(from)].bytes.push_back({set, to}); }
void RuleBuilder::call(int from, int to, int32_t rule) { nfa_[size_t(from)].calls.push_back({rule, to}); }

void RuleBuilder::add(const Expr& e, int from, int to) {
  check_size(nfa_.size(), "a rule");
  switch (e.kind) {
    case Expr::Kind::Bytes: bytes(from, to, e.bytes); return;
    case Expr::Kind::Call: call(from, to, e.rule); return;
    case Expr::Kind::Alt:
      for (const Expr& p : e.parts) add(p, from, to);
      return;
    case Expr::Kind::Seq: {
      int at = from;
      for (size_t i = 0; i < e.parts.size(); ++i) {
        const int next = i + 1 == e.parts.size() ? to : state();
        add(e.parts[i], at, next);
        at = next;
      }
      if (e.parts.empty()) eps(from, to);
      return;
    }
    case Expr::Kind::Repeat: {
      int at = from;
      for (int i = 0; i < e.min; ++i) {
        const int next = state();
        add(e.parts[0], at, next);
        at = next;
      }
      if (e.max < 0) {  // a loop through its own state, so that `to` is left only forward
        const int loop = state();
        eps(at, loop);
        add(e.parts[0], loop, loop);
        eps(loop, to);
        return;
      }
      for (int i = e.min; i < e.max; ++i) {
        const int next = state();
        eps(at, to);
        add(e.parts[0], at, next);
        at = next;
      }
      eps(at, to);
      return;
    }
  }
}

StateSet RuleBuilder::closure(StateSet states) const {
  std::vector<bool> seen(nfa_.size());
  for (int s : states) seen[size_t(s)] = true;
  for (size_t i = 0; i < states.size(); ++i)
    for (int t : nfa_[size_t(states[i])].eps)
      if (!seen[size_t(t)]) seen[size_t(t)] = true, states.push_back(t);
  // Two edges on one byte to one state (a class listing a character twice, `(a|a)`) put it in
  // twice: without the duplicates removed, equal sets would differ and the construction not end.
  std::sort(states.begin(), states.end());
  states.erase(std::unique(states.begin(), states.end()), states.end());
  return states;
}

// Subset construction over the 256 bytes and the called rules.
Rule RuleBuilder::build(std::string name, int end) const {
  check_size(nfa_.size(), name);
  Rule rule{std::move(name), {}};
  std::map<StateSet, int32_t> ids;
  std::vector<StateSet> sets;
  const auto id_of = [&](StateSet set) {
    set = closure(std::move(set));
    auto [it, fresh] = ids.emplace(set, int32_t(sets.size()));
    if (fresh) sets.push_back(std::move(set));
    check_size(sets.size(), rule.name);
    return it->second;
  };
  id_of({0});
  for (size_t d = 0; d < sets.size(); ++d) {
    RuleState st;
    std::vector<StateSet> by_byte(256);
    std::map<int32_t, StateSet> by_call;
    for (int s : sets[d]) {
      st.accepting = st.accepting || s == end;
      for (const auto& [set, to] : nfa_[size_t(s)].bytes)
        for (size_t b = 0; b < 256; ++b)
          if (set.test(b)) by_byte[b].push_back(to);
      for (const CallEdge& c : nfa_[size_t(s)].calls) by_call[c.rule].push_back(c.to);
    }
    for (size_t b = 0; b < 256;) {
      size_t e = b + 1;
      while (e < 256 && by_byte[e] == by_byte[b]) ++e;
      if (!by_byte[b].empty()) st.bytes.push_back({uint8_t(b), uint8_t(e - 1), id_of(by_byte[b])});
      b = e;
    }
    for (auto& [called, targets] : by_call) st.calls.push_back({called, id_of(std::move(targets))});
    rule.states.push_back(std::move(st));
  }
  return trim(std::move(rule));
}

Rule build_rule(std::string name, const Expr& e) {
  RuleBuilder b;
  const int end = b.state();
  b.add(e, 0, end);
  return b.build(std::move(name), end);
}

}  // namespace petrel::grammar
