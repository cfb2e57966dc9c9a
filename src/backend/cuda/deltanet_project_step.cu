// One token's DeltaNet input projections and step in one launch: a cluster of 6 blocks per key
// head (H200: 17 clusters of 6 fit at once, only 15 of 8 and 30 of 4, for 16 key heads or 32
// value heads). Blocks 0-3 each own 64 value columns of the key head's two value heads and
// compute their v and z rows and one of its b and a rows; block 4 computes the head's q rows,
// block 5 its k rows, and each pushes its conv outputs (and blocks 0-3 their gates) into blocks
// 0-3 through distributed shared memory (so every conv channel has one reader, which shifts its
// state). After one cluster
// barrier blocks 0-3 run the delta rule on their columns; a second joins the gated RMSNorm's sums
// of the two blocks of a value head. The kernel boundary between the projections and
// deltanet_decode_kernel (~4.6 us a layer) is gone, and 36 multiprocessors stay free for the
// output projection's blocks to load their weights.
// Every value is computed in the order deltanet_decode_kernel and the one-token GEMV compute it
// (the projection outputs rounded to bf16 as stored, the same sums), so the results are the same
// bits (tests/integration/cuda_ops_test.cpp).
#include "backend/cuda/deltanet_step.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"

#include <cooperative_groups.h>

namespace petrel::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCluster = 6;                      // blocks of a key head
constexpr int kColBlocks = 4;                    // blocks 0-3: value columns and a gate; 4: q; 5: k
constexpr int kQBlock = 4, kKBlock = 5;
constexpr int kDk = 128, kDv = 128, kRatio = 2;  // the shapes the kernel is built for (both models)
constexpr int kCols = kRatio * kDv / kColBlocks;  // value columns a block: 64
constexpr int kHeadBlocks = kDv / kCols;          // blocks of a value head: 2
constexpr int kGateRow = kCols;                   // column blocks' tile: v rows, a gate row, z rows
constexpr int kZRow = kGateRow + 1;
constexpr int kTileRows = kZRow + kCols;          // 129 rows (a q/k block's 128 fit)
constexpr int kParts = 4;                         // threads per value column, as deltanet_decode_kernel
constexpr int kStepThreads = kCols * kParts;
constexpr int kStepWarps = kStepThreads / 32;
constexpr int kStatePitch = kCols + 8;  // floats a state row in shared memory: parts' reads on distinct banks
constexpr int kThreads = 32 * kAsyncWarps;
static_assert(kStepThreads <= kThreads && kDk <= kThreads, "project_step: a thread per column part and channel");
static_assert(kDk <= kTileRows && 2 * kRatio == kColBlocks, "project_step: q/k rows fit the tile, a gate a block");
static_assert(kHeadBlocks * kStepWarps == kDv * kParts / 32, "project_step: the head's warps as deltanet_decode's");

