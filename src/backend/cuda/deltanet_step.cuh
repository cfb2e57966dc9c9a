// The one-token DeltaNet decode step of one value head as a whole-block device function: the body
// of deltanet_decode_kernel (deltanet.cu) and of the persistent DeltaNet layer's step blocks
// (deltanet_layer.cu).
#pragma once
#include "backend/cuda/kernels.cuh"

#include <algorithm>

namespace petrel::cuda {

constexpr int kDecodeThreads = 128;  // threads of a decode block: one per value column (dv <= 128)
constexpr int kDecodeSlots = 3;  // conv channels a thread takes: 2·dk + dv <= 3 · kDecodeThreads
constexpr int kDecodeMaxTaps = 4;  // conv sizes the decode kernel takes (taps, history in registers); the models use 4

// Whether the decode kernel takes shape d (a thread per value column, kDecodeSlots channels each).
inline bool decode_fits(const DeltaNetShape& d) {
  return d.dv <= kDecodeThreads && 2 * d.dk + d.dv <= kDecodeSlots * kDecodeThreads;
}

// The whole decode step of one DeltaNet layer for one value head, a thread per value column
// holding the column's DK fp32 state rows in registers (so the delta rule's sums over rows need no
// other thread, and a warp's store of a state row is one 128-byte line): conv + SiLU of its key
// head's q and k channels and of its own v channels (channels tid, tid + 128, tid + 256, continuing
// the conv state), q/k L2 norms and gates, the delta rule, and the gated RMSNorm. Latency decides
// its time, so everything that does not need the input projections' rows happens before the wait:
// weights, settled states, the conv's history taps and the reader count below. After it: one round
// trip of loads and two block barriers of four warps. Threads past kDecodeThreads (the persistent
// layer's blocks) only meet the barriers.
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
  constexpr int kWarps = kDecodeThreads / 32, kAcc = 8;
  static_assert(DK % kAcc == 0, "the row sums run in kAcc accumulators over float4 reads");
  __shared__ __align__(16) float qs[DK], ks[DK];
  __shared__ float vs[kDecodeThreads], q_sq[kWarps], k_sq[kWarps], o_sq[kWarps];
  __shared__ bool last_reader;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ratio = d.Hv / d.Hk, kh = j / ratio;
  const int key_dim = d.Hk * DK, C = 2 * key_dim + d.Hv * d.dv, hist = d.K - 1;
  const int e = tid;
  const bool active = e < d.dv;
  // This thread's conv channels ch = tid + s·kDecodeThreads: q (ch < DK) or k (ch < 2·DK), shared
  // by the key head's blocks, or one of this head's v channels.
  int c[kDecodeSlots];
  bool has[kDecodeSlots];
#pragma unroll
  for (int s = 0; s < kDecodeSlots; ++s) {
    const int ch = tid + s * kDecodeThreads;
    has[s] = tid < kDecodeThreads && ch < 2 * DK + d.dv;
    c[s] = ch < DK ? kh * DK + ch : ch < 2 * DK ? key_dim + kh * DK + ch - DK : 2 * key_dim + j * d.dv + ch - 2 * DK;
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
  float col[DK], h[kDecodeSlots][kDecodeMaxTaps - 1], hist_acc[kDecodeSlots], tap_x[kDecodeSlots];
  // The states, and the conv taps with them (weights, loaded where the states are rather than
  // held across the wait: registers).
  auto load_states = [&] {
    S = state + int64_t(j) * DK * d.dv + e;
#pragma unroll
    for (int r = 0; r < DK; ++r) col[r] = active ? __ldcg(S + r * d.dv) : 0.0f;
#pragma unroll
    for (int s = 0; s < kDecodeSlots; ++s) {
      float taps[kDecodeMaxTaps];
      tap_x[s] = 0.0f;
#pragma unroll
      for (int t = 0; t < kDecodeMaxTaps; ++t) {
        taps[t] = has[s] && t < d.K ? conv_w[int64_t(c[s]) * d.K + t] : 0.0f;
        if (t == hist) tap_x[s] = taps[t];  // the tap of this step's x (selected, not indexed: registers)
      }
#pragma unroll
      for (int t = 0; t < kDecodeMaxTaps - 1; ++t)
        h[s][t] = has[s] && t < hist ? conv_state[int64_t(t) * C + c[s]] : 0.0f;
      // The conv over the history (the order of a sum over all taps, x's last).
      hist_acc[s] = 0.0f;
#pragma unroll
      for (int t = 0; t < kDecodeMaxTaps - 1; ++t)
        if (t < hist) hist_acc[s] += taps[t] * h[s][t];
    }
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
  float xc[kDecodeSlots];
#pragma unroll
  for (int s = 0; s < kDecodeSlots; ++s) xc[s] = has[s] ? __bfloat162float(x[c[s]]) : 0.0f;
  const float av = a[j] + dt, bj = b[j], zc = active ? __bfloat162float(z[int64_t(j) * d.dv + e]) : 0.0f;
  // The gates need only a and b: worked out while the conv's barrier below waits.
  const float decay = expf(-A * (av > 20.0f ? av : log1pf(expf(av))));
  const float beta = 1.0f / (1.0f + expf(-bj));
  float q2 = 0.0f, k2 = 0.0f;
#pragma unroll
  for (int s = 0; s < kDecodeSlots; ++s) {
    const int ch = tid + s * kDecodeThreads;
    const float u = has[s] ? siluf_(hist_acc[s] + tap_x[s] * xc[s]) : 0.0f;
    if (!has[s]) continue;
    if (ch < DK) {
      qs[ch] = u;
      q2 += u * u;
    } else if (ch < 2 * DK) {
      ks[ch - DK] = u;
      k2 += u * u;
    } else {
      vs[ch - 2 * DK] = u;
    }
  }
  if (tid < kDecodeThreads) {
    q2 = warp_sum(q2);
    k2 = warp_sum(k2);
    if (lane == 0) {
      q_sq[warp] = q2;
      k_sq[warp] = k2;
    }
  }
  __syncthreads();
  if (!rows.states_settled) count_reader();
  float qq = 0.0f, kk = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    qq += q_sq[w];
    kk += k_sq[w];
  }
  const float inv_q = rsqrtf(qq + 1e-6f) * rsqrtf(float(DK)), inv_k = rsqrtf(kk + 1e-6f);
  const float4* q4 = reinterpret_cast<const float4*>(qs);
  const float4* k4 = reinterpret_cast<const float4*>(ks);
  float mp[kAcc] = {};
#pragma unroll
  for (int g = 0; g < DK / 4; ++g) {
    const float4 kv = k4[g];
    const float kr[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      col[4 * g + i] *= decay;
      mp[(4 * g + i) % kAcc] += col[4 * g + i] * kr[i];
    }
  }
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) m += mp[i];
  const float delta = beta * ((active ? vs[e] : 0.0f) - m * inv_k);
  // Each state row goes out as soon as it is known: the stores' drain is the step's longest part.
  float op[kAcc] = {};
#pragma unroll
  for (int g = 0; g < DK / 4; ++g) {
    const float4 kv = k4[g], qv = q4[g];
    const float kr[4] = {kv.x, kv.y, kv.z, kv.w}, qr[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * g + i;
      col[r] += kr[i] * inv_k * delta;
      op[r % kAcc] += col[r] * qr[i];
      if (active) __stcg(S + r * d.dv, col[r]);
    }
  }
  float o = 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) o += op[i];
  o *= inv_q;
  if (tid < kDecodeThreads) {
    const float o2 = warp_sum(active ? o * o : 0.0f);
    if (lane == 0) o_sq[warp] = o2;
  }
  __syncthreads();
  // The conv windows shift last (v's by every block, q/k's by the key head's last reader).
  auto shift_history = [&](int s, float x_now) {
#pragma unroll
    for (int t = 1; t < kDecodeMaxTaps - 1; ++t)
      if (t < hist) conv_state[int64_t(t - 1) * C + c[s]] = h[s][t];
    if (hist > 0) conv_state[int64_t(hist - 1) * C + c[s]] = x_now;
  };
#pragma unroll
  for (int s = 0; s < kDecodeSlots; ++s)
    if (has[s] && (tid + s * kDecodeThreads >= 2 * DK || last_reader)) shift_history(s, xc[s]);
  float oo = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    if (w * 32 < d.dv) oo += o_sq[w];
  if (active) out[int64_t(j) * d.dv + e] = __float2bfloat16(o * rsqrtf(oo / float(d.dv) + eps) * nw * siluf_(zc));
}

}  // namespace petrel::cuda
