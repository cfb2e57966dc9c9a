// Mixture of experts on the GPU with routing decided on the device: router softmax + top-k, the
// few-token path (all selected experts in one launch for gate+up, one for down + weighting + shared
// expert), and the prefill plan (device-built per-expert row lists for the grouped GEMM) + combine.
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/topk.cuh"

#include <algorithm>
#include <type_traits>

namespace petrel::cuda {
namespace {

constexpr int kWarps = 8;

// Row `row` of w dotted with activation row x (bf16 or fp32, `elem` bytes), by one warp.
__device__ float dot_row(const DeviceMatrix& w, int64_t row, const void* x, int elem, int64_t x_off, int lane) {
  float acc = 0.0f;
  if (q4_wide(w)) {
#pragma unroll 4
    for (int c32 = lane; c32 < w.cols / 32; c32 += 32) {
      uint32_t words[4];
      float sc, bi;
      load32_q4(w, row, c32, words, &sc, &bi);
      acc += dot32_q4(words, sc, bi, x, elem, x_off + int64_t(c32) * 32);
    }
    return warp_sum(acc);
  }
#pragma unroll 8
  for (int c8 = lane; c8 < w.cols / 8; c8 += 32) {
    float wv[8], xv[8];
    load8(w, row, c8, wv);
    load8_x(x, elem, x_off + c8 * 8, xv);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += wv[i] * xv[i];
  }
  return warp_sum(acc);
}

__device__ float dot_row_f32(const DeviceMatrix& w, int64_t row, const float* x, int lane) {
  return dot_row(w, row, x, 4, 0, lane);
}

constexpr int kRouteTile = 64, kRouteK = 32;  // tokens x router rows per block, columns per stage
constexpr int kRouteTiledMinTokens = 256;

// grid (ceil((E+1)/64), ceil(T/64)), 256 threads: the prefill router as a tiled fp32 GEMM on CUDA
// cores (the router must see unrounded activations; tensor cores would round them to bf16).
// Thread (tx, ty) owns tokens ty + 16i and rows tx + 16j; row E is the shared-expert gate.
__global__ void __launch_bounds__(256) router_tiled_kernel(DeviceMatrix router, DeviceMatrix shared_gate,
                                                           bool has_shared, const void* x, int64_t x_stride,
                                                           int x_elem, int T, int E, float* logits, float* sgate) {
  __shared__ float xs[kRouteK][kRouteTile + 4], ws[kRouteK][kRouteTile + 4];  // [column][token or row]
  const int t0 = blockIdx.y * kRouteTile, e0 = blockIdx.x * kRouteTile, tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16, r = tid / 4, c8 = tid % 4;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < router.cols; k0 += kRouteK) {
    float xv[8] = {}, wv[8] = {};
    if (t0 + r < T) load8_x(x, x_elem, int64_t(t0 + r) * x_stride + k0 + c8 * 8, xv);
    if (e0 + r < E) load8(router, e0 + r, k0 / 8 + c8, wv);
    else if (e0 + r == E && has_shared) load8(shared_gate, 0, k0 / 8 + c8, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xs[c8 * 8 + i][r] = xv[i];
      ws[c8 * 8 + i][r] = wv[i];
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kRouteK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[kk][ty + 16 * i];
        b[i] = ws[kk][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int t = t0 + ty + 16 * i, e = e0 + tx + 16 * j;
      if (t >= T) continue;
      if (e < E) logits[int64_t(t) * E + e] = acc[i][j];
      else if (e == E && has_shared) sgate[t] = sigmoidf_(acc[i][j]);
    }
}

// One warp: softmax of a token's router logits (in p, E <= 32·PER floats of shared memory), then
// k rounds of argmax (lowest index wins ties) -> ids/weights. Each lane holds its PER
// probabilities in registers; lane r keeps round r's pick.
template <int PER>
__device__ void topk_probs_regs(const float* p, int E, int k, bool renorm, int* ids, float* weights, int lane) {
  float v[PER];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    v[i] = lane + 32 * i < E ? p[lane + 32 * i] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    v[i] = lane + 32 * i < E ? expf(v[i] - mx) : -1.0f;  // -1: below every probability, never picked
    sum += fmaxf(v[i], 0.0f);
  }
  sum = warp_sum(sum);
  float total = 0.0f, my_w = 0.0f;
  int my_id = 0;
  for (int r = 0; r < k; ++r) {
    float best = v[0];
    int best_i = 0;
#pragma unroll
    for (int i = 1; i < PER; ++i)
      if (v[i] > best) {
        best = v[i];
        best_i = i;
      }
    // The warp's largest probability, then the lowest expert holding it: one reduction each.
    // Probabilities (>= 0) order as their bits; the negative markers map below them all.
    const unsigned key = best >= 0.0f ? __float_as_uint(best) + 1u : 0u;
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    const int best_e = int(__reduce_min_sync(0xffffffffu, key == top ? unsigned(lane + 32 * best_i) : 0xffffffffu));
    best = top > 0u ? __uint_as_float(top - 1u) : -2.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (best_e == lane + 32 * i) v[i] = -2.0f;  // picked: excluded from later rounds
    if (lane == r) {
      my_id = best_e;
      my_w = best / sum;
    }
    total += best / sum;
  }
  if (lane < k) {
    ids[lane] = my_id;
    weights[lane] = renorm ? my_w / total : my_w;
  }
}

__device__ void topk_probs(const float* p, int E, int k, bool renorm, int* ids, float* weights, int lane) {
  if (E <= 256) topk_probs_regs<8>(p, E, k, renorm, ids, weights, lane);
  else if (E <= 512) topk_probs_regs<16>(p, E, k, renorm, ids, weights, lane);
  else topk_probs_regs<32>(p, E, k, renorm, ids, weights, lane);
}

__device__ void topk_row(const float* logits, float* p, int E, int k, bool renorm, int* ids, float* weights, int lane) {
  for (int e = lane; e < E; e += 32) p[e] = logits[e];
  __syncwarp();
  topk_probs(p, E, k, renorm, ids, weights, lane);
}

// The fused routers' last block: the whole block fetches the token's logits (bypassing L1: other
// blocks just wrote them) in one round trip, then warp 0 picks the top k.
__device__ void topk_last_block(const float* logits, float* p, int E, int k, bool renorm, int* ids, float* weights) {
  __threadfence();
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = __ldcg(logits + e);
  __syncthreads();
  if (threadIdx.x < 32) topk_probs(p, E, k, renorm, ids, weights, threadIdx.x);
}

// Whole block, once its logits are written: true in the last of the token's blocks to finish
// (counted in *done, which that block resets to zero).
__device__ bool last_block_of_token(int* done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's logits are visible before it is counted
    last = atomicAdd(done, 1) == int(gridDim.x) - 1;
    if (last) *done = 0;
  }
  __syncthreads();
  return last;
}

constexpr int kTopkWarps = 4;  // tokens per top-k block, one warp each

// grid (T / kTopkWarps), a warp per token (after the tiled router).
__global__ void topk_kernel(const float* logits, int T, int E, int k, bool renorm, int* ids, float* weights) {
  __shared__ float probs[kTopkWarps][kMaxExperts];
  const int lane = threadIdx.x % 32, t = blockIdx.x * kTopkWarps + threadIdx.x / 32;
  if (t >= T) return;
  topk_row(logits + int64_t(t) * E, probs[threadIdx.x / 32], E, k, renorm, ids + t * k, weights + t * k, lane);
}

// grid (ceil((E+1)/8), T): one warp per router row (row E is the shared-expert gate), fp32 logits.
// Spread over many blocks: a single block per token would stream the router through one SM. The
// last block of a token to finish (counted in done[t], left at zero) runs its top-k.
__global__ void router_logits_kernel(DeviceMatrix router, DeviceMatrix shared_gate, bool has_shared, const void* x,
                                     int64_t x_stride, int x_elem, int E, int k, bool renorm, float* logits,
                                     float* sgate, int* ids, float* weights, int* done) {
  __shared__ float probs[kMaxExperts];
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * kWarps + warp;
  const int64_t xo = t * x_stride;
  if (e < E) {
    const float v = dot_row(router, e, x, x_elem, xo, lane);
    if (lane == 0) logits[int64_t(t) * E + e] = v;
  } else if (e == E && has_shared) {
    const float v = dot_row(shared_gate, 0, x, x_elem, xo, lane);
    if (lane == 0) sgate[t] = sigmoidf_(v);
  }
  if (last_block_of_token(done + t))
    topk_last_block(logits + int64_t(t) * E, probs, E, k, renorm, ids + t * k, weights + t * k);
}

constexpr int kRouterChunksPerLane = 8;  // the staged router holds a whole row in registers

// True when router rows fit the staged router: bf16 or 8-bit (the formats routers are stored in;
// 8-bit rows meet two int8 levels of activations, ~14 bits, bf16 rows fp32), at most 8 chunks per lane.
bool router_staged_fits(const DeviceMatrix& router) {
  return (router.format == WFormat::BF16 || router.format == WFormat::Q8) && chunked_layout(router) &&
         router.cols / chunk_weights(router.format) <= 32 * kRouterChunksPerLane;
}

// The shared-expert gate row is staged with the router's rows when it has their format and width.
bool gate_staged_with(const DeviceMatrix& router, const DeviceMatrix& shared_gate) {
  return shared_gate.format == router.format && shared_gate.cols == router.cols && chunked_layout(shared_gate);
}

// grid (ceil((E+1)/8), T), PDL: the decode router. A warp per router row loads the whole row into
// registers before waiting for x, then dots it with x staged (fp32, or two int8 levels for 8-bit
// rows). Row E is the shared-expert gate: staged the same way when it has the router's format
// (gate_staged), else the plain warp dot. The last block of a token (counted in done[t], left at
// zero) runs its softmax + top-k. A staged norm (the post-attention RMSNorm) needs the gate staged.
template <WFormat F>
__global__ void __launch_bounds__(32 * kWarps) router_staged_kernel(DeviceMatrix router, DeviceMatrix shared_gate,
                                                                    bool has_shared, bool gate_staged, const void* x,
                                                                    int64_t x_stride, int x_elem, int E, int k,
                                                                    bool renorm, float* logits, float* sgate, int* ids,
                                                                    float* weights, int* done, StageNorm norm,
                                                                    bool logits_only) {
  extern __shared__ float4 smem4[];
  __shared__ float probs[kMaxExperts];
  pdl_launch_dependents();
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * kWarps + warp;
  const bool gate_row = e == E && has_shared, staged_row = e < E || (gate_row && gate_staged);
  const ChunkMatrix<F> m = chunk_matrix<F>(e < E ? router : shared_gate);
  Chunk ch[kRouterChunksPerLane];
#pragma unroll
  for (int i = 0; i < kRouterChunksPerLane; ++i)
    if (staged_row && lane + 32 * i < m.chunks) ch[i] = m.load(e < E ? e : 0, lane + 32 * i);
  pdl_wait();
  const int64_t xo = t * x_stride;
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), x, x_elem, router.cols, 1,
                                     [&](int) { return xo; }, norm);
  if (staged_row) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kRouterChunksPerLane; ++i)
      if (lane + 32 * i < m.chunks) acc += st.dot(ch[i], 0, lane + 32 * i);
    acc = warp_sum(acc) * st.row_scale(0);
    if (lane == 0 && e < E) logits[int64_t(t) * E + e] = acc;
    if (lane == 0 && gate_row) sgate[t] = sigmoidf_(acc);
  } else if (gate_row) {
    const float v = dot_row(shared_gate, 0, x, x_elem, xo, lane);
    if (lane == 0) sgate[t] = sigmoidf_(v);
  }
  if (!logits_only && last_block_of_token(done + t))
    topk_last_block(logits + int64_t(t) * E, probs, E, k, renorm, ids + t * k, weights + t * k);
}

