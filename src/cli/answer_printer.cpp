#include "cli/answer_printer.h"

#include <unistd.h>

#include <cstdio>

namespace petrel::cli {
namespace {

constexpr const char* kDim = "\x1b[2m";
constexpr const char* kReset = "\x1b[0m";

}  // namespace

AnswerPrinter::AnswerPrinter(bool show_thinking)
    : show_thinking_(show_thinking), tty_out_(isatty(STDOUT_FILENO)), tty_err_(isatty(STDERR_FILENO)) {}

void AnswerPrinter::out(std::string_view text) {
  if (text.empty()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  last_ = text.back();
}

// Marks where reasoning starts and ends: colour on a terminal, <think> tags in a pipe.
void AnswerPrinter::enter(Channel channel) {
  if (started_ && channel == channel_) return;
  const bool was_thinking = started_ && channel_ == Channel::Thinking;
  started_ = true;
  channel_ = channel;
  if (channel == Channel::Thinking) {
    if (show_thinking_) out(tty_out_ ? kDim : "<think>\n");
    else if (tty_err_ && !note_shown_) {
      std::fprintf(stderr, "%sthinking...%s", kDim, kReset);
      note_shown_ = true;
    }
    return;
  }
  if (note_shown_) {
    std::fprintf(stderr, "\r\x1b[K");
    note_shown_ = false;
  }
  if (was_thinking && show_thinking_) {
    if (last_ != '\n') out("\n");
    out(tty_out_ ? std::string(kReset) + "\n" : "</think>\n\n");
  }
}

void AnswerPrinter::show(Channel channel, std::string_view text) {
  enter(channel);
  if (channel == Channel::Answer || show_thinking_) out(text);
}

void AnswerPrinter::finish(const GenerateResult& result, bool speculative) {
  if (note_shown_) std::fprintf(stderr, "\r\x1b[K");
  note_shown_ = false;
  if (started_ && channel_ == Channel::Thinking && show_thinking_ && tty_out_) out(kReset);
  if (last_ != '\n') out("\n");
  const std::string line = stats_line(result.stats, result.reason, speculative);
  if (tty_err_) std::fprintf(stderr, "%s[%s]%s\n", kDim, line.c_str(), kReset);
  else std::fprintf(stderr, "[%s]\n", line.c_str());
  started_ = false;
  channel_ = Channel::Answer;
  last_ = '\n';
}

}  // namespace petrel::cli
