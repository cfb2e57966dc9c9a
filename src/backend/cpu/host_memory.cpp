#include "backend/cpu/host_memory.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace petrel {
namespace {

int thread_count(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

}  // namespace

std::string cpu_device_summary(int threads) {
  const int n = thread_count(threads);
  return "CPU, " + std::to_string(n) + (n == 1 ? " thread" : " threads");
}

double cpu_copy_bandwidth(int threads) {
  constexpr size_t kBytes = size_t(256) << 20;  // per buffer: past any last-level cache
  constexpr int kPieces = 256;                  // spread over the threads, each a contiguous piece
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  const int n = thread_count(threads);
  std::vector<double> seconds;
  for (int rep = 0; rep < 6; ++rep) {  // the first copy warms up (pages, caches)
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(n) schedule(static)
    for (int p = 0; p < kPieces; ++p) {
      const size_t at = kBytes / kPieces * size_t(p);
      std::memcpy(dst.data() + at, src.data() + at, kBytes / kPieces);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) seconds.push_back(s);
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * double(kBytes) / seconds[seconds.size() / 2];
}

}  // namespace petrel
