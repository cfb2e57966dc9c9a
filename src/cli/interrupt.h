// Ctrl-C as "stop the current answer": a SIGINT handler that only raises a flag the generation
// loop polls after every token.
#pragma once
#include <atomic>
#include <cstdint>

namespace petrel::cli {

class Interrupt {
 public:
  // `repeat_kills`: a second Ctrl-C before clear_up_to() ends the program the usual way (petrel run);
  // otherwise every Ctrl-C only raises the flag (petrel chat).
  explicit Interrupt(bool repeat_kills);
  ~Interrupt();  // restores the previous handler

  const std::atomic<bool>* flag() const;
  bool raised() const;
  // Ctrl-C presses so far. Take it when one is acted on, then clear_up_to(it): a press that
  // came in between keeps the flag raised instead of being lost.
  uint64_t count() const;
  void clear_up_to(uint64_t seen);
};

}  // namespace petrel::cli
