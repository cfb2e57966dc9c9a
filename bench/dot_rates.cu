// How fast a block dots 4-bit weight rows that are already in shared memory with one staged
// activation row: the phase that follows a one-token GEMV's wait once its copies have landed
// (docs/performance.md, session 14: ~0.9 us per 32-row tile inside the input projections, about
// half the rate of the integer pipe the dots are bound by). Each block (one per multiprocessor,
// 512 threads, as the decode GEMV) holds 128 rows x 2048 columns of 4-bit weights (MLX affine,
// groups of 64) as four 32-row tiles of the GEMV ring, stages a random activation row with the
// product's stage_rows (two int8 levels a chunk), and dots all 128 rows kReps times per variant:
//  - kernel:     as gemv_async_kernel's tile_rows_x1 — a warp two rows at a time, a five-step
//                shuffle sum per row, a block barrier before and after each tile;
//  - one-sync:   the same without the barrier after each tile (a ring that never refills a slot);
//  - four-rows:  a warp four rows at a time over 64-row passes, their sums reduced together
//                (warp_sum4: 7 shuffles for four rows instead of 20; linear.cu's tile_pair_rows_x1
//                since session 14);
//  - one-level:  as kernel with the activations' first int8 level only (half the dp4a): what the
//                second level costs, and the error it removes (printed against kernel's values).
// Prints the median over blocks of ns per 32-row tile and each variant's largest deviation from
// kernel's outputs. Built with the CUDA backend (bench/CMakeLists.txt); on the GPU machine, after
// scripts/gpu-build.sh: ./build-gpu/bench/dot_rates.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/gemv.cuh"
#include "cuda_check.h"

using namespace petrel::cuda;

constexpr int kThreads = 512, kWarps = kThreads / 32, kRows = 128, kTileRows = 32, kCols = 2048, kGroup = 64;
constexpr int kChunks = kCols / 32, kGroups = kCols / kGroup, kTiles = kRows / kTileRows, kReps = 64;
constexpr int kCpl = kChunks / 32;  // chunks a lane holds of the activation row
constexpr int kSlotBytes = kTileRows * (kChunks * 16 + 4 * kGroups);
enum Variant { kKernel, kOneSync, kFourRows, kOneLevel };

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Σ q·x1 over 32 4-bit codes and the first int8 level only (x[0..1] of ChunkX), times 127 so that
// it scales as dot_q4_int8x2.
__device__ __forceinline__ int dot_q4_int8x1(const uint4& raw, const uint4 (&x)[4]) {
  const uint32_t hi[8] = {x[0].x, x[0].y, x[0].z, x[0].w, x[1].x, x[1].y, x[1].z, x[1].w};
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  int even = 0, odd16 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    even = __dp4a(int(words[i] & 0x0F0F0F0Fu), int(hi[2 * i]), even);
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(odd16) : "r"(words[i] & 0xF0F0F0F0u), "r"(hi[2 * i + 1]));
  }
  return 127 * (even + (odd16 >> 4));
}

// This lane's part of row `row` of tile a with the activations in xr (row_dot_x1), or with their
// first level only.
template <Variant V>
__device__ __forceinline__ float lane_dot(const AsyncTile<WFormat::Q4>& a, const ChunkMatrix<WFormat::Q4>& m, int row,
                                          const ChunkX<WFormat::Q4> (&xr)[kCpl]) {
  if constexpr (V != kOneLevel) {
    return row_dot_x1(a, m, row, xr);
  } else {
    const int lane = threadIdx.x % 32;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kCpl; ++j) {
      const int c = lane + 32 * j, g = row * m.groups + (c >> m.group_shift);
      const int q = dot_q4_int8x1(a.w[row * m.chunks + c], xr[j].x);
      acc += __bfloat162float(a.scales[g]) * xr[j].level_scale * float(q) + __bfloat162float(a.biases[g]) * xr[j].sum;
    }
    return acc;
  }
}