// grid (rows/8, T·k + shared slots): silu(gate·x)·(up·x) per selected expert row -> act (fp32).
__global__ void gate_up_kernel(DeviceMatrix gate, DeviceMatrix up, DeviceMatrix s_gate, DeviceMatrix s_up,
                               bool has_shared, const void* x, int64_t x_stride, int x_elem, int T, int k,
                               const int* ids, float* act, int act_stride) {
  const int slot = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + warp;
  const bool routed = slot < T * k;
  const int token = routed ? slot / k : slot - T * k;
  const DeviceMatrix g = routed ? gate.entry(ids[slot]) : s_gate;
  const DeviceMatrix u = routed ? up.entry(ids[slot]) : s_up;
  if (!routed && !has_shared) return;
  if (row >= g.rows) return;
  const int64_t xo = token * x_stride;
  const float gv = dot_row(g, row, x, x_elem, xo, lane), uv = dot_row(u, row, x, x_elem, xo, lane);
  if (lane == 0) act[int64_t(slot) * act_stride + row] = siluf_(gv) * uv;
}

// grid (H/8, T): out[t][h] = Σ_j w[t,j]·down_{e_j}[h]·act_j + sgate[t]·shared_down[h]·act_shared.
__global__ void down_kernel(DeviceMatrix down, DeviceMatrix s_down, bool has_shared, int T, int k, const int* ids,
                            const float* weights, const float* sgate, const float* act, int act_stride, bf16* out,
                            int64_t out_stride) {
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.x * kWarps + warp;
  if (h >= down.rows) return;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int slot = t * k + j;
    acc += weights[slot] * dot_row_f32(down.entry(ids[slot]), h, act + int64_t(slot) * act_stride, lane);
  }
  if (has_shared) acc += sgate[t] * dot_row_f32(s_down, h, act + int64_t(T * k + t) * act_stride, lane);
  if (lane == 0) out[t * out_stride + h] = __float2bfloat16(acc);
}

