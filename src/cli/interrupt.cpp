#include "cli/interrupt.h"

#include <signal.h>

namespace petrel::cli {
namespace {

std::atomic<bool> g_raised{false};
bool g_repeat_kills = false;
struct sigaction g_previous;

void on_sigint(int) {
  if (g_repeat_kills && g_raised.load()) {
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    return;
  }
  g_raised.store(true);
}

}  // namespace

// No SA_RESTART: a blocking read of the chat prompt returns EINTR, so Ctrl-C there is seen at once.
Interrupt::Interrupt(bool repeat_kills) {
  g_repeat_kills = repeat_kills;
  g_raised.store(false);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &g_previous);
}

Interrupt::~Interrupt() { sigaction(SIGINT, &g_previous, nullptr); }

const std::atomic<bool>* Interrupt::flag() const { return &g_raised; }
bool Interrupt::raised() const { return g_raised.load(); }
void Interrupt::clear() { g_raised.store(false); }

}  // namespace petrel::cli
