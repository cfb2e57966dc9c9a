// What a persistent decode step could reach: a chain of dependent GEMVs (each one's output is the
// next one's input, as in a decode step) run by ONE launch of one block per multiprocessor, each
// block copying its next stage's weight rows into the other half of its shared memory (bulk copies)
// while the current stage waits for its input or computes, dependencies as counters in global
// memory. docs/design.md ("Where the next performance floors are") builds on this; the
// figure printed here is the mechanism's own: us a layer of 31 MB (a Qwen3.5-35B-A3B DeltaNet
// layer's 4-bit weights: input projections, output projection, router, gate+up, down) and the
// fraction of the copy bandwidth it reaches. "Routed" runs copy gate+up's and down's rows only once
// the router stage is done, as the experts' addresses are known only then.
//
// Weights are bytes (rows of 2048 bytes: a stage of R rows holds R x 2048 bytes, the bytes of a
// 4-bit matrix of twice the columns), activations int8 with a fixed scale, dot products by dp4a:
// exact integer sums, so the device's last activations must equal the host's bit for bit. Each
// mode runs twice: with int8 weights (one dp4a a word) and with each byte as two 4-bit weights
// against the byte's activation (lo + hi - 15, zero-mean: a mask, a shift and two dp4a a word, the
// integer work of the decode kernels' 4-bit dots less their per-group scales).
// Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/persistent_chain (Hopper or later: bulk copies).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

constexpr int kCols = 2048;                      // every stage reads 2048 activations
constexpr int kThreads = 512;
constexpr int kHalfBytes = 100 * 1024;           // one half of a block's weight window
constexpr int kLayerRows[] = {6144, 2048, 256, 4608, 2304};  // 12.6 + 4.2 + 0.5 + 9.4 + 4.7 MB a layer
constexpr int kStagesPerLayer = 5, kLayers = 40, kStages = kLayers * kStagesPerLayer;
constexpr int kGateUpStage = 3;  // gate+up and down (3, 4) are the experts, chosen by the router (2)

struct Chain {
  const int8_t* w[kStages];  // stage s: rows[s] x kCols bytes
  int rows[kStages];
  int input[kStages];        // the activation row stage s reads: the last output of >= 2048 rows
  int8_t* act;               // [kStages + 1][max rows]: stage s writes row s + 1
  int act_stride;
  unsigned* done;            // [kStages]: blocks that finished stage s
};

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Block b's rows of a stage of R rows: an even split, whole rows.
__host__ __device__ inline void block_rows(int R, int b, int blocks, int* r0, int* r1) {
  *r0 = int(int64_t(R) * b / blocks);
  *r1 = int(int64_t(R) * (b + 1) / blocks);
}

__device__ inline bool expert_stage(int s) { return s % kStagesPerLayer >= kGateUpStage; }

// A dot product -> the next stage's int8 activation (the same formula on the host). Weights of
// std ~73 over 2048 columns give sums of std ~3300x the activations' std (~290x for two nibbles
// of std ~4.6 a byte): the divisor keeps it from fading, the clamp from growing.
__host__ __device__ inline int8_t quantize(int32_t acc, bool nibbles) {
  return int8_t(fminf(127.0f, fmaxf(-127.0f, rintf(float(acc) * (nibbles ? 1.0f / 270.0f : 1.0f / 3000.0f)))));
}

