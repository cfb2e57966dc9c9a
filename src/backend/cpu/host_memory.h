// The host as `petrel bench --device cpu` reports it: what runs the CPU backend and how fast its
// memory copies, the limit a CPU decode token's weight reads are measured against.
#pragma once
#include <string>

namespace petrel {

// "CPU, N threads" (threads 0: every core OpenMP would use).
std::string cpu_device_summary(int threads);
// Host memory copy bandwidth in bytes/s (read + write), with `threads` threads (0: all): the
// median of several copies of a buffer far larger than the caches.
double cpu_copy_bandwidth(int threads);

}  // namespace petrel
