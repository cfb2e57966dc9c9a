// One token's experts as one launch: gate+up of the k routed experts and the shared one, then
// down, the two phases joined by a counter in global memory instead of a kernel boundary. What
// that buys: a block issues its down rows as soon as its own gate+up dots are done (it picked the
// top-k itself, so it knows the experts), where the down kernel reads the ids and issues them only
// after gate+up's last block has left (docs/performance.md, session 19: 1.6 us from down's wait to
// its copies going out, 2.8 us more until they land). Each phase runs the one-token kernels'
// device functions (gemv.cuh, topk.cuh), so every row is computed as gate_up_async_kernel and
// down_async_kernel compute it. Opt-in (CudaOptions::fused_experts) until measured.
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/grid_counts.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/topk.cuh"

namespace petrel::cuda {
namespace {

constexpr int kThreads = 32 * kAsyncWarps;
constexpr size_t kMaxSmem = 200 * 1024;

// Where block b works and where its data sits in shared memory.
struct FusedPlan {
  int gu_per = 0, gu_part = 0, gu_blocks = 0;  // gate+up rows a block, blocks a slot (k + 1 slots), all
  int dn_per = 0, dn_blocks = 0;               // down: output rows a block, blocks with rows
  int dn_at = 0, x_at = 0, act_at = 0;         // shared memory offsets (bytes); gate+up tiles at 0
  size_t smem = 0;
};

FusedPlan plan_fused(const DeviceMatrix& gate, const DeviceMatrix& down, int k) {
  FusedPlan P;
  const int blocks = sm_count(), slots = k + 1;
  P.gu_per = rows_per_part(gate, gate.rows, std::max(1, blocks / slots));
  P.gu_part = div_up(gate.rows, P.gu_per);
  P.gu_blocks = slots * P.gu_part;
  P.dn_per = rows_per_part(down, down.rows, P.gu_blocks);
  P.dn_blocks = div_up(down.rows, P.dn_per);
  auto at16 = [](size_t v) { return int(div_up(int64_t(v), 16) * 16); };
  P.dn_at = at16(2 * size_t(P.gu_per) * async_row_bytes(gate));
  P.x_at = at16(P.dn_at + size_t(slots) * P.dn_per * async_row_bytes(down));
  P.act_at = at16(P.x_at + staged_bytes(gate.format, gate.cols, 1));
  P.smem = P.act_at + staged_bytes(gate.format, down.cols, slots);
  return P;
}

// grid (P.gu_blocks), PDL, one token. Block b takes gate+up rows of slot b / gu_part (slots k: the
// shared expert, whose rows are copied before the wait) and, where b < dn_blocks, dn_per output
// rows of down for all k + 1 matrices (the shared expert's copied before the wait, the routed
// ones once the block's gate+up dots are done). Every block picks the top-k from the router's
// sums (block 0 writes the ids, the shared slot's first block the weights and the shared gate);
// the counter's second word counts the blocks out and the last one clears both.
template <WFormat F, int CPL, int PPL>
__global__ void __launch_bounds__(kThreads, 1)
    moe_fused_kernel(DeviceMatrix gate, DeviceMatrix up, DeviceMatrix down, DeviceMatrix s_gate, DeviceMatrix s_up,
                     DeviceMatrix s_down, const void* x, int x_elem, int k, int* ids, float* weights,
                     const float* sgate, float* act, int act_stride, StageNorm norm, TopK pick, GemvOut out,
                     int* counters, FusedPlan P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __shared__ uint64_t down_landed;
  __shared__ float mix[33];  // routing weight of each down matrix (the shared expert's: its gate)
  pdl_launch_dependents();
  const int b = blockIdx.x, t = threadIdx.x, n_down = k + 1;
  const int slot = b / P.gu_part, part = b % P.gu_part;
  const bool routed = slot < k, dn_block = b < P.dn_blocks;
  ChunkMatrix<F> gm = chunk_matrix<F>(routed ? gate : s_gate), um = chunk_matrix<F>(routed ? up : s_up);
  const int gu_r0 = part * P.gu_per, gu_rows = min(P.gu_per, gate.rows - gu_r0);
  const int gu_tile = P.gu_per * async_row_bytes(gm.chunks, gm.groups);
  const AsyncTile<F> gt = AsyncTile<F>::at(smem, P.gu_per, gm), ut = AsyncTile<F>::at(smem + gu_tile, P.gu_per, um);
  const ChunkMatrix<F> dm = chunk_matrix<F>(down);
  const int dn_r0 = b * P.dn_per, dn_rows = dn_block ? min(P.dn_per, down.rows - dn_r0) : 0;
  const int dn_tile = P.dn_per * async_row_bytes(dm.chunks, dm.groups);
  auto dn_tile_at = [&](int j) { return P.dn_at + j * dn_tile; };  // routed tiles, then the shared one (j = k)
  auto tile_of = [&](int j) { return AsyncTile<F>::at(smem + dn_tile_at(j), P.dn_per, dm); };
  const auto row0 = [](int) { return int64_t(0); };
  auto issue_gate_up = [&] {
    copy_rows_async(gt, gm, gu_r0, gu_rows);
    copy_rows_async(ut, um, gu_r0, gu_rows);
    cp_async_commit();
  };
  if (t == 0) {
    mbar_init(&down_landed, n_down);  // bulk copies: a thread per matrix
    mbar_init_fence();
  }
  __syncthreads();
  // Weights no kernel writes go out before the wait: the shared expert's gate+up and down rows.
  if (!routed) issue_gate_up();
  if (t == 0 && dn_block) bulk_rows(tile_of(k), with_data(dm, s_down), dn_r0, dn_rows, &down_landed);
  pdl_wait();

  // Gate+up: the top-k from the router's sums, then silu(gate·x)·(up·x) of the normed h.
  const StageInputs ahead = stage_ahead<F>(x, x_elem, gate.cols, 1, row0, norm);
  const int* experts = pick_experts(pick, k, b == 0, ids, weights);
  if (routed) {
    gm = with_data(gm, gate.entry(experts[slot]));
    um = with_data(um, up.entry(experts[slot]));
    issue_gate_up();
  }
  const int down_expert = t < k ? experts[t] : 0;  // read before anything reuses the picks' memory
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + P.x_at), x, x_elem, gate.cols, 1, row0, norm, ahead);
  if (!routed && part == 0) weigh_route(pick, k, st.row_scale(0), weights);
  gate_up_rows_once_landed<F, CPL, kAsyncWarps>(st, gt, ut, gm, um, gu_rows, act + int64_t(slot) * act_stride + gu_r0);
  signal_count(counters);
  // The routed down rows go out now (after the count's fence, which need not wait for them), while
  // the other blocks finish their gate+up.
  if (dn_block && t < k) bulk_rows(tile_of(t), with_data(dm, down.entry(down_expert)), dn_r0, dn_rows, &down_landed);

