// What thread-block clusters would cost a fused one-token DeltaNet layer (the input projections
// of one key head spread over a cluster of blocks that then run the head's DeltaNet step
// together, exchanging rows through distributed shared memory; measured and dropped, see
// docs/performance.md):
//  1. how many clusters of 1/2/4/8/16 blocks of 512 threads with ~200 KB of shared memory each
//     (one block a multiprocessor, as the decode GEMVs run) the GPU holds at once — a fused
//     layer wants 128 blocks resident: 16 clusters of 8 or 32 of 4;
//  2. a cluster barrier, and an all-gather of 100 floats a block into every block of the cluster
//     (st.shared::cluster, then the barrier), per round;
//  3. when a PDL-launched grid's blocks start after their predecessor's blocks leave: the
//     predecessor's 132 blocks (one an SM) end at staggered times (3-8 us), the successor (128
//     blocks, one an SM) records each block's start against the end of the block that held its
//     SM before — single blocks take any freed SM, a cluster needs its blocks' SMs free at once.
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/cluster_costs (Hopper or later).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_check.h"

constexpr int kThreads = 512, kRounds = 200, kGatherFloats = 100, kMaxSms = 256;
constexpr size_t kSmem = 200 * 1024;  // more than half an SM's: one block a multiprocessor

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// This block's rank in its cluster and the cluster's block count.
__device__ __forceinline__ uint2 cluster_place() {
  uint2 p;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n\tmov.u32 %1, %%cluster_nctarank;" : "=r"(p.x), "=r"(p.y));
  return p;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Stores v at the shared-memory address of `p` in block `rank` of the cluster.
__device__ __forceinline__ void store_remote(const float* p, unsigned rank, float v) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(remote), "f"(v) : "memory");
}
#endif

// An empty body for the occupancy query.
__global__ void __launch_bounds__(kThreads, 1) resident_kernel() {}

// out[0..1] per cluster-rank-0 block: ns a round of (barrier) and of (all-gather + barrier).
__global__ void __launch_bounds__(kThreads, 1) gather_kernel(float* sink, uint64_t* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float smem[];  // kGatherFloats from each block of the cluster
  const uint2 place = cluster_place();
  const unsigned rank = place.x, n = place.y;
  cluster_sync();
  const uint64_t t0 = now_ns();
  for (int r = 0; r < kRounds; ++r) cluster_sync();
  const uint64_t t1 = now_ns();
  for (int r = 0; r < kRounds; ++r) {
    // Item q < n·kGatherFloats: value q % kGatherFloats of this block into block q / kGatherFloats.
    for (unsigned q = threadIdx.x; q < n * kGatherFloats; q += blockDim.x) {
      const unsigned to = q / kGatherFloats, i = q % kGatherFloats;
      store_remote(smem + rank * kGatherFloats + i, to, float(r + i + rank));
    }
    cluster_sync();
  }
  const uint64_t t2 = now_ns();
  if (threadIdx.x == 0) sink[blockIdx.x] = smem[(rank + 1) % n * kGatherFloats];
  if (threadIdx.x == 0 && rank == 0) {
    out[2 * (blockIdx.x / n)] = (t1 - t0) / kRounds;
    out[2 * (blockIdx.x / n) + 1] = (t2 - t1) / kRounds;
  }
#endif
}

// The predecessor: one block an SM, each busy for 3-8 us after its start (a hash of its index),
// then it records its SM and end. It lets its dependents launch at once.
__global__ void __launch_bounds__(kThreads, 1) busy_kernel(uint64_t* end_of_sm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  __shared__ uint64_t begin;
  if (threadIdx.x == 0) begin = now_ns();
  __syncthreads();
  const uint64_t until = begin + 3000 + (blockIdx.x * 2654435761u) % 5000;
  while (now_ns() < until) {
  }
  __syncthreads();
  if (threadIdx.x == 0) end_of_sm[sm_id()] = now_ns();
}

