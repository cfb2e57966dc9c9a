// Gated DeltaNet on the GPU: causal conv + SiLU, q/k L2 norm and gates, the delta rule (recurrent
// for decode, chunked WY form for prefill; fp32 state), and the gated RMSNorm. The math is the CPU
// reference's (backend/cpu/deltanet.cpp, model-spec.md §2.5 and §3).
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kChunk = 64;       // tokens per WY chunk
constexpr int kColBlock = 32;    // value columns per block in the chunked kernel

__global__ void conv_kernel(const bf16* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state,
                            float* u) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float window[8];
  const int hist = K - 1;
  for (int j = 0; j < hist; ++j) window[j] = conv_state[int64_t(j) * C + c];
  for (int t = 0; t < T; ++t) {
    window[hist] = __bfloat162float(x[t * x_stride + c]);
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc += w[int64_t(c) * K + j] * window[j];
    u[int64_t(t) * C + c] = siluf_(acc);
    for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
  }
  for (int j = 0; j < hist; ++j) conv_state[int64_t(j) * C + c] = window[j];
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

// grid (Hv, ceil(dv/128)), one thread per value column; the state column streams through L1.
__global__ void recurrent_kernel(DeltaNetShape d, int T, const float* q, const float* k, const float* v,
                                 const float* beta, const float* g, float* state, float* out) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* qs = smem + d.dk;
  const int j = blockIdx.x, e = blockIdx.y * blockDim.x + threadIdx.x, kh = j / (d.Hv / d.Hk);
  float* S = state + int64_t(j) * d.dk * d.dv;
  for (int t = 0; t < T; ++t) {
    __syncthreads();
    for (int i = threadIdx.x; i < d.dk; i += blockDim.x) {
      ks[i] = k[(int64_t(t) * d.Hk + kh) * d.dk + i];
      qs[i] = q[(int64_t(t) * d.Hk + kh) * d.dk + i];
    }
    __syncthreads();
    if (e >= d.dv) continue;
    const float decay = expf(g[int64_t(t) * d.Hv + j]), b = beta[int64_t(t) * d.Hv + j];
    float m = 0.0f;
    for (int i = 0; i < d.dk; ++i) {
      const float s = S[int64_t(i) * d.dv + e] * decay;
      S[int64_t(i) * d.dv + e] = s;
      m += s * ks[i];
    }
    const float delta = b * (v[(int64_t(t) * d.Hv + j) * d.dv + e] - m);
    float o = 0.0f;
    for (int i = 0; i < d.dk; ++i) {
      const float s = S[int64_t(i) * d.dv + e] + ks[i] * delta;
      S[int64_t(i) * d.dv + e] = s;
      o += s * qs[i];
    }
    out[(int64_t(t) * d.Hv + j) * d.dv + e] = o;
  }
}

