// What a client sees of the generated tokens: text split into reasoning (between <think> and
// </think>) and answer, stop strings cut from the answer, and the answer's <tool_call> blocks
// turned into tool calls. One token in, one Delta of new text out.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "generate/text_output.h"
#include "server/tool_calls.h"

namespace petrel::server {

struct Delta {
  std::string reasoning;            // reasoning_content
  std::string content;
  std::vector<ToolCall> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(Delta&& later);
};

class AnswerStream {
 public:
  // `think`: routes tokens by the think tags (ThinkFilter() for plain completions).
  // `tool_parser`: set when the request's tools may be called.
  AnswerStream(const Tokenizer& tokenizer, ThinkFilter think, std::vector<std::string> stops,
               std::optional<ToolCallParser> tool_parser);
  // show() is bound to this object's address.
  AnswerStream(const AnswerStream&) = delete;
  AnswerStream& operator=(const AnswerStream&) = delete;

  // One generated token (not EOS); its new text goes into `into`. False once a stop string
  // ended the answer.
  bool push(int32_t id, Delta& into);
  // The answer is over: releases what is still held back into `into`.
  void finish(Delta& into);
  int tool_calls() const { return tools_ ? tools_->calls_found() : 0; }

 private:
  void show(Channel channel, std::string_view text);
  void take(ToolCallParser::Output&& out);

  std::optional<ToolCallParser> tools_;
  Delta* into_ = nullptr;  // where show() writes during push() and finish()
  TextOutput text_;
};

}  // namespace petrel::server