// ahead = 2: a stage's copies start as soon as the stage two back is done (the persistent form);
// ahead = 1: only when the one before is done (as a kernel's copies start when its predecessor's
// block leaves the SM today). routed: the experts' copies (both stages) start only once gate+up's
// input is complete. after_x: a stage's copies start once the stage before has its activations
// (a copy issued earlier delays that load: bench/copy_rates), not when the one before that is done.
// wait = false skips the dependency waits: the chain's streaming floor (its outputs are then
// wrong, and not checked). NIBBLES: each weight byte is two 4-bit weights (see the top).
template <bool NIBBLES>
__global__ void __launch_bounds__(kThreads, 1)
    chain_kernel(Chain c, int ahead, bool routed, bool after_x, bool wait) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char window[];  // two halves of kHalfBytes
  __shared__ uint64_t landed[2];
  __shared__ __align__(16) int8_t x[kCols];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  auto expert = [&](int s) { return routed && expert_stage(s); };
  auto issue = [&](int s) {  // thread 0: stage s's rows into half s % 2
    if (s >= kStages) return;
    int r0, r1;
    block_rows(c.rows[s], blockIdx.x, gridDim.x, &r0, &r1);
    const uint32_t bytes = uint32_t(r1 - r0) * kCols;
    uint64_t* bar = &landed[s % 2];
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes) : "memory");
    for (uint32_t i = 0; i < bytes; i += 16384)
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       shared_addr(window + (s % 2) * kHalfBytes + i)),
                   "l"(c.w[s] + int64_t(r0) * kCols + i), "r"(min(16384u, bytes - i)), "r"(shared_addr(bar))
                   : "memory");
  };
  if (t == 0) {
    for (int h = 0; h < 2; ++h)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(&landed[h])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    issue(0);
    if (ahead == 2 && !after_x) issue(1);
  }
  __syncthreads();
  for (int s = 0; s < kStages; ++s) {
    // The input: every block's part of stage s - 1 written.
    if (s > 0 && t == 0 && wait) {
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(c.done + s - 1) : "memory");
      } while (seen < gridDim.x);
    }
    if (t == 0 && expert(s) && !expert(s - 1)) {
      issue(s);  // into the half the output projection freed
      issue(s + 1);  // into the router's
    }
    __syncthreads();
    if (t < kCols / 16)
      reinterpret_cast<int4*>(x)[t] = __ldcg(reinterpret_cast<const int4*>(c.act + int64_t(c.input[s]) * c.act_stride) + t);
    __syncthreads();
    if (t == 0 && after_x && !expert(s + 1)) issue(s + 1);  // into the half stage s - 1 freed
    // Lane l holds x's bytes [16l + 512j, +16) for j < 4: the weight loads below are conflict-free.
    int4 xr[4];
    int32_t x_sum = 0;  // Σ of the lane's activations: the nibbles' offset, applied once a row
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      xr[j] = reinterpret_cast<const int4*>(x)[lane + 32 * j];
      if constexpr (NIBBLES) {
        x_sum = __dp4a(xr[j].x, 0x01010101, x_sum);
        x_sum = __dp4a(xr[j].y, 0x01010101, x_sum);
        x_sum = __dp4a(xr[j].z, 0x01010101, x_sum);
        x_sum = __dp4a(xr[j].w, 0x01010101, x_sum);
      }
    }
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}" ::"r"(shared_addr(&landed[s % 2])),
        "r"((s / 2) % 2)
        : "memory");
    int r0, r1;
    block_rows(c.rows[s], blockIdx.x, gridDim.x, &r0, &r1);
    const char* half = window + (s % 2) * kHalfBytes;
    for (int r = warp; r < r1 - r0; r += kThreads / 32) {
      int32_t acc = NIBBLES ? -15 * x_sum : 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int4 w = reinterpret_cast<const int4*>(half + int64_t(r) * kCols)[lane + 32 * j];
        if constexpr (NIBBLES) {
          const int words[4] = {w.x, w.y, w.z, w.w}, xs[4] = {xr[j].x, xr[j].y, xr[j].z, xr[j].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            acc = __dp4a(words[q] & 0x0F0F0F0F, xs[q], acc);
            acc = __dp4a((words[q] >> 4) & 0x0F0F0F0F, xs[q], acc);
          }
        } else {
          acc = __dp4a(w.x, xr[j].x, acc);
          acc = __dp4a(w.y, xr[j].y, acc);
          acc = __dp4a(w.z, xr[j].z, acc);
          acc = __dp4a(w.w, xr[j].w, acc);
        }
      }
      acc = __reduce_add_sync(0xffffffffu, acc);
      if (lane == 0) c.act[int64_t(s + 1) * c.act_stride + r0 + r] = quantize(acc, NIBBLES);
    }
    __syncthreads();  // this half is read, and the block's outputs are written
    if (t == 0) {
      __threadfence();
      atomicAdd(c.done + s, 1u);
      if (!after_x && !expert(s + ahead)) issue(s + ahead);  // into the half just freed (ahead 2) or the other one
    }
  }
