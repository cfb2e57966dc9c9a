// The one-token DeltaNet decode step of one value head as a whole-block device function: the body
// of deltanet_decode_kernel (deltanet.cu).
#pragma once
#include "backend/cuda/kernels.cuh"

#include <algorithm>

namespace petrel::cuda {

constexpr int kDecodeParts = 4;  // threads per value column in the decode kernel, a run of rows each
constexpr int kDecodeMaxTaps = 4;  // conv sizes the decode kernel takes (taps, history in registers); the models use 4

// Threads of the decode kernel: kDecodeParts per value column and one per conv channel the block
// reads (2·dk + dv), whichever is more, in whole warps.
inline int decode_threads(const DeltaNetShape& d) {
  return div_up(std::max(d.dv * kDecodeParts, 2 * d.dk + d.dv), 32) * 32;
}

// The whole decode step of one DeltaNet layer for one value head (kDecodeParts threads per value
// column, dv threads apart, each holding a run of DK / kDecodeParts rows of the fp32 state column in
// registers, so that a warp's store of a state row is whole 128-byte lines: stores of quarter lines
// took ~1 us a block):
// conv + SiLU of its key head's q and k channels and of its own v channels (a thread per channel,
// continuing the conv state), q/k L2 norms and gates, the delta rule, and the gated RMSNorm.
// Latency decides its time (stamps: ~3.5 us after the wait, ~0.5 of it the one round trip for
// x), so everything that does not need the input projections' rows
// happens before the wait: weights, settled states, the conv's history taps and the reader count
// below. After it: one round trip of loads, four block barriers, short sums (4 accumulators,
// float4 reads of q and k).
// The Hv/Hk blocks of a key head all read its q/k conv state; the last of them to finish reading
// (counted in readers[row·Hk + key head], left at zero) shifts it. A batched step's row `row` first
// moves to its operand rows and, from the tables, its sequence's states. The block of value head j
// runs it; wait() returns once x, b, a and z are written (the PDL wait).
template <int DK, typename Wait>
__device__ __forceinline__ void deltanet_head_step(const DeltaNetShape& d, int j, int row, DeltaNetRows rows,
                                                   const bf16* x, const float* conv_w, float* conv_state,
                                                   const float* b, const float* a, const float* A_log,
                                                   const float* dt_bias, float* state, const float* norm_w,
                                                   const bf16* z, float eps, bf16* out, int* readers, Wait wait) {
  constexpr int kRows = DK / kDecodeParts, kMaxWarps = 16, kQkWarps = (2 * DK + 31) / 32;
  static_assert(kRows % 4 == 0, "a part's rows are read as float4s");
  constexpr int kMaxDv = 512 / kDecodeParts;
  // q and k in shared memory (a warp reads one part's rows: float4 broadcasts), the parts' sums
  // of each column.
  __shared__ __align__(16) float qs[DK], ks[DK];
  __shared__ float vs[kMaxDv], m_part[kDecodeParts][kMaxDv], o_part[kDecodeParts][kMaxDv];
  __shared__ float q_sq[kQkWarps], k_sq[kQkWarps], o_sq[kMaxWarps];
  __shared__ bool last_reader;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ratio = d.Hv / d.Hk, kh = j / ratio;
  const int key_dim = d.Hk * DK, C = 2 * key_dim + d.Hv * d.dv, hist = d.K - 1;
  const int e = tid % d.dv, part = tid / d.dv;
  const bool active = part < kDecodeParts;
  // This thread's conv channel: q (ch < DK) or k (ch < 2·DK), shared by the key head's blocks, or
  // one of this head's v channels.
  const int ch = tid;
  const bool has_ch = ch < 2 * DK + d.dv, shared_qk = ch < 2 * DK;
  const int c = ch < DK ? kh * DK + ch : shared_qk ? key_dim + kh * DK + ch - DK : 2 * key_dim + j * d.dv + ch - 2 * DK;
  // Weights: written by nothing earlier in the stream, so loaded before the wait.
  float taps[kDecodeMaxTaps], tap_x = 0.0f;
#pragma unroll
  for (int t = 0; t < kDecodeMaxTaps; ++t) {
    taps[t] = has_ch && t < d.K ? conv_w[int64_t(c) * d.K + t] : 0.0f;
    if (t == hist) tap_x = taps[t];  // the tap of this step's x (selected, not indexed: registers)
  }
  const float A = expf(A_log[j]), dt = dt_bias[j], nw = active ? norm_w[e] : 0.0f;
  pdl_launch_dependents();
  x += row * rows.x_stride;
  b += row * rows.b_stride;
  a += row * rows.a_stride;
  z += row * rows.z_stride;
  out += row * rows.out_stride;
  // This thread's first state element; its rows are dv floats apart (32-bit offsets), read and
  // written once a step through L2 (global space: the pointer may come from a table).
  float* S = nullptr;
  float col[kRows], h[kDecodeMaxTaps - 1], hist_acc = 0.0f;
  auto load_states = [&] {
    S = state + int64_t(j) * DK * d.dv + part * kRows * d.dv + e;
#pragma unroll
    for (int r = 0; r < kRows; ++r) col[r] = active ? __ldcg(S + r * d.dv) : 0.0f;
#pragma unroll
    for (int t = 0; t < kDecodeMaxTaps - 1; ++t) h[t] = has_ch && t < hist ? conv_state[int64_t(t) * C + c] : 0.0f;
    // The conv over the history (the order of a sum over all taps, x's last).
    hist_acc = 0.0f;
#pragma unroll
    for (int t = 0; t < kDecodeMaxTaps - 1; ++t)
      if (t < hist) hist_acc += taps[t] * h[t];
  };
  // Thread 0, after a barrier that follows every thread's use of its history values: this block
  // has read the q/k window; the key head's last reader shifts it at the end.
  auto count_reader = [&] {
    if (tid == 0) {
      __threadfence();
      int* count = readers + row * d.Hk + kh;
      const bool last = atomicAdd(count, 1) == ratio - 1;
      if (last) *count = 0;
      last_reader = last;
    }
  };
  // Settled states load (and are counted) before the wait, while the input projections still
  // run; otherwise L2 is asked for them (a hint, safe to issue early). One load site (a loop kept
  // rolled) keeps the kernel within its registers.
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
    if (!after_wait && rows.states_settled) {
      __syncthreads();
      count_reader();
    }
  }
  const float xc = has_ch ? __bfloat162float(x[c]) : 0.0f;
  const float av = a[j] + dt, bj = b[j], zc = active && part == 0 ? __bfloat162float(z[int64_t(j) * d.dv + e]) : 0.0f;
  // The gates need only a and b: worked out while the conv's barrier below waits.
  const float decay = expf(-A * (av > 20.0f ? av : log1pf(expf(av))));
  const float beta = 1.0f / (1.0f + expf(-bj));
  const float u = has_ch ? siluf_(hist_acc + tap_x * xc) : 0.0f;
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
  if (warp < kQkWarps) {
    float q2, k2;
    if constexpr (DK % 32 == 0) {  // a warp holds q or k channels only: one sum (the other is zero)
      const float s2 = warp_sum(u * u);
      q2 = warp * 32 < DK ? s2 : 0.0f;
      k2 = warp * 32 < DK ? 0.0f : s2;
    } else {
      q2 = warp_sum(ch < DK ? u * u : 0.0f);
      k2 = warp_sum(ch >= DK ? u * u : 0.0f);
    }
    if (lane == 0) {
      q_sq[warp] = q2;
      k_sq[warp] = k2;
    }
  }
  __syncthreads();
  if (!rows.states_settled) count_reader();
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int w = 0; w < kQkWarps; ++w) {
    qq += q_sq[w];
    kk += k_sq[w];
  }
  const float inv_q = rsqrtf(qq + 1e-6f) * rsqrtf(float(DK)), inv_k = rsqrtf(kk + 1e-6f);
  // Inactive threads (past the parts) read part 0's rows and hold zero columns.
  const int rows0 = active ? part * kRows : 0;
  const float4* q4 = reinterpret_cast<const float4*>(qs + rows0);
  const float4* k4 = reinterpret_cast<const float4*>(ks + rows0);
  float mp[4] = {};
