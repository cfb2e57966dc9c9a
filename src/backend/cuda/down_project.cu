// One token's MoE down and the next layer's input projections as one launch (Hopper, 4-bit): the
// projections' rows land while down finishes, instead of after its blocks leave their
// multiprocessors (docs/performance.md, session 34: that landing is ~2.2 us of the ~7.7 the
// projections take after down). Both phases run the separate kernels' device functions, so every
// value is theirs bit for bit.
#include "backend/cuda/down_block.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/grid_counts.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kMaxTiles = 4;  // a block's projection rows, all in flight at once (as the one-row GEMV's)
constexpr size_t kMaxSmem = 227 * 1024 - 1024;  // what a block may ask for, less its static arrays

// Where a block's data sits in shared memory: down's tiles and staged activations from 0, the
// projection tiles from proj_at, the staged h from x_at.
struct ProjectPlan {
  int tile_rows = 0, slot_bytes = 0, proj_at = 0, x_at = 0, down_blocks = 0;
  size_t smem = 0;
};

// grid (a block per multiprocessor), PDL. Block b runs down for its output rows (b < down_blocks),
// copying its projection rows by bulk copies once down's have landed; every block counts itself
// once its rows of h are written; the projecting blocks (those of segs) then stage the new h with
// its norm and dot their tiles in pairs as they land, as gemv_async_kernel's one-row path does.
template <WFormat F, int PPL, int CPL>
__global__ void __launch_bounds__(32 * kAsyncWarps, 1)
    down_project_kernel(DownLaunch d, GemvSegments segs, StageNorm norm, const float* h, unsigned long long* join,
                        ProjectPlan P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __shared__ uint64_t tile_in[kMaxTiles];
  pdl_launch_dependents();
  const bool projects = int(blockIdx.x) < segs.first_block[segs.n];
  const BlockSegment seg = block_segment(segs);
  const ChunkMatrix<F> m = chunk_matrix<F>(seg.w);
  const int r0 = seg.block * seg.rows_per_block, r1 = projects ? min(seg.w.rows, r0 + seg.rows_per_block) : r0;
  const int tiles = div_up(r1 - r0, P.tile_rows);
  auto slot = [&](int i) { return AsyncTile<F>::at(smem + P.proj_at + i * P.slot_bytes, P.tile_rows, m); };
  if (threadIdx.x == 0) {
    for (int i = 0; i < tiles; ++i) mbar_init(&tile_in[i], 1);
    mbar_init_fence();
  }
  __syncthreads();
  const auto issue_rows = [&] {  // thread 0, behind down's rows: they decide down's phase
    if (threadIdx.x != 0) return;
    for (int i = 0; i < tiles; ++i) {
      const int first = r0 + i * P.tile_rows;
      bulk_rows(slot(i), m, first, min(P.tile_rows, r1 - first), &tile_in[i]);
    }
  };
  if (int(blockIdx.x) < P.down_blocks) {
    down_block_bulk<F, PPL, kAsyncWarps>(smem, d, issue_rows);
  } else {
    pdl_wait();
    issue_rows();
  }
  join_launch(join, gridDim.x, projects);  // every block's rows of h are written
  if (!projects) return;
  const auto x_row = [](int) { return int64_t(0); };
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + P.x_at), h, 4, seg.w.cols, 1, x_row, norm);
  ChunkX<F> xr[CPL];
  load_lane_x(st, xr);
  const float scale = st.row_scale(0);
  for (int i = 0; i < tiles; i += 2) {
    mbar_wait(&tile_in[i], 0);
    if (i + 1 < tiles) mbar_wait(&tile_in[i + 1], 0);
    __syncthreads();  // any scale tail thread 0 copied by plain loads is visible
    const int first = r0 + i * P.tile_rows, rows = min(2 * P.tile_rows, r1 - first);
    tile_pair_rows_x1<F, CPL>(slot(i), slot(i + 1), P.tile_rows, m, rows, xr, scale, seg.out, first, nullptr);
  }
#else
  __trap();  // never launched from this build (down_project asks pdl_supported())
#endif
}

using ProjectKernel = void (*)(DownLaunch, GemvSegments, StageNorm, const float*, unsigned long long*, ProjectPlan);

ProjectKernel project_kernel(int ppl, int cpl) {
  constexpr WFormat F = WFormat::Q4;
  if (ppl == 3) return cpl == 1 ? down_project_kernel<F, 3, 1> : down_project_kernel<F, 3, 2>;
  return cpl == 1 ? down_project_kernel<F, 5, 1> : down_project_kernel<F, 5, 2>;
}

// The launch's segments and shared-memory plan for these shapes; P.tile_rows == 0 where they do not fit.
ProjectPlan plan_project(const DownLaunch& d, const DeviceMatrix* const* ws, const GemvOut* outs, int n,
                         int64_t h_stride, StageNorm norm, int leave, GemvSegments& segs) {
  if (!d.valid || !pdl_supported() || d.down.format != WFormat::Q4 || d.out.elem != 4 || !d.out.add || n < 1 ||
      n > GemvSegments::kMax || !norm.w || !gemv_stageable(ws, n, 1, h_stride, true))
    return {};
  for (int i = 0; i < n; ++i) {
    if (ws[i]->format != WFormat::Q4 || ws[i]->group != ws[0]->group) return {};
    segs.add(*ws[i], outs ? outs[i] : GemvOut{});
  }
  segs.leave = leave;
  plan_gemv_blocks(segs);
  ProjectPlan P;
  P.tile_rows = gemv_async_pair_tile_rows(segs);
  P.down_blocks = div_up(d.down.rows, d.per);
  const int blocks = sm_count();
  if (P.tile_rows == 0 || segs.first_block[n] > blocks || P.down_blocks > blocks) return {};
  int per_max = 0;
  for (int i = 0; i < n; ++i) per_max = std::max(per_max, segs.rows_per_block[i]);
  const int tiles = div_up(per_max, P.tile_rows);
  P.slot_bytes = P.tile_rows * async_row_bytes(*ws[0]);
  P.proj_at = int(div_up(int64_t(d.smem), 16) * 16);
  P.x_at = P.proj_at + tiles * P.slot_bytes;
  P.smem = P.x_at + staged_bytes(WFormat::Q4, ws[0]->cols, 1);
  if (tiles > kMaxTiles || P.smem > kMaxSmem) return {};
  return P;
}

}  // namespace

bool down_project_fits(const DownLaunch& d, const DeviceMatrix* const* ws, int n, int64_t h_stride, StageNorm norm,
                       int leave) {
  GemvSegments segs;
  return plan_project(d, ws, nullptr, n, h_stride, norm, leave, segs).tile_rows > 0;
}

void down_project(const DownLaunch& d, const DeviceMatrix* const* ws, const GemvOut* outs, int n, const float* h,
                  int64_t h_stride, StageNorm norm, int leave, unsigned long long* join, cudaStream_t s) {
  GemvSegments segs;
  const ProjectPlan P = plan_project(d, ws, outs, n, h_stride, norm, leave, segs);
  check(P.tile_rows > 0 && d.out.y == h, "CUDA down_project: the shapes do not take the joined launch");
  const ProjectKernel kernel = project_kernel(d.ppl, lane_x_chunks(WFormat::Q4, ws[0]->cols / chunk_weights(WFormat::Q4)));
  PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(P.smem)));
  launch_pdl(kernel, sm_count(), 32 * kAsyncWarps, P.smem, s, d, segs, norm, h, join, P);
  PETREL_LAUNCHED("down + projections");
}

}  // namespace petrel::cuda
