// What an address translation costs a decode kernel that reads a routed expert's rows: one thread
// chases a chain through N pages P bytes apart (one node a page, on a random line of it, the pages
// in random order), after one warm pass, so every node is an L2 hit and each hop's latency above the
// one-page figure is the translation's. Where N pages outgrow a TLB level the hop gets dearer: the
// spans at which that happens are the TLBs' reach. The expert stacks of Qwen3.5-35B-A3B at 4-bit
// hold ~10 GB, touched at random, 9 experts a layer.
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/tlb_reach (needs 32 GB of free device memory).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_check.h"

constexpr size_t kSpan = 32ull << 30;  // the buffer the chains lie in
constexpr int kLine = 128;
constexpr int kMaxPages = 16384;  // the longest chain

// Node i's offset in the buffer: page i, a pseudo-random line of it.
__host__ __device__ inline uint64_t node_at(uint64_t i, uint64_t page) {
  const uint64_t lines = page / kLine;
  return i * page + (i * 2654435761ull % lines) * kLine;
}

// next[order[j]] = order[j + 1] (cyclic), as offsets stored at each node.
__global__ void link_kernel(char* buf, const uint32_t* order, int n, uint64_t page) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const uint64_t from = node_at(order[j], page), to = node_at(order[(j + 1) % n], page);
  *reinterpret_cast<uint64_t*>(buf + from) = to;
}

// One thread: `hops` hops from `start` (L2 only), twice; the second pass's cycles to out[0].
__global__ void chase_kernel(const char* buf, uint64_t start, int hops, long long* out, uint64_t* sink) {
  uint64_t at = start;
  for (int i = 0; i < hops; ++i) at = __ldcg(reinterpret_cast<const unsigned long long*>(buf + at));
  const long long t0 = clock64();
  for (int i = 0; i < hops; ++i) at = __ldcg(reinterpret_cast<const unsigned long long*>(buf + at));
  out[0] = clock64() - t0;
  sink[0] = at;  // keeps the chain live
}

int main() {
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  char* buf = nullptr;
  CHECK(cudaMalloc(&buf, kSpan));
  long long* cycles = nullptr;
  uint64_t* sink = nullptr;
  uint32_t* order_d = nullptr;
  CHECK(cudaMalloc(&cycles, sizeof(long long)));
  CHECK(cudaMalloc(&sink, sizeof(uint64_t)));
  CHECK(cudaMalloc(&order_d, kMaxPages * sizeof(uint32_t)));
  std::mt19937 rng(7);
  std::printf("one thread, a chain of one node a page (pages in random order), warm: cycles a hop (L2 hits)\n");
  std::printf("%10s %8s %12s %12s %10s\n", "page", "pages", "span", "cycles/hop", "ns/hop");
  for (uint64_t page : {uint64_t(kLine), uint64_t(64) << 10, uint64_t(2) << 20, uint64_t(32) << 20}) {
    for (int n : {16, 64, 256, 1024, 2048, 4096, 8192, kMaxPages}) {
      if (page * uint64_t(n) > kSpan) continue;
      std::vector<uint32_t> order(n);
      std::iota(order.begin(), order.end(), 0u);
      std::shuffle(order.begin(), order.end(), rng);
      CHECK(cudaMemcpy(order_d, order.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
      link_kernel<<<(n + 255) / 256, 256>>>(buf, order_d, n, page);
      CHECK(cudaGetLastError());
      const int hops = std::max(n, 4096);
      chase_kernel<<<1, 1>>>(buf, node_at(order[0], page), hops, cycles, sink);
      CHECK(cudaGetLastError());
      long long c = 0;
      CHECK(cudaMemcpy(&c, cycles, sizeof(c), cudaMemcpyDeviceToHost));
      const double per = double(c) / hops;
      std::printf("%10llu %8d %10.1f MB %12.1f %10.1f\n", static_cast<unsigned long long>(page), n,
                  double(page) * n / (1 << 20), per, per / (clock_khz * 1e-6));
    }
  }
  return 0;
}
