// The prefill GEMM y = x · Wᵀ on tensor cores: mma.sync m16n8k16 (bf16 in, fp32 accumulate), both
// operands fed by ldmatrix from padded shared memory, filled by a multi-stage cp.async pipeline.
// 4/8-bit and FP8 weights arrive packed and are dequantised once per k-tile into a bf16 tile all
// warps share.
//
// Block tile BM x 128 (BM 128 dense, 64 = kGemmTileM grouped), k-tile 64, 8 warps as 2 (m) x 4 (n),
// each warp BM/2 x 32: BM/32 m16 fragments x 4 n8 fragments. Shared memory per stage: the
// activation tile [BM][72] bf16 and the weight tile, [128][72] bf16 or [128][32|64] packed bytes
// (plus one dequantised [128][72] bf16 tile). The 72-element pitch (144 bytes) puts the 8 rows an
// ldmatrix phase reads on 8 distinct 16-byte bank groups.
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

namespace petrel::cuda {
namespace {

constexpr int BN = 128, BK = 64, kPitch = BK + 8, kThreads = 256;

// How the weight tile reaches shared memory: bf16 rows and packed 4/8-bit or FP8 codes by cp.async;
// other quantised layouts (groups not a multiple of 32) decoded element-wise through load8.
enum class WLoad { Bf16, Q4, Q8, F8, Decode };

template <int BM, WLoad L>
struct Tile {
  static constexpr bool kPacked = L == WLoad::Q4 || L == WLoad::Q8 || L == WLoad::F8;
  static constexpr int kStages = L == WLoad::Q4 ? 4 : 3;  // as many as keep two blocks per multiprocessor
  static constexpr int kRawRow = L == WLoad::Q4 ? BK / 2 : BK;  // packed bytes of a weight row per k-tile
  static constexpr int kA = BM * kPitch * 2;
  static constexpr int kW = kPacked ? BN * kRawRow : BN * kPitch * 2;
  static constexpr int kBytes = kStages * (kA + kW) + (kPacked ? BN * kPitch * 2 : 0);
};

__device__ __forceinline__ void store8_bf16(bf16* dst, const float f[8]) {
  *reinterpret_cast<uint4*>(dst) =
      make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

// Scale and bias of a thread's half row of 32 codes: one pair, or one per 16 codes (8-bit weights
// in groups of 16: GGUF's Q6_K, Q3_K, Q2_K).
struct Affine {
  bf16 s[2], b[2];
};

template <int BM, WLoad L>
struct Gemm {
  using G = Tile<BM, L>;
  static constexpr int kS = G::kStages, MI = BM / 32;

  DeviceMatrix W;
  const void* x;
  int x_elem, M, N, K, m0, n0, tid;
  uint8_t* smem;
  const uint8_t* a_src[BM / 32];  // source rows of this thread's activation chunks (null: zero rows)

  __device__ bf16* a_tile(int stage) const { return reinterpret_cast<bf16*>(smem + stage * G::kA); }
  __device__ uint8_t* w_tile(int stage) const { return smem + kS * G::kA + stage * G::kW; }
  __device__ bf16* deq_tile() const { return reinterpret_cast<bf16*>(smem + kS * (G::kA + G::kW)); }

  // Activations: thread tid copies 16-byte chunk tid%8 of rows tid/8 + 32i.
  __device__ void load_a(int stage, int kt) const {
    const int k = kt * BK + (tid % 8) * 8;
    bf16* dst = a_tile(stage) + (tid / 8) * kPitch + (tid % 8) * 8;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const bool ok = a_src[i] != nullptr && k < K;
      if (x_elem == 2) {
        cp_async16(smem_addr(dst + 32 * i * kPitch), ok ? a_src[i] + k * 2 : x, ok);
      } else {  // fp32 activations are converted on the way, through registers
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (ok) load8_x(a_src[i], 4, k, f);
        store8_bf16(dst + 32 * i * kPitch, f);
      }
    }
  }

  // bf16 or element-wise decoded weights: 16-byte chunk tid%8 of tile rows tid/8 + 32i.
  __device__ void load_w_rows(int stage, int kt) const {
    const int k = kt * BK + (tid % 8) * 8;
    bf16* dst = reinterpret_cast<bf16*>(w_tile(stage)) + (tid / 8) * kPitch + (tid % 8) * 8;
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
      const int n = n0 + tid / 8 + 32 * i;
      const bool ok = n < N && k < K;
      if constexpr (L == WLoad::Bf16) {
        cp_async16(smem_addr(dst + 32 * i * kPitch), ok ? static_cast<const bf16*>(W.w) + int64_t(n) * K + k : W.w, ok);
      } else {
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (ok) load8(W, n, k / 8, f);
        store8_bf16(dst + 32 * i * kPitch, f);
      }
    }
  }

  // Packed weights: thread tid owns half tid%2 (32 codes) of tile row tid/2, which it also dequantises.
  __device__ int half_k(int kt) const { return kt * BK + (tid % 2) * 32; }
  __device__ bool half_ok(int kt) const { return n0 + tid / 2 < N && half_k(kt) < K; }

