// Causal GQA attention of a prefill chunk on tensor cores, FlashAttention-2 style: one block of
// 4 warps per (64-query tile, query head); each warp owns 16 query rows and streams 64-key tiles
// of K and V through shared memory, with the online-softmax state and the output in registers.
//
// Layout (mma.m16n8k16, lane = 4·g + c: g = groupID 0..7, c = thread in group 0..3):
//   sQ [64][D], sK [64][D], sV [64][D] bf16, row-major; the 16-byte chunk k of row r is stored at
//   chunk k ^ (r & 7), so the 8 row addresses of each ldmatrix phase fall in 8 distinct bank groups.
//   S = Q·Kᵀ: warp w owns rows 16w..16w+15; A = Q by ldmatrix.x4 (lane l addresses row l%16,
//   column 8·(l/16)); B = K rows as columns (non-transposed ldmatrix.x4: key 8·(l/16) + l%8,
//   column 8·((l/8)%2) gives b0,b1 of keys 0-7 then b0,b1 of keys 8-15).
//   C fragment of an 8-key block: lane holds rows g (c0, c1) and g+8 (c2, c3), keys 2c and 2c+1,
//   so the row max and sum reduce over the 4 lanes of a quad.
//   O += P·V: the C fragments of key blocks 2k and 2k+1, packed to bf16 pairs, are exactly the A
//   fragment of keys 16k..16k+15; B = V by ldmatrix.x4.trans (lane l addresses key l%16, column
//   8·(l/16): b0,b1 of dims 0-7 then b0,b1 of dims 8-15).
// Pipeline per key tile j (single K and V buffers): wait K_j; load V_j; S = Q·K_jᵀ, softmax;
// wait V_j; load K_{j+1}; O += P·V_j. Each load overlaps the math that does not read it.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

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

// Byte offset of (row, col) in a swizzled [rows][D] bf16 tile; col is a multiple of 8. The XOR is
// confined to the 64-column group so unrolled loops fold the group into an immediate.
template <int D>
__device__ __forceinline__ uint32_t swz(int row, int col) {
  return 2u * uint32_t(row * D + (col & ~63) + ((((col >> 3) & 7) ^ (row & 7)) << 3));
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; -inf gives 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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

// s = (this warp's 16 query rows)·Kᵀ, raw dot products.
template <int D>
__device__ __forceinline__ void scores(uint32_t sQ, uint32_t sK, int warp, int lane, float s[kBKV / 8][4]) {
#pragma unroll
  for (int n = 0; n < kBKV / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sQ + swz<D>(16 * warp + lane % 16, 16 * kk + 8 * (lane / 16)));
#pragma unroll
    for (int np = 0; np < kBKV / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, sK + swz<D>(16 * np + 8 * (lane / 16) + lane % 8, 16 * kk + 8 * ((lane / 8) % 2)));
      mma_bf16(s[2 * np], a, b[0], b[1]);
      mma_bf16(s[2 * np + 1], a, b[2], b[3]);
    }
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

// Online softmax over one key tile: turns s into p = 2^(s·scale_log2 - m) in place, rescales the
// running sums l (this lane's share) and the output o to the new row maxima m.
template <int D>
__device__ __forceinline__ void online_softmax(float s[kBKV / 8][4], float m[2], float l[2], float o[D / 8][4],
                                               float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // rows g and g+8: elements 2r and 2r+1 of each fragment
    float mx = m[r];
#pragma unroll
    for (int n = 0; n < kBKV / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float base = mx == -INFINITY ? 0.0f : mx * scale_log2;  // no visible key yet: p stays 0
    const float corr = exp2_approx(m[r] * scale_log2 - base);
    m[r] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kBKV / 8; ++n)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[n][e] = exp2_approx(fmaf(s[n][e], scale_log2, -base));
        sum += s[n][e];
      }
    l[r] = l[r] * corr + sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][2 * r] *= corr;
      o[n][2 * r + 1] *= corr;
    }
  }
}

// o += p·V for this warp's rows, p rounded to bf16.
template <int D>
__device__ __forceinline__ void accumulate_pv(const float p[kBKV / 8][4], uint32_t sV, int lane,
                                              float o[D / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBKV / 16; ++kk) {
    const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                           pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sV + swz<D>(16 * kk + lane % 16, 16 * dp + 8 * (lane / 16)));
      mma_bf16(o[2 * dp], a, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
    }
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
    scores<D>(sQ, sK, warp, lane, s);
    if (key0 + kBKV - 1 > warp_pos) causal_mask(s, key0, warp_pos + lane / 4, lane);  // diagonal tiles only
    online_softmax<D>(s, m, l, o, scale_log2);
    cp_async_wait<0>();
    __syncthreads();  // V_j has landed; every warp is done reading K_j
    if (j + 1 < n_tiles) {
      load_tile<D, kBKV>(sK, kh, kv_stride, key0 + kBKV, n_keys);
      cp_async_commit();
    }
    accumulate_pv<D>(s, sV, lane, o);
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
