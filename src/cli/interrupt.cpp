#include "cli/interrupt.h"

#include <signal.h>

namespace petrel::cli {
namespace {

std::atomic<bool> g_raised{false};
std::atomic<uint64_t> g_count{0};
bool g_repeat_kills = false;
struct sigaction g_previous;

void on_sigint(int) {
  if (g_repeat_kills && g_raised.load()) {
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
    return;
  }
  g_count.fetch_add(1);
  g_raised.store(true);  // after the count, so clear_up_to() never loses a press
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
uint64_t Interrupt::count() const { return g_count.load(); }

void Interrupt::clear_up_to(uint64_t seen) {
  g_raised.store(false);
  if (g_count.load() != seen) g_raised.store(true);
}

}  // namespace petrel::cli
