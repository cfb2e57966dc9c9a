// A terminal progress bar on stderr (redrawn in place on a TTY, a single final line otherwise).
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace petrel {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(size_t done, size_t total);  // byte counts
  void finish();

 private:
  std::string label_;
  bool tty_ = false, finished_ = false;
  size_t done_ = 0, total_ = 0;
  int last_permille_ = -1;
  std::chrono::steady_clock::time_point start_;
};

std::string format_bytes(double bytes);  // "1.65 GB"

}  // namespace petrel
