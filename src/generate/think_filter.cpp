#include "generate/think_filter.h"

namespace petrel {

ThinkFilter::ThinkFilter(const Tokenizer& tokenizer, std::span<const int32_t> prompt) {
  const auto open = tokenizer.token_id("<think>"), close = tokenizer.token_id("</think>");
  if (!open || !close) return;
  open_ = int32_t(*open);
  close_ = int32_t(*close);
  for (auto it = prompt.rbegin(); it != prompt.rend(); ++it) {  // the last tag in the prompt decides
    if (*it == *open_) channel_ = Channel::Thinking;
    if (*it == *open_ || *it == *close_) break;
  }
}

std::optional<Channel> ThinkFilter::route(int32_t id) {
  if (open_ && id == *open_) {
    channel_ = Channel::Thinking;
    return std::nullopt;
  }
  if (close_ && id == *close_) {
    channel_ = Channel::Answer;
    return std::nullopt;
  }
  return channel_;
}

}  // namespace petrel