// Same function with the state column held in registers for the whole call: the loads of a
// column are independent (one round trip instead of dk dependent ones per token).
template <int DK>
__global__ void __launch_bounds__(128, 1) recurrent_reg_kernel(DeltaNetShape d, int T, const float* q, const float* k, const float* v,
                                     const float* beta, const float* g, float* state, float* out) {
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

// Shared-memory layout of the chunked kernel for one (value head, column block).
struct ChunkSmem {
  float *K, *Q, *W, *A, *QK, *U, *Dl, *S, *gamma, *beta;
  __device__ ChunkSmem(float* p, int dk) {
    K = p; p += kChunk * dk;
    Q = p; p += kChunk * dk;
    W = p; p += kChunk * dk;
    A = p; p += kChunk * kChunk;
    QK = p; p += kChunk * kChunk;
    U = p; p += kChunk * kColBlock;
    Dl = p; p += kChunk * kColBlock;
    S = p; p += dk * kColBlock;
    gamma = p; p += kChunk;
    beta = p;
  }
  static size_t bytes(int dk) {
    return sizeof(float) * (3 * kChunk * dk + 2 * kChunk * kChunk + 2 * kChunk * kColBlock + dk * kColBlock + 2 * kChunk);
  }
};

__global__ void chunked_kernel(DeltaNetShape d, int T, const float* q, const float* k, const float* v,
                               const float* beta, const float* g, float* state, float* out) {
  extern __shared__ float smem[];
  ChunkSmem s(smem, d.dk);
  const int j = blockIdx.x, col0 = blockIdx.y * kColBlock, kh = j / (d.Hv / d.Hk), dk = d.dk;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int ncols = min(kColBlock, d.dv - col0);
  float* Sg = state + int64_t(j) * dk * d.dv;
  for (int x = tid; x < dk * kColBlock; x += nt) {
    const int i = x / kColBlock, e = x % kColBlock;
    s.S[x] = e < ncols ? Sg[int64_t(i) * d.dv + col0 + e] : 0.0f;
  }
  for (int c0 = 0; c0 < T; c0 += kChunk) {
    const int L = min(kChunk, T - c0);
    __syncthreads();
    for (int x = tid; x < L * dk; x += nt) {
      const int t = x / dk, i = x % dk;
      s.K[x] = k[(int64_t(c0 + t) * d.Hk + kh) * dk + i];
      s.Q[x] = q[(int64_t(c0 + t) * d.Hk + kh) * dk + i];
    }
    for (int t = tid; t < L; t += nt) s.beta[t] = beta[int64_t(c0 + t) * d.Hv + j];
    if (tid == 0) {
      float acc = 0.0f;
      for (int t = 0; t < L; ++t) s.gamma[t] = (acc += g[int64_t(c0 + t) * d.Hv + j]);
    }
    __syncthreads();
    // A (strictly lower, with β) and the decayed Q·Kᵀ (lower incl. diagonal); exponent of differences only.
    for (int x = tid; x < L * L; x += nt) {
      const int t = x / L, u = x % L;
      float kk = 0.0f, qk = 0.0f;
      if (u <= t) {
        for (int i = 0; i < dk; ++i) {
          kk += s.K[t * dk + i] * s.K[u * dk + i];
          qk += s.Q[t * dk + i] * s.K[u * dk + i];
        }
      }
      const float decay = u <= t ? expf(s.gamma[t] - s.gamma[u]) : 0.0f;
      s.A[t * kChunk + u] = u < t ? s.beta[t] * kk * decay : 0.0f;
      s.QK[t * kChunk + u] = qk * decay;
    }
    __syncthreads();
    // Forward substitution: W = (I+A)⁻¹ diag(β e^γ) K and U = (I+A)⁻¹ diag(β) V, one row at a time.
    for (int t = 0; t < L; ++t) {
      for (int c = tid; c < dk + kColBlock; c += nt) {
        float val;
        if (c < dk) {
          val = s.beta[t] * expf(s.gamma[t]) * s.K[t * dk + c];
          for (int u = 0; u < t; ++u) val -= s.A[t * kChunk + u] * s.W[u * dk + c];
          s.W[t * dk + c] = val;
        } else {
          const int e = c - dk;
          val = e < ncols ? s.beta[t] * v[(int64_t(c0 + t) * d.Hv + j) * d.dv + col0 + e] : 0.0f;
          for (int u = 0; u < t; ++u) val -= s.A[t * kChunk + u] * s.U[u * kColBlock + e];
          s.U[t * kColBlock + e] = val;
        }
      }
      __syncthreads();
    }
    // Δ = U − W·S.
    for (int x = tid; x < L * kColBlock; x += nt) {
      const int t = x / kColBlock, e = x % kColBlock;
      float acc = s.U[x];
      for (int i = 0; i < dk; ++i) acc -= s.W[t * dk + i] * s.S[i * kColBlock + e];
      s.Dl[x] = acc;
    }
    __syncthreads();
    // O = e^γ Q·S + (decayed Q·Kᵀ)·Δ.
    for (int x = tid; x < L * kColBlock; x += nt) {
      const int t = x / kColBlock, e = x % kColBlock;
      if (e >= ncols) continue;
      float acc = 0.0f;
      for (int i = 0; i < dk; ++i) acc += s.Q[t * dk + i] * s.S[i * kColBlock + e];
      acc *= expf(s.gamma[t]);
      for (int u = 0; u <= t; ++u) acc += s.QK[t * kChunk + u] * s.Dl[u * kColBlock + e];
      out[(int64_t(c0 + t) * d.Hv + j) * d.dv + col0 + e] = acc;
    }
    __syncthreads();
    // S ← e^{γ_L} S + Σ_u e^{γ_L − γ_u} k_u Δ_uᵀ.
    const float gl = s.gamma[L - 1];
    for (int x = tid; x < dk * kColBlock; x += nt) {
      const int i = x / kColBlock, e = x % kColBlock;
      float acc = s.S[x] * expf(gl);
      for (int u = 0; u < L; ++u) acc += expf(gl - s.gamma[u]) * s.K[u * dk + i] * s.Dl[u * kColBlock + e];
      s.S[x] = acc;
    }
  }
  __syncthreads();
  for (int x = tid; x < dk * kColBlock; x += nt) {
    const int i = x / kColBlock, e = x % kColBlock;
    if (e < ncols) Sg[int64_t(i) * d.dv + col0 + e] = s.S[x];
  }
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

// The whole decode step of one DeltaNet layer for one key head and its Hv/Hk value heads (one
// thread per value column): conv + SiLU of the head's q, k and v channels (continuing the conv
// state), q/k L2 norms and gates, the delta rule on the fp32 state column held in registers, and
// the gated RMSNorm. The state loads are issued first so their latency overlaps the conv.
template <int DK>
__global__ void __launch_bounds__(256, 1) deltanet_decode_kernel(DeltaNetShape d, const bf16* x, const float* conv_w,
                                                                 float* conv_state, const float* b, const float* a,
                                                                 const float* A_log, const float* dt_bias, float* state,
                                                                 const float* norm_w, const bf16* z, float eps,
                                                                 bf16* out) {
  extern __shared__ float vs[];  // the block's v channels, then their outputs
  __shared__ float qs[DK], ks[DK], head_inv[32];
  const int kh = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32, warps = blockDim.x / 32;
  const int ratio = d.Hv / d.Hk, cols = ratio * d.dv;
  const int key_dim = d.Hk * DK, C = 2 * key_dim + d.Hv * d.dv, hist = d.K - 1;
  const bool active = tid < cols;
  const int jl = tid / d.dv, e = tid % d.dv, j = kh * ratio + jl;
  float* S = state + int64_t(j) * DK * d.dv;
  float col[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i) col[i] = active ? S[int64_t(i) * d.dv + e] : 0.0f;

  for (int ch = tid; ch < 2 * DK + cols; ch += blockDim.x) {
    const int c = ch < DK ? kh * DK + ch : ch < 2 * DK ? key_dim + kh * DK + ch - DK : 2 * key_dim + kh * cols + ch - 2 * DK;
    float acc = conv_w[int64_t(c) * d.K + hist] * __bfloat162float(x[c]);
    for (int t = 0; t < hist; ++t) {
      const float w_t = conv_state[int64_t(t) * C + c];
      acc += conv_w[int64_t(c) * d.K + t] * w_t;
      if (t > 0) conv_state[int64_t(t - 1) * C + c] = w_t;
    }
    if (hist > 0) conv_state[int64_t(hist - 1) * C + c] = __bfloat162float(x[c]);
    const float u = siluf_(acc);
    if (ch < DK) qs[ch] = u;
    else if (ch < 2 * DK) ks[ch - DK] = u;
    else vs[ch - 2 * DK] = u;
  }
  __syncthreads();
  for (int which = warp; which < 2; which += warps) {  // q (with the 1/sqrt(dk) scale), then k
    float* v = which == 0 ? qs : ks;
    float ss = 0.0f;
    for (int i = lane; i < DK; i += 32) ss += v[i] * v[i];
    const float inv = rsqrtf(warp_sum(ss) + 1e-6f) * (which == 0 ? rsqrtf(float(DK)) : 1.0f);
    for (int i = lane; i < DK; i += 32) v[i] *= inv;
  }
  __syncthreads();
  float o = 0.0f;
  if (active) {
    const float av = a[j] + dt_bias[j];
    const float decay = expf(-expf(A_log[j]) * (av > 20.0f ? av : log1pf(expf(av))));
    const float beta = 1.0f / (1.0f + expf(-b[j]));
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      col[i] *= decay;
      m += col[i] * ks[i];
    }
    const float delta = beta * (vs[tid] - m);
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      col[i] += ks[i] * delta;
      o += col[i] * qs[i];
    }
#pragma unroll
    for (int i = 0; i < DK; ++i) S[int64_t(i) * d.dv + e] = col[i];
  }
  __syncthreads();  // every v channel read: its slot now holds this column's output
  if (active) vs[tid] = o;
  __syncthreads();
  for (int h = warp; h < ratio; h += warps) {
    float ss = 0.0f;
    for (int i = lane; i < d.dv; i += 32) ss += vs[h * d.dv + i] * vs[h * d.dv + i];
    const float inv = rsqrtf(warp_sum(ss) / float(d.dv) + eps);
    if (lane == 0) head_inv[h] = inv;
  }
  __syncthreads();
  if (active) {
    const int64_t c = int64_t(j) * d.dv + e;
    out[c] = __float2bfloat16(o * head_inv[jl] * norm_w[e] * siluf_(__bfloat162float(z[c])));
  }
}

