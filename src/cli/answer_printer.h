// Streams an answer to the terminal as it is generated: the answer on stdout, the reasoning
// dimmed (--show-thinking) or a transient "thinking..." note on a terminal's stderr, then the
// statistics line on stderr.
#pragma once
#include <string>
#include <string_view>

#include "generate/conversation.h"

namespace petrel::cli {

class AnswerPrinter {
 public:
  explicit AnswerPrinter(bool show_thinking);

  void show(Channel channel, std::string_view text);
  // Ends the answer's line and prints the statistics line (and why it stopped, when unusual).
  void finish(const GenerateResult& result, bool speculative);

 private:
  void enter(Channel channel);
  void out(std::string_view text);

  bool show_thinking_;
  bool tty_out_, tty_err_;
  bool note_shown_ = false;  // "thinking..." on stderr, erased when the answer starts
  Channel channel_ = Channel::Answer;
  bool started_ = false;
  char last_ = '\n';
};

}  // namespace petrel::cli