  __device__ void load_w_packed(int stage, int kt) const {
    constexpr int bits = L == WLoad::Q4 ? 4 : 8, chunks = bits / 4;
    const int n = n0 + tid / 2, k = half_k(kt);
    const bool ok = half_ok(kt);
    uint8_t* dst = w_tile(stage) + (tid / 2) * G::kRawRow + (tid % 2) * (G::kRawRow / 2);
    const uint8_t* src = static_cast<const uint8_t*>(W.w) + int64_t(n) * (K / 8 * bits) + k / 8 * bits;
#pragma unroll
    for (int c = 0; c < chunks; ++c) cp_async16(smem_addr(dst + 16 * c), ok ? src + 16 * c : W.w, ok);
  }

  // Scales and biases of the thread's half row (groups of 16 or a multiple of 32 columns); zero off
  // the matrix.
  __device__ Affine affine(int kt) const {
    const bf16 zero = __float2bfloat16(0.0f);
    if (!half_ok(kt)) return {{zero, zero}, {zero, zero}};
    const int64_t gi = int64_t(n0 + tid / 2) * (K / W.group) + half_k(kt) / W.group;
    const int64_t g2 = W.group == 16 ? gi + 1 : gi;
    return {{W.scales[gi], W.scales[g2]}, {W.biases[gi], W.biases[g2]}};
  }

  __device__ void dequant(int stage, Affine a) const {
    const uint4* raw = reinterpret_cast<const uint4*>(w_tile(stage) + (tid / 2) * G::kRawRow + (tid % 2) * (G::kRawRow / 2));
    uint4* dst = reinterpret_cast<uint4*>(deq_tile() + (tid / 2) * kPitch + (tid % 2) * 32);
    if constexpr (L == WLoad::Q4) {
      const uint4 q = raw[0];
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      const __nv_bfloat162 s = __bfloat162bfloat162(a.s[0]), b = __bfloat162bfloat162(a.b[0]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t out[4];
        dequant_q4(words[i], s, b, out);
        dst[i] = make_uint4(out[0], out[1], out[2], out[3]);
      }
    } else if constexpr (L == WLoad::F8) {  // 32 codes of one group (WFormat: scale + bias is its scale)
      const float s = (__bfloat162float(a.s[0]) + __bfloat162float(a.b[0])) * kE4m3Unscale;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint4 q = raw[c];
        uint32_t out[8];
        dequant_f8(q.x, s, out);
        dequant_f8(q.y, s, out + 2);
        dequant_f8(q.z, s, out + 4);
        dequant_f8(q.w, s, out + 6);
        dst[2 * c] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[2 * c + 1] = make_uint4(out[4], out[5], out[6], out[7]);
      }
    } else {
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // 16 codes each, under scale and bias pair c
        const float s = __bfloat162float(a.s[c]), b = __bfloat162float(a.b[c]);
        const uint4 q = raw[c];
        uint32_t out[8];
        dequant_q8(q.x, s, b, out);
        dequant_q8(q.y, s, b, out + 2);
        dequant_q8(q.z, s, b, out + 4);
        dequant_q8(q.w, s, b, out + 6);
        dst[2 * c] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[2 * c + 1] = make_uint4(out[4], out[5], out[6], out[7]);
      }
    }
  }

  __device__ void load_stage(int stage, int kt) const {
    load_a(stage, kt);
    if constexpr (G::kPacked) load_w_packed(stage, kt);
    else load_w_rows(stage, kt);
  }

  // One k-tile of the warp's (BM/2) x 32 block: per 16-wide k step, ldmatrix x4 gives an m16 A
  // fragment (lanes 0-15 rows 0-15 at k, lanes 16-31 the same rows at k+8) and two n8 B fragments
  // (lanes 0-7 n 0-7 at k, 8-15 n 0-7 at k+8, 16-23 n 8-15 at k, 24-31 n 8-15 at k+8).
  __device__ static void mma_tile(const bf16* a, const bf16* b, int lane, float (&acc)[MI][4][4]) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[MI][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) ldmatrix_x4(af[i], smem_addr(a + (i * 16 + lane % 16) * kPitch + kk + (lane / 16) * 8));
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t r[4];
        ldmatrix_x4(r, smem_addr(b + (jj * 16 + (lane / 16) * 8 + lane % 8) * kPitch + kk + (lane / 8 % 2) * 8));
        bf[2 * jj][0] = r[0];
        bf[2 * jj][1] = r[1];
        bf[2 * jj + 1][0] = r[2];
        bf[2 * jj + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
  }
};

// Accumulator element pair (row m, columns n, n+1) to y; `pairs`: y rows allow aligned pair stores.
__device__ __forceinline__ void store_pair(void* y, int y_elem, int64_t i, float v0, float v1, int n, int N,
                                           bool pairs) {
  if (pairs && n + 1 < N) {
    if (y_elem == 2) *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(y) + i) = __floats2bfloat162_rn(v0, v1);
    else *reinterpret_cast<float2*>(static_cast<float*>(y) + i) = make_float2(v0, v1);
    return;
  }
  if (n < N) store_act(y, y_elem, i, v0);
  if (n + 1 < N) store_act(y, y_elem, i + 1, v1);
}

