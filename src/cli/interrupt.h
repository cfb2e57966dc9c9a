// Ctrl-C as "stop the current answer": a SIGINT handler that only raises a flag the generation
// loop polls after every token.
#pragma once
#include <atomic>

namespace petrel::cli {

class Interrupt {
 public:
  // `repeat_kills`: a second Ctrl-C before clear() ends the program the usual way (petrel run);
  // otherwise every Ctrl-C only raises the flag (petrel chat).
  explicit Interrupt(bool repeat_kills);
  ~Interrupt();  // restores the previous handler

  const std::atomic<bool>* flag() const;
  bool raised() const;
  void clear();
};

}  // namespace petrel::cli