constexpr int kStagedRows = 2;    // gate and up rows per warp in the staged expert kernel
constexpr int kGateUpSteps = 1;   // chunk steps per row whose loads a lane issues at once (2 costs 112 registers)
constexpr int kDownChunksInFlight = 8;  // per lane in the staged down kernel (one output row per warp)

// grid (width/16, slots), PDL: the staged form of gate_up_kernel. Each warp streams kStagedRows
// rows of gate and of up, kGateUpSteps chunk steps at once; a block issues its first loads before
// staging its token's activation row (the shared expert's blocks even before waiting for the
// router) and, once its loads are consumed, asks L2 for a slice of its expert's down projection
// (the next kernel's weights). A staged norm is the post-attention RMSNorm. With pick.any() a
// routed block first picks the top-k itself (pick_expert), as gate_up_async_kernel does.
template <WFormat F>
__global__ void __launch_bounds__(32 * kWarps, 3) gate_up_staged_kernel(DeviceMatrix gate, DeviceMatrix up,
                                                                     DeviceMatrix down, DeviceMatrix s_gate,
                                                                     DeviceMatrix s_up, DeviceMatrix s_down,
                                                                     bool has_shared, const void* x, int64_t x_stride,
                                                                     int x_elem, int T, int k, int* ids,
                                                                     float* weights, float* act, int act_stride,
                                                                     int lpr, StageNorm norm, TopK pick) {
  extern __shared__ float4 smem4[];
  pdl_launch_dependents();
  const int slot = blockIdx.y;
  const bool routed = slot < T * k;
  if (!routed && !has_shared) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / lpr, sl = lane % lpr, pass = 32 / lpr;
  const int block_rows = kWarps * kStagedRows * pass, first = blockIdx.x * block_rows;
  const int base = first + warp * kStagedRows * pass, rows = routed ? gate.rows : s_gate.rows;
  ChunkMatrix<F> gm = chunk_matrix<F>(routed ? gate : s_gate), um = chunk_matrix<F>(routed ? up : s_up);
  Chunk gc[kStagedRows][kGateUpSteps], uc[kStagedRows][kGateUpSteps];
  auto load_step = [&](int c0) {
#pragma unroll
    for (int r = 0; r < kStagedRows; ++r)
#pragma unroll
      for (int u = 0; u < kGateUpSteps; ++u) {
        const int row = base + r * pass + sub, c = c0 + u * lpr;
        if (row < rows && c < gm.chunks) {
          gc[r][u] = gm.load(row, c);
          uc[r][u] = um.load(row, c);
        }
      }
  };
  if (!routed) load_step(sl);  // the shared expert's weights: loaded before waiting
  pdl_wait();
  const int token = routed ? slot / k : slot - T * k;
  const bool writer = blockIdx.x == 0 && slot == 0;
  const int expert = !routed ? -1 : pick.any() ? pick_expert(pick, k, slot, writer, ids, weights) : ids[slot];
  if (routed) {
    gm = with_data(gm, gate.entry(expert));
    um = with_data(um, up.entry(expert));
    load_step(sl);  // issued before the activations are staged
  }
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), x, x_elem, gate.cols, 1,
                                     [&](int) { return token * x_stride; }, norm);
  if (pick.sums && blockIdx.x == 0 && slot == (has_shared ? T * k : 0)) weigh_route(pick, k, st.row_scale(0), weights);
  float ga[kStagedRows] = {}, ua[kStagedRows] = {};
  for (int c0 = sl; c0 < gm.chunks; c0 += lpr * kGateUpSteps) {
    if (c0 != sl) load_step(c0);
#pragma unroll
    for (int r = 0; r < kStagedRows; ++r)
#pragma unroll
      for (int u = 0; u < kGateUpSteps; ++u)
        if (c0 + u * lpr < gm.chunks) {
          ga[r] += st.dot(gc[r][u], 0, c0 + u * lpr);
          ua[r] += st.dot(uc[r][u], 0, c0 + u * lpr);
        }
  }
  if (threadIdx.x == 0) {
    const DeviceMatrix d = routed ? down.entry(expert) : s_down;
    const int per = (d.rows + gridDim.x - 1) / gridDim.x;
    prefetch_matrix_rows(d, int64_t(blockIdx.x) * per, min(d.rows, int(blockIdx.x + 1) * per));
  }
#pragma unroll
  for (int r = 0; r < kStagedRows; ++r) {
    const int row = base + r * pass + sub;
    const float gv = group_sum(ga[r], lpr) * st.row_scale(0), uv = group_sum(ua[r], lpr) * st.row_scale(0);
    if (sl == 0 && row < rows) act[int64_t(slot) * act_stride + row] = siluf_(gv) * uv;
  }
}

