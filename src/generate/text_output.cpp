#include "generate/text_output.h"

namespace petrel {

TextOutput::TextOutput(const Tokenizer& tokenizer, ThinkFilter think, std::vector<std::string> stops, Show show)
    : tokenizer_(tokenizer),
      detok_(tokenizer, /*skip_special_tokens=*/true),
      think_(think),
      stop_(std::move(stops)),
      show_(std::move(show)),
      trim_(think.channel() == Channel::Thinking) {}

void TextOutput::show(Channel channel, std::string_view text) {
  if (trim_) {
    const size_t start = text.find_first_not_of('\n');
    text = start == std::string_view::npos ? std::string_view{} : text.substr(start);
    if (!text.empty()) trim_ = false;
  }
  if (!text.empty()) show_(channel, text);
}

void TextOutput::emit(Channel channel, std::string_view text) {
  if (channel == Channel::Thinking) {
    transcript_.append(text);
    show(channel, text);
    return;
  }
  const std::string released = stop_.push(text);
  transcript_.append(released);
  show(channel, released);
}

bool TextOutput::push(int32_t id) {
  if (stop_.stopped()) return false;
  const Channel before = think_.channel();
  const auto channel = think_.route(id);
  if (!channel) {  // a tag: finish the text of the channel it closes
    emit(before, detok_.finish());
    transcript_.append(tokenizer_.token_bytes(uint32_t(id)));
    trim_ = true;
    return !stop_.stopped();
  }
  emit(*channel, detok_.push(uint32_t(id)));
  return !stop_.stopped();
}

void TextOutput::finish() {
  emit(think_.channel(), detok_.finish());
  const std::string rest = stop_.finish();
  transcript_.append(rest);
  show(Channel::Answer, rest);
}

}  // namespace petrel
