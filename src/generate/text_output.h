// What a person sees of an answer: ids -> UTF-8 text (streaming detokenizer) -> thinking or
// answer channel -> stop strings (answer only). Each piece goes to `show` as soon as it is final.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "generate/detok_stream.h"
#include "generate/stop.h"
#include "generate/think_filter.h"

namespace petrel {

class TextOutput {
 public:
  using Show = std::function<void(Channel, std::string_view)>;

  TextOutput(const Tokenizer& tokenizer, ThinkFilter think, std::vector<std::string> stops, Show show);

  // One generated token (EOS is never pushed). False once a stop string has ended the answer.
  bool push(int32_t id);
  // The answer is over: releases text still held back (partial characters, stop-string prefixes).
  void finish();

  // The model's message as the conversation history should keep it: thinking with its tags as
  // generated, then the answer cut before any stop string. Special tokens are left out.
  const std::string& transcript() const { return transcript_; }
  bool stopped() const { return stop_.stopped(); }

 private:
  void emit(Channel channel, std::string_view text);
  void show(Channel channel, std::string_view text);

  const Tokenizer& tokenizer_;
  DetokStream detok_;
  ThinkFilter think_;
  StopMatcher stop_;
  Show show_;
  std::string transcript_;
  bool trim_ = false;  // drop the newlines that follow a think tag
};

}  // namespace petrel