// The one-token expert kernels with weights in shared memory: a block of 512 threads per
// multiprocessor, all of its rows in flight at once (bf16 experts' rows do not fit: they keep the
// register-streaming kernels, and a ring of tiles measured slower than those).
constexpr int kExpertAsyncWarps = 16;
constexpr size_t kExpertAsyncMaxSmem = 200 * 1024;

// grid (blocks per slot, slots), PDL, one token: gate+up with the weights copied into shared
// memory. Each block owns `per` rows of its slot's expert (gate and up alike) and copies them all
// at once with cp.async (the shared expert's before waiting for the router, a routed expert's
// as soon as its id is read), stages its token's activations while they land and keeps its
// lane's chunks of them in registers; a warp per row, gate and up side by side. It asks L2 for
// none of down's rows: that traffic met other blocks' expert copies in HBM (without it gate+up is
// 0.6 us a layer faster and down no slower). With pick.any() (the router wrote logits or sums
// only) a routed block first runs the softmax + top-k itself, a step sooner than the router's last
// block could hand it over through memory; block (0, 0) writes the ids and weights for the down
// kernel.
template <WFormat F, int CPL>
__global__ void __launch_bounds__(32 * kExpertAsyncWarps, 1)
    gate_up_async_kernel(DeviceMatrix gate, DeviceMatrix up, DeviceMatrix s_gate, DeviceMatrix s_up, bool has_shared,
                         const void* x, int x_elem, int k, int* ids, float* weights, float* act, int act_stride,
                         int per, StageNorm norm, TopK pick) {
  extern __shared__ float4 smem4[];
  pdl_launch_dependents();
  const int slot = blockIdx.y;
  const bool routed = slot < k;
  if (!routed && !has_shared) return;
  ChunkMatrix<F> gm = chunk_matrix<F>(routed ? gate : s_gate), um = chunk_matrix<F>(routed ? up : s_up);
  const int rows = routed ? gate.rows : s_gate.rows, r0 = blockIdx.x * per, n = min(per, rows - r0);
  if (n <= 0) return;
  const int tile_bytes = per * async_row_bytes(gm.chunks, gm.groups);
  char* smem = reinterpret_cast<char*>(smem4);
  const AsyncTile<F> gt = AsyncTile<F>::at(smem, per, gm), ut = AsyncTile<F>::at(smem + tile_bytes, per, um);
  auto issue = [&]() {
    copy_rows_async(gt, gm, r0, n);
    copy_rows_async(ut, um, r0, n);
    cp_async_commit();
  };
  if (!routed) issue();  // the shared expert's weights: in flight before waiting
  pdl_wait();
  // The token's activations are loaded before a routed expert's copies go out (behind them they
  // would wait for every byte) and land during its top-k.
  const auto x_row = [](int) { return int64_t(0); };
  const StageInputs ahead = stage_ahead<F>(x, x_elem, gate.cols, 1, x_row, norm);
  const bool writer = blockIdx.x == 0 && slot == 0;
  const int expert = !routed ? -1 : pick.any() ? pick_expert(pick, k, slot, writer, ids, weights) : ids[slot];
  if (routed) {
    gm = with_data(gm, gate.entry(expert));
    um = with_data(um, up.entry(expert));
    issue();
  }
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + 2 * tile_bytes), x, x_elem, gate.cols, 1, x_row,
                                     norm, ahead);
  if (pick.sums && blockIdx.x == 0 && slot == (has_shared ? k : 0)) weigh_route(pick, k, st.row_scale(0), weights);
  gate_up_rows_once_landed<F, CPL, kExpertAsyncWarps>(st, gt, ut, gm, um, n, act + int64_t(slot) * act_stride + r0);
}

// How gate_up_async_kernel covers `slots` slots: `per` rows a block (one wave of blocks, one per
// multiprocessor; 0 where the async form does not take this shape) in `smem` bytes.
struct GateUpSplit {
  int per = 0;
  size_t smem = 0;
};
GateUpSplit gate_up_async_split(const DeviceMatrix& gate, int slots) {
  if (lane_x_chunks(gate.format, gate.cols / chunk_weights(gate.format)) == 0) return {};
  const int align = async_row_align(gate), blocks = std::max(1, sm_count() / slots);
  const int per = div_up(div_up(gate.rows, blocks), align) * align;
  const size_t smem = 2 * size_t(per) * async_row_bytes(gate) + staged_bytes(gate.format, gate.cols, 1);
  if (smem > kExpertAsyncMaxSmem) return {};
  return {per, smem};
}

template <WFormat F, int CPL>
void launch_gate_up_async(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix* s_gate,
                          const DeviceMatrix* s_up, const void* x, int x_elem, int k, int* ids, float* weights,
                          float* act, int width, GateUpSplit split, StageNorm norm, TopK pick, cudaStream_t s) {
  const bool shared = s_gate != nullptr;
  const int slots = k + (shared ? 1 : 0), rows = std::max(gate.rows, shared ? s_gate->rows : 0);
  allow_dynamic_smem<gate_up_async_kernel<F, CPL>>(split.smem);
  launch_pdl(gate_up_async_kernel<F, CPL>, dim3(div_up(rows, split.per), slots), 32 * kExpertAsyncWarps, split.smem, s,
             gate, up, shared ? *s_gate : DeviceMatrix{}, shared ? *s_up : DeviceMatrix{}, shared, x, x_elem, k, ids,
             weights, act, width, split.per, norm, pick);
}

// Block 0 of a down launch, after its wait: zeroes the router sums gate+up picked from (null:
// none), ready for the next layer's output projection.
__device__ __forceinline__ void clear_route_sums(unsigned long long* sums, int n) {
  if (sums && blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < n; i += blockDim.x) sums[i] = 0;
}

