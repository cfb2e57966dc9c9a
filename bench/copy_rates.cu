// How fast one block per multiprocessor can fill its shared memory from DRAM, by each copy
// mechanism the decode kernels could use: the figure behind "how long until a kernel's weights
// have landed" (docs/design.md, "The kernel chain of a layer").
//
// Every launch has one block of 512 threads on each multiprocessor copy `bytes` (its own range,
// fresh from DRAM: launches rotate over a 3 GB buffer, far past the 50 MB L2) into shared memory,
// and records %globaltimer at its start, when one warp's load of an 8 KB L2-resident vector
// (the activations a GEMV stages after its weight copies are issued) came back, and when every
// byte has landed. Mechanisms:
//  - cp.async: 16-byte cp.async.cg by all 512 threads (Petrel's GEMV ring today), or by the block's
//    last N threads only, so that the warp loading x issues no copies (do its loads pass them?);
//  - bulk xN: cp.async.bulk (TMA) pieces of `piece` bytes issued by N threads, one mbarrier;
//  - ld/st: 16-byte ld.global by all threads (8 in flight each), stored to shared memory.
// Then the L2 prefetch a kernel could issue for its successor: how long a grid of such blocks takes
// (does a block leave before its prefetches land?) and how fast the bulk copy above reads the
// range afterwards, by `cp.async.bulk.prefetch.L2` (one thread, 16 KB pieces) or `prefetch.global.L2`
// (every thread, a 128-byte line at a time).
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/copy_rates (Hopper or later: bulk copies).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <unistd.h>

#include "cuda_check.h"

enum Method { kCpAsync, kBulk, kLoadStore };
constexpr int kThreads = 512, kLaunches = 30, kXBytes = 8192;
constexpr int kProbes = 8, kSinkWords = 2 + kProbes;  // a block's sink: x's XOR, the landed XOR, the probes
constexpr size_t kSourceBytes = size_t(3) << 30, kMaxBlockBytes = 192 * 1024;

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Word index of probe p: the last word of the p-th eighth of a `bytes` range.
__host__ __device__ inline int probe_word(int bytes, int p) { return (p + 1) * (bytes / 4) / kProbes - 1; }

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Issues this thread's part of the block's copy of [src, src + bytes) into smem (cp.async: the last
// `issuers` threads, all where 0).
template <Method M>
__device__ void issue(char* smem, const char* src, int bytes, int piece, int issuers, uint64_t* bar) {
  const int t = threadIdx.x;
  if constexpr (M == kCpAsync) {
    const int n = issuers > 0 ? issuers : kThreads, first = kThreads - n;
    if (t >= first)
      for (int i = (t - first) * 16; i < bytes; i += n * 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_addr(smem + i)), "l"(src + i) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  } else if constexpr (M == kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (t >= issuers) return;
    uint32_t mine = 0;
    for (int i = t * piece; i < bytes; i += issuers * piece) mine += min(piece, bytes - i);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(mine) : "memory");
    for (int i = t * piece; i < bytes; i += issuers * piece)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       shared_addr(smem + i)),
                   "l"(src + i), "r"(min(piece, bytes - i)), "r"(shared_addr(bar))
                   : "memory");
#endif
  }
}

// Waits until every byte of the block's copy has landed (ld/st: does the whole copy).
template <Method M>
__device__ void land(char* smem, const char* src, int bytes, uint64_t* bar) {
  if constexpr (M == kCpAsync) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  } else if constexpr (M == kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(shared_addr(bar))
        : "memory");
#endif
  } else {
    constexpr int kInFlight = 8;
    for (int base = threadIdx.x * 16; base < bytes; base += kThreads * 16 * kInFlight) {
      uint4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int i = base + u * kThreads * 16;
        if (i < bytes) v[u] = __ldcs(reinterpret_cast<const uint4*>(src + i));
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int i = base + u * kThreads * 16;
        if (i < bytes) *reinterpret_cast<uint4*>(smem + i) = v[u];
      }
    }
  }
  __syncthreads();
}