// grid (m-tiles, n-tiles): m-tiles vary fastest so the blocks resident together share weight tiles.
template <int BM, WLoad L>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(DeviceMatrix w, const void* x, int64_t x_stride, int x_elem, int M, const int* row_token,
                const int* tile_expert, void* y, int64_t y_stride, int y_elem, bool pairs) {
  using Op = Gemm<BM, L>;
  constexpr int kS = Op::kS, MI = Op::MI;
  extern __shared__ uint4 smem4[];
  Op op;
  op.W = w;
  if (tile_expert) {
    const int e = tile_expert[blockIdx.x];
    if (e < 0) return;
    op.W = w.entry(e);
  }
  op.x = x;
  op.x_elem = x_elem;
  op.M = M;
  op.N = op.W.rows;
  op.K = op.W.cols;
  op.m0 = blockIdx.x * BM;
  op.n0 = blockIdx.y * BN;
  op.tid = threadIdx.x;
  op.smem = reinterpret_cast<uint8_t*>(smem4);
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int m = op.m0 + op.tid / 8 + 32 * i;
    const int src = m < M ? (row_token ? row_token[m] : m) : -1;
    op.a_src[i] = src >= 0 ? static_cast<const uint8_t*>(x) + src * x_stride * x_elem : nullptr;
  }
  const int KT = (op.K + BK - 1) / BK, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / 4, wn = warp % 4;
  float acc[MI][4][4] = {};
  Affine next{};
  if constexpr (Tile<BM, L>::kPacked) next = op.affine(0);
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < KT) op.load_stage(s, s);
    cp_async_commit();  // one group per k-tile, empty past the end, so wait counts stay fixed
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kS - 2>();
    __syncthreads();  // tile kt landed for every thread; every warp is done with tile kt-1
    const int fetch = kt + kS - 1;
    if (fetch < KT) op.load_stage(fetch % kS, fetch);
    cp_async_commit();
    const bf16* b;
    if constexpr (Tile<BM, L>::kPacked) {
      const Affine cur = next;
      if (kt + 1 < KT) next = op.affine(kt + 1);  // a k-tile ahead: its latency hides behind this one
      op.dequant(kt % kS, cur);
      __syncthreads();
      b = op.deq_tile();
    } else {
      b = reinterpret_cast<const bf16*>(op.w_tile(kt % kS));
    }
    Op::mma_tile(op.a_tile(kt % kS) + wm * (BM / 2) * kPitch, b + wn * 32 * kPitch, lane, acc);
  }
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = op.m0 + wm * (BM / 2) + i * 16 + g + 8 * h, n = op.n0 + wn * 32 + j * 8 + 2 * t4;
        if (m < M) store_pair(y, y_elem, int64_t(m) * y_stride + n, acc[i][j][2 * h], acc[i][j][2 * h + 1], n, op.N,
                              pairs);
      }
}

template <int BM, WLoad L>
void launch(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int M, const int* row_token,
            const int* tile_expert, void* y, int64_t y_stride, int y_elem, cudaStream_t s) {
  constexpr int bytes = Tile<BM, L>::kBytes;
  static bool configured = false;  // one attribute call per instantiation
  if (!configured) {
    PETREL_CUDA(cudaFuncSetAttribute(gemm_kernel<BM, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    PETREL_CUDA(cudaFuncSetAttribute(gemm_kernel<BM, L>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
    configured = true;
  }
  const bool pairs = y_stride % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * y_elem) == 0;
  const dim3 grid(div_up(M, BM), div_up(w.rows, BN));
  gemm_kernel<BM, L><<<grid, kThreads, bytes, s>>>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride,
                                                   y_elem, pairs);
}

template <int BM>
void launch_format(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int M, const int* row_token,
                   const int* tile_expert, void* y, int64_t y_stride, int y_elem, cudaStream_t s) {
  // Whole 16-byte chunks, one group per half k-tile (8-bit: or one per 16 codes).
  const bool packed = (w.group % 32 == 0 || (w.format == WFormat::Q8 && w.group == 16)) && w.cols % 32 == 0;
  if (w.format == WFormat::BF16)
    launch<BM, WLoad::Bf16>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
  else if (!packed)
    launch<BM, WLoad::Decode>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
  else if (w.format == WFormat::Q4)
    launch<BM, WLoad::Q4>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
  else if (w.format == WFormat::F8)
    launch<BM, WLoad::F8>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
  else
    launch<BM, WLoad::Q8>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
}

}  // namespace

void gemm(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int M, const int* row_token,
          const int* tile_expert, void* y, int64_t y_stride, int y_elem, cudaStream_t s) {
  static_assert(kGemmTileM == 64, "grouped tiles are the 64-row GEMM tiles");
  // Dense: 128-row tiles, unless that leaves multiprocessors idle.
  const bool tall = !tile_expert && int64_t(div_up(M, 128)) * div_up(w.rows, BN) >= sm_count();
  if (tall) launch_format<128>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
  else launch_format<64>(w, x, x_stride, x_elem, M, row_token, tile_expert, y, y_stride, y_elem, s);
}

}  // namespace petrel::cuda
