// One token's experts as one launch (Hopper, 4-bit): gate+up of the k routed experts and the
// shared one, then down, the two phases joined by a count in global memory instead of a kernel
// boundary. What that buys: every block knows the experts from its own top-k, so it issues its
// down rows right behind its gate and up rows, and they land during the dots and the join; the
// down kernel issues them only after reading the ids gate+up wrote (docs/performance.md, session
// 19: 1.6 us from its wait to its copies going out, 2.8 us more until they land). Each phase runs
// the one-token kernels' device functions, so every value is the two kernels' bit for bit.
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
  int gu_per = 0, gu_part = 0, blocks = 0;  // gate+up rows a block, blocks a slot (k + 1 slots), all
  int dn_per = 0, dn_blocks = 0;            // down: output rows a block, blocks that have some
  int dn_at = 0, x_at = 0, act_at = 0;      // shared memory offsets (bytes); gate+up tiles at 0
  size_t smem = 0;
};

FusedPlan plan_fused(const DeviceMatrix& gate, const DeviceMatrix& down, int k) {
  FusedPlan P;
  const int slots = k + 1;
  P.gu_per = rows_per_part(gate, gate.rows, std::max(1, sm_count() / slots));
  P.gu_part = div_up(gate.rows, P.gu_per);
  P.blocks = slots * P.gu_part;
  P.dn_per = rows_per_part(down, down.rows, P.blocks);
  P.dn_blocks = div_up(down.rows, P.dn_per);
  auto at16 = [](size_t v) { return int(div_up(int64_t(v), 16) * 16); };
  P.dn_at = at16(2 * size_t(P.gu_per) * async_row_bytes(gate));
  P.x_at = at16(P.dn_at + size_t(slots) * P.dn_per * async_row_bytes(down));
  P.act_at = at16(P.x_at + staged_bytes(gate.format, gate.cols, 1));
  P.smem = P.act_at + staged_bytes(gate.format, down.cols, slots);
  return P;
}

// grid (P.blocks), PDL, one token. Block b takes the gate+up rows [part·gu_per, ...) of slot b /
// gu_part (slot k: the shared expert, whose rows go out before the wait) and, where b < dn_blocks,
// dn_per output rows of down for all k + 1 matrices (the shared one's before the wait, the routed
// ones right behind its own gate+up rows). Block 0 writes the ids and, once every block has
// picked, clears the router sums; the shared slot's first block writes the weights and the
// shared gate, which the down phase reads after the join.
template <WFormat F, int CPL, int PPL>
__global__ void __launch_bounds__(kThreads, 1)
    moe_fused_kernel(DeviceMatrix gate, DeviceMatrix up, DeviceMatrix down, DeviceMatrix s_gate, DeviceMatrix s_up,
                     DeviceMatrix s_down, const void* x, int x_elem, int k, int* ids, float* weights,
                     const float* sgate, float* act, int act_stride, StageNorm norm, TopK pick, GemvOut out,
                     unsigned long long* join, FusedPlan P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kIssueWarp = 1;  // its lanes issue the down rows' bulk copies: thread 0 joins the count
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __shared__ uint64_t down_landed;
  __shared__ int picked[32];
  __shared__ float mix[33];  // routing weight of each down matrix (the shared expert's: its gate)
  pdl_launch_dependents();
  const int b = blockIdx.x, t = threadIdx.x, n_down = k + 1;
  const int slot = b / P.gu_part, part = b % P.gu_part, issuer = t - 32 * kIssueWarp;
  const bool routed = slot < k, dn_block = b < P.dn_blocks;
  ChunkMatrix<F> gm = chunk_matrix<F>(routed ? gate : s_gate), um = chunk_matrix<F>(routed ? up : s_up);
  const int gu_r0 = part * P.gu_per, gu_rows = min(P.gu_per, gate.rows - gu_r0);
  const int gu_tile = P.gu_per * async_row_bytes(gm.chunks, gm.groups);
  const AsyncTile<F> gt = AsyncTile<F>::at(smem, P.gu_per, gm), ut = AsyncTile<F>::at(smem + gu_tile, P.gu_per, um);
  const ChunkMatrix<F> dm = chunk_matrix<F>(down);
  const int dn_r0 = b * P.dn_per, dn_rows = dn_block ? min(P.dn_per, down.rows - dn_r0) : 0;
  const int dn_tile = P.dn_per * async_row_bytes(dm.chunks, dm.groups);
  auto tile_of = [&](int j) { return AsyncTile<F>::at(smem + P.dn_at + j * dn_tile, P.dn_per, dm); };
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
  if (dn_block && issuer == k) bulk_rows(tile_of(k), with_data(dm, s_down), dn_r0, dn_rows, &down_landed);
  pdl_wait();

  // Gate+up as gate_up_async_kernel: the top-k from the router's sums, then silu(gate·x)·(up·x) of
  // the normed h; the routed down rows go out right behind the block's own gate+up rows.
  const StageInputs ahead = stage_ahead<F>(x, x_elem, gate.cols, 1, row0, norm);
  topk_block(pick, k, picked, nullptr);
  __syncthreads();
  if (b == 0 && t < k) ids[t] = picked[t];
  if (routed) {
    gm = with_data(gm, gate.entry(picked[slot]));
    um = with_data(um, up.entry(picked[slot]));
    issue_gate_up();
  }
  if (dn_block && issuer >= 0 && issuer < k)
    bulk_rows(tile_of(issuer), with_data(dm, down.entry(picked[issuer])), dn_r0, dn_rows, &down_landed);
  const Staged<F> st =
      stage_rows<F>(reinterpret_cast<float*>(smem + P.x_at), x, x_elem, gate.cols, 1, row0, norm, ahead);
  if (!routed && part == 0) weigh_route(pick, k, st.row_scale(0), weights);
  gate_up_rows_once_landed<F, CPL, kAsyncWarps>(st, gt, ut, gm, um, gu_rows, act + int64_t(slot) * act_stride + gu_r0);

  // Down as down_async_kernel, once every block's act rows (and the weights) are written.
  join_launch(join, gridDim.x);
  if (b == 0)  // every block has picked from the sums: clear them for the next layer
    for (int i = t; i < pick.E + 1; i += blockDim.x) pick.sums[i] = 0;
  if (!dn_block) return;
  if (t < n_down) mix[t] = t < k ? weights[t] : sgate[0];
  const Staged<F> sa = stage_rows<F>(reinterpret_cast<float*>(smem + P.act_at), act, 4, down.cols, n_down,
                                     [&](int r) { return int64_t(r) * act_stride; });
  const DownPairs<F, PPL> pairs =
      down_pairs<F, PPL>(sa, dm, n_down, P.dn_per, mix, [&](int j) { return P.dn_at + j * dn_tile; });
  mbar_wait(&down_landed, 0);
  __syncthreads();  // every copy has landed (and any scale tail copied by plain loads)
  down_rows<F, PPL, kAsyncWarps>(smem, pairs, dm, n_down, P.dn_per, dn_rows, out, dn_r0);
#else
  __trap();  // never launched from this build (moe_fused_fits asks for the sm_90 binary)
#endif
}

