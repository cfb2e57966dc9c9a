// Mixture of experts on the GPU with routing decided on the device: router softmax + top-k, the
// few-token path (all selected experts in one launch for gate+up, one for down + weighting + shared
// expert), and the prefill plan (device-built per-expert row lists for the grouped GEMM) + combine.
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarps = 8;

// Row `row` of w dotted with activation row x (bf16 or fp32, `elem` bytes), by one warp.
__device__ float dot_row(const DeviceMatrix& w, int64_t row, const void* x, int elem, int64_t x_off, int lane) {
  float acc = 0.0f;
  if (q4_wide(w)) {
    for (int c32 = lane; c32 < w.cols / 32; c32 += 32) {
      uint32_t words[4];
      float sc, bi;
      load32_q4(w, row, c32, words, &sc, &bi);
      acc += dot32_q4(words, sc, bi, x, elem, x_off + int64_t(c32) * 32);
    }
    return warp_sum(acc);
  }
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

// One warp: softmax of a token's router logits (staged in p, E floats of shared memory), then k
// rounds of argmax (lowest index wins ties) -> ids/weights. Loads bypass L1: in the fused router
// the logits were just written by other blocks.
__device__ void topk_row(const float* logits, float* p, int E, int k, bool renorm, int* ids, float* weights, int lane) {
  for (int e = lane; e < E; e += 32) p[e] = __ldcg(logits + e);
  __syncwarp();
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, p[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += (p[e] = expf(p[e] - mx));
  sum = warp_sum(sum);
  __syncwarp();
  float total = 0.0f;
  for (int i = 0; i < k; ++i) {
    float best = -1.0f;
    int best_e = E;
    for (int e = lane; e < E; e += 32)
      if (p[e] > best) {
        best = p[e];
        best_e = e;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    if (lane == 0) {
      ids[i] = best_e;
      weights[i] = best / sum;
      p[best_e] = -2.0f;  // below every probability: excluded from later rounds
    }
    total += best / sum;
    __syncwarp();
  }
  if (renorm && lane < k) weights[lane] /= total;
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
  __shared__ bool last;
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
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's logits are visible before it is counted
    last = atomicAdd(done + t, 1) == int(gridDim.x) - 1;
    if (last) done[t] = 0;
  }
  __syncthreads();
  if (last && warp == 0) {
    __threadfence();
    topk_row(logits + int64_t(t) * E, probs, E, k, renorm, ids + t * k, weights + t * k, lane);
  }
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

constexpr int kStagedRows = 2;  // gate and up rows per warp in the staged expert kernel
constexpr int kDownChunksInFlight = 4;  // per lane in the staged down kernel (one output row per warp)

// grid (width/16, slots), staged form of gate_up_kernel: the block stages its token's activation
// row, each warp streams kStagedRows rows of gate and of up at once.
template <WFormat F>
__global__ void __launch_bounds__(32 * kWarps) gate_up_staged_kernel(DeviceMatrix gate, DeviceMatrix up,
                                                                     DeviceMatrix s_gate, DeviceMatrix s_up,
                                                                     bool has_shared, const void* x, int64_t x_stride,
                                                                     int x_elem, int T, int k, const int* ids,
                                                                     float* act, int act_stride, int lpr) {
  extern __shared__ float4 smem4[];
  const int slot = blockIdx.y;
  const bool routed = slot < T * k;
  if (!routed && !has_shared) return;
  const int token = routed ? slot / k : slot - T * k;
  const DeviceMatrix g = routed ? gate.entry(ids[slot]) : s_gate;
  const DeviceMatrix u = routed ? up.entry(ids[slot]) : s_up;
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), x, x_elem, g.cols, 1,
                                     [&](int) { return token * x_stride; });
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / lpr, sl = lane % lpr, pass = 32 / lpr;
  const int base = (blockIdx.x * kWarps + warp) * kStagedRows * pass;
  float ga[kStagedRows] = {}, ua[kStagedRows] = {};
  for (int c = sl; c < st.chunks; c += lpr) {
    Chunk gc[kStagedRows], uc[kStagedRows];
#pragma unroll
    for (int r = 0; r < kStagedRows; ++r) {
      const int row = base + r * pass + sub;
      if (row < g.rows) {
        gc[r] = load_chunk<F>(g, row, c);
        uc[r] = load_chunk<F>(u, row, c);
      }
    }
#pragma unroll
    for (int r = 0; r < kStagedRows; ++r) {
      ga[r] += st.dot(gc[r], 0, c);
      ua[r] += st.dot(uc[r], 0, c);
    }
  }
#pragma unroll
  for (int r = 0; r < kStagedRows; ++r) {
    const int row = base + r * pass + sub;
    const float gv = group_sum(ga[r], lpr), uv = group_sum(ua[r], lpr);
    if (sl == 0 && row < g.rows) act[int64_t(slot) * act_stride + row] = siluf_(gv) * uv;
  }
}

// grid (H/8, T), staged form of down_kernel: the block stages its token's k (+1 shared)
// activation rows; a warp's lanes spread over the (expert, chunk) pairs of one output row.
template <WFormat F>
__global__ void __launch_bounds__(32 * kWarps) down_staged_kernel(DeviceMatrix down, DeviceMatrix s_down,
                                                                  bool has_shared, int T, int k, const int* ids,
                                                                  const float* weights, const float* sgate,
                                                                  const float* act, int act_stride, bf16* out,
                                                                  int64_t out_stride) {
  extern __shared__ float4 smem4[];
  __shared__ float mix[33];  // routing weight of each staged row (the shared expert's is its gate)
  __shared__ int expert[33];
  const int t = blockIdx.y, n = k + (has_shared ? 1 : 0);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    expert[j] = j < k ? ids[t * k + j] : -1;
    mix[j] = j < k ? weights[t * k + j] : sgate[t];
  }
  const Staged<F> st = stage_rows<F>(reinterpret_cast<float*>(smem4), act, 4, down.cols, n, [&](int j) {
    return int64_t(j < k ? t * k + j : T * k + t) * act_stride;
  });
  const int lane = threadIdx.x % 32, h = blockIdx.x * kWarps + threadIdx.x / 32;
  const int pairs = n * st.chunks;
  float acc = 0.0f;
  for (int p0 = lane; p0 < pairs; p0 += 32 * kDownChunksInFlight) {
    Chunk ch[kDownChunksInFlight];
#pragma unroll
    for (int u = 0; u < kDownChunksInFlight; ++u) {
      const int p = p0 + 32 * u, j = p / st.chunks;
      if (p < pairs && h < down.rows) ch[u] = load_chunk<F>(expert[j] >= 0 ? down.entry(expert[j]) : s_down, h, p % st.chunks);
    }
#pragma unroll
    for (int u = 0; u < kDownChunksInFlight; ++u) {
      const int p = p0 + 32 * u, j = p / st.chunks;
      if (p < pairs) acc += mix[j] * st.dot(ch[u], j, p % st.chunks);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0 && h < down.rows) out[t * out_stride + h] = __float2bfloat16(acc);
}

// The staged kernels need every expert matrix (and the shared expert's) in one chunked format.
bool moe_staged_fits(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                     const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k) {
  const DeviceMatrix* all[] = {&gate, &up, &down, s_gate, s_up, s_down};
  for (const DeviceMatrix* m : all)
    if (m && (m->format != gate.format || !chunked_layout(*m))) return false;
  if (s_down && (s_down->cols != down.cols || s_gate->cols != gate.cols)) return false;
  if (std::max(gate.rows, s_gate ? s_gate->rows : 0) % 8) return false;  // staged act rows start 16-byte aligned
  return k + 1 <= 33 && staged_bytes(gate.format, down.cols, k + 1) <= 48 * 1024 &&
         staged_bytes(gate.format, gate.cols, 1) <= 48 * 1024;
}

template <WFormat F>
void moe_decode_staged(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                       const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down,
                       const void* x, int64_t x_stride, int x_elem, int T, int k, const int* ids,
                       const float* weights, const float* sgate, float* act, int width, bf16* out,
                       int64_t out_stride, cudaStream_t s) {
  const bool shared = s_gate != nullptr;
  const int slots = T * k + (shared ? T : 0);
  const int lpr = lanes_per_row(gate.cols / chunk_weights(F));
  const int gu_rows = kWarps * kStagedRows * (32 / lpr);
  gate_up_staged_kernel<F><<<dim3(div_up(width, gu_rows), slots), 32 * kWarps, staged_bytes(F, gate.cols, 1), s>>>(
      gate, up, shared ? *s_gate : DeviceMatrix{}, shared ? *s_up : DeviceMatrix{}, shared, x, x_stride, x_elem, T, k,
      ids, act, width, lpr);
  PETREL_LAUNCHED("moe gate_up");
  const int n = k + (shared ? 1 : 0);
  down_staged_kernel<F><<<dim3(div_up(down.rows, kWarps), T), 32 * kWarps,
                          staged_bytes(F, down.cols, n), s>>>(down, shared ? *s_down : DeviceMatrix{}, shared, T, k,
                                                              ids, weights, sgate, act, width, out, out_stride);
  PETREL_LAUNCHED("moe down");
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
__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const int* ids, int T, int k, int E, int max_rows,
                                                            int* counts, int* row_token, int* slot_row,
                                                            int* tile_expert) {
  __shared__ int count[kMaxExperts], cursor[kMaxExperts], used;
  const int n = T * k, e = threadIdx.x;
  if (e < E) count[e] = 0;
  for (int r = threadIdx.x; r < max_rows; r += blockDim.x) row_token[r] = -1;
  __syncthreads();
  for (int a = threadIdx.x; a < n; a += blockDim.x) atomicAdd(&count[ids[a]], 1);
  __syncthreads();
  const int padded = e < E ? (count[e] + kGemmTileM - 1) / kGemmTileM * kGemmTileM : 0;
  const int offset = block_exclusive_scan(padded, &used);
  if (e < E) {
    cursor[e] = offset;
    counts[e] = count[e];
    for (int tile = offset / kGemmTileM; tile < (offset + padded) / kGemmTileM; ++tile) tile_expert[tile] = e;
  }
  __syncthreads();
  for (int tile = used / kGemmTileM + threadIdx.x; tile < max_rows / kGemmTileM; tile += blockDim.x)
    tile_expert[tile] = -1;
  for (int a = threadIdx.x; a < n; a += blockDim.x) {
    const int p = atomicAdd(&cursor[ids[a]], 1);
    row_token[p] = a / k;
    slot_row[a] = p;
  }
}

__global__ void combine_kernel(const bf16* y, int64_t y_stride, const int* slot_row, const float* weights, int k, int H,
                               const float* sgate, const bf16* shared, int64_t shared_stride, bf16* out,
                               int64_t out_stride) {
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; ++j)
      acc += weights[t * k + j] * __bfloat162float(y[int64_t(slot_row[t * k + j]) * y_stride + h]);
    if (shared) acc += sgate[t] * __bfloat162float(shared[t * shared_stride + h]);
    out[t * out_stride + h] = __float2bfloat16(acc);
  }
}

}  // namespace