// grid (H/8, T), PDL: the staged form of down_kernel. A warp's lanes spread over the (expert,
// chunk) pairs of one output row, kDownChunksInFlight pairs per lane at once; a block issues its
// first loads (the router's choice read) before staging its token's k (+1 shared) activation rows.
// Where out.add, the sum is the residual stream's update.
template <WFormat F>
__global__ void __launch_bounds__(32 * kWarps) down_staged_kernel(DeviceMatrix down, DeviceMatrix s_down,
                                                                  bool has_shared, int T, int k, const int* ids,
                                                                  const float* weights, const float* sgate,
                                                                  const float* act, int act_stride, GemvOut out,
                                                                  unsigned long long* clear, int clear_n) {
  extern __shared__ float4 smem4[];
  __shared__ float mix[33];  // routing weight of each staged row (the shared expert's is its gate)
  pdl_launch_dependents();
  const int t = blockIdx.y, n = k + (has_shared ? 1 : 0);
  const int lane = threadIdx.x % 32, h = blockIdx.x * kWarps + threadIdx.x / 32;
  const ChunkMatrix<F> dm = chunk_matrix<F>(down);
  const int chunks = dm.chunks;
  if (has_shared && threadIdx.x == 0)
    chunk_matrix<F>(s_down).prefetch_rows(blockIdx.x * kWarps, std::min(down.rows, int(blockIdx.x + 1) * kWarps));
  pdl_wait();
  clear_route_sums(clear, clear_n);
  if (int(threadIdx.x) < n) mix[threadIdx.x] = int(threadIdx.x) < k ? weights[t * k + threadIdx.x] : sgate[t];
  // Row j of the staged activations meets expert ids[t·k + j] (j < k) or the shared expert.
  auto matrix_of = [&](int j) { return with_data(dm, j < k ? down.entry(ids[t * k + j]) : s_down); };
  // Lane pairs p = lane + 32·i walk (row j, chunk c) in order, without division.
  int j = lane / chunks, c = lane % chunks;
  Chunk ch[kDownChunksInFlight];
  int js[kDownChunksInFlight], cs[kDownChunksInFlight];
  auto load_round = [&]() {
#pragma unroll
    for (int u = 0; u < kDownChunksInFlight; ++u) {
      js[u] = j;
      cs[u] = c;
      if (j < n && h < down.rows) ch[u] = matrix_of(j).load(h, c);
      for (c += 32; c >= chunks; c -= chunks) ++j;
    }
  };
  load_round();
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), act, 4, down.cols, n, [&](int r) {
    return int64_t(r < k ? t * k + r : T * k + t) * act_stride;
  });
  float acc = 0.0f;
  while (true) {
#pragma unroll
    for (int u = 0; u < kDownChunksInFlight; ++u)
      if (js[u] < n) acc += mix[js[u]] * st.dot(ch[u], js[u], cs[u]);
    if (j >= n) break;
    load_round();
  }
  acc = warp_sum(acc);
  if (lane == 0 && h < down.rows) write_out(out, t * out.stride + h, acc);
}

// grid (H / per), PDL, one token: down_staged_kernel with the weights copied into shared memory.
// A block owns `per` output rows of all n = k (+1) matrices the token meets: it copies the shared
// expert's rows before waiting, a routed expert's as soon as the router's choice is read (on
// Hopper by bulk copies, a thread per matrix; elsewhere by 16-byte cp.async), stages
// the n activation rows while they land and keeps its lane's (row j, chunk c) pairs of them in
// registers, PPL pairs per lane; then a warp per output row.
template <WFormat F, int PPL>
__global__ void __launch_bounds__(32 * kExpertAsyncWarps, 1)
    down_async_kernel(DeviceMatrix down, DeviceMatrix s_down, bool has_shared, int k, const int* ids,
                      const float* weights, const float* sgate, const float* act, int act_stride, GemvOut out,
                      int per, unsigned long long* clear, int clear_n) {
  extern __shared__ float4 smem4[];
  __shared__ float mix[33];  // routing weight of each staged row (the shared expert's is its gate)
  pdl_launch_dependents();
  const int n = k + (has_shared ? 1 : 0), r0 = blockIdx.x * per, rows = min(per, down.rows - r0);
  const ChunkMatrix<F> dm = chunk_matrix<F>(down);
  const int tile_bytes = per * async_row_bytes(dm.chunks, dm.groups);
  char* smem = reinterpret_cast<char*>(smem4);
  auto tile = [&](int j) { return AsyncTile<F>::at(smem + j * tile_bytes, per, dm); };
  const int t = threadIdx.x;
  const auto act_row = [&](int r) { return int64_t(r) * act_stride; };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Bulk copies: the rows of matrix j come from thread blockDim - n + j (the last warp, which has
  // the least to do next: the first stores nothing in the staging's second pass), each one
  // arrival on `landed`; the shared expert's before waiting.
  __shared__ uint64_t landed;
  const int issues = t - (int(blockDim.x) - n);  // the matrix this thread copies, if >= 0
  if (t == 0) {
    mbar_init(&landed, n);
    mbar_init_fence();
  }
  __syncthreads();
  if (has_shared && issues == k) bulk_rows(tile(k), with_data(dm, s_down), r0, rows, &landed);
  pdl_wait();
  // Both staging passes' activations (all of them: down_async_split allows at most 5 pairs a
  // lane) are loaded before the routed copies go out (+0.8% decode against loading the second
  // pass after them).
  const StageInputs ahead = stage_ahead<F>(act, 4, down.cols, n, act_row);
  const StageInputs ahead2 = stage_ahead_second<F>(act, 4, down.cols, n, act_row);
  const float mix_t = t < k ? weights[t] : t < n ? sgate[0] : 0.0f;
  clear_route_sums(clear, clear_n);  // block 0's stores, before the copies too
  if (out.add)  // the residual rows write_out adds to: in L1 by the dots' end (asked before the copies: +1.3%)
    prefetch_l1_rows(static_cast<const char*>(out.y) + int64_t(r0) * out.elem, 1, 0, rows * out.elem);
  if (issues >= 0 && issues < k) bulk_rows(tile(issues), with_data(dm, down.entry(ids[issues])), r0, rows, &landed);
#else
  if (has_shared) copy_rows_async(tile(k), with_data(dm, s_down), r0, rows);  // before waiting
  pdl_wait();
  // One round trip for what gate+up wrote: lane j of every warp holds expert j's id, thread j
  // < n its routing weight (the shared gate for j = k), and the activation rows head for L1
  // while the copies are issued.
  const int lane = t % 32, id = lane < k ? ids[lane] : 0;
  const float mix_t = t < k ? weights[t] : t < n ? sgate[0] : 0.0f;
  prefetch_l1_rows(act, n, int64_t(act_stride) * 4, down.cols * 4);
  for (int j = 0; j < k; ++j)
    copy_rows_async(tile(j), with_data(dm, down.entry(__shfl_sync(0xffffffffu, id, j))), r0, rows);
  cp_async_commit();
  clear_route_sums(clear, clear_n);
#endif
  if (t < n) mix[t] = mix_t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + n * tile_bytes), act, 4, down.cols, n, act_row,
                                     StageNorm{}, ahead, ahead2);
