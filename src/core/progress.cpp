#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace petrel {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(size_t done, size_t total) {
  done_ = done;
  total_ = total;
  if (!tty_ || total == 0) return;
  const int permille = int(1000.0 * double(done) / double(total));
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  std::string bar(size_t(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s", label_.c_str(), bar.c_str(), permille / 10.0,
               format_bytes(double(done)).c_str(), format_bytes(double(total)).c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s: %s in %.2f s\n", label_.c_str(), format_bytes(double(total_)).c_str(), s);
}

}  // namespace petrel
