// /metrics in Prometheus' text format: the server's own counters and latency histograms, plus the
// scheduler's gauges and token counters (SchedulerMetrics). Names are listed in docs/serving.md.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/completion_job.h"

namespace petrel::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The _bucket, _sum and _count lines of metric `name`.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  // Every answered HTTP request, by route (unknown paths count as "other") and status.
  void count_request(const std::string& path, int status);
  // Every generation that ended, with its latencies.
  void count_finished(const JobFinish& finish);
  // The whole exposition; `scheduler` is null while the model loads.
  std::string render(const SchedulerMetrics* scheduler) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;  // by finish reason
  Histogram ttft_, tpot_;
};

}  // namespace petrel::server
