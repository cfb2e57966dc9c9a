// What one kernel boundary costs a batch-1 decode step against one grid-wide barrier inside a
// kernel, on the GPU at hand: the figure that decides between more fusion under PDL and a
// persistent kernel per layer (docs/design.md, "Performance model").
//
// Both chains pass a value from block to block each step (block b reads what block b+1 wrote),
// with the decode GEMV's launch shape (3 blocks of 256 threads per multiprocessor):
//  - kernels: a CUDA graph of N kernels launched with programmatic dependent launch, each
//    letting its successor start at once and waiting before it reads (as Petrel's kernels do);
//  - barrier: one kernel running N steps separated by a grid barrier (an atomic count and a
//    spin on it; every block is resident, so the spin cannot deadlock).
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/sync_cost (Hopper or later: PDL).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"
#include "pdl_launch.h"

constexpr int kThreads = 256, kBlocksPerSm = 3, kSteps = 200, kRepeats = 20;
static_assert(kSteps % 2 == 0, "the last step writes a");

__global__ void __launch_bounds__(kThreads) step_kernel(const float* in, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (threadIdx.x == 0) out[blockIdx.x] = in[(blockIdx.x + 1) % gridDim.x] + 1.0f;
}

// Step s's arrivals bring the count to (s + 1)·gridDim.x.
__device__ void grid_barrier(unsigned* count, int step) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned target = unsigned(step + 1) * gridDim.x;
    __threadfence();
    atomicAdd(count, 1u);
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) barrier_kernel(float* a, float* b, unsigned* count, int steps) {
  for (int s = 0; s < steps; ++s) {
    const float* in = s % 2 ? b : a;
    float* out = s % 2 ? a : b;
    if (threadIdx.x == 0) out[blockIdx.x] = __ldcg(in + (blockIdx.x + 1) % gridDim.x) + 1.0f;
    grid_barrier(count, s);
  }
}

// After kSteps steps from zeros every value is kSteps (kSteps is even: the last step writes a).
void expect_all_steps(const float* a, int blocks, const char* what) {
  std::vector<float> host(blocks);
  CHECK(cudaMemcpy(host.data(), a, blocks * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < blocks; ++i)
    if (host[i] != float(kSteps)) {
      std::fprintf(stderr, "%s: block %d holds %g after %d steps: a step did not see the one before\n", what, i,
                   host[i], kSteps);
      std::exit(1);
    }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * kBlocksPerSm;
  float *a = nullptr, *b = nullptr;
  unsigned* count = nullptr;
  CHECK(cudaMalloc(&a, blocks * sizeof(float)));
  CHECK(cudaMalloc(&b, blocks * sizeof(float)));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  CHECK(cudaMemset(a, 0, blocks * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));

  // kSteps PDL kernels in one graph, as a decode step records them.
  const PdlLaunch launch(dim3(blocks), dim3(kThreads), 0, s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kSteps; ++i)
    CHECK(cudaLaunchKernelEx(&launch.cfg, step_kernel, static_cast<const float*>(i % 2 ? b : a), i % 2 ? a : b));
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // Median time a step of `run` takes (it starts from zeros in a), over kRepeats runs after a warm-up.
  auto per_step_us = [&](auto run) {
    std::vector<float> us;
    for (int r = 0; r < kRepeats + 1; ++r) {
      CHECK(cudaMemsetAsync(a, 0, blocks * sizeof(float), s));
      CHECK(cudaEventRecord(t0, s));
      run();
      CHECK(cudaEventRecord(t1, s));
      CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      if (r) us.push_back(1000.0f * ms / kSteps);
    }
    return median(us);
  };
  const float kernel_us = per_step_us([&] { CHECK(cudaGraphLaunch(exec, s)); });
  expect_all_steps(a, blocks, "kernel chain");
  const float barrier_us = per_step_us([&] {
    CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
    barrier_kernel<<<blocks, kThreads, 0, s>>>(a, b, count, kSteps);
    CHECK(cudaGetLastError());
  });
  expect_all_steps(a, blocks, "grid barrier");
  std::printf("%d blocks of %d threads, %d steps, median of %d runs:\n", blocks, kThreads, kSteps, kRepeats);
  std::printf("  kernel boundary (PDL, in a graph): %.2f us a step\n", kernel_us);
  std::printf("  grid barrier (one kernel):         %.2f us a step\n", barrier_us);
  return 0;
}