// stamps[3b..3b+2]: block b's start, its x load back, all landed (ns).
template <Method M>
__global__ void __launch_bounds__(kThreads, 1)
    fill_kernel(const char* src, int bytes, int piece, int issuers, const uint4* x, uint64_t* stamps, uint32_t* sink) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bar;
  const uint64_t t0 = now_ns();
  if (M == kBulk && threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(&bar)), "r"(issuers) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  if (M == kBulk) __syncthreads();
  const char* mine = src + size_t(blockIdx.x) * bytes;
  issue<M>(smem, mine, bytes, piece, issuers, &bar);
  // Warp 1 loads the activations, as a GEMV stages x after issuing its weight copies.
  uint32_t xs = 0;
  uint64_t tx = 0;
  if (threadIdx.x / 32 == 1) {
    for (int i = threadIdx.x % 32; i < kXBytes / 16; i += 32) xs ^= __ldcg(x + i).x;
    xs = __reduce_xor_sync(0xffffffffu, xs);
    tx = now_ns();
  }
  land<M>(smem, mine, bytes, &bar);
  // The last word of each eighth of the range, read as soon as the copy counts as landed: had
  // the wait returned before the bytes arrived, these would be the previous launch's.
  uint32_t probe[kProbes];
  if (threadIdx.x == 32)
    for (int p = 0; p < kProbes; ++p) probe[p] = reinterpret_cast<const uint32_t*>(smem)[probe_word(bytes, p)];
  const uint64_t t1 = now_ns();
  // What landed, checked by the host: the XOR of every copied word.
  __shared__ uint32_t landed_xor;
  if (threadIdx.x == 0) landed_xor = 0;
  __syncthreads();
  uint32_t words = 0;
  for (int i = threadIdx.x; i < bytes / 4; i += kThreads) words ^= reinterpret_cast<const uint32_t*>(smem)[i];
  words = __reduce_xor_sync(0xffffffffu, words);
  if (threadIdx.x % 32 == 0) atomicXor(&landed_xor, words);
  __syncthreads();
  if (threadIdx.x == 32) {
    stamps[3 * blockIdx.x] = t0;
    stamps[3 * blockIdx.x + 1] = tx;
    stamps[3 * blockIdx.x + 2] = t1;
    uint32_t* mine_sink = sink + kSinkWords * blockIdx.x;
    mine_sink[0] = xs;
    mine_sink[1] = landed_xor;
    for (int p = 0; p < kProbes; ++p) mine_sink[2 + p] = probe[p];
  }
}

enum Prefetch { kPrefetchBulk, kPrefetchLines };

// Asks L2 for this block's `bytes` of src and leaves.
template <Prefetch P>
__global__ void __launch_bounds__(kThreads, 1) prefetch_kernel(const char* src, int bytes) {
  const char* mine = src + size_t(blockIdx.x) * bytes;
  if constexpr (P == kPrefetchBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0)
      for (int i = 0; i < bytes; i += 16384)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(mine + i), "r"(min(16384, bytes - i)) : "memory");
