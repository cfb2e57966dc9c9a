// One token's z projection rows computed by the DeltaNet decode step's blocks before their PDL
// wait (DeltaNetZRows in kernels.cuh): the step's multiprocessors would otherwise idle through the
// input projections, whose phase then lands fewer bytes.
#pragma once
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {

constexpr int kZSyncInputs = 0;  // DeltaNetZRows::sync words: the input projections' waits passed,
constexpr int kZSyncRows = 1;    // the step blocks' rows written,
constexpr int kZSyncSeen = 2;    // then block j's last targets of both: [2 + 2j], [3 + 2j]
constexpr unsigned long long kZSyncTimeoutNs = 1000000000ull;  // a phase edge takes microseconds

// Thread 0: block j's next target of count `which` (its last one plus `step`, remembered), then
// waits until the count reaches it (wrapping compare, acquire reads). A count still short after a
// second means a launch that can never signal (a bug): the kernel traps instead of hanging.
__device__ __forceinline__ void z_sync_wait(unsigned* sync, int which, int j, unsigned step) {
  unsigned* seen = sync + kZSyncSeen + 2 * j + which;
  const unsigned target = *seen + step;
  *seen = target;
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (true) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(sync + which) : "memory");
    if (int(v - target) >= 0) return;
    __nanosleep(32);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > kZSyncTimeoutNs) __trap();
  }
}

// Shared memory deltanet_z_rows uses: the block's rows, h, and h staged.
inline size_t deltanet_z_rows_smem(const DeltaNetZRows& zr) {
  return size_t(zr.per) * async_row_bytes(zr.w) + size_t(zr.w.cols) * sizeof(float) +
         staged_bytes(zr.w.format, zr.w.cols, 1);
}

// Whole block of 16 warps (block j of the step), before its PDL wait: copies its rows of zr.w,
// waits for the input projections' signal that h is written, stages rmsnorm(h)·norm.w from h as
// they do (h read through L2 into shared memory first: this kernel never waited for h's writer),
// dots the rows into zr.z, then waits until every block's rows are written.
template <WFormat F, int CPL>
__device__ void deltanet_z_rows(const DeltaNetZRows& zr, int j, char* smem) {
  const ChunkMatrix<F> m = chunk_matrix<F>(zr.w);
  const int r0 = j * zr.per, n = min(zr.per, zr.w.rows - r0), cols = zr.w.cols;
  const AsyncTile<F> tile = AsyncTile<F>::at(smem, zr.per, m);
  if (n > 0) copy_rows_async(tile, m, r0, n);
  cp_async_commit();
  float* h = reinterpret_cast<float*>(smem + zr.per * async_row_bytes(m.chunks, m.groups));
  if (threadIdx.x == 0) z_sync_wait(zr.sync, kZSyncInputs, j, 1);
  __syncthreads();
  for (int i = 4 * threadIdx.x; i < cols; i += 4 * blockDim.x)
    *reinterpret_cast<float4*>(h + i) = __ldcg(reinterpret_cast<const float4*>(zr.h + i));
  __syncthreads();
  const Staged<F> st = stage_rows<F>(h + cols, h, 4, cols, 1, [](int) { return int64_t(0); }, zr.norm);
  ChunkX<F> xr[CPL];
  load_lane_x(st, xr);
  cp_async_wait<0>();
  __syncthreads();  // every thread's copies have landed
  if (n > 0) tile_pair_rows_x1<F, CPL>(tile, tile, n, m, n, xr, st.row_scale(0), GemvOut{zr.z, 0, 2, false}, r0, nullptr);
  __syncthreads();  // the block's rows are stored
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(zr.sync + kZSyncRows, 1u);
    z_sync_wait(zr.sync, kZSyncRows, j, gridDim.x);
  }
  __syncthreads();
}

}  // namespace petrel::cuda
