// One block of one token's MoE down projection (a DownLaunch), shared by down_async_kernel (moe.cu)
// and down_project_kernel (down_project.cu), so that both compute the same bits.
#pragma once
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {

// Block 0 of a down launch, after its wait: zeroes the router sums gate+up picked from (null:
// none), ready for the next layer's output projection.
__device__ __forceinline__ void clear_route_sums(unsigned long long* sums, int n) {
  if (sums && blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < n; i += blockDim.x) sums[i] = 0;
}

// Whole block of WARPS warps on Hopper, block b < div_up(d.down.rows, d.per): output rows [b·per,
// ...) of all n = k (+1) matrices the token meets, their tiles from smem on. The shared expert's
// rows go out by bulk copy before the PDL wait, a routed expert's (thread j: matrix j) as soon as
// the ids are read; the n activation rows are staged while they land. Once every tile has landed
// every thread runs landed() (down_project issues its projection rows there, behind down's), then
// a warp per output row adds Σ_j mix_j·(row · act_j) to d.out.
template <WFormat F, int PPL, int WARPS, typename Landed>
__device__ __forceinline__ void down_block_bulk(char* smem, const DownLaunch& d, Landed landed) {
  __shared__ float mix[33];  // routing weight of each staged row (the shared expert's is its gate)
  __shared__ uint64_t rows_in;
  const int n = d.k + (d.has_shared ? 1 : 0), r0 = blockIdx.x * d.per, rows = min(d.per, d.down.rows - r0);
  const ChunkMatrix<F> dm = chunk_matrix<F>(d.down);
  const int tile_bytes = d.per * async_row_bytes(dm.chunks, dm.groups);
  auto tile = [&](int j) { return AsyncTile<F>::at(smem + j * tile_bytes, d.per, dm); };
  const int t = threadIdx.x;
  if (t == 0) {
    mbar_init(&rows_in, n);  // one arrival a matrix
    mbar_init_fence();
    if (d.has_shared) bulk_rows(tile(d.k), with_data(dm, d.s_down), r0, rows, &rows_in);
  }
  __syncthreads();
  pdl_wait();
  const float mix_t = t < d.k ? d.weights[t] : t < n ? d.sgate[0] : 0.0f;
  if (t < d.k) bulk_rows(tile(t), with_data(dm, d.down.entry(d.ids[t])), r0, rows, &rows_in);
  prefetch_l1_rows(d.act, n, int64_t(d.act_stride) * 4, d.down.cols * 4);
  if (t < n) mix[t] = mix_t;
  clear_route_sums(d.clear, d.clear_n);
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + n * tile_bytes), d.act, 4, d.down.cols, n,
                                     [&](int r) { return int64_t(r) * d.act_stride; });
  const DownPairs<F, PPL> pairs = down_pairs<F, PPL>(st, dm, n, d.per, mix, [&](int j) { return j * tile_bytes; });
  mbar_wait(&rows_in, 0);
  __syncthreads();  // every copy has landed (and any scale tail copied by plain loads)
  landed();
  down_rows<F, PPL, WARPS>(smem, pairs, dm, n, d.per, rows, d.out, r0);
}

}  // namespace petrel::cuda