  // Down: out += Σ_j w_j·down_j·act_j + sgate·shared_down·act_shared, as down_async_kernel.
  wait_count(counters, P.gu_blocks);
  if (b == 0)  // every block has picked from the sums: clear them for the next layer
    for (int i = t; i < pick.E + 1; i += blockDim.x) pick.sums[i] = 0;
  if (dn_block) {
    if (t < n_down) mix[t] = t < k ? weights[t] : sgate[0];
    const Staged<F> sa = stage_rows<F>(reinterpret_cast<float*>(smem + P.act_at), act, 4, down.cols, n_down,
                                       [&](int r) { return int64_t(r) * act_stride; });
    const DownPairs<F, PPL> pairs = down_pairs<F, PPL>(sa, dm, n_down, P.dn_per, mix, dn_tile_at);
    mbar_wait(&down_landed, 0);
    __syncthreads();  // every copy has landed
    down_rows<F, PPL, kAsyncWarps>(smem, pairs, dm, n_down, P.dn_per, dn_rows, out, dn_r0);
  }
  reset_counts_at_exit(counters, 2);
#endif
}

using FusedKernel = void (*)(DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix,
                             const void*, int, int, int*, float*, const float*, float*, int, StageNorm, TopK, GemvOut,
                             int*, FusedPlan);

// The kernel for these shapes (4-bit, one or two chunks a lane, up to 5 down pairs a lane), or null.
FusedKernel fused_kernel(const DeviceMatrix& gate, const DeviceMatrix& down, int k) {
  if (gate.format != WFormat::Q4) return nullptr;
  constexpr WFormat F = WFormat::Q4;
  const int cpl = lane_x_chunks(F, gate.cols / chunk_weights(F));
  const int pairs = div_up((k + 1) * (down.cols / chunk_weights(F)), 32);
  if (cpl == 2 && pairs <= 3) return moe_fused_kernel<F, 2, 3>;
  if (cpl == 2 && pairs <= 5) return moe_fused_kernel<F, 2, 5>;
  return nullptr;
}

}  // namespace

bool moe_fused_fits(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                    const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k,
                    const TopK& pick, const GemvOut& out) {
  if (!pdl_supported() || !s_gate || !s_up || !s_down || !pick.sums || !fused_kernel(gate, down, k)) return false;
  const DeviceMatrix* all[] = {&gate, &up, &down, s_gate, s_up, s_down};
  for (const DeviceMatrix* m : all)
    if (m->format != gate.format || m->group != gate.group || !chunked_layout(*m)) return false;
  if (s_gate->rows != gate.rows || s_gate->cols != gate.cols || s_down->rows != down.rows ||
      s_down->cols != down.cols || down.cols != gate.rows || k + 1 > 33 || pick.E > kMaxExperts ||
      !norm_stageable(gate.cols, 8) || out.elem != 4 || !out.add)
    return false;
  const FusedPlan P = plan_fused(gate, down, k);
  if (P.gu_blocks > sm_count() || P.dn_blocks > P.gu_blocks || P.smem > kMaxSmem) return false;
  cudaFuncAttributes attr{};
  PETREL_CUDA(cudaFuncGetAttributes(&attr, fused_kernel(gate, down, k)));
  return attr.ptxVersion >= 90;  // the body is Hopper code
}

void moe_fused(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix& s_gate,
               const DeviceMatrix& s_up, const DeviceMatrix& s_down, const void* x, int x_elem, int k, int* ids,
               float* weights, const float* sgate, float* act, int act_stride, StageNorm norm, TopK pick,
               const GemvOut& out, int* counters, cudaStream_t s) {
  const FusedKernel kernel = fused_kernel(gate, down, k);  // the caller has checked moe_fused_fits
  check(kernel != nullptr, "CUDA moe_fused: the fused experts kernel does not take these shapes");
  const FusedPlan P = plan_fused(gate, down, k);
  PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(P.smem)));
  launch_pdl(kernel, P.gu_blocks, kThreads, P.smem, s, gate, up, down, s_gate, s_up, s_down, x, x_elem, k, ids,
             weights, sgate, act, act_stride, norm, pick, out, counters, P);
  PETREL_LAUNCHED("moe_fused");
}

}  // namespace petrel::cuda
