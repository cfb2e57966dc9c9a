// A gate for scheduler tests: holds the scheduler thread inside a request's callback until the
// test has done what it must do first (queued more requests, cancelled, ...).
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>

#include "runtime/scheduler.h"

namespace petrel {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool arrived = false, open = false;
  void pass() {
    std::unique_lock lock(mu);
    arrived = true;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void wait_arrival() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return arrived; });
  }
  void release() {
    {
      std::lock_guard lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  // A callback that waits at its n-th event.
  std::function<bool(const StepEvent&)> at_event(int n) {
    return [this, n, seen = 0](const StepEvent&) mutable {
      if (++seen == n) pass();
      return true;
    };
  }
};

}  // namespace petrel