struct Smem {
  float res[kTileRows];                  // the block's projection outputs (before rounding)
  float qs[kDk], ks[kDk];                // the key head's conv outputs, pushed by blocks 4 and 5
  float vs[kCols];                       // the block's own v conv outputs
  float gates[2 * kRatio];               // b of the key head's value heads, then a (block r: gate r)
  float o_sq[kHeadBlocks * kStepWarps];  // the value head's per-warp Σo², pushed by its blocks
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // the kernel's helpers: Hopper code, as its body
// Cluster barrier halves (every thread of every block arrives; wait returns once all have).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The view of tile t starting `row` rows in.
template <WFormat F>
__device__ __forceinline__ AsyncTile<F> tile_from(AsyncTile<F> t, int row, const ChunkMatrix<F>& m) {
  t.w += row * m.chunks;
  t.scales += row * m.groups;
  t.biases += row * m.groups;
  return t;
}

__device__ __forceinline__ float as_stored(float v) { return __bfloat162float(__float2bfloat16(v)); }
#endif

template <WFormat F, int CPL>
__global__ void __launch_bounds__(kThreads, 1) deltanet_project_step_kernel(DeltaNetProjectStep P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 smem4[];
  __shared__ Smem sm;
  cg::cluster_group cluster = cg::this_cluster();
  cluster_arrive_relaxed();  // every block has started before any pushes into another (wait below)
  pdl_launch_dependents();
  const DeltaNetShape& d = P.d;
  const int r = int(cluster.block_rank()), kh = blockIdx.x / kCluster, tid = threadIdx.x;
  const int key_dim = d.Hk * kDk, C = 2 * key_dim + d.Hv * kDv, hist = d.K - 1;
  const bool col_block = r < kColBlocks;
  const int hh = r / kHeadBlocks, j = kRatio * kh + hh, e0 = (r % kHeadBlocks) * kCols;  // column blocks' head
  const ChunkMatrix<F> m = chunk_matrix<F>(P.qkv);
  char* smem = reinterpret_cast<char*>(smem4);
  const AsyncTile<F> tile = AsyncTile<F>::at(smem, kTileRows, m);
  float* S_s = reinterpret_cast<float*>(smem + kTileRows * async_row_bytes(m.chunks, m.groups));
  float* staged = S_s + kDk * kStatePitch;
  // The block's first projection row (of qkv) and conv channels: its v rows, or the head's q or k.
  const int first = col_block ? 2 * key_dim + j * kDv + e0 : (r == kKBlock ? key_dim : 0) + kh * kDk;
  const int channels = col_block ? kCols : kDk;
  const int state_cols = (j * kDk) * kDv + e0;  // a column block's state: rows 0..dk of columns e0..
  // One copy group each (empty where the block has no such rows), so the wait counts are fixed.
  auto copy_state = [&] {
    if (col_block)
      for (int x = tid; x < kDk * kCols / 4; x += kThreads) {
        const int i = x / (kCols / 4), c = 4 * (x % (kCols / 4));
        cp_async16(smem_addr(S_s + i * kStatePitch + c), P.state + state_cols + i * kDv + c, true);
      }
    cp_async_commit();
  };
  // The settled states and the first half of the block's rows go out before the wait, the other
  // half and the z rows after x's loads (more copies before the wait measured slower: they share
  // the bandwidth with the kernel before, as the one-token GEMV's ring found).
  if (P.states_settled) copy_state();
  const ChunkMatrix<F> gm = chunk_matrix<F>(r < kRatio ? P.b : P.a);  // a column block's gate row
  const int half = channels / 2;
  copy_rows_async(tile, m, first, half);
  if (col_block) copy_rows_async(tile_from(tile, kGateRow, m), gm, kRatio * kh + r % kRatio, 1);
  cp_async_commit();
  // The conv channel of thread tid < channels (global channel c).
  const bool has_ch = tid < channels;
  const int c = first + tid;
  float taps[kDecodeMaxTaps], h[kDecodeMaxTaps - 1];
#pragma unroll
  for (int t = 0; t < kDecodeMaxTaps; ++t) taps[t] = has_ch && t < d.K ? P.conv_w[int64_t(c) * d.K + t] : 0.0f;
  auto load_history = [&] {
#pragma unroll
    for (int t = 0; t < kDecodeMaxTaps - 1; ++t) h[t] = has_ch && t < hist ? P.conv_state[int64_t(t) * C + c] : 0.0f;
  };
  const int e = tid / kParts, part = tid % kParts;  // the step's value column (of the block's) and part
  const bool steps = col_block && tid < kStepThreads;
  const float A = col_block ? expf(P.A_log[j]) : 0.0f, dt = col_block ? P.dt_bias[j] : 0.0f;
  const float nw = steps ? P.norm_w[e0 + e] : 0.0f;
  if (P.states_settled) load_history();

  pdl_wait();
  const auto x_row = [](int) { return int64_t(0); };
  const StageInputs ahead = stage_ahead<F>(P.h, 4, P.qkv.cols, 1, x_row, P.input_norm);
  copy_rows_async(tile_from(tile, half, m), m, first + half, channels - half);
  cp_async_commit();
  const ChunkMatrix<F> zm = chunk_matrix<F>(P.z);
  if (col_block) copy_rows_async(tile_from(tile, kZRow, m), zm, j * kDv + e0, kCols);
  cp_async_commit();
  if (!P.states_settled) {
    load_history();
    copy_state();
  }
  const Staged<F> st = stage_rows<F>(staged, P.h, 4, P.qkv.cols, 1, x_row, P.input_norm, ahead);
  ChunkX<F> xr[CPL];
  load_lane_x(st, xr);
  const float scale = st.row_scale(0);
  const GemvOut to_res{sm.res, 0, 4, false};
  // A column block's v rows and gate row (on the last warp, fp32 as b and a are stored: the
  // outputs stay fp32 here, those of qkv rounded where read); a q/k block's q or k rows. The
  // state's copies, where they follow the wait, may still land: they are read after the barrier.
  if (P.states_settled) cp_async_wait<2>();  // the first half
  else cp_async_wait<3>();
  __syncthreads();
  tile_pair_rows_x1<F, CPL>(tile, tile, half, m, half, xr, scale, to_res, 0, nullptr);
  if (P.states_settled) cp_async_wait<1>();  // the second half
  else cp_async_wait<2>();
  __syncthreads();
  const AsyncTile<F> second = tile_from(tile, half, m);
  tile_pair_rows_x1<F, CPL>(second, second, channels - half, m, channels - half, xr, scale, to_res, half, nullptr);
  if (col_block && tid / 32 == kAsyncWarps - 1) {
    const float v = warp_sum(row_dot_x1(tile_from(tile, kGateRow, m), gm, 0, xr));
    if (tid % 32 == 0) sm.res[kGateRow] = v * scale;
  }
  __syncthreads();

  // The conv of the block's channels (inputs as stored, bf16), its history shifted at once.
  float u = 0.0f;
  if (has_ch) {
    const float xc = as_stored(sm.res[tid]);
    float acc = 0.0f;
#pragma unroll
    for (int t = 0; t < kDecodeMaxTaps; ++t) acc += taps[t] * (t < hist ? h[t] : t == hist ? xc : 0.0f);
    u = siluf_(acc);
#pragma unroll
    for (int t = 1; t < kDecodeMaxTaps - 1; ++t)
      if (t < hist) P.conv_state[int64_t(t - 1) * C + c] = h[t];
    if (hist > 0) P.conv_state[int64_t(hist - 1) * C + c] = xc;
  }
  cluster_wait();  // every block has started: its shared memory takes pushes
  if (col_block && has_ch) {
    sm.vs[tid] = u;
  } else if (col_block && tid == channels) {
    for (int b = 0; b < kColBlocks; ++b) *cluster.map_shared_rank(&sm.gates[r], b) = sm.res[kGateRow];
  } else if (has_ch) {
    float* dst = r == kQBlock ? &sm.qs[tid] : &sm.ks[tid];
    for (int b = 0; b < kColBlocks; ++b) *cluster.map_shared_rank(dst, b) = u;
  }
  cluster_arrive();
  // While the pushes land: the column blocks' z rows.
  cp_async_wait<0>();
  __syncthreads();
  if (col_block)
    tile_pair_rows_x1<F, CPL>(tile_from(tile, kZRow, m), tile_from(tile, kZRow, m), kCols, m, kCols, xr, scale,
                              to_res, kZRow, nullptr);
  cluster_wait();
  __syncthreads();  // the z rows' values (and the state's copies) are in shared memory

  // The delta rule on a column block's columns, as deltanet_head_step: q/k norms from per-warp
  // sums in its channel order, kParts threads a column.
  float o = 0.0f;
  if (steps) {
    float qq = 0.0f, kk = 0.0f;
    const int lane = tid % 32, warp = tid / 32;
    for (int w = 0; w < kDk / 32; ++w) {
      const float qv = sm.qs[32 * w + lane], kv = sm.ks[32 * w + lane];
      qq += warp_sum(qv * qv);
      kk += warp_sum(kv * kv);
    }
    const float inv_q = rsqrtf(qq + 1e-6f) * rsqrtf(float(kDk)), inv_k = rsqrtf(kk + 1e-6f);
    const float av = sm.gates[kRatio + hh] + dt, bj = sm.gates[hh];
    const float decay = expf(-A * (av > 20.0f ? av : log1pf(expf(av))));
    const float beta = 1.0f / (1.0f + expf(-bj));
    constexpr int kColRows = kDk / kParts;  // state rows a thread holds
    float col[kColRows];
#pragma unroll
    for (int i = 0; i < kColRows; ++i) col[i] = S_s[(part + kParts * i) * kStatePitch + e];
    float mm = 0.0f;
#pragma unroll
    for (int i = 0; i < kColRows; ++i) {
      col[i] *= decay;
      mm += col[i] * sm.ks[part + kParts * i];
    }
    mm += __shfl_xor_sync(0xffffffffu, mm, 1);
    mm += __shfl_xor_sync(0xffffffffu, mm, 2);
    const float delta = beta * (sm.vs[e] - mm * inv_k);
#pragma unroll
    for (int i = 0; i < kColRows; ++i) {
      col[i] += sm.ks[part + kParts * i] * inv_k * delta;
      o += col[i] * sm.qs[part + kParts * i];
    }
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    o *= inv_q;
    float* S = P.state + state_cols + part * kDv + e;
#pragma unroll
    for (int i = 0; i < kColRows; ++i) __stcg(S + i * kParts * kDv, col[i]);
    const float o2 = warp_sum(part == 0 ? o * o : 0.0f);
    if (lane == 0) {
      const int slot = (r % kHeadBlocks) * kStepWarps + warp;
      for (int b = 0; b < kHeadBlocks; ++b) *cluster.map_shared_rank(&sm.o_sq[slot], hh * kHeadBlocks + b) = o2;
    }
  }
  cluster_arrive();
  cluster_wait();  // the head's sums are in; no block touches another's memory after this
  if (steps && part == 0) {
    float oo = 0.0f;
    for (int w = 0; w < kHeadBlocks * kStepWarps; ++w) oo += sm.o_sq[w];
    const float zc = as_stored(sm.res[kZRow + e]);
    P.out[int64_t(j) * kDv + e0 + e] = __float2bfloat16(o * rsqrtf(oo / float(kDv) + P.eps) * nw * siluf_(zc));
  }
#endif
}

using ProjectStepKernel = void (*)(DeltaNetProjectStep);

ProjectStepKernel project_step_kernel(const DeltaNetProjectStep& P) {
  if (P.qkv.format != WFormat::Q4) return nullptr;
  if (lane_x_chunks(WFormat::Q4, P.qkv.cols / chunk_weights(WFormat::Q4)) != 2) return nullptr;
  return deltanet_project_step_kernel<WFormat::Q4, 2>;
}

size_t project_step_smem(const DeltaNetProjectStep& P) {
  return size_t(kTileRows) * async_row_bytes(P.qkv) + size_t(kDk) * kStatePitch * sizeof(float) +
         staged_bytes(P.qkv.format, P.qkv.cols, 1);
}

// Lets the kernel take `bytes` of dynamic shared memory (set once, raised when more is asked).
void allow_smem(ProjectStepKernel kernel, size_t bytes) {
  static size_t allowed = 0;
  if (bytes <= allowed) return;
  PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  allowed = bytes;
}

cudaLaunchAttribute cluster_attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = kCluster;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// The grid (a cluster per key head), blocks and shared memory, without attributes.
cudaLaunchConfig_t launch_config(const DeltaNetProjectStep& P, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(P.d.Hk * kCluster);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = project_step_smem(P);
  cfg.stream = s;
  return cfg;
}

}  // namespace

