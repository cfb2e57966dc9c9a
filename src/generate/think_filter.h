// Reasoning models (Qwen3, Qwen3.5) think between <think> and </think> before answering. This
// routes each generated token to the thinking or the answer channel by those tag tokens.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "grammar/matcher.h"
#include "petrel/tokenizer.h"

namespace petrel {

enum class Channel { Thinking, Answer };

class ThinkFilter {
 public:
  // Tag ids from the tokenizer; a tokenizer without both tags routes everything to the answer.
  // `prompt`: the templated prompt, which may already open a <think> block (Qwen3.5 does).
  ThinkFilter(const Tokenizer& tokenizer, std::span<const int32_t> prompt);
  // Everything is answer (raw prompts, models without tags).
  ThinkFilter() = default;

  // The channel of token `id`'s text, or nullopt for a tag (which switches channel, shows nothing).
  std::optional<Channel> route(int32_t id);
  Channel channel() const { return channel_; }
  // The tags and whether a block is open now (at construction: the prompt opened it), for a
  // grammar that starts after the reasoning; nullopt without tags.
  std::optional<grammar::ReasoningTags> reasoning() const {
    if (!open_ || !close_) return std::nullopt;
    return grammar::ReasoningTags{*open_, *close_, channel_ == Channel::Thinking};
  }

 private:
  std::optional<int32_t> open_, close_;
  Channel channel_ = Channel::Answer;
};

}  // namespace petrel
