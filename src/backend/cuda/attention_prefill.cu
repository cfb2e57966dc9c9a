// Causal GQA attention of a prefill chunk on tensor cores, FlashAttention-2 style: one block of
// 4 warps per (64-query tile, query head); each warp owns 16 query rows and streams 64-key tiles
// of K and V through shared memory, with the online-softmax state and the output in registers.
//
// Fragment layouts and the shared pieces: attention_mma.cuh.
// Pipeline per key tile j (single K and V buffers): wait K_j; load V_j; S = Q·K_jᵀ, softmax;
// wait V_j; load K_{j+1}; O += P·V_j. Each load overlaps the math that does not read it.
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kBQ = 64;   // queries per block, 16 per warp
constexpr int kBKV = 64;  // keys per tile
constexpr int kWarps = kBQ / 16;
constexpr int kThreads = 32 * kWarps;
// 2 blocks per SM: what shared memory allows at D = 256 and registers at D = 128 (fewer spill).
constexpr int kMinBlocks = 2;

template <int D>
constexpr size_t smem_bytes() {
  return size_t(kBQ + 2 * kBKV) * D * sizeof(bf16);
}

// Issues the copy of rows [row0, row0 + ROWS) of a [*, D] matrix (row stride `stride`) into a
// swizzled tile; rows at or past `row_end` become zeros. Each thread copies one 16-byte column
// chunk of every (kThreads / (D/8))-th row, walking a single pointer down the rows.
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* src, int64_t stride, int row0, int row_end) {
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && ROWS % kRowStep == 0, "every thread copies the same chunks");
  const int k = threadIdx.x % kChunks;
  int r = threadIdx.x / kChunks;
  const bf16* p = src + (row0 + r) * stride + 8 * k;
#pragma unroll
  for (int it = 0; it < ROWS / kRowStep; ++it, r += kRowStep, p += kRowStep * stride) {
    const bool valid = row0 + r < row_end;
    cp_async16(dst + swz<D>(r, 8 * k), valid ? p : src, valid);
  }
}

// Hides keys past each row's position: key0 is the tile's first key, pos the position of row g.
__device__ __forceinline__ void causal_mask(float s[kBKV / 8][4], int key0, int pos, int lane) {
#pragma unroll
  for (int n = 0; n < kBKV / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + 8 * n + 2 * (lane % 4) + (e & 1);
      if (key > pos + 8 * (e / 2)) s[n][e] = -INFINITY;
    }
}

// grid (query tiles, Hq), kThreads threads, smem_bytes<D>() of dynamic shared memory.
template <int D>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_prefill_kernel(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv,
                             const int* pos0, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t sQ = smem_addr(smem), sK = sQ + kBQ * D * 2, sV = sK + kBKV * D * 2;  // shared addresses
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kBQ;  // tiles with the most keys start first
  const int h = blockIdx.y, kvh = h / (Hq / Hkv);
  const int p0 = *pos0;
  const int n_keys = p0 + min(q0 + kBQ, T);  // keys 0 .. position of the tile's last query
  const int n_tiles = (n_keys + kBKV - 1) / kBKV;
  const int64_t kv_stride = int64_t(Hkv) * D;
  const bf16* kh = kc + int64_t(kvh) * D;
  const bf16* vh = vc + int64_t(kvh) * D;
  const int warp_pos = p0 + q0 + 16 * warp;  // position of this warp's first row
  const float scale_log2 = rsqrtf(float(D)) * 1.44269504088896341f;

  load_tile<D, kBQ>(sQ, q + int64_t(h) * D, q_stride, q0, T);
  load_tile<D, kBKV>(sK, kh, kv_stride, 0, n_keys);
  cp_async_commit();

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j = 0; j < n_tiles; ++j) {
    const int key0 = j * kBKV;
    cp_async_wait<0>();
    __syncthreads();  // K_j (and Q) have landed; every warp is done reading V_{j-1}
    load_tile<D, kBKV>(sV, vh, kv_stride, key0, n_keys);
    cp_async_commit();
    float s[kBKV / 8][4];
    scores<D, kBKV>(sQ, sK, 16 * warp, lane, s);
    if (key0 + kBKV - 1 > warp_pos) causal_mask(s, key0, warp_pos + lane / 4, lane);  // diagonal tiles only
    online_softmax<kBKV, D / 8>(s, m, l, o, scale_log2);
    cp_async_wait<0>();
    __syncthreads();  // V_j has landed; every warp is done reading K_j
    if (j + 1 < n_tiles) {
      load_tile<D, kBKV>(sK, kh, kv_stride, key0 + kBKV, n_keys);
      cp_async_commit();
    }
    accumulate_pv<D, kBKV, D / 8>(s, sV, lane, 0, o);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int t = q0 + 16 * warp + lane / 4 + 8 * r;
    if (t >= T) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = int64_t(h) * D + 8 * n + 2 * (lane % 4) + e;
        float v = o[n][2 * r + e] * inv;
        if (gate) v *= sigmoidf_(__bfloat162float(gate[t * gate_stride + col]));
        out[t * out_stride + col] = __float2bfloat16(v);
      }
  }
}

template <int D>
void launch(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, const int* pos0,
            const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride, cudaStream_t s) {
  constexpr size_t smem = smem_bytes<D>();
  allow_dynamic_smem<attention_prefill_kernel<D>>(smem);
  attention_prefill_kernel<D><<<dim3(div_up(T, kBQ), Hq), kThreads, smem, s>>>(q, q_stride, T, kc, vc, Hq, Hkv, pos0,
                                                                                gate, gate_stride, out, out_stride);
  PETREL_LAUNCHED("attention_prefill");
}

}  // namespace

bool attention_prefill(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
                       const int* pos0, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                       cudaStream_t s) {
  // 16-byte copies of q rows need an aligned base and stride (the cache rows always are).
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0 && q_stride % 8 == 0;
  if (T < kPrefillMinQueries || !aligned) return false;
  switch (D) {
    case 64: launch<64>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, gate, gate_stride, out, out_stride, s); return true;
    case 128: launch<128>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, gate, gate_stride, out, out_stride, s); return true;
    case 256: launch<256>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, gate, gate_stride, out, out_stride, s); return true;
  }
  return false;
}

}  // namespace petrel::cuda