template <int DK>
void launch_deltanet_decode(const DeltaNetShape& d, int threads, const bf16* x, const float* conv_w, float* conv_state,
                            const float* b, const float* a, const float* A_log, const float* dt_bias, float* state,
                            const float* norm_w, const bf16* z, float eps, bf16* out, cudaStream_t s) {
  const int cols = d.Hv / d.Hk * d.dv;
  deltanet_decode_kernel<DK><<<d.Hk, threads, cols * sizeof(float), s>>>(d, x, conv_w, conv_state, b, a, A_log, dt_bias,
                                                                         state, norm_w, z, eps, out);
}

}  // namespace

void causal_conv_silu(const bf16* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state, float* u,
                      cudaStream_t s) {
  check(K >= 1 && K <= 8, "CUDA conv: kernel size " + std::to_string(K) + " is not supported (1..8)");
  conv_kernel<<<div_up(C, 256), 256, 0, s>>>(x, x_stride, T, C, K, w, conv_state, u);
  PETREL_LAUNCHED("causal_conv_silu");
}

void deltanet_prepare(const DeltaNetShape& d, const float* u, int T, const float* b, int64_t b_stride, const float* a,
                      int64_t a_stride, const float* A_log, const float* dt_bias, float* q, float* k, float* v,
                      float* beta, float* g, cudaStream_t s) {
  prepare_kernel<<<T, 256, 0, s>>>(d, u, b, b_stride, a, a_stride, A_log, dt_bias, q, k, v, beta, g);
  PETREL_LAUNCHED("deltanet_prepare");
}

