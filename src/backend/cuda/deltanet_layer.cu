// One token's whole DeltaNet MoE layer as one persistent launch: a block per multiprocessor runs
// the layer's phases (input projections, the DeltaNet step, output projection + router sums,
// gate+up, down), each phase waiting for the one before through a counter in global memory
// instead of a kernel boundary. What that buys is time for copies: a block copies the weights of
// a later phase into its own shared memory while an earlier one computes or waits (the output
// projection's rows land during the input projections' dots and the step, the shared expert's
// during everything before gate+up), which separate kernels cannot do because a kernel's blocks
// are not resident until the one before has left (docs/design.md, "Where the next performance
// floors are"). The phases run the same device functions as the one-token kernels (gemv.cuh,
// topk.cuh, deltanet_step.cuh), so each output row is computed as those kernels compute it.
// Measured 21% slower than the kernel chain when it was built (the step and the top-k after the
// router sums' atomics were the slow phases) and 32% slower than today's chain
// (docs/performance.md), so it runs only where CudaOptions asks for it.
#include "backend/cuda/deltanet_step.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/grid_counts.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/topk.cuh"

namespace petrel::cuda {
namespace {

constexpr int kThreads = 32 * kAsyncWarps;
constexpr int kStepDk = 128;  // the key head dim the step blocks are built for (the models' dim)
enum Counter { kInDone, kStepDone, kOutDone, kGateUpDone, kBlocksDone };
static_assert(kBlocksDone < kDeltaNetLayerCounters, "DeltaNetLayer: one counter per phase");

// Block b's place in each phase and where each phase's data sits in its shared memory.
struct LayerPlan {
  int blocks = 0;                      // one per multiprocessor
  int in_first[5] = {}, in_per[4] = {}, in_half[4] = {};  // input projections: segment i's first
                                                          // block, rows a block and in its first half
  int in_blocks = 0;                   // the step's Hv blocks follow them
  int out_per = 0, out_blocks = 0;     // output projection rows a block, blocks with rows
  int gu_per = 0, gu_part = 0, gu_blocks = 0, gu_shift = 0;  // gate+up: rows, blocks a slot, all, rotation
  int dn_per = 0, dn_blocks = 0;       // down: output rows a block
  int out_at = 0, cols_at = 0, keep_at = 0, sdown_at = 0, stage_at = 0;  // shared memory offsets (bytes)
  size_t smem = 0;
};

// Each thread: `bar` counts one arrival once every cp.async this thread has issued has landed (a
// barrier initialised for the whole block).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

template <WFormat F, int CH, int CV, int PPL>
__global__ void __launch_bounds__(kThreads, 1) deltanet_layer_kernel(DeltaNetLayer L, LayerPlan P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __shared__ uint64_t bar[5];  // landed: input projections (two halves), output projection, gate+up, down
  __shared__ float mix[33];
  enum { kIn0, kIn1, kOut, kGu, kDown };
  const int b = blockIdx.x, tid = threadIdx.x;
  const int k = L.k, n_down = k + 1;
  int* counters = L.counters;
  // Roles.
  const bool in_block = b < P.in_blocks, step_block = !in_block && b < P.in_blocks + L.d.Hv;
  const int g = (b - P.in_blocks + P.gu_shift + P.blocks) % P.blocks;  // gate+up: the shared slot on step blocks
  const int slot = g / P.gu_part, part = g % P.gu_part;
  const bool gu_block = g < P.gu_blocks, routed = slot < k;
  const bool out_block = b < P.out_blocks, dn_block = b < P.dn_blocks;
  // Input projections: this block's segment and rows.
  int seg = 0;
#pragma unroll
  for (int i = 1; i < 4; ++i)
    if (b >= P.in_first[i]) seg = i;
  DeviceMatrix in_w = L.in[0];
  GemvOut in_out = L.in_out[0];
#pragma unroll
  for (int i = 1; i < 4; ++i)  // constant indices keep the segments in parameter space
    if (seg == i) {
      in_w = L.in[i];
      in_out = L.in_out[i];
    }
  const int in_per = P.in_per[seg], in_r0 = (b - P.in_first[seg]) * in_per;
  const int in_rows = in_block ? min(in_per, in_w.rows - in_r0) : 0;
  const ChunkMatrix<F> in_m = chunk_matrix<F>(in_w);
  const AsyncTile<F> in_tile = AsyncTile<F>::at(smem, in_per, in_m);
  // The rows land in two halves, the first dotted while the second lands.
  const int in_half = min(in_rows, P.in_half[seg]);
  AsyncTile<F> in_tile2 = in_tile;
  in_tile2.w += in_half * in_m.chunks;
  in_tile2.scales += in_half * in_m.groups;
  in_tile2.biases += in_half * in_m.groups;
  // Output projection (+ the router's columns of its rows), gate+up and down tiles.
  const ChunkMatrix<F> out_m = chunk_matrix<F>(L.out);
  const int out_r0 = b * P.out_per, out_rows = out_block ? min(P.out_per, L.out.rows - out_r0) : 0;
  const AsyncTile<F> out_tile = AsyncTile<F>::at(smem + P.out_at, P.out_per, out_m);
  const bf16* route_cols = reinterpret_cast<const bf16*>(smem + P.cols_at);
  float* keep = reinterpret_cast<float*>(smem + P.keep_at);
  ChunkMatrix<F> gm = chunk_matrix<F>(routed ? L.gate : L.s_gate), um = chunk_matrix<F>(routed ? L.up : L.s_up);
  const int gu_r0 = part * P.gu_per, gu_rows = gu_block ? min(P.gu_per, L.gate.rows - gu_r0) : 0;
  const int gu_tile_bytes = P.gu_per * async_row_bytes(gm.chunks, gm.groups);
  const AsyncTile<F> gt = AsyncTile<F>::at(smem, P.gu_per, gm), ut = AsyncTile<F>::at(smem + gu_tile_bytes, P.gu_per, um);
  const ChunkMatrix<F> dm = chunk_matrix<F>(L.down);
  const int dn_r0 = b * P.dn_per, dn_rows = dn_block ? min(P.dn_per, L.down.rows - dn_r0) : 0;
  const int dn_tile_bytes = P.dn_per * async_row_bytes(dm.chunks, dm.groups);
  auto dn_at = [&](int j) { return j < k ? j * dn_tile_bytes : P.sdown_at; };  // routed tiles, then the shared one
  auto dn_tile = [&](int j) { return AsyncTile<F>::at(smem + dn_at(j), P.dn_per, dm); };
  float* stage = reinterpret_cast<float*>(smem + P.stage_at);
  const auto row0 = [](int) { return int64_t(0); };

  // Copies by the whole block (16-byte cp.async from every thread lands sooner than a few bulk
  // copies), each set counted on its own barrier.
  auto issue_out = [&] {
    if (out_rows <= 0) return;
    copy_rows_async(out_tile, out_m, out_r0, out_rows);
    copy_async(route_cols, L.route.cols + int64_t(out_r0) * L.route.ld, out_rows * L.route.ld * 2);
    cp_async_arrive(&bar[kOut]);
  };
  auto issue_gate_up = [&] {  // once gm and um hold the slot's matrices
    copy_rows_async(gt, gm, gu_r0, gu_rows);
    copy_rows_async(ut, um, gu_r0, gu_rows);
    cp_async_arrive(&bar[kGu]);
  };
  if (tid == 0) {
    for (int i = 0; i < kDown; ++i) mbar_init(&bar[i], kThreads);
    mbar_init(&bar[kDown], n_down);  // bulk copies: a thread per matrix
    mbar_init_fence();
  }
  __syncthreads();
  pdl_launch_dependents();
  // Weights no phase writes go out before the wait: an input projection block's own rows first
  // (the others follow once they are dotted); every other block's output projection rows and, on
  // the shared expert's gate+up blocks, its rows; everyone's shared down rows.
  if (in_block) {
    copy_rows_async(in_tile, in_m, in_r0, in_half);
    cp_async_arrive(&bar[kIn0]);
    copy_rows_async(in_tile2, in_m, in_r0 + in_half, in_rows - in_half);
    cp_async_arrive(&bar[kIn1]);
  } else {
    issue_out();
    if (gu_block && !routed) issue_gate_up();
  }
  if (tid == 0 && dn_block) bulk_rows(dn_tile(k), with_data(dm, L.s_down), dn_r0, dn_rows, &bar[kDown]);

  // Phase 1: input projections of the normed residual row.
  if (in_block) {
    pdl_wait();
    const StageInputs ahead = stage_ahead<F>(L.h, 4, L.in[0].cols, 1, row0, L.input_norm);
    const Staged<F> st = stage_rows<F>(stage, L.h, 4, L.in[0].cols, 1, row0, L.input_norm, ahead);
    ChunkX<F> xr[CH];
    load_lane_x(st, xr);
    const float scale = st.row_scale(0);
    mbar_wait(&bar[kIn0], 0);
    tile_pair_rows_x1<F, CH>(in_tile, in_tile, in_half, in_m, in_half, xr, scale, in_out, in_r0, nullptr);
    mbar_wait(&bar[kIn1], 0);
    tile_pair_rows_x1<F, CH>(in_tile2, in_tile2, in_rows - in_half, in_m, in_rows - in_half, xr, scale, in_out,
                             in_r0 + in_half, nullptr);
    signal_count(counters + kInDone);
    // The tile is read (signal_count's barrier): the output projection's rows land during the
    // step, the shared expert's in the tile's place.
    issue_out();
    if (gu_block && !routed) issue_gate_up();
  }
  // Phase 2: the DeltaNet step, a value head a block (settled states loaded before the wait).
  if (step_block) {
    DeltaNetRows one;
    one.states_settled = L.states_settled;
    deltanet_head_step<kStepDk>(L.d, b - P.in_blocks, 0, one, L.qkv, L.conv_w, L.conv_state, L.b, L.a, L.A_log,
                                L.dt_bias, L.state, L.gdn_norm, L.z, L.eps, L.o, L.readers, [&] {
                                  pdl_wait();
                                  wait_count(counters + kInDone, P.in_blocks);
                                });
    signal_count(counters + kStepDone);
  }
  pdl_wait();  // (blocks of neither role) before any write to the residual row
  // Phase 3: h += o · outᵀ, and the router's sums of the new h beside it.
  if (out_block) {
    wait_count(counters + kStepDone, L.d.Hv);
    const Staged<F> st = stage_rows<F>(stage, L.o, 2, L.out.cols, 1, row0);
    ChunkX<F> xr[CV];
    load_lane_x(st, xr);
    mbar_wait(&bar[kOut], 0);
    __syncthreads();
    tile_rows_x1<F, CV>(out_tile, out_m, out_rows, xr, st.row_scale(0), GemvOut{L.h, 0, 4, true}, out_r0, keep);
    __syncthreads();  // every warp's rows are in keep
    add_route_sums(L.route, route_cols, keep, out_rows);
    signal_count(counters + kOutDone);
  }
  // Phase 4: the top-k from the sums, then silu(gate·x)·(up·x) of the normed new h for a slot's rows.
  if (gu_block) {
    wait_count(counters + kOutDone, P.out_blocks);
    const StageInputs ahead = stage_ahead<F>(L.h, 4, L.gate.cols, 1, row0, L.post_norm);
    if (routed) {
      const int expert = pick_expert(L.pick, k, slot, g == 0, L.ids, L.weights);
      gm = with_data(gm, L.gate.entry(expert));
      um = with_data(um, L.up.entry(expert));
      issue_gate_up();
    }
    const Staged<F> st = stage_rows<F>(stage, L.h, 4, L.gate.cols, 1, row0, L.post_norm, ahead);
    if (!routed && part == 0) weigh_route(L.pick, k, st.row_scale(0), L.weights);
    ChunkX<F> xr[CH];
    load_lane_x(st, xr);
    const float scale = st.row_scale(0);
    mbar_wait(&bar[kGu], 0);
    __syncthreads();
    gate_up_rows<F, CH, kAsyncWarps>(gt, ut, gm, um, gu_rows, xr, scale, L.act + int64_t(slot) * L.act_stride + gu_r0);
    signal_count(counters + kGateUpDone);
  }
  // Phase 5: h += Σ_j w_j·down_j·act_j + sgate·shared_down·act_shared, as down_async_kernel.
  if (dn_block) {
    wait_count(counters + kGateUpDone, P.gu_blocks);
    if (b == 0)  // every block has picked from the sums: clear them for the next layer
      for (int i = tid; i < L.pick.E + 1; i += blockDim.x) L.pick.sums[i] = 0;
    if (tid < k) bulk_rows(dn_tile(tid), with_data(dm, L.down.entry(L.ids[tid])), dn_r0, dn_rows, &bar[kDown]);
    if (tid < n_down) mix[tid] = tid < k ? L.weights[tid] : L.sgate[0];
    const Staged<F> st = stage_rows<F>(stage, L.act, 4, L.down.cols, n_down,
                                       [&](int r) { return int64_t(r) * L.act_stride; });
    const DownPairs<F, PPL> pairs = down_pairs<F, PPL>(st, dm, n_down, P.dn_per, mix, dn_at);
    mbar_wait(&bar[kDown], 0);
    __syncthreads();
    down_rows<F, PPL, kAsyncWarps>(smem, pairs, dm, n_down, P.dn_per, dn_rows, GemvOut{L.h, 0, 4, true}, dn_r0);
  }
  // The last block out leaves the counters at zero for the layer's next step.
  reset_counts_at_exit(counters, kBlocksDone + 1);
#endif
}

LayerPlan plan_layer(const DeltaNetLayer& L) {
  LayerPlan P;
  P.blocks = sm_count();
  // Input projections: blocks in proportion to rows on the multiprocessors the step leaves.
  int64_t total = 0;
  for (const DeviceMatrix& m : L.in) total += m.rows;
  const int spare = std::max(0, P.blocks - L.d.Hv - 4);
  int in_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    const int want = 1 + int(spare * L.in[i].rows / total);
    P.in_per[i] = rows_per_part(L.in[i], L.in[i].rows, want);
    P.in_half[i] = rows_per_part(L.in[i], P.in_per[i], 2);
    P.in_first[i + 1] = P.in_first[i] + div_up(L.in[i].rows, P.in_per[i]);
    in_bytes = std::max(in_bytes, P.in_per[i] * async_row_bytes(L.in[i]));
  }
  P.in_blocks = P.in_first[4];
  P.out_per = rows_per_part(L.out, L.out.rows, P.blocks);
  P.out_blocks = div_up(L.out.rows, P.out_per);
  const int slots = L.k + 1;
  P.gu_per = rows_per_part(L.gate, L.gate.rows, std::max(1, P.blocks / slots));
  P.gu_part = div_up(L.gate.rows, P.gu_per);
  P.gu_blocks = slots * P.gu_part;
  P.gu_shift = L.k * P.gu_part;  // block in_blocks is the shared slot's first
  P.dn_per = rows_per_part(L.down, L.down.rows, P.blocks);
  P.dn_blocks = div_up(L.down.rows, P.dn_per);
  const int gu_bytes = 2 * P.gu_per * async_row_bytes(L.gate), dn_tile = P.dn_per * async_row_bytes(L.down);
  auto at16 = [](size_t v) { return int(div_up(int64_t(v), 16) * 16); };
  P.out_at = at16(std::max({in_bytes, gu_bytes, L.k * dn_tile}));
  P.cols_at = at16(P.out_at + size_t(P.out_per) * async_row_bytes(L.out));
  P.keep_at = at16(P.cols_at + size_t(P.out_per) * L.route.ld * 2);
  P.sdown_at = at16(P.keep_at + size_t(P.out_per) * 4);
  P.stage_at = at16(P.sdown_at + size_t(dn_tile));
  const WFormat f = L.out.format;
  const size_t stage = std::max({staged_bytes(f, L.in[0].cols, 1), staged_bytes(f, L.out.cols, 1),
                                 staged_bytes(f, L.down.cols, L.k + 1)});
  P.smem = P.stage_at + stage;
  return P;
}

// The kernel for these shapes, or null.
using LayerKernel = void (*)(DeltaNetLayer, LayerPlan);
LayerKernel layer_kernel(const DeltaNetLayer& L) {
  if (L.out.format != WFormat::Q4) return nullptr;
  constexpr WFormat F = WFormat::Q4;
  const int ch = lane_x_chunks(F, L.in[0].cols / chunk_weights(F)), cv = lane_x_chunks(F, L.out.cols / chunk_weights(F));
  const int pairs = div_up((L.k + 1) * (L.down.cols / chunk_weights(F)), 32);
  if (ch != 2 || cv != 4) return nullptr;
  if (pairs <= 3) return deltanet_layer_kernel<F, 2, 4, 3>;
  if (pairs <= 5) return deltanet_layer_kernel<F, 2, 4, 5>;
  return nullptr;
}

// Every matrix chunked in one 4-bit layout, with 16-byte aligned data.
bool same_layout(const DeltaNetLayer& L) {
  const DeviceMatrix* all[] = {&L.in[0], &L.in[1], &L.in[2], &L.in[3], &L.out,  &L.gate,
                               &L.up,    &L.down,  &L.s_gate, &L.s_up, &L.s_down};
  for (const DeviceMatrix* m : all) {
    if (m->format != L.out.format || m->group != L.out.group || !chunked_layout(*m)) return false;
    for (const void* p : {m->w, static_cast<const void*>(m->scales), static_cast<const void*>(m->biases)})
      if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  }
  return true;
}

}  // namespace