#endif
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Chain c{};
  std::vector<std::vector<int8_t>> host_w(kStages);
  size_t total = 0;
  int max_rows = 0;
  uint32_t seed = 12345;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  for (int s = 0; s < kStages; ++s) {
    c.rows[s] = kLayerRows[s % kStagesPerLayer];
    c.input[s] = s == 0 || c.rows[s - 1] >= kCols ? s : c.input[s - 1];  // the router's logits feed no stage
    max_rows = std::max(max_rows, c.rows[s]);
    int r0, r1;
    block_rows(c.rows[s], 0, sms, &r0, &r1);
    if ((r1 - r0 + 1) * kCols > kHalfBytes) {
      std::fprintf(stderr, "stage %d: %d rows a block do not fit a %d-byte half\n", s, r1 - r0 + 1, kHalfBytes);
      return 1;
    }
    host_w[s].resize(size_t(c.rows[s]) * kCols);
    for (auto& v : host_w[s]) v = int8_t(std::max(-127, int(next() >> 24) - 128));
    int8_t* d = nullptr;
    CHECK(cudaMalloc(&d, host_w[s].size()));
    CHECK(cudaMemcpy(d, host_w[s].data(), host_w[s].size(), cudaMemcpyHostToDevice));
    c.w[s] = d;
    total += host_w[s].size();
  }
  c.act_stride = max_rows;
  CHECK(cudaMalloc(&c.act, size_t(kStages + 1) * max_rows));
  CHECK(cudaMalloc(&c.done, kStages * sizeof(unsigned)));
  std::vector<int8_t> x0(kCols);
  for (auto& v : x0) v = int8_t(int(next() % 255) - 127);
  CHECK(cudaMemcpy(c.act, x0.data(), kCols, cudaMemcpyHostToDevice));
  CHECK(cudaFuncSetAttribute(chain_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kHalfBytes));
  CHECK(cudaFuncSetAttribute(chain_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kHalfBytes));

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  // Median us of 5 runs (after a warm-up) with the given lookahead.
  auto time_chain = [&](bool nibbles, int ahead, bool routed, bool after_x, bool wait) {
    std::vector<float> us;
    for (int run = 0; run < 6; ++run) {
      CHECK(cudaMemset(c.done, 0, kStages * sizeof(unsigned)));
      CHECK(cudaMemset(c.act + c.act_stride, 0, size_t(kStages) * c.act_stride));
      CHECK(cudaEventRecord(e0));
      if (nibbles) chain_kernel<true><<<sms, kThreads, 2 * kHalfBytes>>>(c, ahead, routed, after_x, wait);
      else chain_kernel<false><<<sms, kThreads, 2 * kHalfBytes>>>(c, ahead, routed, after_x, wait);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (run) us.push_back(1000.0f * ms);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };

  // The host's chain, exact: the device's last activations must match.
  auto host_chain = [&](bool nibbles) {
    std::vector<std::vector<int8_t>> outputs(kStages + 1);
    outputs[0] = x0;
    for (int s = 0; s < kStages; ++s) {
      const std::vector<int8_t>& x = outputs[c.input[s]];
      std::vector<int8_t>& y = outputs[s + 1];
      y.assign(c.rows[s], 0);
      for (int r = 0; r < c.rows[s]; ++r) {
        int32_t acc = 0;
        const int8_t* w = host_w[s].data() + size_t(r) * kCols;
        for (int k = 0; k < kCols; ++k) {
          const int b = uint8_t(w[k]);
          acc += (nibbles ? (b & 15) + (b >> 4) - 15 : int(w[k])) * x[k];
        }
        y[r] = quantize(acc, nibbles);
      }
    }
    return outputs[kStages];
  };
  std::printf("persistent chain: %d layers x %d stages (%.1f MB a layer), %d blocks of %d threads, "
              "2 x %d KB windows; median of 5 runs\n",
              kLayers, kStagesPerLayer, 1e-6 * double(total) / kLayers, sms, kThreads, kHalfBytes / 1024);
  int failed = 0;
  struct Mode {
    int ahead;
    bool routed, after_x;
    const char* what;
  };
  for (bool nibbles : {false, true}) {
    const std::vector<int8_t> y = host_chain(nibbles);
    int nonzero = 0;
    for (int8_t v : y) nonzero += v != 0;
    std::printf("%s dots (the host's last activations: %d of %zu nonzero):\n",
                nibbles ? "4-bit (two nibbles a byte)" : "int8", nonzero, y.size());
    for (const Mode& mode : {Mode{2, false, false, "copies 2 stages ahead, experts too"},
                             Mode{2, true, false, "copies 2 stages ahead, experts' after the router"},
                             Mode{2, true, true, "as above, each once the stage before has its x"},
                             Mode{1, true, false, "copies 1 stage ahead, experts' after the router"}}) {
      const float median = time_chain(nibbles, mode.ahead, mode.routed, mode.after_x, true);
      std::vector<int8_t> dev(y.size());
      CHECK(cudaMemcpy(dev.data(), c.act + int64_t(kStages) * c.act_stride, dev.size(), cudaMemcpyDeviceToHost));
      int wrong = 0;
      for (size_t i = 0; i < dev.size(); ++i) wrong += dev[i] != y[i];
      failed += wrong != 0;
      std::printf("  %-50s %.1f us, %.2f us a layer, %.2f TB/s (%.0f%% of 4.23 TB/s); %d wrong\n", mode.what,
                  median, median / kLayers, 1e-6 * double(total) / median,
                  100.0 * 1e-6 * double(total) / median / 4.23, wrong);
    }
    const float floor_us = time_chain(nibbles, 2, false, false, false);
    std::printf("  without the dependency waits (streaming floor): %.1f us, %.2f us a layer, %.2f TB/s (%.0f%%)\n",
                floor_us, floor_us / kLayers, 1e-6 * double(total) / floor_us,
                100.0 * 1e-6 * double(total) / floor_us / 4.23);
  }
  return failed;
}
