// What every route reads: the phase (loading, ready, draining), the model once loaded, the
// metrics, and the generation requests in flight (which a graceful shutdown waits for).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "server/metrics.h"
#include "server/served_model.h"

namespace petrel::server {

enum class Phase { Loading, Ready, Draining };

class ServerState {
 public:
  Phase phase() const { return phase_.load(); }
  // Null until ready.
  ServedModel* model() const { return model_.get(); }
  ServerMetrics& metrics() { return metrics_; }

  void set_ready(std::unique_ptr<ServedModel> model);
  // New generation requests are refused (503) from now on.
  void begin_draining() { phase_ = Phase::Draining; }

  // Held by a generation request from submission to its last byte.
  class InFlight {
   public:
    explicit InFlight(ServerState& state);
    ~InFlight();
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    ServerState& state_;
  };
  // True when no request was in flight before the timeout.
  bool wait_idle(std::chrono::milliseconds timeout);
  // Frees the model; call when no thread can reach it any more.
  void release_model() { model_.reset(); }

 private:
  std::atomic<Phase> phase_{Phase::Loading};
  std::unique_ptr<ServedModel> model_;
  ServerMetrics metrics_;
  std::mutex mutex_;
  std::condition_variable idle_;
  int in_flight_ = 0;
};

}  // namespace petrel::server
