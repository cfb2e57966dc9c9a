// Gated DeltaNet on the GPU: causal conv + SiLU, q/k L2 norm and gates, the delta rule (recurrent
// for decode, chunked WY form for prefill; fp32 state), and the gated RMSNorm. The math is the CPU
// reference's (backend/cpu/deltanet.cpp, model-spec.md §2.5 and §3).
#include "backend/cuda/deltanet_step.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

namespace petrel::cuda {
namespace {

constexpr int kChunk = 64;  // tokens per WY chunk

constexpr int kConvSpan = 64;  // tokens per thread of the prefill conv

// grid (ceil(C/256), ceil(T/kConvSpan)): one thread runs one channel over kConvSpan tokens, its
// window primed from the inputs before the span (or the conv state, before the first token).
template <int K>
__global__ void conv_kernel(const bf16* x, int64_t x_stride, int T, int C, const float* w, const float* conv_state,
                            float* u) {
  constexpr int hist = K - 1;
  const int c = blockIdx.x * blockDim.x + threadIdx.x, t0 = blockIdx.y * kConvSpan;
  if (c >= C) return;
  float wk[K], window[K];
#pragma unroll
  for (int j = 0; j < K; ++j) wk[j] = w[int64_t(c) * K + j];
#pragma unroll
  for (int j = 0; j < hist; ++j) {
    const int t = t0 - hist + j;
    window[j] = t >= 0 ? __bfloat162float(x[t * x_stride + c]) : conv_state[int64_t(hist + t) * C + c];
  }
  const int end = min(T, t0 + kConvSpan);
  for (int t = t0; t < end; ++t) {
    window[hist] = __bfloat162float(x[t * x_stride + c]);
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) acc += wk[j] * window[j];
    u[int64_t(t) * C + c] = siluf_(acc);
#pragma unroll
    for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
  }
}

// After the conv: the state keeps the last K-1 inputs of (old state ++ x). Row j reads row T + j
// (> j) of the old state at most, so one thread per channel can update it in place, lowest row first.
__global__ void conv_state_kernel(const bf16* x, int64_t x_stride, int T, int C, int hist, float* conv_state) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int j = 0; j < hist; ++j) {
    const int t = T - hist + j;
    conv_state[int64_t(j) * C + c] =
        t >= 0 ? __bfloat162float(x[t * x_stride + c]) : conv_state[int64_t(hist + t) * C + c];
  }
}

// grid (T), one warp per q or k head, then v copy and gates.
__global__ void prepare_kernel(DeltaNetShape d, const float* u, const float* b, int64_t b_stride, const float* a,
                               int64_t a_stride, const float* A_log, const float* dt_bias, float* q, float* k, float* v,
                               float* beta, float* g) {
  const int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int key_dim = d.Hk * d.dk, value_dim = d.Hv * d.dv, C = 2 * key_dim + value_dim;
  const float* ut = u + int64_t(t) * C;
  const float q_scale = rsqrtf(float(d.dk));
  for (int h = warp; h < 2 * d.Hk; h += warps) {
    const float* src = ut + int64_t(h) * d.dk;  // q heads then k heads
    float ss = 0.0f;
    for (int i = lane; i < d.dk; i += 32) ss += src[i] * src[i];
    const bool is_q = h < d.Hk;
    const float inv = rsqrtf(warp_sum(ss) + 1e-6f) * (is_q ? q_scale : 1.0f);
    float* dst = (is_q ? q : k) + (int64_t(t) * d.Hk + (is_q ? h : h - d.Hk)) * d.dk;
    for (int i = lane; i < d.dk; i += 32) dst[i] = src[i] * inv;
  }
  for (int i = threadIdx.x; i < value_dim; i += blockDim.x) v[int64_t(t) * value_dim + i] = ut[2 * key_dim + i];
  for (int j = threadIdx.x; j < d.Hv; j += blockDim.x) {
    const float bv = b[t * b_stride + j], av = a[t * a_stride + j] + dt_bias[j];
    const float softplus = av > 20.0f ? av : log1pf(expf(av));
    beta[int64_t(t) * d.Hv + j] = 1.0f / (1.0f + expf(-bv));
    g[int64_t(t) * d.Hv + j] = -expf(A_log[j]) * softplus;
  }
}