using FusedKernel = void (*)(DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix, DeviceMatrix,
                             const void*, int, int, int*, float*, const float*, float*, int, StageNorm, TopK, GemvOut,
                             unsigned long long*, FusedPlan);

// The kernel for these shapes (4-bit, one, two or four chunks a lane, up to 5 down pairs a lane), or null.
FusedKernel fused_kernel(const DeviceMatrix& gate, const DeviceMatrix& down, int k) {
  if (gate.format != WFormat::Q4) return nullptr;
  constexpr WFormat F = WFormat::Q4;
  const int cpl = lane_x_chunks(F, gate.cols / chunk_weights(F));
  const int pairs = div_up((k + 1) * (down.cols / chunk_weights(F)), 32);
  if (pairs > 5) return nullptr;  // 6 and up spill the 4-bit activations (down_async_split)
  const bool three = pairs <= 3;
  switch (cpl) {
    case 1: return three ? moe_fused_kernel<F, 1, 3> : moe_fused_kernel<F, 1, 5>;
    case 2: return three ? moe_fused_kernel<F, 2, 3> : moe_fused_kernel<F, 2, 5>;
    case 4: return three ? moe_fused_kernel<F, 4, 3> : moe_fused_kernel<F, 4, 5>;
    default: return nullptr;
  }
}

}  // namespace

bool moe_fused_fits(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                    const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k,
                    const TopK& pick, const GemvOut& out) {
  if (!pdl_supported() || !s_gate || !s_up || !s_down || !pick.sums || !fused_kernel(gate, down, k)) return false;
  const DeviceMatrix* all[] = {&gate, &up, &down, s_gate, s_up, s_down};
  for (const DeviceMatrix* m : all)
    if (m->format != gate.format || m->group != gate.group || !chunked_layout(*m)) return false;
  // k + 1 <= 32: one warp's lanes issue the down matrices' copies.
  if (s_gate->rows != gate.rows || s_gate->cols != gate.cols || s_down->rows != down.rows ||
      s_down->cols != down.cols || down.cols != gate.rows || k + 1 > 32 || pick.E > kMaxExperts || out.elem != 4 ||
      !out.add)
    return false;
  const FusedPlan P = plan_fused(gate, down, k);
  // Every block must be resident at once (the join waits for all of them): one a multiprocessor.
  return P.blocks <= sm_count() && P.dn_blocks <= P.blocks && P.smem <= kMaxSmem;
}

void moe_fused(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix& s_gate,
               const DeviceMatrix& s_up, const DeviceMatrix& s_down, const void* x, int x_elem, int k, int* ids,
               float* weights, const float* sgate, float* act, int act_stride, StageNorm norm, TopK pick,
               const GemvOut& out, unsigned long long* join, cudaStream_t s) {
  const FusedKernel kernel = fused_kernel(gate, down, k);  // the caller has checked moe_fused_fits
  check(kernel != nullptr, "CUDA moe_fused: the fused experts kernel does not take these shapes");
  const FusedPlan P = plan_fused(gate, down, k);
  PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(P.smem)));
  launch_pdl(kernel, P.blocks, kThreads, P.smem, s, gate, up, down, s_gate, s_up, s_down, x, x_elem, k, ids, weights,
             sgate, act, act_stride, norm, pick, out, join, P);
  PETREL_LAUNCHED("moe_fused");
}

}  // namespace petrel::cuda