bool deltanet_project_step_fits(const DeltaNetProjectStep& P) {
  const DeltaNetShape& d = P.d;
  if (!pdl_supported() || !project_step_kernel(P)) return false;
  if (d.dk != kDk || d.dv != kDv || d.Hv != kRatio * d.Hk || d.K < 1 || d.K > kDecodeMaxTaps) return false;
  const DeviceMatrix* all[] = {&P.qkv, &P.z, &P.b, &P.a};
  for (const DeviceMatrix* w : all) {
    if (w->format != P.qkv.format || w->cols != P.qkv.cols || w->group != P.qkv.group || !chunked_layout(*w))
      return false;
    for (const void* p : {w->w, static_cast<const void*>(w->scales), static_cast<const void*>(w->biases)})
      if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  }
  const int groups = P.qkv.cols / P.qkv.group;
  if (groups % 8 || P.qkv.rows != 2 * d.Hk * kDk + d.Hv * kDv || P.z.rows != d.Hv * kDv || P.b.rows != d.Hv ||
      P.a.rows != d.Hv || !norm_stageable(P.qkv.cols, 8))
    return false;
  if (reinterpret_cast<uintptr_t>(P.state) % 16) return false;  // the state's 16-byte copies
  // The room the kernel's build leaves (asked once: this runs every layer of every step).
  static const size_t room = [&] {
    cudaFuncAttributes attr{};
    PETREL_CUDA(cudaFuncGetAttributes(&attr, project_step_kernel(P)));
    if (attr.ptxVersion < 90) return size_t(0);  // built for an older chip (the body is Hopper code)
    int device = 0, optin = 0;
    PETREL_CUDA(cudaGetDevice(&device));
    PETREL_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return size_t(optin) - std::min(size_t(optin), attr.sharedSizeBytes);
  }();
  if (project_step_smem(P) > room) return false;
  // Every cluster resident at once (6 free multiprocessors of one GPC each): a second wave would
  // double the step.
  static const int clusters = [&] {
    const ProjectStepKernel kernel = project_step_kernel(P);
    allow_smem(kernel, project_step_smem(P));
    cudaLaunchConfig_t cfg = launch_config(P, nullptr);
    cudaLaunchAttribute attr = cluster_attribute();
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    PETREL_CUDA(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    return n;
  }();
  return clusters >= P.d.Hk;
}

void deltanet_project_step(const DeltaNetProjectStep& P, cudaStream_t s) {
  const ProjectStepKernel kernel = project_step_kernel(P);
  check(kernel != nullptr, "CUDA deltanet_project_step: the fused kernel does not take these shapes");
  allow_smem(kernel, project_step_smem(P));
  cudaLaunchConfig_t cfg = launch_config(P, s);
  cudaLaunchAttribute attr[2] = {cluster_attribute(), {}};
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  PETREL_CUDA(cudaLaunchKernelEx(&cfg, kernel, P));
  PETREL_LAUNCHED("deltanet_project_step");
}

}  // namespace petrel::cuda