// grid (Hv, ceil(dv/128)), one thread per value column, the T tokens in turn: the recurrent delta
// rule with the state column held in registers for the whole call (its loads are independent: one
// round trip instead of dk dependent ones per token). For one token of a shape the fused decode step
// does not take (deltanet_decode).
template <int DK>
__global__ void __launch_bounds__(128, 1) recurrent_kernel(DeltaNetShape d, int T, const float* q, const float* k,
                                                            const float* v, const float* beta, const float* g,
                                                            float* state, float* out) {
  __shared__ float ks[DK], qs[DK];
  const int j = blockIdx.x, e = blockIdx.y * blockDim.x + threadIdx.x, kh = j / (d.Hv / d.Hk);
  const bool active = e < d.dv;
  float* S = state + int64_t(j) * DK * d.dv;
  float col[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) col[i] = active ? S[int64_t(i) * d.dv + e] : 0.0f;
  for (int t = 0; t < T; ++t) {
    __syncthreads();
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
      ks[i] = k[(int64_t(t) * d.Hk + kh) * DK + i];
      qs[i] = q[(int64_t(t) * d.Hk + kh) * DK + i];
    }
    __syncthreads();
    if (!active) continue;
    const float decay = expf(g[int64_t(t) * d.Hv + j]), b = beta[int64_t(t) * d.Hv + j];
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      col[i] *= decay;
      m += col[i] * ks[i];
    }
    const float delta = b * (v[(int64_t(t) * d.Hv + j) * d.dv + e] - m);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      col[i] += ks[i] * delta;
      o += col[i] * qs[i];
    }
    out[(int64_t(t) * d.Hv + j) * d.dv + e] = o;
  }
  if (active) {
#pragma unroll
    for (int i = 0; i < DK; ++i) S[int64_t(i) * d.dv + e] = col[i];
  }
}

// The chunked delta rule, per chunk of kChunk tokens and value head, with γ the within-chunk
// cumulative log-decay (γ_t = Σ_{u<=t} g_u):
//   A = strict_tril(diag(β) K Kᵀ ⊙ e^{γ_t-γ_u}),  QK = tril(Q Kᵀ ⊙ e^{γ_t-γ_u}),
//   W = (I+A)⁻¹ diag(β e^γ) K,  U = (I+A)⁻¹ diag(β) V        (chunk_prepare_kernel, chunks in parallel)
// then chunk after chunk over the state S [dk, dv] (chunk_state_kernel, one block per column block):
//   Δ = U − W S,  O = diag(e^γ) Q S + QK Δ,  S ← e^{γ_L} S + (diag(e^{γ_L−γ}) K)ᵀ Δ.
// Scratch per (chunk, value head): W [kChunk, dk], U [kChunk, dv], QK [kChunk, kChunk] and the
// decays [2, kChunk]: e^{γ_t} (for Q), then e^{γ_L−γ_u} (for K; zero past the chunk's end).
struct ChunkScratch {
  float *w, *u, *qk, *decay;
  __host__ __device__ ChunkScratch(float* p, const DeltaNetShape& d, int chunks) {
    const int64_t n = int64_t(chunks) * d.Hv * kChunk;
    w = p;
    u = w + n * d.dk;
    qk = u + n * d.dv;
    decay = qk + n * kChunk;
  }
  static int64_t floats(const DeltaNetShape& d, int chunks) {
    return int64_t(chunks) * d.Hv * kChunk * (d.dk + d.dv + kChunk + 2);
  }
};

template <int DK>
struct PrepareSmem {
  float K[kChunk][DK + 1], Q[kChunk][DK + 1];  // odd row stride: column reads hit distinct banks
  float A[kChunk][kChunk + 4];                 // rows read as float4
  float gamma[kChunk], beta[kChunk], beta_decay[kChunk];
};

constexpr int kPrepareThreads = 256;
constexpr int kPrepareBatch = 16;  // K and Q elements a thread loads at once: one round trip per batch

