// Element-wise and per-row kernels: embedding gather, RMSNorm, residual add, q/k norm + RoPE, SwiGLU.
#include <algorithm>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/norm_rope.cuh"

namespace petrel::cuda {
namespace {

// ids and pos.from may be mapped pinned memory the host rewrote since the last replay: volatile
// loads fetch them anew, from one thread (a read from every warp queued as many PCIe round trips:
// 8.9 us for the kernel against 5.8 with four warps), both issued before either is used. A thread
// per 8-column chunk (up to 1024): the row comes in one round trip.
__global__ void embed_kernel(DeviceMatrix table, const int* ids, PosCopy pos, void* out, int64_t out_stride,
                             int out_elem) {
  pdl_enter();
  __shared__ int row_id;
  const int t = blockIdx.x;
  if (threadIdx.x == 0) {
    const bool copies_pos = pos.from && t == 0;
    const int id = *static_cast<const volatile int*>(ids + t);
    const int position = copies_pos ? *static_cast<const volatile int*>(pos.from) : 0;
    row_id = id;
    if (copies_pos) *pos.to = position;
  }
  __syncthreads();
  const int64_t row = row_id;
  for (int c8 = threadIdx.x; c8 < table.cols / 8; c8 += blockDim.x) {
    float f[8];
    load8(table, row, c8, f);
#pragma unroll
    for (int i = 0; i < 8; ++i) store_act(out, out_elem, t * out_stride + c8 * 8 + i, f[i]);
  }
}

// Sum over a block of any size that is a multiple of 32.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < warps; ++i) total += partial[i];
  return total;
}

__global__ void rms_norm_kernel(const void* x, int64_t x_stride, int x_elem, const float* w, int n, float eps,
                                void* out, int64_t out_stride, int out_elem) {
  pdl_enter();
  const int64_t base = blockIdx.x * x_stride;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load_act(x, x_elem, base + i);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(n) + eps);
  const int64_t obase = blockIdx.x * out_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) store_act(out, out_elem, obase + i, load_act(x, x_elem, base + i) * inv * w[i]);
}

__global__ void add_kernel(void* h, int64_t h_stride, int h_elem, const bf16* a, int64_t a_stride, int n) {
  pdl_enter();
  const bf16* ar = a + blockIdx.x * a_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t j = blockIdx.x * h_stride + i;
    store_act(h, h_elem, j, load_act(h, h_elem, j) + __bfloat162float(ar[i]));
  }
}

// The heads one qk_norm_rope launch normalises and rotates: q's, then (k.heads > 0) k's.
struct NormRopeHeads {
  bf16* x;
  int64_t stride;
  int heads;
  const float* w;
};

constexpr int kNormRopeWarps = 4;  // heads per qk_norm_rope block

// One warp per (token, head); D <= 512. grid.y: q_blocks blocks of q's heads, then k's. Token t is
// at *pos + t, or at pos[t] where per_row. Latency decides its time: the head, its norm weights and
// the position load in one round trip; the normed head waits in shared memory for the rotation's
// pairs, and the head is written once.
__global__ void qk_norm_rope_kernel(NormRopeHeads q, NormRopeHeads k, int q_blocks, int D, float eps, int rotary,
                                    float theta, const int* pos, bool per_row) {
  __shared__ float heads[kNormRopeWarps][32 * kNormRopeMaxPer];
  pdl_enter();
  const bool is_k = int(blockIdx.y) >= q_blocks;
  const NormRopeHeads m = is_k ? k : q;
  const int warp = int(threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x, h = (int(blockIdx.y) - (is_k ? q_blocks : 0)) * kNormRopeWarps + warp;
  if (h >= m.heads) return;
  bf16* p = m.x + t * m.stride + int64_t(h) * D;
  float* hv = heads[warp];
  norm_rope_head(p, m.w, D, eps, rotary, theta, float(per_row ? pos[t] : *pos + t), hv);
  for (int i = lane; i < D; i += 32) p[i] = __float2bfloat16(hv[i]);
}

__global__ void silu_mul_kernel(const bf16* g, const bf16* u, int64_t stride, int T, int n, bf16* out,
                                int64_t out_stride) {
  pdl_enter();
  const int64_t total = int64_t(T) * n;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = x / n, i = x % n;
    const float gv = __bfloat162float(g[t * stride + i]), uv = __bfloat162float(u[t * stride + i]);
    out[t * out_stride + i] = __float2bfloat16(siluf_(gv) * uv);
  }
}