#else
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem + n * tile_bytes), act, 4, down.cols, n, act_row);
#endif
  const DownPairs<F, PPL> pairs = down_pairs<F, PPL>(st, dm, n, per, mix, [&](int j) { return j * tile_bytes; });
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_wait(&landed, 0);
#else
  cp_async_wait<0>();
#endif
  __syncthreads();  // every copy has landed (and any scale tail copied by plain loads)
  down_rows<F, PPL, kExpertAsyncWarps>(smem, pairs, dm, n, per, rows, out, r0);
}

// How down_async_kernel covers the output rows: `per` rows a block (one wave of blocks, one per
// multiprocessor; 0 where the async form does not take this shape) in `smem` bytes, with `ppl`
// (row, chunk) pairs a lane.
struct DownSplit {
  int per = 0, ppl = 0;
  size_t smem = 0;
};
DownSplit down_async_split(const DeviceMatrix& down, int n) {
  const int pairs = div_up(n * (down.cols / chunk_weights(down.format)), 32);
  const int ppl = pairs <= 3 ? 3 : pairs <= 5 ? 5 : 0;  // 6 and up spill 4-bit activations
  const int align = async_row_align(down);
  const int per = div_up(div_up(down.rows, sm_count()), align) * align;
  const size_t smem = size_t(n) * per * async_row_bytes(down) + staged_bytes(down.format, down.cols, n);
  if (ppl == 0 || smem > kExpertAsyncMaxSmem) return {};
  return {per, ppl, smem};
}

template <WFormat F, int PPL>
void launch_down_async(const DeviceMatrix& down, const DeviceMatrix* s_down, int k, const int* ids,
                       const float* weights, const float* sgate, const float* act, int width, const GemvOut& out,
                       DownSplit split, const TopK& pick, cudaStream_t s) {
  allow_dynamic_smem<down_async_kernel<F, PPL>>(split.smem);
  launch_pdl(down_async_kernel<F, PPL>, div_up(down.rows, split.per), 32 * kExpertAsyncWarps, split.smem, s, down,
             s_down ? *s_down : DeviceMatrix{}, s_down != nullptr, k, ids, weights, sgate, act, width, out, split.per,
             pick.sums, pick.E + 1);
}

// True when matrices a, b, c, d (null: absent) share one chunked layout: one format and, quantised,
// one group size.
bool one_layout(const DeviceMatrix& a, const DeviceMatrix* b, const DeviceMatrix* c, const DeviceMatrix* d) {
  for (const DeviceMatrix* m : {&a, b, c, d})
    if (m && (m->format != a.format || !chunked_layout(*m) || (m->format != WFormat::BF16 && m->group != a.group)))
      return false;
  return true;
}

// The staged kernels read gate and up (and the shared expert's) in one chunked layout and down
// (and the shared down) in one of its own.
bool moe_staged_fits(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                     const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k) {
  if (!one_layout(gate, &up, s_gate, s_up) || !one_layout(down, s_down, nullptr, nullptr)) return false;
  if (s_down && (s_down->cols != down.cols || s_gate->cols != gate.cols)) return false;
  if (std::max(gate.rows, s_gate ? s_gate->rows : 0) % 8) return false;  // staged act rows start 16-byte aligned
  return k + 1 <= 33 && staged_bytes(down.format, down.cols, k + 1) <= 48 * 1024 &&
         staged_bytes(gate.format, gate.cols, 1) <= 48 * 1024;
}

// The gate and up half of the staged expert decode (plus SiLU·mul into act), on gate's format F.
template <WFormat F>
void moe_gate_up_staged(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                        const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down,
                        const void* x, int64_t x_stride, int x_elem, int T, int k, int* ids, float* weights,
                        float* act, int width, StageNorm norm, TopK pick, cudaStream_t s) {
  const bool shared = s_gate != nullptr;
  const int slots = T * k + (shared ? T : 0);
  const GateUpSplit split = T == 1 ? gate_up_async_split(gate, slots) : GateUpSplit{};
  check(!pick.any() || T == 1, "CUDA MoE: the expert blocks pick the top-k of one token only");
  if (split.per > 0) {
    auto launch = [&](auto cpl) {
      launch_gate_up_async<F, decltype(cpl)::value>(gate, up, s_gate, s_up, x, x_elem, k, ids, weights, act, width,
                                                    split, norm, pick, s);
    };
    switch (lane_x_chunks(F, gate.cols / chunk_weights(F))) {
      case 1: launch(std::integral_constant<int, 1>{}); break;
      case 2: launch(std::integral_constant<int, 2>{}); break;
      case 4: launch(std::integral_constant<int, 4>{}); break;
      default:
        if constexpr (max_lane_chunks(F) >= 8) launch(std::integral_constant<int, 8>{});
    }
  } else {
    const int lpr = lanes_per_row(gate.cols / chunk_weights(F));
    const int gu_rows = kWarps * kStagedRows * (32 / lpr);
    launch_pdl(gate_up_staged_kernel<F>, dim3(div_up(width, gu_rows), slots), 32 * kWarps, staged_bytes(F, gate.cols, 1),
               s, gate, up, down, shared ? *s_gate : DeviceMatrix{}, shared ? *s_up : DeviceMatrix{},
               shared ? *s_down : DeviceMatrix{}, shared, x, x_stride, x_elem, T, k, ids, weights, act, width, lpr, norm,
               pick);
  }
  PETREL_LAUNCHED("moe gate_up");
}

