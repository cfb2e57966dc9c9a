// The one-token DeltaNet decode step of one value head as a whole-block device function: the body
// of deltanet_decode_kernel (deltanet.cu) and of the persistent DeltaNet layer's step blocks
// (deltanet_layer.cu).
#pragma once
#include "backend/cuda/kernels.cuh"

#include <algorithm>

namespace petrel::cuda {

constexpr int kDecodeParts = 4;  // threads per value column in the decode kernel, rows interleaved
constexpr int kDecodeMaxTaps = 4;  // conv sizes the decode kernel takes (taps, history in registers); the models use 4

// Threads of the decode kernel: kDecodeParts per value column and one per conv channel the block
// reads (2·dk + dv), whichever is more, in whole warps.
inline int decode_threads(const DeltaNetShape& d) {
  return div_up(std::max(d.dv * kDecodeParts, 2 * d.dk + d.dv), 32) * 32;
}

// The whole decode step of one DeltaNet layer for one value head (kDecodeParts adjacent threads per
// value column, each holding every kDecodeParts-th row of the fp32 state column in registers):
// conv + SiLU of its key head's q and k channels and of its own v channels (a thread per channel,
// continuing the conv state), q/k L2 norms and gates, the delta rule, and the gated RMSNorm.
// Latency decides its time, so it is laid out as one round trip of loads (weights before the PDL
// wait, everything else at once after it) and two block barriers; the norms are block sums of
// per-warp partials applied as scalars.
// The Hv/Hk blocks of a key head all read its q/k conv state; the last of them to finish reading
// (counted in readers[row·Hk + key head], left at zero) shifts it. A batched step's row `row` first
// moves to its operand rows and, from the tables, its sequence's states. The block of value head j
// runs it; wait() returns once x, b, a and z are written (the PDL wait, or the persistent layer's
// counter).
template <int DK, typename Wait>
__device__ __forceinline__ void deltanet_head_step(const DeltaNetShape& d, int j, int row, DeltaNetRows rows,
                                                   const bf16* x, const float* conv_w, float* conv_state,
                                                   const float* b, const float* a, const float* A_log,
                                                   const float* dt_bias, float* state, const float* norm_w,
                                                   const bf16* z, float eps, bf16* out, int* readers, Wait wait) {
  constexpr int kRows = DK / kDecodeParts, kMaxWarps = 16;
  __shared__ float qs[DK], ks[DK], vs[512 / kDecodeParts], q_sq[kMaxWarps], k_sq[kMaxWarps], o_sq[kMaxWarps];
  __shared__ bool last_reader;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warps = blockDim.x / 32, ratio = d.Hv / d.Hk, kh = j / ratio;
  const int key_dim = d.Hk * DK, C = 2 * key_dim + d.Hv * d.dv, hist = d.K - 1;
  const int e = tid / kDecodeParts, part = tid % kDecodeParts;
  const bool active = e < d.dv;
  // This thread's conv channel: q (ch < DK) or k (ch < 2·DK), shared by the key head's blocks, or
  // one of this head's v channels.
  const int ch = tid;
  const bool has_ch = ch < 2 * DK + d.dv, shared_qk = ch < 2 * DK;
  const int c = ch < DK ? kh * DK + ch : shared_qk ? key_dim + kh * DK + ch - DK : 2 * key_dim + j * d.dv + ch - 2 * DK;
  // Weights: written by nothing earlier in the stream, so loaded before the wait.
  float taps[kDecodeMaxTaps];
#pragma unroll
  for (int t = 0; t < kDecodeMaxTaps; ++t) taps[t] = has_ch && t < d.K ? conv_w[int64_t(c) * d.K + t] : 0.0f;
  const float A = expf(A_log[j]), dt = dt_bias[j], nw = active ? norm_w[e] : 0.0f;
  pdl_launch_dependents();
  x += row * rows.x_stride;
  b += row * rows.b_stride;
  a += row * rows.a_stride;
  z += row * rows.z_stride;
  out += row * rows.out_stride;
  // This thread's first state element; its rows are kDecodeParts·dv floats apart (32-bit offsets),
  // read and written once a step through L2 (global space: the pointer may come from a table).
  const int row_step = kDecodeParts * d.dv;
  float* S = nullptr;
  float col[kRows], h[kDecodeMaxTaps - 1];
  auto load_states = [&] {
    S = state + int64_t(j) * DK * d.dv + part * d.dv + e;
#pragma unroll
    for (int r = 0; r < kRows; ++r) col[r] = active ? __ldcg(S + r * row_step) : 0.0f;
#pragma unroll
    for (int t = 0; t < kDecodeMaxTaps - 1; ++t) h[t] = has_ch && t < hist ? conv_state[int64_t(t) * C + c] : 0.0f;
  };
  // Settled states load before the wait, while the input projections still run; otherwise L2 is
  // asked for them (a hint, safe to issue early). One load site (a loop kept rolled) keeps the
  // kernel within its registers.
  if (tid == 0 && !rows.states && !rows.states_settled)
    prefetch_l2(state + int64_t(j) * DK * d.dv, size_t(DK) * d.dv * sizeof(float));
#pragma unroll 1
  for (int after_wait = 0; after_wait < 2; ++after_wait) {
    if (after_wait) {
      wait();
      if (rows.states) {
        conv_state = rows.conv_states[row];
        state = rows.states[row];
      }
    }
    if (bool(after_wait) != rows.states_settled) load_states();
  }
  const float xc = has_ch ? __bfloat162float(x[c]) : 0.0f;
  const float av = a[j] + dt, bj = b[j], zc = active && part == 0 ? __bfloat162float(z[int64_t(j) * d.dv + e]) : 0.0f;

  float acc = 0.0f;
#pragma unroll
  for (int t = 0; t < kDecodeMaxTaps; ++t) acc += taps[t] * (t < hist ? h[t] : t == hist ? xc : 0.0f);
  const float u = has_ch ? siluf_(acc) : 0.0f;
  // Shifts the channel's history one step (from registers: the values were just read).
  auto shift_history = [&] {
#pragma unroll
    for (int t = 1; t < kDecodeMaxTaps - 1; ++t)
      if (t < hist) conv_state[int64_t(t - 1) * C + c] = h[t];
    if (hist > 0) conv_state[int64_t(hist - 1) * C + c] = xc;
  };
  if (has_ch && !shared_qk) shift_history();
  if (ch < DK) qs[ch] = u;
  else if (shared_qk) ks[ch - DK] = u;
  else if (has_ch) vs[ch - 2 * DK] = u;
  const float q2 = warp_sum(ch < DK ? u * u : 0.0f), k2 = warp_sum(shared_qk && ch >= DK ? u * u : 0.0f);
  if (lane == 0) {
    q_sq[warp] = q2;
    k_sq[warp] = k2;
  }
  __syncthreads();
  if (tid == 0) {  // this block has read the q/k window; the key head's last reader shifts it below
    __threadfence();
    int* count = readers + row * d.Hk + kh;
    last_reader = atomicAdd(count, 1) == ratio - 1;
    if (last_reader) *count = 0;
  }
  float qq = 0.0f, kk = 0.0f;
  for (int w = 0; w < warps; ++w) {
    qq += q_sq[w];
    kk += k_sq[w];
  }
  const float inv_q = rsqrtf(qq + 1e-6f) * rsqrtf(float(DK)), inv_k = rsqrtf(kk + 1e-6f);
  // Every thread runs the shuffles (inactive ones hold zeros); the parts of a column are adjacent lanes.
  const float decay = expf(-A * (av > 20.0f ? av : log1pf(expf(av))));
  const float beta = 1.0f / (1.0f + expf(-bj));
  float m = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    col[r] *= decay;
    m += col[r] * ks[part + kDecodeParts * r];
  }
  m += __shfl_xor_sync(0xffffffffu, m, 1);
  m += __shfl_xor_sync(0xffffffffu, m, 2);
  const float delta = beta * ((active ? vs[e] : 0.0f) - m * inv_k);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    col[r] += ks[part + kDecodeParts * r] * inv_k * delta;
    o += col[r] * qs[part + kDecodeParts * r];
  }
  o += __shfl_xor_sync(0xffffffffu, o, 1);
  o += __shfl_xor_sync(0xffffffffu, o, 2);
  o *= inv_q;
  if (active) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) __stcg(S + r * row_step, col[r]);
  }
  const float o2 = warp_sum(active && part == 0 ? o * o : 0.0f);
  if (lane == 0) o_sq[warp] = o2;
  __syncthreads();
  if (last_reader && shared_qk) shift_history();
  float oo = 0.0f;
  for (int w = 0; w < warps; ++w) oo += o_sq[w];
  if (active && part == 0)
    out[int64_t(j) * d.dv + e] = __float2bfloat16(o * rsqrtf(oo / float(d.dv) + eps) * nw * siluf_(zc));
}

}  // namespace petrel::cuda
