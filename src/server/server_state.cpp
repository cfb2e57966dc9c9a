#include "server/server_state.h"

namespace petrel::server {

void ServerState::set_ready(std::unique_ptr<ServedModel> model) {
  model_ = std::move(model);
  phase_ = Phase::Ready;  // after the model is in place: routes read it once they see Ready
}

ServerState::InFlight::InFlight(ServerState& state) : state_(state) {
  std::lock_guard lock(state_.mutex_);
  ++state_.in_flight_;
}

ServerState::InFlight::~InFlight() {
  std::lock_guard lock(state_.mutex_);
  if (--state_.in_flight_ == 0) state_.idle_.notify_all();
}

bool ServerState::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [&] { return in_flight_ == 0; });
}

}  // namespace petrel::server