// grid (chunks, Hv), kPrepareThreads threads.
template <int DK>
__global__ void __launch_bounds__(kPrepareThreads) chunk_prepare_kernel(DeltaNetShape d, int T, const float* q,
                                                                        const float* k, const float* v,
                                                                        const float* beta, const float* g,
                                                                        float* scratch) {
  extern __shared__ float4 smem4[];
  auto& sm = *reinterpret_cast<PrepareSmem<DK>*>(smem4);
  const ChunkScratch sc(scratch, d, gridDim.x);
  const int c = blockIdx.x, j = blockIdx.y, c0 = c * kChunk, L = min(kChunk, T - c0);
  const int kh = j / (d.Hv / d.Hk), tid = threadIdx.x;
  // The first warp's γ and β inputs go out first, then K and Q in batches of loads issued together
  // (a loop of single loads and stores would wait a round trip per element: 32 a block).
  const int t2 = 2 * tid;
  const bool scans = tid < 32;
  const float g0 = scans && t2 < L ? g[int64_t(c0 + t2) * d.Hv + j] : 0.0f;
  const float g1 = scans && t2 + 1 < L ? g[int64_t(c0 + t2 + 1) * d.Hv + j] : 0.0f;
  const float b0 = scans && t2 < L ? beta[int64_t(c0 + t2) * d.Hv + j] : 0.0f;
  const float b1 = scans && t2 + 1 < L ? beta[int64_t(c0 + t2 + 1) * d.Hv + j] : 0.0f;
  constexpr int kPer = kChunk * DK / kPrepareThreads, kBatch = kPer < kPrepareBatch ? kPer : kPrepareBatch;
  static_assert(kPer % kBatch == 0, "chunk_prepare: whole batches of K and Q elements a thread");
#pragma unroll 1
  for (int first = 0; first < kPer; first += kBatch) {
    float kv[kBatch], qv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int x = tid + (first + u) * kPrepareThreads, t = x / DK, i = x % DK;
      const int64_t src = (int64_t(c0 + t) * d.Hk + kh) * DK + i;
      kv[u] = t < L ? k[src] : 0.0f;
      qv[u] = t < L ? q[src] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int x = tid + (first + u) * kPrepareThreads, t = x / DK, i = x % DK;
      sm.K[t][i] = kv[u];
      sm.Q[t][i] = qv[u];
    }
  }
  const int64_t head = int64_t(c) * d.Hv + j;  // this block's (chunk, value head) slot in the scratch
  if (scans) {  // γ as an inclusive scan, two tokens per lane; padding tokens decay by nothing
    const int t = t2;
    float sum = g0 + g1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, sum, o);
      if (tid >= o) sum += n;
    }
    sm.gamma[t] = sum - g1;
    sm.gamma[t + 1] = sum;
    sm.beta[t] = b0;
    sm.beta[t + 1] = b1;
    sm.beta_decay[t] = b0 * expf(sum - g1);
    sm.beta_decay[t + 1] = b1 * expf(sum);
  }
  __syncthreads();
  if (tid < kChunk) {
    float* decay = sc.decay + head * 2 * kChunk;
    decay[tid] = expf(sm.gamma[tid]);
    decay[kChunk + tid] = tid < L ? expf(sm.gamma[L - 1] - sm.gamma[tid]) : 0.0f;
  }

  // K Kᵀ and Q Kᵀ: thread (tx, ty) owns rows ty*4 + r and columns tx + 16c.
  const int tx = tid % 16, ty = tid / 16;
  float kk[4][4] = {}, qk[4][4] = {};
  for (int i = 0; i < DK; ++i) {
    float ku[4], kt[4], qt[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      ku[r] = sm.K[tx + 16 * r][i];
      kt[r] = sm.K[ty * 4 + r][i];
      qt[r] = sm.Q[ty * 4 + r][i];
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        kk[r][cc] += kt[r] * ku[cc];
        qk[r][cc] += qt[r] * ku[cc];
      }
  }
  float* QKg = sc.qk + head * kChunk * kChunk;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      const int t = ty * 4 + r, u = tx + 16 * cc;
      const float decay = u <= t ? expf(sm.gamma[t] - sm.gamma[u]) : 0.0f;
      sm.A[t][u] = u < t ? sm.beta[t] * kk[r][cc] * decay : 0.0f;
      QKg[t * kChunk + u] = qk[r][cc] * decay;
    }
  __syncthreads();

  // Forward substitution, one column of [W | U] per thread: no synchronisation between rows.
  float* Wg = sc.w + head * kChunk * DK;
  float* Ug = sc.u + head * kChunk * d.dv;
  for (int col = tid; col < DK + d.dv; col += blockDim.x) {
    const bool is_w = col < DK;
    float x[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      float r = is_w ? sm.beta_decay[t] * sm.K[t][col]
                     : (t < L ? sm.beta[t] * v[(int64_t(c0 + t) * d.Hv + j) * d.dv + col - DK] : 0.0f);
#pragma unroll
      for (int u = 0; u + 4 <= t; u += 4) {
        const float4 a = *reinterpret_cast<const float4*>(&sm.A[t][u]);
        r -= a.x * x[u] + a.y * x[u + 1] + a.z * x[u + 2] + a.w * x[u + 3];
      }
#pragma unroll
      for (int u = t & ~3; u < t; ++u) r -= sm.A[t][u] * x[u];
      x[t] = r;
    }
    if (is_w) {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) Wg[t * DK + col] = x[t];
    } else {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) Ug[t * d.dv + col - DK] = x[t];
    }
  }
}