// The down half: every staged row of act through its expert's down projection, weighted and
// summed, on down's format F (GGUF mixes store down with more bits than gate and up).
template <WFormat F>
void moe_down_staged(const DeviceMatrix& down, const DeviceMatrix* s_down, int T, int k, const int* ids,
                     const float* weights, const float* sgate, const float* act, int width, TopK pick,
                     const GemvOut& out, cudaStream_t s) {
  const bool shared = s_down != nullptr;
  const int n = k + (shared ? 1 : 0);
  const DownSplit down_split = T == 1 ? down_async_split(down, n) : DownSplit{};
  if (down_split.ppl == 3)
    launch_down_async<F, 3>(down, s_down, k, ids, weights, sgate, act, width, out, down_split, pick, s);
  else if (down_split.ppl == 5)
    launch_down_async<F, 5>(down, s_down, k, ids, weights, sgate, act, width, out, down_split, pick, s);
  else
    launch_pdl(down_staged_kernel<F>, dim3(div_up(down.rows, kWarps), T), 32 * kWarps, staged_bytes(F, down.cols, n), s,
               down, shared ? *s_down : DeviceMatrix{}, shared, T, k, ids, weights, sgate, act, width, out, pick.sums,
               pick.E + 1);
  PETREL_LAUNCHED("moe down");
}

// Calls fn with format f as a compile-time constant.
template <typename Fn>
void with_format(WFormat f, Fn&& fn) {
  switch (f) {
    case WFormat::Q4: return fn(std::integral_constant<WFormat, WFormat::Q4>{});
    case WFormat::Q8: return fn(std::integral_constant<WFormat, WFormat::Q8>{});
    case WFormat::F8: return fn(std::integral_constant<WFormat, WFormat::F8>{});
    case WFormat::I4: return fn(std::integral_constant<WFormat, WFormat::I4>{});
    case WFormat::BF16: return fn(std::integral_constant<WFormat, WFormat::BF16>{});
  }
}

// Exclusive prefix sum of v over the block (blockDim.x = kPlanThreads); *total gets the sum.
constexpr int kPlanThreads = kMaxExperts;
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_sums[kPlanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane], wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += n;
    }
    warp_sums[lane] = wi - w;  // exclusive, per warp
    if (lane == 31) *total = wi;
  }
  __syncthreads();
  return warp_sums[warp] + incl - v;
}

// One block: per-expert counts, segments padded to the GEMM tile (an expert per thread), then each
// assignment's row.
// With `shared_rows` (T or 0), the shared expert's rows come first: token t in row t, its tiles
// marked expert E.
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const int* ids, int T, int k, int E, int shared_rows,
                                                            int max_rows, int* counts, int* row_token, int* slot_row,
                                                            int* tile_expert) {
  __shared__ int count[kMaxExperts], cursor[kMaxExperts], used;
  pdl_enter();
  const int n = T * k, e = threadIdx.x;
  const int base = (shared_rows + kGemmTileM - 1) / kGemmTileM * kGemmTileM;  // the routed experts' first row
  if (e < E) count[e] = 0;
  for (int r = threadIdx.x; r < max_rows; r += blockDim.x) row_token[r] = r < shared_rows ? r : -1;
  for (int tile = threadIdx.x; tile < base / kGemmTileM; tile += blockDim.x) tile_expert[tile] = E;
  __syncthreads();
  for (int a = threadIdx.x; a < n; a += blockDim.x) atomicAdd(&count[ids[a]], 1);
  __syncthreads();
  const int padded = e < E ? (count[e] + kGemmTileM - 1) / kGemmTileM * kGemmTileM : 0;
  const int offset = base + block_exclusive_scan(padded, &used);
  if (e < E) {
    cursor[e] = offset;
    counts[e] = count[e];
    for (int tile = offset / kGemmTileM; tile < (offset + padded) / kGemmTileM; ++tile) tile_expert[tile] = e;
  }
  __syncthreads();
  for (int tile = (base + used) / kGemmTileM + threadIdx.x; tile < max_rows / kGemmTileM; tile += blockDim.x)
    tile_expert[tile] = -1;
  for (int a = threadIdx.x; a < n; a += blockDim.x) {
    const int p = atomicAdd(&cursor[ids[a]], 1);
    row_token[p] = a / k;
    slot_row[a] = p;
  }
}

// out's row t, or (residual set) residual's row t plus it rounded to bf16 as out would hold it.
__global__ void combine_kernel(const bf16* y, int64_t y_stride, const int* slot_row, const float* weights, int k, int H,
                               const float* sgate, const bf16* shared, int64_t shared_stride, bf16* out,
                               int64_t out_stride, float* residual, int64_t residual_stride) {
  pdl_enter();
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc += weights[t * k + j] * __bfloat162float(y[int64_t(slot_row[t * k + j]) * y_stride + h]);
    if (shared) acc += sgate[t] * __bfloat162float(shared[t * shared_stride + h]);
    if (residual) residual[t * residual_stride + h] += __bfloat162float(__float2bfloat16(acc));
    else out[t * out_stride + h] = __float2bfloat16(acc);
  }
}

}  // namespace

void moe_route(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const void* x, int64_t x_stride, int x_elem,
               int T, int E, int k, bool renorm, float* logits, int* ids, float* weights, float* sgate, int* done,
               StageNorm norm, bool logits_only, cudaStream_t s) {
  check(E <= kMaxExperts && k <= 32, "CUDA MoE: at most 1024 experts and top-32 are supported");
  const DeviceMatrix sg = shared_gate ? *shared_gate : DeviceMatrix{};
  // Below a few hundred tokens the per-row kernel is faster (the tiled one has only E/64 blocks per 64 tokens).
  const dim3 grid(div_up(E + 1, kWarps), T);
  if (T < kRouteTiledMinTokens && router_staged_fits(router) && x_stride % 8 == 0) {
    const size_t smem = staged_bytes(router.format, router.cols, 1);
    const bool sh = shared_gate != nullptr;
    const bool gate_staged = sh && gate_staged_with(router, sg);
    check(!norm.w || !sh || gate_staged, "CUDA MoE: a staged norm needs the shared gate staged with the router");
    if (router.format == WFormat::Q8)
      launch_pdl(router_staged_kernel<WFormat::Q8>, grid, 32 * kWarps, smem, s, router, sg, sh, gate_staged, x,
                 x_stride, x_elem, E, k, renorm, logits, sgate, ids, weights, done, norm, logits_only);
    else
      launch_pdl(router_staged_kernel<WFormat::BF16>, grid, 32 * kWarps, smem, s, router, sg, sh, gate_staged, x,
                 x_stride, x_elem, E, k, renorm, logits, sgate, ids, weights, done, norm, logits_only);
    PETREL_LAUNCHED("moe router + top-k");
    return;
  }
  check(!norm.w, "CUDA MoE: a staged norm needs the staged router");
  if (T < kRouteTiledMinTokens || router.cols % kRouteK != 0 || x_stride % 8 != 0) {
    router_logits_kernel<<<dim3(div_up(E + 1, kWarps), T), 32 * kWarps, 0, s>>>(
        router, sg, shared_gate != nullptr, x, x_stride, x_elem, E, k, renorm, logits, sgate, ids, weights, done);
    PETREL_LAUNCHED("moe router + top-k");
    return;
  }
  router_tiled_kernel<<<dim3(div_up(E + 1, kRouteTile), div_up(T, kRouteTile)), 256, 0, s>>>(
      router, sg, shared_gate != nullptr, x, x_stride, x_elem, T, E, logits, sgate);
  PETREL_LAUNCHED("moe router logits");
  topk_kernel<<<div_up(T, kTopkWarps), 32 * kTopkWarps, 0, s>>>(logits, T, E, k, renorm, ids, weights);
  PETREL_LAUNCHED("moe top-k");
}

