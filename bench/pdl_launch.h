// The launch configuration the micro-benchmarks record their kernel chains with (programmatic
// dependent launch, as the decode step launches its kernels), and how they time such a chain.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"

struct PdlLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  PdlLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  PdlLaunch(const PdlLaunch&) = delete;  // cfg points at attr
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

// Records record() (its `launches` launches on s) into a graph, replays it repeats + 1 times
// (before() queued on s ahead of each) and returns the median replay, after the first, in us a
// launch.
template <typename Record, typename Before>
float graph_us_per_launch(cudaStream_t s, int launches, int repeats, Record record, Before before) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  record();
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::vector<float> us;
  for (int r = 0; r < repeats + 1; ++r) {
    before();
    CHECK(cudaEventRecord(t0, s));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(t1, s));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (r) us.push_back(1000.0f * ms / launches);
  }
  CHECK(cudaEventDestroy(t0));
  CHECK(cudaEventDestroy(t1));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}