constexpr int kStateCols = 32;     // value columns per block of the state kernel: one per lane
constexpr int kStateWarps = 16;    // warp w owns chunk rows w, w + 16, ... and a run of state rows

// K, QK, U and the decays are read until a chunk's end, so they have two buffers (chunk c's in
// c % 2): the next chunk's land while this one runs. W and Q, read in its first half, have one.
template <int DK>
struct StateSmem {
  float S[DK][kStateCols];
  float W[kChunk][DK + 4], Q[kChunk][DK + 4];  // rows of 16-byte copies, read as float4
  float K[2][kChunk][DK + 4];
  float QK[2][kChunk][kChunk + 4];
  float D[2][kChunk][kStateCols];  // U, then Δ
  float decay[2][2][kChunk];
};

// Whole block: starts copying `rows` rows of `width` floats (a multiple of 4, 16-byte aligned) from
// src (rows `stride` floats apart) to dst (rows `pitch` floats apart), zeros for rows >= valid.
__device__ __forceinline__ void copy_tile_async(float* dst, int pitch, const float* src, int64_t stride, int rows,
                                                int width, int valid) {
  const int per_row = width / 4;
  for (int x = threadIdx.x; x < rows * per_row; x += blockDim.x) {
    const int t = x / per_row, i = 4 * (x % per_row);
    cp_async16(smem_addr(dst + t * pitch + i), src + (t < valid ? t : 0) * stride + i, t < valid);
  }
}

