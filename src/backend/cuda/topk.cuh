// The one-token top-k of the router's values inside the decode expert kernels (moe.cu):
// whole-block device functions.
#pragma once
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {

constexpr int kMaxExperts = 1024;

constexpr int kTopkSegments = 4;  // segments of 32 logits a warp holds in topk_block
static_assert(kTopkSegments * 32 * 8 >= kMaxExperts, "topk_block: a block of 8 or more warps holds every logit");

// The float whose ordered_bits are u.
__device__ __forceinline__ float key_float(unsigned u) {
  return __uint_as_float(u & 0x80000000u ? u & 0x7fffffffu : ~u);
}

// The router's value for expert e: a logit, or its fixed-point sum (a positive multiple of it).
__device__ __forceinline__ float router_value(const TopK& src, int e) {
  return src.sums ? __ll2float_rn(static_cast<long long>(__ldcg(src.sums + e))) * (1.0f / kRouteFixedOne)
                  : __ldcg(src.logits + e);
}

// Whole block: the top k (<= 32) of one token's E router logits (ties to the lower expert) into
// shared ids[0..k), by rank; with weights set, also their softmax probabilities (renormalised over
// the k where `renorm`). Softmax keeps the logits' order, so the logits are ranked. Each warp takes
// the maxima of its segments of 32 logits (one reduction each); when there are at least k
// segments, the k-th largest logit reaches the smallest of those maxima, and only the logits that
// do (about 17 of 256 for normal logits) are ranked, by warp 0, each against the others. The
// weights take the values times `scale` (router sums times the norm's rsqrt are the logits).
__device__ inline void topk_block(const TopK& src, int k, int* ids, float* weights, float scale = 1.0f) {
  const int E = src.E;
  const bool renorm = src.renorm;
  __shared__ unsigned seg_max[kMaxExperts / 32];
  __shared__ float warp_exp[32];
  __shared__ int2 cand[kMaxExperts];  // (logit bits, expert) of the logits ranked
  __shared__ int count;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, segs = div_up(E, 32);
  if (threadIdx.x == 0) count = 0;
  float v[kTopkSegments];
  unsigned key[kTopkSegments];
#pragma unroll
  for (int m = 0; m < kTopkSegments; ++m) {  // one L2 round trip for all of them
    const int e = 32 * (warp + m * warps) + lane;
    v[m] = e < E ? router_value(src, e) : -INFINITY;
    key[m] = e < E ? ordered_bits(v[m]) : 0u;  // 0: below every logit
  }
#pragma unroll
  for (int m = 0; m < kTopkSegments; ++m) {
    const unsigned mx = __reduce_max_sync(0xffffffffu, key[m]);
    if (lane == 0 && warp + m * warps < segs) seg_max[warp + m * warps] = mx;
  }
  __syncthreads();
  unsigned bound = 0xffffffffu, top = 0u;
  for (int i = 0; i < segs; ++i) {
    bound = min(bound, seg_max[i]);
    top = max(top, seg_max[i]);
  }
  if (segs < k) bound = 0u;  // too few segments for the bound: rank them all
  const float vmax = key_float(top);
  const unsigned below = (1u << lane) - 1u;
  float sum = 0.0f;
#pragma unroll
  for (int m = 0; m < kTopkSegments; ++m) {
    const int e = 32 * (warp + m * warps) + lane;
    if (weights && e < E) sum += expf((v[m] - vmax) * scale);
    const bool ranked = e < E && key[m] >= bound;
    const unsigned ballot = __ballot_sync(0xffffffffu, ranked);
    int base = 0;
    if (lane == 0 && ballot) base = atomicAdd(&count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (ranked) cand[base + __popc(ballot & below)] = make_int2(__float_as_int(v[m]), e);
  }
  if (weights) {
    sum = warp_sum(sum);
    if (lane == 0) warp_exp[warp] = sum;
  }
  __syncthreads();
  if (warp != 0) return;
  const int n = count;
  float total = 0.0f;
  if (weights)
    for (int w = 0; w < warps; ++w) total += warp_exp[w];
  for (int c = lane; c < n; c += 32) {
    const int2 me = cand[c];
    const float mv = __int_as_float(me.x);
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const int2 o = cand[j];
      const float ov = __int_as_float(o.x);
      rank += ov > mv || (ov == mv && o.y < me.y);
    }
    if (rank < k) {
      ids[rank] = me.y;
      if (weights) weights[rank] = expf((mv - vmax) * scale) / total;
    }
  }
  if (weights && renorm) {  // the picks' sum in rank order (off the critical path: block (0, 0) only)
    __syncwarp();
    float kept = 0.0f;
    for (int r = 0; r < k; ++r) kept += weights[r];
    __syncwarp();
    if (lane < k) weights[lane] /= kept;
  }
}

// Whole block, in a routed expert block that picks the top-k itself (pick.any(), one token): the
// top-k of the router's values; the `writer` block (block (0, 0) of a launch) also writes the ids
// for the down kernel and, from logits, their softmax weights (from sums: weigh_route, once the
// norm is staged). Returns the expert of `slot`.
__device__ inline int pick_expert(const TopK& pick, int k, int slot, bool writer, int* ids, float* weights) {
  __shared__ int picked[32];
  __shared__ float picked_w[32];
  const bool weigh = writer && !pick.sums;
  topk_block(pick, k, picked, weigh ? picked_w : nullptr);
  __syncthreads();
  if (writer && int(threadIdx.x) < k) {
    ids[threadIdx.x] = picked[threadIdx.x];
    if (weigh) weights[threadIdx.x] = picked_w[threadIdx.x];
  }
  return picked[slot];
}

// Whole block, once the norm's rsqrt (inv_rms) is staged, in a block with time to spare (a shared-
// expert block, whose weights were in flight before the wait; block (0, 0) where there is none):
// the softmax weights of the top-k picked from router sums (ranked on the sums as pick_expert
// ranks them, so they follow its ids) and the shared expert's gate, as the router's logits give them.
__device__ inline void weigh_route(const TopK& pick, int k, float inv_rms, float* weights) {
  __shared__ int picked[32];
  __shared__ float picked_w[32];
  topk_block(pick, k, picked, picked_w, inv_rms);
  __syncthreads();
  if (int(threadIdx.x) < k) weights[threadIdx.x] = picked_w[threadIdx.x];
  if (threadIdx.x == 0 && pick.sgate) *pick.sgate = sigmoidf_(router_value(pick, pick.E) * inv_rms);
}

}  // namespace petrel::cuda
