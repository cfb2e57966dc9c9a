// What a decode kernel pays to fetch its machine code: each decode kernel runs its body once per
// block, right after its PDL wait, and a layer's five kernels hold ~200 KB of code, so the body
// may run from a cold instruction cache (docs/design.md, "The kernel chain of a layer").
//
// A CUDA graph of kSteps kernels under programmatic dependent launch, one block of 512 threads a
// multiprocessor. Each kernel waits, then runs a straight-line body of OPS FMAs (8 independent
// chains, distinct immediates per kernel, so every kernel is its own code) and writes one value a
// thread. The graph cycles through `kinds` different kernels of the same size: with one kind the
// code is warm after the first launch; with more, the instruction caches must refetch it.
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/icache_cost (Hopper or later: PDL).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "pdl_launch.h"

constexpr int kThreads = 512, kSteps = 200, kRepeats = 20, kMaxKinds = 10;

// Body of kernel kind V: OPS FMAs in 8 chains, each with immediates no other kind uses.
template <int V, int OPS>
__global__ void __launch_bounds__(kThreads, 1) body_kernel(float* out, float seed) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  float a[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) a[c] = seed + float(threadIdx.x + c);
#pragma unroll
  for (int i = 0; i < OPS / 8; ++i)
#pragma unroll
    for (int c = 0; c < 8; ++c)
      a[c] = fmaf(a[c], 1.0f + float((V * OPS + i * 8 + c) % 4093) * 1e-7f, float(V * 8 + c + i) * 1e-6f);
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += a[c];
  out[blockIdx.x * kThreads + threadIdx.x] = s;
}

using Kernel = void (*)(float*, float);

template <int OPS, int... V>
std::vector<Kernel> kinds_of(std::integer_sequence<int, V...>) {
  return {body_kernel<V, OPS>...};
}

// Median us a kernel of a graph of kSteps launches cycling through the first `kinds` of ks.
float per_kernel_us(const std::vector<Kernel>& ks, int kinds, int sms, float* out, cudaStream_t s) {
  const PdlLaunch launch(dim3(sms), dim3(kThreads), 0, s);
  return graph_us_per_launch(
      s, kSteps, kRepeats,
      [&] {
        for (int i = 0; i < kSteps; ++i) CHECK(cudaLaunchKernelEx(&launch.cfg, ks[i % kinds], out, float(i)));
      },
      [] {});
}

template <int OPS>
void row(int sms, float* out, cudaStream_t s) {
  const std::vector<Kernel> ks = kinds_of<OPS>(std::make_integer_sequence<int, kMaxKinds>{});
  std::printf("%8d", OPS);
  for (int kinds : {1, 2, 5, 10}) std::printf(" %9.3f", per_kernel_us(ks, kinds, sms, out, s));
  std::printf("\n");
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float* out = nullptr;
  CHECK(cudaMalloc(&out, size_t(sms) * kThreads * sizeof(float)));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  std::printf("%d blocks of %d threads, a graph of %d PDL kernels cycling through K kinds of the same size,\n"
              "median us a kernel over %d runs (sm_90a code: ~2 instructions, 32 bytes, an FMA):\n\n%8s %9s %9s %9s %9s\n",
              sms, kThreads, kSteps, kRepeats, "FMAs", "K=1", "K=2", "K=5", "K=10");
  row<64>(sms, out, s);
  row<512>(sms, out, s);
  row<1024>(sms, out, s);
  row<2048>(sms, out, s);
  return 0;
}
