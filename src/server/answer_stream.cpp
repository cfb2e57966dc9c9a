#include "server/answer_stream.h"

namespace petrel::server {

void Delta::append(Delta&& later) {
  reasoning += later.reasoning;
  content += later.content;
  for (ToolCall& call : later.tool_calls) tool_calls.push_back(std::move(call));
}

AnswerStream::AnswerStream(const Tokenizer& tokenizer, ThinkFilter think, std::vector<std::string> stops,
                           std::optional<ToolCallParser> tool_parser)
    : tools_(std::move(tool_parser)),
      text_(tokenizer, think, std::move(stops), [this](Channel c, std::string_view s) { show(c, s); }) {}

void AnswerStream::take(ToolCallParser::Output&& out) {
  into_->content += out.content;
  for (ToolCall& call : out.calls) into_->tool_calls.push_back(std::move(call));
}

void AnswerStream::show(Channel channel, std::string_view text) {
  if (channel == Channel::Thinking) into_->reasoning.append(text);
  else if (tools_) take(tools_->push(text));
  else into_->content.append(text);
}

bool AnswerStream::push(int32_t id, Delta& into) {
  into_ = &into;
  const bool more = text_.push(id);
  into_ = nullptr;
  return more;
}

void AnswerStream::finish(Delta& into) {
  into_ = &into;
  text_.finish();
  if (tools_) take(tools_->finish());
  into_ = nullptr;
}

}  // namespace petrel::server
