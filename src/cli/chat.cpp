// `petrel chat DIR`: an interactive chat in the terminal. The history goes through the chat
// template every turn; /reset, /system TEXT, /think on|off, /help, /exit; Ctrl-C stops the
// answer being written (not the program); a statistics line follows every answer.
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>

#include "cli/answer_printer.h"
#include "cli/common.h"
#include "cli/generation_flags.h"
#include "cli/interrupt.h"
#include "cli/registry.h"
#include "core/error.h"
#include "generate/make_decoder.h"
#include "io/model_tokenizer.h"

namespace petrel::cli {
namespace {

constexpr int kDefaultContext = 32768;

constexpr const char* kHelp =
    "  /reset          forget the conversation (the system message stays)\n"
    "  /system TEXT    set the system message (/system alone removes it)\n"
    "  /think on|off   let the model think before answering, or not\n"
    "  /exit           quit (also /quit or Ctrl-D)\n"
    "  Ctrl-C stops the answer being written. A line ending in \\ continues on the next line;\n"
    "  a line of \"\"\" starts a multi-line message that the next \"\"\" line ends.\n";

struct Args {
  std::string dir;
  GenerationFlags gen;
  LoadOptions load;
};

enum class Input { Line, Interrupted, End };

// Lines from stdin through read(2) and its own buffer, polling so that a Ctrl-C is noticed
// whether it comes while waiting or just before (the terminal then discards the typed line).
class LineReader {
 public:
  Input next(std::string& line, const Interrupt& interrupt) {
    for (;;) {
      if (interrupt.raised()) {
        buffer_.clear();
        return Input::Interrupted;
      }
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return Input::Line;
      }
      if (eof_) {
        if (buffer_.empty()) return Input::End;
        line.swap(buffer_);
        buffer_.clear();
        return Input::Line;
      }
      fill();
    }
  }

 private:
  void fill() {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) return;  // timeout or a signal: look at the flag again
    char buf[4096];
    const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n > 0) buffer_.append(buf, size_t(n));
    else if (n == 0 || errno != EINTR) eof_ = true;
  }

  std::string buffer_;
  bool eof_ = false;
};

// One message: a line ending in a backslash continues on the next; a line of three double
// quotes starts a block (pasted text) that the next such line ends.
Input read_message(LineReader& reader, std::string& message, const Interrupt& interrupt) {
  message.clear();
  std::string line;
  bool block = false;
  for (;;) {
    const Input in = reader.next(line, interrupt);
    if (in != Input::Line) return in == Input::End && !message.empty() ? Input::Line : in;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "\"\"\"") {
      if (block) {
        if (!message.empty()) message.pop_back();  // the newline before the closing quotes
        return Input::Line;
      }
      block = true;
      continue;
    }
    if (block) {
      message += line + "\n";
      continue;
    }
    if (line.empty() || line.back() != '\\') {
      message += line;
      return Input::Line;
    }
    line.back() = '\n';
    message += line;
  }
}

class ChatLoop {
 public:
  ChatLoop(Conversation& conversation, const ConversationOptions& options, bool show_thinking)
      : conversation_(conversation), options_(options), printer_(show_thinking), tty_(isatty(STDOUT_FILENO)) {}

  void run() {
    std::string message;
    for (;;) {
      prompt();
      const Input in = read_message(reader_, message, interrupt_);
      if (in == Input::End) break;
      if (in == Input::Interrupted) {
        const uint64_t seen = interrupt_.count();
        std::printf("\n(Ctrl-C stops an answer; /exit or Ctrl-D quits)\n");
        interrupt_.clear_up_to(seen);
        continue;
      }
      if (message.find_first_not_of(" \t\n") == std::string::npos) continue;
      if (message[0] == '/') {
        if (!command(message)) break;
        continue;
      }
      answer(message);
    }
    if (tty_) std::printf("\n");
  }

 private:
  void prompt() {
    std::printf(tty_ ? "\x1b[1m> \x1b[0m" : "> ");
    std::fflush(stdout);
  }

  void note(const std::string& text) { std::printf("(%s)\n", text.c_str()); }

  // Returns false to quit.
  bool command(const std::string& line) {
    const size_t space = line.find_first_of(" \t");
    const std::string name = line.substr(0, space);
    const size_t from = space == std::string::npos ? line.size() : line.find_first_not_of(" \t", space);
    std::string arg = from == std::string::npos ? "" : line.substr(from);
    arg.erase(arg.find_last_not_of(" \t\n") + 1);
    if (name == "/exit" || name == "/quit") return false;
    if (name == "/reset") {
      conversation_.reset();
      note("conversation reset");
    } else if (name == "/system") {
      conversation_.set_system(arg);
      note(arg.empty() ? "system message removed" : "system message set");
    } else if (name == "/think") {
      if (arg == "on" || arg == "off") conversation_.set_thinking(arg == "on");
      note(arg == "on" ? "thinking on" : arg == "off" ? "thinking off" : "usage: /think on|off");
    } else if (name == "/help") {
      std::printf("%s", kHelp);
    } else {
      note("unknown command " + line + "; /help lists them");
    }
    return true;
  }

  void answer(const std::string& message) {
    uint64_t seen = interrupt_.count();
    try {
      const Turn turn = conversation_.ask(message, [&](Channel c, std::string_view s) { printer_.show(c, s); },
                                          interrupt_.flag());
      seen = interrupt_.count();
      printer_.finish(turn.result, options_.speculative.draft > 0);
      if (turn.result.reason == FinishReason::ContextFull)
        note("the context is full: /reset starts a new conversation; --context sets a larger one");
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      if (conversation_.history_size() > 0) note("/reset starts a new conversation");
    }
    interrupt_.clear_up_to(seen);  // the Ctrl-C that stopped this answer is spent
  }

  Conversation& conversation_;
  const ConversationOptions& options_;
  AnswerPrinter printer_;
  Interrupt interrupt_{/*repeat_kills=*/false};
  LineReader reader_;
  bool tty_;
};

void run(const CLI::App& cmd, Args& a) {
  a.load.progress = isatty(STDERR_FILENO);
  LoadedModel m = load_model(a.dir, a.load);
  const Tokenizer tokenizer = load_tokenizer(a.dir);
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template.emplace(load_chat_template(a.dir));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "; petrel chat needs one (petrel run --raw completes plain text)");
  }
  ConversationOptions o = resolve_generation(cmd, a.gen, a.dir, m.config(), &tokenizer);
  o.multi_turn = true;
  const int trained = m.config().max_position;
  o.capacity = a.gen.context > 0 ? a.gen.context : trained > 0 ? std::min(trained, kDefaultContext) : kDefaultContext;
  const std::unique_ptr<Decoder> decoder = make_decoder(*m.model);
  Conversation conversation(*decoder, tokenizer, &*chat_template, o);

  std::fprintf(stderr, "%s\n", m.summary().c_str());
  std::string line = "sampling " + describe_sampling(o.sampling) + ", context " + std::to_string(o.capacity) + " tokens";
  if (o.speculative.draft > 0) line += ", " + describe_speculative(o.speculative);
  std::fprintf(stderr, "%s\n/help lists commands; Ctrl-C stops an answer; Ctrl-D or /exit quits\n", line.c_str());
  ChatLoop(conversation, o, a.gen.show_thinking).run();
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal");
  add_model_dir(cmd, a.dir, "Checkpoint folder");
  add_generation_flags(cmd, a.gen);
  add_load_flags(cmd, a.load);
  cmd->callback([cmd] { run(*cmd, a); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