#pragma unroll
  for (int g = 0; g < kRows / 4; ++g) {
    const float4 kv = k4[g];
    const float kr[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      col[4 * g + i] *= decay;
      mp[i] += col[4 * g + i] * kr[i];
    }
  }
  if (active) m_part[part][e] = (mp[0] + mp[1]) + (mp[2] + mp[3]);
  __syncthreads();
  const float m = (m_part[0][e] + m_part[1][e]) + (m_part[2][e] + m_part[3][e]);
  const float delta = beta * ((active ? vs[e] : 0.0f) - m * inv_k);
  float op[4] = {};
#pragma unroll
  for (int g = 0; g < kRows / 4; ++g) {
    const float4 kv = k4[g], qv = q4[g];
    const float kr[4] = {kv.x, kv.y, kv.z, kv.w}, qr[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      col[4 * g + i] += kr[i] * inv_k * delta;
      op[i] += col[4 * g + i] * qr[i];
    }
  }
  // The state rows go out as soon as they are known: their drain is the step's longest part.
  if (active) {
    o_part[part][e] = (op[0] + op[1]) + (op[2] + op[3]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) __stcg(S + r * d.dv, col[r]);
  }
  __syncthreads();
  // Part 0's threads finish the columns and the gated norm's Σo² (by warps).
  const float o = ((o_part[0][e] + o_part[1][e]) + (o_part[2][e] + o_part[3][e])) * inv_q;
  if (warp * 32 < d.dv) {
    const float o2 = warp_sum(tid < d.dv ? o * o : 0.0f);
    if (lane == 0) o_sq[warp] = o2;
  }
  __syncthreads();
  if (last_reader && shared_qk) shift_history();
  float oo = 0.0f;
#pragma unroll
  for (int w = 0; w < kMaxWarps; ++w)
    if (w * 32 < d.dv) oo += o_sq[w];
  if (part == 0)
    out[int64_t(j) * d.dv + e] = __float2bfloat16(o * rsqrtf(oo / float(d.dv) + eps) * nw * siluf_(zc));
}

}  // namespace petrel::cuda