#endif
  } else {
    for (int i = threadIdx.x * 128; i < bytes; i += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(mine + i) : "memory");
  }
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Word i of the source: a mixing hash of i (murmur3's finaliser), incompressible to any memory path.
__host__ __device__ inline uint32_t source_word(size_t i) {
  uint32_t h = uint32_t(i) ^ uint32_t(i >> 32) * 0x9e3779b9u;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}

struct Result {
  float span_us, block_us, x_us;
  int wrong;  // blocks of the last launch whose shared memory does not hold their range
};

// The XOR of the source's words [w, w + n).
uint32_t source_xor(size_t w, size_t n) {
  uint32_t v = 0;
  for (size_t i = w; i < w + n; ++i) v ^= source_word(i);
  return v;
}

template <Method M>
Result measure(const char* src, int blocks, int bytes, int piece, int issuers, const uint4* x, uint64_t* stamps,
               uint32_t* sink) {
  CHECK(cudaFuncSetAttribute(fill_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxBlockBytes)));
  const size_t grid_bytes = size_t(blocks) * bytes, regions = kSourceBytes / grid_bytes;
  std::vector<float> span, block, xlat;
  std::vector<uint64_t> host(3 * blocks);
  for (int l = 0; l < kLaunches + 1; ++l) {
    const char* from = src + (l % regions) * grid_bytes;  // a range no launch of the last ~100 read
    fill_kernel<M><<<blocks, kThreads, kMaxBlockBytes>>>(from, bytes, piece, issuers, x, stamps, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host.data(), stamps, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    if (l == 0) continue;  // warm-up
    uint64_t first = ~0ull, last = 0;
    std::vector<float> per, xs;
    for (int b = 0; b < blocks; ++b) {
      first = std::min(first, host[3 * b]);
      last = std::max(last, host[3 * b + 2]);
      per.push_back(1e-3f * float(host[3 * b + 2] - host[3 * b]));
      xs.push_back(1e-3f * float(host[3 * b + 1] - host[3 * b]));
    }
    span.push_back(1e-3f * float(last - first));
    block.push_back(median(per));
    xlat.push_back(median(xs));
  }
  std::vector<uint32_t> got(size_t(kSinkWords) * blocks);
  CHECK(cudaMemcpy(got.data(), sink, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  const size_t last_from = (size_t(kLaunches) % regions) * grid_bytes;
  int wrong = 0;
  for (int b = 0; b < blocks; ++b) {
    const uint32_t* g = got.data() + size_t(kSinkWords) * b;
    const size_t w0 = (last_from + size_t(b) * bytes) / 4;
    bool bad = g[1] != source_xor(w0, size_t(bytes) / 4);
    for (int p = 0; p < kProbes; ++p) bad |= g[2 + p] != source_word(w0 + probe_word(bytes, p));
    wrong += bad;
  }
  return {median(span), median(block), median(xlat), wrong};
}

// Median time of a prefetch grid (events around each launch, fresh DRAM each time), and the bulk
// copy's span over the range right after it landed (a 20 us pause first).
template <Prefetch P>
void measure_prefetch(const char* name, const char* src, int blocks, int bytes, const uint4* x, uint64_t* stamps,
                      uint32_t* sink) {
  CHECK(cudaFuncSetAttribute(fill_kernel<kBulk>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxBlockBytes)));
  const size_t grid_bytes = size_t(blocks) * bytes, regions = bytes ? kSourceBytes / grid_bytes : 1;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> grid_us, span_us;
  std::vector<uint64_t> host(3 * blocks);
  for (int l = 0; l < kLaunches + 1; ++l) {
    const char* from = src + ((l + regions / 2) % regions) * grid_bytes;
    CHECK(cudaEventRecord(e0));
    prefetch_kernel<P><<<blocks, kThreads>>>(from, bytes);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    grid_us.push_back(1000.0f * ms);
    if (bytes == 0) continue;
    usleep(20);
    fill_kernel<kBulk><<<blocks, kThreads, kMaxBlockBytes>>>(from, bytes, 16384, 1, x, stamps, sink);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host.data(), stamps, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    if (l == 0) continue;
    uint64_t first = ~0ull, last = 0;
    for (int b = 0; b < blocks; ++b) {
      first = std::min(first, host[3 * b]);
      last = std::max(last, host[3 * b + 2]);
    }
    span_us.push_back(1e-3f * float(last - first));
  }
  grid_us.erase(grid_us.begin());  // the warm-up
  std::printf("%-22s %8d %9.2f %9.2f\n", name, bytes / 1024, median(grid_us), bytes ? median(span_us) : 0.0f);
}

// Fills [p, p + n) with a hash of the word index: no run of equal words that a compressing memory
// path could shortcut (the 64-issuer rows once exceeded the HBM peak over a memset source).
__global__ void fill_hash(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = source_word(i);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char* src = nullptr;
  uint4* x = nullptr;
  uint64_t* stamps = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&src, kSourceBytes));
  fill_hash<<<1024, 256>>>(reinterpret_cast<uint32_t*>(src), kSourceBytes / 4);
  CHECK(cudaGetLastError());
  CHECK(cudaMalloc(&x, kXBytes));
  CHECK(cudaMemset(x, 2, kXBytes));
  CHECK(cudaMalloc(&stamps, 3 * sizeof(uint64_t) * sms));
  CHECK(cudaMalloc(&sink, kSinkWords * sizeof(uint32_t) * sms));
  std::printf("%d blocks (one a multiprocessor) x 512 threads, each copying its own DRAM range into shared memory;\n"
              "median of %d launches. span: first start to last landed; block: a block's start to landed;\n"
              "x: one warp's 8 KB L2 load issued after the copies, start to back; wrong: blocks of the last launch\n"
              "whose shared memory does not hold their range, in all or at eight probes read as the copy counted\n"
              "as landed (should be 0).\n\n",
              sms, kLaunches);
  std::printf("%-22s %8s %9s %9s %9s %9s %6s\n", "mechanism", "KB/block", "span us", "TB/s", "block us", "x us", "wrong");
  for (int kb : {48, 96, 192}) {
    const int bytes = kb * 1024;
    auto row = [&](const char* name, Result r) {
      std::printf("%-22s %8d %9.2f %9.2f %9.2f %9.2f %6d\n", name, kb, r.span_us, 1e-6 * double(bytes) * sms / r.span_us,
                  r.block_us, r.x_us, r.wrong);
    };
    row("cp.async 16B x512", measure<kCpAsync>(src, sms, bytes, 0, 0, x, stamps, sink));
    row("cp.async 16B last 256", measure<kCpAsync>(src, sms, bytes, 0, 256, x, stamps, sink));
    row("cp.async 16B last 64", measure<kCpAsync>(src, sms, bytes, 0, 64, x, stamps, sink));
    row("ld/st 16B x512", measure<kLoadStore>(src, sms, bytes, 0, 0, x, stamps, sink));
    row("bulk whole x1", measure<kBulk>(src, sms, bytes, bytes, 1, x, stamps, sink));
    row("bulk 16KB x1", measure<kBulk>(src, sms, bytes, 16384, 1, x, stamps, sink));
    row("bulk 4KB x1", measure<kBulk>(src, sms, bytes, 4096, 1, x, stamps, sink));
    row("bulk 4KB x32", measure<kBulk>(src, sms, bytes, 4096, 32, x, stamps, sink));
    row("bulk 1KB x32", measure<kBulk>(src, sms, bytes, 1024, 32, x, stamps, sink));
  }
  // Is the fill rate a multiprocessor's own limit or the whole chip's? The same copies on fewer
  // multiprocessors: a per-multiprocessor limit keeps "block us" as the grid shrinks, a shared
  // (DRAM) limit lets it fall toward the latency.
  std::printf("\nFewer blocks (one a multiprocessor), 96 KB each:\n%-22s %8s %9s %9s %9s %9s %6s\n", "mechanism",
              "blocks", "span us", "TB/s", "block us", "GB/s/SM", "wrong");
  for (int blocks : {16, 32, 66, 98, sms}) {
    const int bytes = 96 * 1024;
    auto row = [&](const char* name, Result r) {
      std::printf("%-22s %8d %9.2f %9.2f %9.2f %9.1f %6d\n", name, blocks, r.span_us,
                  1e-6 * double(bytes) * blocks / r.span_us, r.block_us, 1e-3 * double(bytes) / r.block_us, r.wrong);
    };
    row("cp.async 16B x512", measure<kCpAsync>(src, blocks, bytes, 0, 0, x, stamps, sink));
    row("bulk 16KB x1", measure<kBulk>(src, blocks, bytes, 16384, 1, x, stamps, sink));
  }
  std::printf("\nL2 prefetch grid (events around one launch; the empty grid is the launch cost) and the bulk\n"
              "copy (16KB x1) of the same range right after:\n%-22s %8s %9s %9s\n",
              "prefetch", "KB/block", "grid us", "copy span");
  for (int kb : {0, 96, 192}) {
    measure_prefetch<kPrefetchBulk>("bulk prefetch 16KB x1", src, sms, kb * 1024, x, stamps, sink);
    measure_prefetch<kPrefetchLines>("prefetch lines x512", src, sms, kb * 1024, x, stamps, sink);
  }
  return 0;
}