bool moe_experts_pick(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                      const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k, int T) {
  return T == 1 && moe_staged_fits(gate, up, down, s_gate, s_up, s_down, k);
}

void moe_decode(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix* s_gate,
                const DeviceMatrix* s_up, const DeviceMatrix* s_down, const void* x, int64_t x_stride, int x_elem, int T,
                int k, int* ids, float* weights, const float* sgate, float* act, StageNorm norm, TopK pick,
                const GemvOut& out, cudaStream_t s) {
  const bool shared = s_gate != nullptr;
  const int width = std::max(gate.rows, shared ? s_gate->rows : 0);
  if (moe_staged_fits(gate, up, down, s_gate, s_up, s_down, k)) {
    with_format(gate.format, [&](auto f) {
      moe_gate_up_staged<decltype(f)::value>(gate, up, down, s_gate, s_up, s_down, x, x_stride, x_elem, T, k, ids,
                                             weights, act, width, norm, pick, s);
    });
    with_format(down.format, [&](auto f) {
      moe_down_staged<decltype(f)::value>(down, s_down, T, k, ids, weights, sgate, act, width, pick, out, s);
    });
    return;
  }
  check(!norm.w && !out.add && out.elem == 2 && !pick.any(),
        "CUDA MoE: a staged norm, an added output or picking the top-k needs the staged experts");
  const int slots = T * k + (shared ? T : 0);
  gate_up_kernel<<<dim3(div_up(width, kWarps), slots), 32 * kWarps, 0, s>>>(
      gate, up, shared ? *s_gate : DeviceMatrix{}, shared ? *s_up : DeviceMatrix{}, shared, x, x_stride, x_elem, T, k,
      ids, act, width);
  PETREL_LAUNCHED("moe gate_up");
  down_kernel<<<dim3(div_up(down.rows, kWarps), T), 32 * kWarps, 0, s>>>(down, shared ? *s_down : DeviceMatrix{},
                                                                          shared, T, k, ids, weights, sgate, act, width,
                                                                          static_cast<bf16*>(out.y), out.stride);
  PETREL_LAUNCHED("moe down");
}

bool moe_norm_stageable(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const DeviceMatrix& gate,
                        const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix* s_gate,
                        const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k, int T, int64_t x_stride) {
  return T <= kGemvMaxTokens && norm_stageable(router.cols, x_stride) &&
         router_staged_fits(router) && (!shared_gate || gate_staged_with(router, *shared_gate)) &&
         moe_staged_fits(gate, up, down, s_gate, s_up, s_down, k);
}

// grid (ceil(H/8 / 128), E + 1): cols[i][e] = router[e][i]·norm[i], column E from the shared gate.
__global__ void route_columns_kernel(DeviceMatrix router, DeviceMatrix shared_gate, const float* norm, bf16* cols,
                                     int ld) {
  const int e = blockIdx.y, c8 = blockIdx.x * blockDim.x + threadIdx.x;
  if (8 * c8 >= router.cols) return;
  float v[8];
  load8(e < router.rows ? router : shared_gate, e < router.rows ? e : 0, c8, v);
#pragma unroll
  for (int i = 0; i < 8; ++i) cols[int64_t(8 * c8 + i) * ld + e] = __float2bfloat16(v[i] * norm[8 * c8 + i]);
}

void route_columns(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const float* norm, bf16* cols, int ld,
                   cudaStream_t s) {
  check(router.cols % 8 == 0 && router.rows + 1 <= ld, "CUDA route_columns: router rows do not fit the columns");
  PETREL_CUDA(cudaMemsetAsync(cols, 0, size_t(router.cols) * ld * sizeof(bf16), s));
  const int rows = router.rows + (shared_gate ? 1 : 0);
  route_columns_kernel<<<dim3(div_up(router.cols / 8, 128), rows), 128, 0, s>>>(
      router, shared_gate ? *shared_gate : DeviceMatrix{}, norm, cols, ld);
  PETREL_LAUNCHED("route_columns");
}

void moe_plan(const int* ids, int T, int k, int E, bool shared, int max_rows, int* counts, int* row_token,
              int* slot_row, int* tile_expert, cudaStream_t s) {
  check(moe_tiles(T, k, E, shared) * kGemmTileM <= max_rows,
        "CUDA moe_plan: " + std::to_string(max_rows) + " rows cannot hold the tiles of " + std::to_string(T) + " tokens");
  launch_pdl(plan_kernel, dim3(1), dim3(kPlanThreads), 0, s, ids, T, k, E, shared ? T : 0, max_rows, counts, row_token,
             slot_row, tile_expert);
  PETREL_LAUNCHED("moe_plan");
}

void moe_combine(const bf16* y, int64_t y_stride, const int* slot_row, const float* weights, int T, int k, int H,
                 const float* sgate, const bf16* shared, int64_t shared_stride, bf16* out, int64_t out_stride,
                 float* residual, int64_t residual_stride, cudaStream_t s) {
  launch_pdl(combine_kernel, dim3(T), dim3(256), 0, s, y, y_stride, slot_row, weights, k, H, sgate, shared, shared_stride,
             out, out_stride, residual, residual_stride);
  PETREL_LAUNCHED("moe_combine");
}

}  // namespace petrel::cuda
