// Counters in global memory that join the blocks of one launch (all of them resident: a block per
// multiprocessor) at a phase edge: each block signals once its phase's writes are issued, and a
// block that needs them waits for the count. The persistent DeltaNet layer uses them instead of
// kernel boundaries.
#pragma once
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {

constexpr unsigned long long kCountTimeoutNs = 1000000000ull;  // a phase edge takes microseconds

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 waits until *c reaches `target` (polling one word with a short sleep, each read an
// acquire), then the block goes on; what the counted blocks wrote is visible to every thread after it.
// A count still short after a second means a block that can never signal (not resident, or a
// bug): the launch traps, so the caller sees an error instead of a hung device.
__device__ __forceinline__ void wait_count(const int* c, int target) {
  if (threadIdx.x == 0) {
    const unsigned long long start = global_ns();
    int v;
    while (true) {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
      if (v >= target) break;
      __nanosleep(32);
      if (global_ns() - start > kCountTimeoutNs) __trap();
    }
  }
  __syncthreads();
}

// Whole block, once its phase's writes are issued: counts the block in *c (a release). Copies for
// later phases go out after it, so that the fence does not wait for them.
__device__ __forceinline__ void signal_count(int* c) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    atomicAdd(c, 1);
  }
}

// Whole block, at its end: the last block of the launch to get here sets counters[0..n) back to
// zero (counters[n - 1] counts the blocks out), ready for the next launch.
__device__ __forceinline__ void reset_counts_at_exit(int* counters, int n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(counters + n - 1, 1) == int(gridDim.x) - 1)
      for (int i = 0; i < n; ++i) counters[i] = 0;
  }
}

}  // namespace petrel::cuda
