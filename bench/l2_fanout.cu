// What a decode kernel's first read costs when every multiprocessor asks L2 for the same small
// vector its predecessor has just written (the activations, the router sums), and whether
// spreading that read over R copies of the vector (block b reads copy b % R; the producer writes
// all R) makes the chain shorter: the figure behind "one L2 round trip after each wait"
// (docs/performance.md: no hot spot, the read costs 0.63-0.93 us whatever R).
//
// A CUDA graph of kSteps kernels under programmatic dependent launch, one block of 512 threads a
// multiprocessor (as the decode GEMVs run): each waits for its predecessor, reads the whole
// vector (16-byte loads, L2 only), sums it over the block, and writes its slice of the next vector
// into every copy. R = 0 reads nothing: the boundary and the writes alone.
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/l2_fanout (Hopper or later: PDL).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "pdl_launch.h"

constexpr int kThreads = 512, kSteps = 200, kRepeats = 20, kMaxCopies = 32;
constexpr size_t kSmem = 100 * 1024;  // one block a multiprocessor
// Copies lie this far apart (in words): 16 KB plus a line, so that they start on different slices.
constexpr size_t kPitch = 16 * 1024 / 4 + 32;

// Launched with kSmem of dynamic shared memory (unused) so that each multiprocessor holds one block.
__global__ void __launch_bounds__(kThreads, 1) step_kernel(const uint32_t* in, uint32_t* out, int words, int copies) {
  __shared__ uint32_t warp_sums[kThreads / 32];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  uint32_t s = 0;
  if (copies > 0) {
    const uint32_t* src = in + (blockIdx.x % copies) * kPitch;
    for (int i = threadIdx.x * 4; i < words; i += kThreads * 4) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + i));
      s += v.x + v.y + v.z + v.w;
    }
    s = __reduce_add_sync(0xffffffffu, s);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += warp_sums[w];
  }
  const int per = (words + gridDim.x - 1) / gridDim.x, first = blockIdx.x * per;
  for (int c = 0; c < max(copies, 1); ++c)
    for (int i = threadIdx.x; i < per && first + i < words; i += kThreads)
      out[c * kPitch + first + i] = s + uint32_t(first + i);
}

// The vector after kSteps steps from v[i] = i: each step's sum S gives v'[i] = S + i.
std::vector<uint32_t> expected(int words, int copies) {
  std::vector<uint32_t> v(words);
  for (int i = 0; i < words; ++i) v[i] = uint32_t(i);
  for (int s = 0; s < kSteps; ++s) {
    uint32_t sum = 0;
    if (copies > 0)
      for (uint32_t x : v) sum += x;
    for (int i = 0; i < words; ++i) v[i] = sum + uint32_t(i);
  }
  return v;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const size_t buffer_words = kMaxCopies * kPitch;
  uint32_t *a = nullptr, *b = nullptr;
  CHECK(cudaMalloc(&a, buffer_words * 4));
  CHECK(cudaMalloc(&b, buffer_words * 4));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  const PdlLaunch launch(dim3(sms), dim3(kThreads), kSmem, s);
  std::vector<uint32_t> start(buffer_words);
  for (size_t i = 0; i < buffer_words; ++i) start[i] = uint32_t(i % kPitch);

  std::printf("%d blocks of %d threads (one a multiprocessor), a graph of %d PDL kernels, median of %d runs:\n"
              "each kernel reads the whole vector (copy b %% R in block b) and writes its slice of every copy.\n\n",
              sms, kThreads, kSteps, kRepeats);
  std::printf("%8s %7s %11s %12s\n", "vector", "copies", "us a step", "vs 1 copy");
  for (int bytes : {2048, 8192, 16384}) {
    const int words = bytes / 4;
    float one = 0.0f;
    for (int copies : {0, 1, 2, 4, 8, 16, 32}) {
      const float m = graph_us_per_launch(
          s, kSteps, kRepeats,
          [&] {
            for (int i = 0; i < kSteps; ++i)
              CHECK(cudaLaunchKernelEx(&launch.cfg, step_kernel, static_cast<const uint32_t*>(i % 2 ? b : a),
                                       i % 2 ? a : b, words, copies));
          },
          [&] { CHECK(cudaMemcpyAsync(a, start.data(), buffer_words * 4, cudaMemcpyHostToDevice, s)); });
      // kSteps is even: the last step wrote a. Every copy must hold the expected vector.
      const std::vector<uint32_t> want = expected(words, copies);
      std::vector<uint32_t> got(buffer_words);
      CHECK(cudaMemcpy(got.data(), a, buffer_words * 4, cudaMemcpyDeviceToHost));
      for (int c = 0; c < std::max(copies, 1); ++c)
        for (int i = 0; i < words; ++i)
          if (got[c * kPitch + i] != want[i]) {
            std::fprintf(stderr, "%d B, %d copies: copy %d word %d is %u, expected %u\n", bytes, copies, c, i,
                         got[c * kPitch + i], want[i]);
            return 1;
          }
      if (copies == 1) one = m;
      std::printf("%8d %7d %11.3f %12s\n", bytes, copies, m,
                  copies > 1 ? (std::to_string(m - one).substr(0, 6) + " us").c_str() : "");
    }
  }
  return 0;
}