// One block a multiprocessor: the tiles and the activation row into shared memory, then kReps
// passes of variant V over all rows; stamps[block] = ns for the passes, out = the last pass's rows.
template <Variant V>
__global__ void __launch_bounds__(kThreads, 1)
    dot_kernel(const uint4* tiles, const float* x, float* out, uint64_t* stamps) {
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  for (int i = threadIdx.x; i < kTiles * kSlotBytes / 16; i += kThreads) reinterpret_cast<uint4*>(smem)[i] = tiles[i];
  DeviceMatrix dm;
  dm.format = WFormat::Q4;
  dm.rows = kRows;
  dm.cols = kCols;
  dm.group = kGroup;
  const ChunkMatrix<WFormat::Q4> m = chunk_matrix<WFormat::Q4>(dm);
  const Staged<WFormat::Q4> st = stage_rows<WFormat::Q4>(reinterpret_cast<float*>(smem + kTiles * kSlotBytes), x, 4,
                                                         kCols, 1, [](int) { return int64_t(0); });
  ChunkX<WFormat::Q4> xr[kCpl];
  load_lane_x(st, xr);
  auto tile = [&](int t) { return AsyncTile<WFormat::Q4>::at(smem + t * kSlotBytes, kTileRows, m); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  const uint64_t start = now_ns();
  for (int rep = 0; rep < kReps; ++rep) {
    if constexpr (V == kFourRows) {
      for (int pass = 0; pass < kRows; pass += 4 * kWarps) {
        __syncthreads();
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = pass + warp + kWarps * i;
          v[i] = lane_dot<V>(tile(row / kTileRows), m, row % kTileRows, xr);
        }
        const float total = warp_sum4(v);
        const int row = pass + warp + kWarps * (((lane >> 4) & 1) * 2 + ((lane >> 3) & 1));
        if (lane % 8 == 0) out[blockIdx.x * kRows + row] = total;
      }
    } else {
      for (int t = 0; t < kTiles; ++t) {
        __syncthreads();
        for (int row = warp; row < kTileRows; row += 2 * kWarps) {
          const int row2 = row + kWarps;
          const float v = warp_sum(lane_dot<V>(tile(t), m, row, xr)), v2 = warp_sum(lane_dot<V>(tile(t), m, row2, xr));
          if (lane == 0) {
            out[blockIdx.x * kRows + t * kTileRows + row] = v;
            out[blockIdx.x * kRows + t * kTileRows + row2] = v2;
          }
        }
        if constexpr (V != kOneSync) __syncthreads();
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) stamps[blockIdx.x] = now_ns() - start;
}

template <Variant V>
float run(int sms, const uint4* tiles, const float* x, float* out, uint64_t* stamps, size_t smem) {
  CHECK(cudaFuncSetAttribute(dot_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  std::vector<float> medians;
  for (int launch = 0; launch < 6; ++launch) {  // the first warms up
    dot_kernel<V><<<sms, kThreads, smem>>>(tiles, x, out, stamps);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<uint64_t> ns(sms);
    CHECK(cudaMemcpy(ns.data(), stamps, ns.size() * 8, cudaMemcpyDeviceToHost));
    std::sort(ns.begin(), ns.end());
    if (launch > 0) medians.push_back(float(ns[ns.size() / 2]) / (kReps * kTiles));
  }
  std::sort(medians.begin(), medians.end());
  return medians[medians.size() / 2];
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint32_t seed = 2024;
  auto next = [&] { return seed = seed * 1664525u + 1013904223u; };
  auto uniform = [&](float lo, float hi) { return lo + (hi - lo) * float(next() >> 8) / 16777216.0f; };
  auto to_bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  };
  // Four tiles in the ring's layout: each tile's weights (rows x chunks x 16 bytes), then its
  // scales and biases (rows x groups bf16 each).
  std::vector<uint8_t> host(size_t(kTiles) * kSlotBytes);
  for (int t = 0; t < kTiles; ++t) {
    uint8_t* p = host.data() + size_t(t) * kSlotBytes;
    for (int i = 0; i < kTileRows * kChunks * 16; i += 4) {
      const uint32_t w = next();
      std::memcpy(p + i, &w, 4);
    }
    uint16_t* scales = reinterpret_cast<uint16_t*>(p + kTileRows * kChunks * 16);
    for (int i = 0; i < kTileRows * kGroups; ++i) {
      scales[i] = to_bf16(uniform(0.002f, 0.01f));
      scales[kTileRows * kGroups + i] = to_bf16(uniform(-0.05f, -0.01f));
    }
  }
  std::vector<float> hx(kCols);
  for (float& v : hx) v = uniform(-1.0f, 1.0f) * (next() % 16 == 0 ? 8.0f : 1.0f);  // a few outliers, as activations have
  uint4* tiles = nullptr;
  float *x = nullptr, *out = nullptr;
  uint64_t* stamps = nullptr;
  CHECK(cudaMalloc(&tiles, host.size()));
  CHECK(cudaMalloc(&x, kCols * sizeof(float)));
  CHECK(cudaMalloc(&out, size_t(sms) * kRows * sizeof(float)));
  CHECK(cudaMalloc(&stamps, sms * sizeof(uint64_t)));
  CHECK(cudaMemcpy(tiles, host.data(), host.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(x, hx.data(), kCols * sizeof(float), cudaMemcpyHostToDevice));
  const size_t smem = size_t(kTiles) * kSlotBytes + staged_bytes(WFormat::Q4, kCols, 1);

  auto rows_of = [&] {
    std::vector<float> v(size_t(sms) * kRows);
    CHECK(cudaMemcpy(v.data(), out, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  };
  std::printf("dot rates: %d blocks of %d threads, %d rows x %d 4-bit columns each (%d tiles of %d rows), %d passes; "
              "median over blocks and of 5 launches\n",
              sms, kThreads, kRows, kCols, kTiles, kTileRows, kReps);
  const float base_ns = run<kKernel>(sms, tiles, x, out, stamps, smem);
  const std::vector<float> base = rows_of();
  float scale = 0.0f;
  for (float v : base) scale = std::max(scale, std::fabs(v));
  std::printf("  %-10s %7.1f ns a 32-row tile\n", "kernel", base_ns);
  auto report = [&](const char* name, float ns) {
    const std::vector<float> v = rows_of();
    float worst = 0.0f;
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(v[i] - base[i]));
    std::printf("  %-10s %7.1f ns a 32-row tile (%.2fx), largest deviation from kernel's %.2e of its largest value\n",
                name, ns, base_ns / ns, worst / scale);
  };
  report("one-sync", run<kOneSync>(sms, tiles, x, out, stamps, smem));
  report("four-rows", run<kFourRows>(sms, tiles, x, out, stamps, smem));
  report("one-level", run<kOneLevel>(sms, tiles, x, out, stamps, smem));
  return 0;
}