// The successor (PDL, any cluster shape): each block records its start and SM before waiting.
__global__ void __launch_bounds__(kThreads, 1) follow_kernel(uint64_t* start_of_block, unsigned* sm_of_block) {
  if (threadIdx.x == 0) {
    start_of_block[blockIdx.x] = now_ns();
    sm_of_block[blockIdx.x] = sm_id();
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

cudaLaunchConfig_t config(int grid, int cluster, cudaLaunchAttribute* attrs, bool pdl) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(kThreads);
  c.dynamicSmemBytes = kSmem;
  c.attrs = attrs;
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cluster;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  c.numAttrs = pdl ? 2 : 1;
  return c;
}

template <typename K>
void allow(K kernel) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  allow(resident_kernel);
  allow(gather_kernel);
  allow(busy_kernel);
  allow(follow_kernel);
  const int sizes[] = {1, 2, 4, 8, 16};
  cudaLaunchAttribute attrs[2];

  std::printf("%d SMs; blocks of %d threads with %zu KB of shared memory (one an SM).\n\n", sms, kThreads,
              kSmem / 1024);
  std::printf("%-8s %16s %16s\n", "cluster", "clusters at once", "blocks at once");
  for (int size : sizes) {
    cudaLaunchConfig_t c = config(size * (sms / size), size, attrs, false);
    int clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, resident_kernel, &c));
    std::printf("%-8d %16d %16d\n", size, clusters, clusters * size);
  }

  float* sink = nullptr;
  uint64_t *out = nullptr, *end_of_sm = nullptr, *start_of_block = nullptr;
  unsigned* sm_of_block = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(float) * sms));
  CHECK(cudaMalloc(&out, sizeof(uint64_t) * 2 * sms));
  CHECK(cudaMalloc(&end_of_sm, sizeof(uint64_t) * kMaxSms));
  CHECK(cudaMalloc(&start_of_block, sizeof(uint64_t) * sms));
  CHECK(cudaMalloc(&sm_of_block, sizeof(unsigned) * sms));

  std::printf("\nns a round, median over clusters of 5 launches (%d rounds each; gather: %d floats from each\n"
              "block into every block of its cluster, then the barrier):\n%-8s %10s %18s\n",
              kRounds, kGatherFloats, "cluster", "barrier", "gather + barrier");
  for (int size : {2, 4, 8}) {
    const int clusters = 128 / size;
    std::vector<float> bar, gather;
    std::vector<uint64_t> host(2 * clusters);
    for (int l = 0; l < 6; ++l) {
      cudaLaunchConfig_t c = config(clusters * size, size, attrs, false);
      CHECK(cudaLaunchKernelEx(&c, gather_kernel, sink, out));
      CHECK(cudaMemcpy(host.data(), out, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
      if (l == 0) continue;
      for (int i = 0; i < clusters; ++i) {
        bar.push_back(float(host[2 * i]));
        gather.push_back(float(host[2 * i + 1]));
      }
    }
    std::printf("%-8d %10.0f %18.0f\n", size, median(bar), median(gather));
  }

  std::printf("\nA PDL successor's 128 blocks after %d staggered blocks (3-8 us): us from the end of the block\n"
              "that held a block's SM to the block's start (median [max] over blocks, median of 10 launches),\n"
              "and the last start after the predecessor's last end:\n%-8s %18s %16s\n",
              sms, "cluster", "start after SM free", "last start");
  std::vector<uint64_t> ends(kMaxSms), starts(128);
  std::vector<unsigned> where(128);
  for (int size : {1, 4, 8}) {
    std::vector<float> med, worst, last;
    for (int l = 0; l < 11; ++l) {
      CHECK(cudaMemset(end_of_sm, 0, sizeof(uint64_t) * kMaxSms));
      cudaLaunchConfig_t a = config(sms, 1, attrs, false);
      CHECK(cudaLaunchKernelEx(&a, busy_kernel, end_of_sm));
      cudaLaunchConfig_t b = config(128, size, attrs, true);
      CHECK(cudaLaunchKernelEx(&b, follow_kernel, start_of_block, sm_of_block));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(ends.data(), end_of_sm, sizeof(uint64_t) * kMaxSms, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(starts.data(), start_of_block, sizeof(uint64_t) * 128, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(where.data(), sm_of_block, sizeof(unsigned) * 128, cudaMemcpyDeviceToHost));
      if (l == 0) continue;
      std::vector<float> delay;
      uint64_t last_end = 0, last_start = 0;
      for (int s = 0; s < kMaxSms; ++s) last_end = std::max(last_end, ends[s]);
      for (int i = 0; i < 128; ++i) {
        last_start = std::max(last_start, starts[i]);
        if (ends[where[i]]) delay.push_back(1e-3f * float(int64_t(starts[i] - ends[where[i]])));
      }
      med.push_back(median(delay));
      worst.push_back(*std::max_element(delay.begin(), delay.end()));
      last.push_back(1e-3f * float(int64_t(last_start - last_end)));
    }
    std::printf("%-8d %9.2f [%6.2f] %16.2f\n", size, median(med), median(worst), median(last));
  }
  return 0;
}