// grid (Hv, ceil(dv/32)), 512 threads: lane = value column, warp w owns chunk rows w, w+16, ...
// The chunks run in order; their tiles are copied by cp.async, all at once (loads looping through
// registers took a round trip each, ~20 a chunk) and ahead: K, QK, U and the decays of the next
// chunk while this one runs, W and Q once its first half has read them.
template <int DK>
__global__ void __launch_bounds__(32 * kStateWarps) chunk_state_kernel(DeltaNetShape d, int T, const float* q, const float* k,
                                                          const float* scratch, float* state, float* out) {
  extern __shared__ float4 smem4[];
  auto& sm = *reinterpret_cast<StateSmem<DK>*>(smem4);
  constexpr int kRows = kChunk / kStateWarps, kStateRows = DK / kStateWarps;
  const int chunks = (T + kChunk - 1) / kChunk;
  const ChunkScratch sc(const_cast<float*>(scratch), d, chunks);
  const int j = blockIdx.x, col0 = blockIdx.y * kStateCols, kh = j / (d.Hv / d.Hk);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const bool col_ok = col0 + lane < d.dv;
  const int64_t qk_stride = int64_t(d.Hk) * DK;  // floats between two tokens' q (or k) rows
  float* Sg = state + int64_t(j) * DK * d.dv;
#pragma unroll
  for (int r = 0; r < kStateRows; ++r) {
    const int i = warp + kStateWarps * r;
    sm.S[i][lane] = col_ok ? Sg[int64_t(i) * d.dv + col0 + lane] : 0.0f;
  }
  auto copy_w_q = [&](int c) {
    const int c0 = c * kChunk;
    copy_tile_async(&sm.W[0][0], DK + 4, sc.w + (int64_t(c) * d.Hv + j) * kChunk * DK, DK, kChunk, DK, kChunk);
    copy_tile_async(&sm.Q[0][0], DK + 4, q + int64_t(c0) * qk_stride + kh * DK, qk_stride, kChunk, DK,
                    min(kChunk, T - c0));
    cp_async_commit();
  };
  const bool whole_cols = col0 + kStateCols <= d.dv;
  // Chunk c's K, QK, U (where the block's columns are whole) and decays into buffer c % 2; one copy
  // group, empty past the last chunk, so that the wait counts stay fixed.
  auto copy_rest = [&](int c) {
    if (c < chunks) {
      const int c0 = c * kChunk, b = c % 2;
      const int64_t head = int64_t(c) * d.Hv + j;
      copy_tile_async(&sm.decay[b][0][0], 2 * kChunk, sc.decay + head * 2 * kChunk, 0, 1, 2 * kChunk, 1);
      copy_tile_async(&sm.QK[b][0][0], kChunk + 4, sc.qk + head * kChunk * kChunk, kChunk, kChunk, kChunk, kChunk);
      copy_tile_async(&sm.K[b][0][0], DK + 4, k + int64_t(c0) * qk_stride + kh * DK, qk_stride, kChunk, DK,
                      min(kChunk, T - c0));
      if (whole_cols)
        copy_tile_async(&sm.D[b][0][0], kStateCols, sc.u + head * kChunk * d.dv + col0, d.dv, kChunk, kStateCols,
                        kChunk);
    }
    cp_async_commit();
  };
  copy_rest(0);
  copy_w_q(0);
  for (int c = 0; c < chunks; ++c) {
    const int c0 = c * kChunk, L = min(kChunk, T - c0), b = c % 2;
    const int64_t head = int64_t(c) * d.Hv + j;
    __syncthreads();  // the previous chunk is done with buffer (c + 1) % 2
    copy_rest(c + 1);
    if (!whole_cols)  // a partial column block (dv not a multiple of 32): U by plain loads
      for (int t = warp; t < kChunk; t += kStateWarps)
        sm.D[b][t][lane] = col_ok ? sc.u[(head * kChunk + t) * d.dv + col0 + lane] : 0.0f;
    cp_async_wait<1>();  // all but the next chunk's copies
    __syncthreads();
    auto& K = sm.K[b];
    auto& QK = sm.QK[b];
    auto& D = sm.D[b];
    auto& decay = sm.decay[b];

    // Δ = U − W S, and the part of O that comes from the state before this chunk.
    float dacc[kRows] = {}, oacc[kRows] = {};
    for (int i = 0; i < DK; i += 4) {
      const float s0 = sm.S[i][lane], s1 = sm.S[i + 1][lane], s2 = sm.S[i + 2][lane], s3 = sm.S[i + 3][lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 w = *reinterpret_cast<const float4*>(&sm.W[warp + kStateWarps * r][i]);
        const float4 qv = *reinterpret_cast<const float4*>(&sm.Q[warp + kStateWarps * r][i]);
        dacc[r] += w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
        oacc[r] += qv.x * s0 + qv.y * s1 + qv.z * s2 + qv.w * s3;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int t = warp + kStateWarps * r;
      D[t][lane] -= dacc[r];
      oacc[r] *= decay[0][t];
    }
    __syncthreads();  // W and Q are read: the next chunk's land in them during the rest
    if (c + 1 < chunks) copy_w_q(c + 1);

    // O += QK Δ (QK is zero above the diagonal), then S ← e^{γ_L} S + Kᵀ Δ.
    for (int u = 0; u < kChunk; u += 4) {
      const float d0 = D[u][lane], d1 = D[u + 1][lane], d2 = D[u + 2][lane], d3 = D[u + 3][lane];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float4 a = *reinterpret_cast<const float4*>(&QK[warp + kStateWarps * r][u]);
        oacc[r] += a.x * d0 + a.y * d1 + a.z * d2 + a.w * d3;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int t = warp + kStateWarps * r;
      if (t < L && col_ok) out[(int64_t(c0 + t) * d.Hv + j) * d.dv + col0 + lane] = oacc[r];
    }
    // Δ's rows scaled by e^{γ_L−γ_u} once (this thread's column only), instead of every K entry;
    // the warp's state rows i0.. are contiguous, so each token's K entries for them are float4s.
    const float chunk_decay = decay[0][L - 1];
    const int i0 = warp * kStateRows;
    float sacc[kStateRows];
#pragma unroll
    for (int r = 0; r < kStateRows; ++r) sacc[r] = sm.S[i0 + r][lane] * chunk_decay;
    for (int u = 0; u < kChunk; ++u) {
      const float du = D[u][lane] * decay[1][u];
      const float* kr = &K[u][i0];
      if constexpr (kStateRows % 4 == 0) {
#pragma unroll
        for (int r = 0; r < kStateRows; r += 4) {
          const float4 kv = *reinterpret_cast<const float4*>(kr + r);
          sacc[r] += kv.x * du;
          sacc[r + 1] += kv.y * du;
          sacc[r + 2] += kv.z * du;
          sacc[r + 3] += kv.w * du;
        }
      } else {
#pragma unroll
        for (int r = 0; r < kStateRows; ++r) sacc[r] += kr[r] * du;
      }
    }
#pragma unroll
    for (int r = 0; r < kStateRows; ++r) sm.S[i0 + r][lane] = sacc[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kStateRows; ++r) {
    const int i = warp + kStateWarps * r;
    if (col_ok) Sg[int64_t(i) * d.dv + col0 + lane] = sm.S[i][lane];
  }
}

template <int DK>
void launch_chunk_prepare(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* scratch, cudaStream_t s) {
  allow_dynamic_smem<chunk_prepare_kernel<DK>>(sizeof(PrepareSmem<DK>));
  chunk_prepare_kernel<DK><<<dim3(div_up(T, kChunk), d.Hv), kPrepareThreads, sizeof(PrepareSmem<DK>), s>>>(
      d, T, q, k, v, beta, g, scratch);
  PETREL_LAUNCHED("delta_rule_chunk_prepare");
}

template <int DK>
void launch_chunk_state(const DeltaNetShape& d, int T, const float* q, const float* k, const float* scratch,
                        float* state, float* out, cudaStream_t s) {
  if (d.dv % 4 != 0 || reinterpret_cast<uintptr_t>(q) % 16 || reinterpret_cast<uintptr_t>(k) % 16 ||
      reinterpret_cast<uintptr_t>(scratch) % 16)  // the message built only on failure: this runs every layer
    throw Error("CUDA DeltaNet prefill: value head dim " + std::to_string(d.dv) +
                " must be a multiple of 4 and q, k, scratch 16-byte aligned (the chunk tiles are 16-byte copies)");
  allow_dynamic_smem<chunk_state_kernel<DK>>(sizeof(StateSmem<DK>));
  chunk_state_kernel<DK><<<dim3(d.Hv, div_up(d.dv, kStateCols)), 32 * kStateWarps, sizeof(StateSmem<DK>), s>>>(
      d, T, q, k, scratch, state, out);
  PETREL_LAUNCHED("delta_rule_chunk_state");
}

void check_key_dim(const DeltaNetShape& d) {
  check(d.dk == 16 || d.dk == 32 || d.dk == 64 || d.dk == 128,
        "CUDA DeltaNet: key head dim " + std::to_string(d.dk) + " is not supported (16, 32, 64 or 128)");
}

// grid (T, Hv), one warp per value head.
__global__ void gated_norm_kernel(DeltaNetShape d, const float* o, const float* w, const bf16* z, int64_t z_stride,
                                  float eps, bf16* out, int64_t out_stride) {
  const int t = blockIdx.x, j = blockIdx.y, lane = threadIdx.x;
  const float* oh = o + (int64_t(t) * d.Hv + j) * d.dv;
  float ss = 0.0f;
  for (int e = lane; e < d.dv; e += 32) ss += oh[e] * oh[e];
  const float inv = rsqrtf(warp_sum(ss) / float(d.dv) + eps);
  for (int e = lane; e < d.dv; e += 32) {
    const int64_t col = int64_t(j) * d.dv + e;
    out[t * out_stride + col] = __float2bfloat16(oh[e] * inv * w[e] * siluf_(__bfloat162float(z[t * z_stride + col])));
  }
}

// kMinBlocks 2 (batched steps) caps registers at 64, a few spilling to L1, so that two blocks share
// a multiprocessor: the rows·heads blocks then overlap one block's state loads with another's
// stores, where one block at a time left each multiprocessor waiting on its own round trips.
// 0 (one row: a block per head, fewer than the multiprocessors) leaves registers unbounded.
template <int DK, int kMinBlocks>
__global__ void __launch_bounds__(512, kMinBlocks)
    deltanet_decode_kernel(DeltaNetShape d, DeltaNetRows rows, const bf16* x, const float* conv_w, float* conv_state,
                           const float* b, const float* a, const float* A_log, const float* dt_bias, float* state,
                           const float* norm_w, const bf16* z, float eps, bf16* out, int* readers) {
  deltanet_head_step<DK>(d, blockIdx.x, blockIdx.y, rows, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z,
                         eps, out, readers, [] { pdl_wait(); });
}

template <int DK>
void launch_deltanet_decode(const DeltaNetShape& d, int threads, const DeltaNetRows& rows, const bf16* x,
                            const float* conv_w, float* conv_state, const float* b, const float* a, const float* A_log,
                            const float* dt_bias, float* state, const float* norm_w, const bf16* z, float eps,
                            bf16* out, int* readers, cudaStream_t s) {
  const auto kernel = rows.B > 1 ? deltanet_decode_kernel<DK, 2> : deltanet_decode_kernel<DK, 0>;
  launch_pdl(kernel, dim3(deltanet_decode_blocks(d), rows.B), threads, 0, s, d, rows, x, conv_w, conv_state, b, a,
             A_log, dt_bias, state, norm_w, z, eps, out, readers);
}

// The shape checks and head-dim dispatch of deltanet_decode and deltanet_decode_rows.
bool decode_step(const DeltaNetShape& d, const DeltaNetRows& rows, const bf16* x, const float* conv_w,
                 float* conv_state, const float* b, const float* a, const float* A_log, const float* dt_bias,
                 float* state, const float* norm_w, const bf16* z, float eps, bf16* out, int* readers, cudaStream_t s) {
  const int ratio = d.Hk > 0 ? d.Hv / d.Hk : 0, threads = decode_threads(d);
  if (ratio < 1 || d.Hv != ratio * d.Hk || threads > 512 || d.K < 1 || d.K > kDecodeMaxTaps) return false;
  switch (d.dk) {
    case 16: launch_deltanet_decode<16>(d, threads, rows, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, readers, s); break;
    case 32: launch_deltanet_decode<32>(d, threads, rows, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, readers, s); break;
    case 64: launch_deltanet_decode<64>(d, threads, rows, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, readers, s); break;
    case 128: launch_deltanet_decode<128>(d, threads, rows, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, readers, s); break;
    default: return false;
  }
  PETREL_LAUNCHED("deltanet_decode");
  return true;
}

}  // namespace

void causal_conv_silu(const bf16* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state, float* u,
                      cudaStream_t s) {
  const dim3 grid(div_up(C, 256), div_up(T, kConvSpan));
  switch (K) {
    case 1: conv_kernel<1><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 2: conv_kernel<2><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 3: conv_kernel<3><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 4: conv_kernel<4><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 5: conv_kernel<5><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 6: conv_kernel<6><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 7: conv_kernel<7><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    case 8: conv_kernel<8><<<grid, 256, 0, s>>>(x, x_stride, T, C, w, conv_state, u); break;
    default: throw Error("CUDA conv: kernel size " + std::to_string(K) + " is not supported (1..8)");
  }
  PETREL_LAUNCHED("causal_conv_silu");
  if (K > 1) {
    conv_state_kernel<<<div_up(C, 256), 256, 0, s>>>(x, x_stride, T, C, K - 1, conv_state);
    PETREL_LAUNCHED("conv_state");
  }
}

void deltanet_prepare(const DeltaNetShape& d, const float* u, int T, const float* b, int64_t b_stride, const float* a,
                      int64_t a_stride, const float* A_log, const float* dt_bias, float* q, float* k, float* v,
                      float* beta, float* g, cudaStream_t s) {
  prepare_kernel<<<T, 256, 0, s>>>(d, u, b, b_stride, a, a_stride, A_log, dt_bias, q, k, v, beta, g);
  PETREL_LAUNCHED("deltanet_prepare");
}

void delta_rule_recurrent(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* state, float* out, cudaStream_t s) {
  check_key_dim(d);
  const dim3 grid(d.Hv, div_up(d.dv, 128));
  switch (d.dk) {
    case 16: recurrent_kernel<16><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    case 32: recurrent_kernel<32><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    case 64: recurrent_kernel<64><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    default: recurrent_kernel<128><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
  }
  PETREL_LAUNCHED("delta_rule_recurrent");
}

int64_t delta_rule_chunked_scratch(const DeltaNetShape& d, int T) { return ChunkScratch::floats(d, div_up(T, kChunk)); }

void delta_rule_chunk_prepare(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                              const float* beta, const float* g, float* scratch, cudaStream_t s) {
  check_key_dim(d);
  switch (d.dk) {
    case 16: return launch_chunk_prepare<16>(d, T, q, k, v, beta, g, scratch, s);
    case 32: return launch_chunk_prepare<32>(d, T, q, k, v, beta, g, scratch, s);
    case 64: return launch_chunk_prepare<64>(d, T, q, k, v, beta, g, scratch, s);
    default: return launch_chunk_prepare<128>(d, T, q, k, v, beta, g, scratch, s);
  }
}

void delta_rule_chunk_state(const DeltaNetShape& d, int T, const float* q, const float* k, const float* scratch,
                            float* state, float* out, cudaStream_t s) {
  check_key_dim(d);
  switch (d.dk) {
    case 16: return launch_chunk_state<16>(d, T, q, k, scratch, state, out, s);
    case 32: return launch_chunk_state<32>(d, T, q, k, scratch, state, out, s);
    case 64: return launch_chunk_state<64>(d, T, q, k, scratch, state, out, s);
    default: return launch_chunk_state<128>(d, T, q, k, scratch, state, out, s);
  }
}

int deltanet_decode_blocks(const DeltaNetShape& d) { return d.Hv; }

bool deltanet_decode(const DeltaNetShape& d, const bf16* x, const float* conv_w, float* conv_state, const float* b,
                     const float* a, const float* A_log, const float* dt_bias, float* state, const float* norm_w,
                     const bf16* z, float eps, bf16* out, int* readers, bool states_settled, cudaStream_t s) {
  DeltaNetRows one;
  one.states_settled = states_settled;
  return decode_step(d, one, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, readers, s);
}

bool deltanet_decode_rows(const DeltaNetShape& d, const DeltaNetRows& rows, const bf16* x, const float* conv_w,
                          const float* b, const float* a, const float* A_log, const float* dt_bias,
                          const float* norm_w, const bf16* z, float eps, bf16* out, int* readers, cudaStream_t s) {
  check(rows.B >= 1 && rows.conv_states && rows.states, "CUDA deltanet_decode_rows: needs rows and state tables");
  return decode_step(d, rows, x, conv_w, nullptr, b, a, A_log, dt_bias, nullptr, norm_w, z, eps, out, readers, s);
}

void gated_rms_norm(const DeltaNetShape& d, const float* o, int T, const float* w, const bf16* z, int64_t z_stride,
                    float eps, bf16* out, int64_t out_stride, cudaStream_t s) {
  gated_norm_kernel<<<dim3(T, d.Hv), 32, 0, s>>>(d, o, w, z, z_stride, eps, out, out_stride);
  PETREL_LAUNCHED("gated_rms_norm");
}

}  // namespace petrel::cuda