void delta_rule_recurrent(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* state, float* out, cudaStream_t s) {
  const dim3 grid(d.Hv, div_up(d.dv, 128));
  switch (d.dk) {
    case 16: recurrent_reg_kernel<16><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    case 32: recurrent_reg_kernel<32><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    case 64: recurrent_reg_kernel<64><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    case 128: recurrent_reg_kernel<128><<<grid, 128, 0, s>>>(d, T, q, k, v, beta, g, state, out); break;
    default:
      recurrent_kernel<<<dim3(d.Hv, div_up(d.dv, 128)), 128, 2 * d.dk * sizeof(float), s>>>(d, T, q, k, v, beta, g, state,
                                                                                       out);
  }
  PETREL_LAUNCHED("delta_rule_recurrent");
}

void delta_rule_chunked(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                        const float* beta, const float* g, float* state, float* out, cudaStream_t s) {
  const size_t smem = ChunkSmem::bytes(d.dk);
  static size_t configured = 0;
  if (smem > configured) {
    PETREL_CUDA(cudaFuncSetAttribute(chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    configured = smem;
  }
  chunked_kernel<<<dim3(d.Hv, div_up(d.dv, kColBlock)), 256, smem, s>>>(d, T, q, k, v, beta, g, state, out);
  PETREL_LAUNCHED("delta_rule_chunked");
}

bool deltanet_decode(const DeltaNetShape& d, const bf16* x, const float* conv_w, float* conv_state, const float* b,
                     const float* a, const float* A_log, const float* dt_bias, float* state, const float* norm_w,
                     const bf16* z, float eps, bf16* out, cudaStream_t s) {
  const int ratio = d.Hk > 0 ? d.Hv / d.Hk : 0, threads = div_up(int64_t(ratio) * d.dv, 32) * 32;
  if (ratio < 1 || d.Hv != ratio * d.Hk || threads > 256 || ratio > 32 || d.K < 1 || d.K > 8) return false;
  switch (d.dk) {
    case 16: launch_deltanet_decode<16>(d, threads, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, s); break;
    case 32: launch_deltanet_decode<32>(d, threads, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, s); break;
    case 64: launch_deltanet_decode<64>(d, threads, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, s); break;
    case 128: launch_deltanet_decode<128>(d, threads, x, conv_w, conv_state, b, a, A_log, dt_bias, state, norm_w, z, eps, out, s); break;
    default: return false;
  }
  PETREL_LAUNCHED("deltanet_decode");
  return true;
}

void gated_rms_norm(const DeltaNetShape& d, const float* o, int T, const float* w, const bf16* z, int64_t z_stride,
                    float eps, bf16* out, int64_t out_stride, cudaStream_t s) {
  gated_norm_kernel<<<dim3(T, d.Hv), 32, 0, s>>>(d, o, w, z, z_stride, eps, out, out_stride);
  PETREL_LAUNCHED("gated_rms_norm");
}

}  // namespace petrel::cuda
