#include "grammar/matcher.h"

#include <algorithm>

#include "core/error.h"

namespace petrel::grammar {
namespace {

bool test(const std::vector<uint32_t>& mask, int32_t id) { return (mask[size_t(id) / 32] >> (id % 32)) & 1u; }
void set(std::vector<uint32_t>& mask, int32_t id) { mask[size_t(id) / 32] |= 1u << (id % 32); }

}  // namespace

Matcher::Matcher(std::shared_ptr<const TokenGrammar> grammar, std::vector<int32_t> end_ids,
                 std::optional<ReasoningTags> reasoning)
    : grammar_(std::move(grammar)), end_ids_(std::move(end_ids)) {
  if (reasoning) {
    tags_ = *reasoning;
    phase_ = reasoning->open_in_prompt ? Phase::Thinking : Phase::MayThink;
  }
  stacks_ = {{Frame{grammar_->grammar().root, 0}}};
  mask_.assign(grammar_->vocab().words(), 0);
}

bool Matcher::is_end(int32_t token) const { return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end(); }

// The bytes stack `s` can take next. Where its top may end, most of the vocabulary is uncertain
// (it depends on what follows), and this rejects nearly all of it at its first byte.
std::bitset<256> Matcher::first_bytes(const Stack& s) const {
  std::bitset<256> first;
  std::vector<Stack> out;
  for (size_t b = 0; b < 256; ++b) {
    out.clear();
    grammar_->stepper().step(s, uint8_t(b), out);
    first[b] = !out.empty();
  }
  return first;
}

// The cached masks of each stack's top, plus the uncertain tokens the whole stack accepts.
const uint32_t* Matcher::mask() {
  if (phase_ == Phase::Thinking) return nullptr;
  std::fill(mask_.begin(), mask_.end(), 0);
  const TokenVocab& v = grammar_->vocab();
  const Stepper& stepper = grammar_->stepper();
  for (const Stack& s : stacks_) {
    const StateMasks& m = grammar_->masks(s.back());
    for (size_t w = 0; w < mask_.size(); ++w) mask_[w] |= m.accepted[w];
    if (m.uncertain.empty()) continue;
    const std::bitset<256> first = first_bytes(s);
    for (int32_t id : m.uncertain) {
      const std::string& text = v.text(id);
      if (!test(mask_, id) && first[uint8_t(text[0])] && !stepper.advance({s}, text).empty()) set(mask_, id);
    }
  }
  if (stepper.can_end(stacks_))
    for (int32_t id : end_ids_)
      if (id >= 0 && id < v.rows) set(mask_, id);
  if (phase_ == Phase::MayThink && tags_.open >= 0 && tags_.open < v.rows) set(mask_, tags_.open);
  return mask_.data();
}

void Matcher::accept(int32_t token) {
  if (phase_ == Phase::Thinking) {
    if (token == tags_.close) phase_ = Phase::Grammar;
    return;
  }
  if (phase_ == Phase::MayThink) {
    phase_ = token == tags_.open ? Phase::Thinking : Phase::Grammar;
    if (phase_ == Phase::Thinking) return;
  }
  const Stepper& stepper = grammar_->stepper();
  if (is_end(token)) {
    check(stepper.can_end(stacks_), "structured output: the answer ended before the grammar allows it");
    stacks_.clear();
    return;
  }
  const TokenVocab& v = grammar_->vocab();
  const bool has_text = token >= 0 && token < v.rows && v.position[size_t(token)] >= 0;
  std::vector<Stack> next = has_text ? stepper.advance(stacks_, v.text(token)) : std::vector<Stack>{};
  check(!next.empty(), "structured output: token " + std::to_string(token) + " does not continue the grammar");
  stacks_ = std::move(next);
}

}  // namespace petrel::grammar
