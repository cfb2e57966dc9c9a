// What each kernel really took on the device, from CUPTI activity records: unlike CUDA events
// around each op, this sees kernels inside replayed graphs at real clocks, and the idle time
// between them. Used by `petrel bench --breakdown`; empty where the toolkit has no CUPTI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace petrel::cuda {

struct KernelRecord {
  std::string name;  // demangled, without namespaces and parameters
  uint64_t start_ns = 0, end_ns = 0;
  // The launch's shape, which decides whose blocks can share a multiprocessor with whose:
  // registers per thread, threads per block, shared memory per block (static + dynamic).
  int blocks = 0, threads = 0, registers = 0, shared_bytes = 0;
};

class KernelTrace {
 public:
  static bool available();
  // Starts recording every kernel the process launches (one trace at a time).
  void start();
  // Waits for the device, stops recording and returns the kernels in start order.
  std::vector<KernelRecord> stop();
};

}  // namespace petrel::cuda