bool deltanet_layer_fits(const DeltaNetLayer& L) {
  if (!pdl_supported() || !layer_kernel(L) || !same_layout(L)) return false;
  const DeltaNetShape& d = L.d;
  if (d.dk != kStepDk || d.Hv % d.Hk != 0 || decode_threads(d) > kThreads || d.K < 1 || d.K > kDecodeMaxTaps)
    return false;
  const int H = L.out.rows;
  if (L.in[0].cols != H || L.gate.cols != H || L.down.rows != H || L.s_gate.rows != L.gate.rows ||
      L.s_down.cols != L.down.cols || L.down.cols != L.gate.rows || L.act_stride < L.gate.rows ||
      !norm_stageable(H, 8) || L.k + 1 > 33 || !L.route.cols || L.route.ld % 8 || !L.pick.sums ||
      L.route.n != L.pick.E + 1 || L.pick.E > kMaxExperts)
    return false;
  const LayerPlan P = plan_layer(L);
  if (P.in_blocks + d.Hv > P.blocks || P.gu_blocks > P.blocks) return false;
  cudaFuncAttributes attr{};
  PETREL_CUDA(cudaFuncGetAttributes(&attr, layer_kernel(L)));
  if (attr.ptxVersion < 90) return false;  // built for an older chip (the body is Hopper code)
  int device = 0, optin = 0;
  PETREL_CUDA(cudaGetDevice(&device));
  PETREL_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return attr.sharedSizeBytes + P.smem <= size_t(optin);
}

void deltanet_layer(const DeltaNetLayer& L, cudaStream_t s) {
  const LayerKernel kernel = layer_kernel(L);  // the caller has checked deltanet_layer_fits
  check(kernel != nullptr, "CUDA deltanet_layer: the persistent layer does not take these shapes");
  const LayerPlan P = plan_layer(L);
  PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(P.smem)));
  launch_pdl(kernel, P.blocks, kThreads, P.smem, s, L, P);
  PETREL_LAUNCHED("deltanet_layer");
}

}  // namespace petrel::cuda