// q's heads then k's in one launch; token t at *pos + t, or at pos[t] where per_row.
void launch_qk_norm_rope(bf16* q, int64_t q_stride, int Hq, const float* q_w, bf16* k, int64_t k_stride, int Hkv,
                         const float* k_w, int T, int D, float eps, int rotary, float theta, const int* pos,
                         bool per_row, cudaStream_t s) {
  check(D % 32 == 0 && D <= 512, "CUDA qk_norm_rope: head_dim " + std::to_string(D) + " must be a multiple of 32, <= 512");
  const int q_blocks = div_up(Hq, kNormRopeWarps), blocks = q_blocks + div_up(Hkv, kNormRopeWarps);
  launch_pdl(qk_norm_rope_kernel, dim3(T, blocks), 32 * kNormRopeWarps, 0, s, NormRopeHeads{q, q_stride, Hq, q_w},
             NormRopeHeads{k, k_stride, Hkv, k_w}, q_blocks, D, eps, rotary, theta, pos, per_row);
  PETREL_LAUNCHED("qk_norm_rope");
}

}  // namespace

void embed(const DeviceMatrix& table, const int* ids, int T, void* out, int64_t out_stride, int out_elem,
           cudaStream_t s, PosCopy pos) {
  launch_pdl(embed_kernel, T, std::clamp(div_up(table.cols / 8, 32) * 32, 32, 1024), 0, s, table, ids, pos, out,
             out_stride, out_elem);
  PETREL_LAUNCHED("embed");
}

void rms_norm(const void* x, int64_t x_stride, int x_elem, const float* w, int T, int n, float eps, void* out,
              int64_t out_stride, int out_elem, cudaStream_t s) {
  launch_pdl(rms_norm_kernel, T, 256, 0, s, x, x_stride, x_elem, w, n, eps, out, out_stride, out_elem);
  PETREL_LAUNCHED("rms_norm");
}

void add_inplace(void* h, int64_t h_stride, int h_elem, const bf16* a, int64_t a_stride, int T, int n,
                 cudaStream_t s) {
  launch_pdl(add_kernel, T, 256, 0, s, h, h_stride, h_elem, a, a_stride, n);
  PETREL_LAUNCHED("add");
}


void qk_norm_rope(bf16* q, int64_t q_stride, int Hq, const float* q_w, bf16* k, int64_t k_stride, int Hkv,
                  const float* k_w, int T, int D, float eps, int rotary, float theta, const int* pos0,
                  cudaStream_t s) {
  launch_qk_norm_rope(q, q_stride, Hq, q_w, k, k_stride, Hkv, k_w, T, D, eps, rotary, theta, pos0, false, s);
}

void qk_norm_rope_rows(bf16* q, int64_t q_stride, int Hq, const float* q_w, bf16* k, int64_t k_stride, int Hkv,
                       const float* k_w, int T, int D, float eps, int rotary, float theta, const int* pos,
                       cudaStream_t s) {
  launch_qk_norm_rope(q, q_stride, Hq, q_w, k, k_stride, Hkv, k_w, T, D, eps, rotary, theta, pos, true, s);
}

void silu_mul(const bf16* g, const bf16* u, int64_t stride, int T, int n, bf16* out, int64_t out_stride, cudaStream_t s) {
  launch_pdl(silu_mul_kernel, dim3(std::min(4096, div_up(int64_t(T) * n, 256))), dim3(256), 0, s, g, u, stride, T, n, out,
             out_stride);
  PETREL_LAUNCHED("silu_mul");
}

}  // namespace petrel::cuda
