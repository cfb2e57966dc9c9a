// Per-op device timing for `petrel bench --breakdown`: a CUDA event pair around each op, read
// back (one synchronisation) when the totals are taken. Costs nothing while disabled.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace petrel::cuda {

class OpTimer {
 public:
  ~OpTimer();
  bool enabled() const { return enabled_; }
  void enable(bool on) { enabled_ = on; }

  // Marks the start of an op on `stream`; returns the record to close with stop().
  int start(std::string label, cudaStream_t stream);
  void stop(int record, cudaStream_t stream);
  // Seconds per label since the last call, in order of first appearance (waits for the stream).
  std::vector<std::pair<std::string, double>> take(cudaStream_t stream);

 private:
  struct Record {
    std::string label;
    cudaEvent_t begin, end;
  };
  bool enabled_ = false;
  std::vector<Record> records_;
  size_t used_ = 0;  // records_[0, used_) hold this round's ops; the rest are kept for reuse
};

// Times one op for the scope's lifetime when the timer is enabled.
class TimedOp {
 public:
  TimedOp(OpTimer& t, cudaStream_t s, const char* op, long a = 0, long b = 0) : timer_(t), stream_(s) {
    if (!t.enabled()) return;
    std::string label = op;
    if (a) label += " " + std::to_string(a) + "x" + std::to_string(b);
    record_ = t.start(std::move(label), s);
  }
  ~TimedOp() {
    if (record_ >= 0) timer_.stop(record_, stream_);
  }
  TimedOp(const TimedOp&) = delete;
  TimedOp& operator=(const TimedOp&) = delete;

 private:
  OpTimer& timer_;
  cudaStream_t stream_;
  int record_ = -1;
};

}  // namespace petrel::cuda