void moe_route(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const void* x, int64_t x_stride, int x_elem,
               int T, int E, int k, bool renorm, float* logits, int* ids, float* weights, float* sgate, int* done,
               cudaStream_t s) {
  check(E <= kMaxExperts && k <= 32, "CUDA MoE: at most 1024 experts and top-32 are supported");
  const DeviceMatrix sg = shared_gate ? *shared_gate : DeviceMatrix{};
  // Below a few hundred tokens the per-row kernel is faster (the tiled one has only E/64 blocks per 64 tokens).
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

void moe_decode(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix* s_gate,
                const DeviceMatrix* s_up, const DeviceMatrix* s_down, const void* x, int64_t x_stride, int x_elem, int T,
                int k,
                const int* ids, const float* weights, const float* sgate, float* act, bf16* out, int64_t out_stride,
                cudaStream_t s) {
  const bool shared = s_gate != nullptr;
  const int width = std::max(gate.rows, shared ? s_gate->rows : 0);
  if (moe_staged_fits(gate, up, down, s_gate, s_up, s_down, k)) {
    if (gate.format == WFormat::Q4)
      moe_decode_staged<WFormat::Q4>(gate, up, down, s_gate, s_up, s_down, x, x_stride, x_elem, T, k, ids, weights,
                                     sgate, act, width, out, out_stride, s);
    else if (gate.format == WFormat::Q8)
      moe_decode_staged<WFormat::Q8>(gate, up, down, s_gate, s_up, s_down, x, x_stride, x_elem, T, k, ids, weights,
                                     sgate, act, width, out, out_stride, s);
    else
      moe_decode_staged<WFormat::BF16>(gate, up, down, s_gate, s_up, s_down, x, x_stride, x_elem, T, k, ids, weights,
                                       sgate, act, width, out, out_stride, s);
    return;
  }

  const int slots = T * k + (shared ? T : 0);
  gate_up_kernel<<<dim3(div_up(width, kWarps), slots), 32 * kWarps, 0, s>>>(
      gate, up, shared ? *s_gate : DeviceMatrix{}, shared ? *s_up : DeviceMatrix{}, shared, x, x_stride, x_elem, T, k,
      ids, act, width);
  PETREL_LAUNCHED("moe gate_up");
  down_kernel<<<dim3(div_up(down.rows, kWarps), T), 32 * kWarps, 0, s>>>(
      down, shared ? *s_down : DeviceMatrix{}, shared, T, k, ids, weights, sgate, act, width, out, out_stride);
  PETREL_LAUNCHED("moe down");
}

void moe_plan(const int* ids, int T, int k, int E, int max_rows, int* counts, int* row_token, int* slot_row,
              int* tile_expert, cudaStream_t s) {
  plan_kernel<<<1, kPlanThreads, 0, s>>>(ids, T, k, E, max_rows, counts, row_token, slot_row, tile_expert);
  PETREL_LAUNCHED("moe_plan");
}

void moe_combine(const bf16* y, int64_t y_stride, const int* slot_row, const float* weights, int T, int k, int H,
                 const float* sgate, const bf16* shared, int64_t shared_stride, bf16* out, int64_t out_stride,
                 cudaStream_t s) {
  combine_kernel<<<T, 256, 0, s>>>(y, y_stride, slot_row, weights, k, H, sgate, shared, shared_stride, out, out_stride);
  PETREL_LAUNCHED("moe_combine");
}

}  // namespace petrel::cuda
