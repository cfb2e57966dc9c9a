// Causal GQA attention over a bf16 KV cache, split-K over the context (flash-decoding style):
// each block reduces one key range with an online softmax, a second kernel merges the ranges.
// Decode and shapes the tensor-core prefill kernel (attention_prefill.cu) does not cover.
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxSplits = 64;  // key ranges the combine kernel merges

// grid (T): row t at *pos0 + t of kc, vc; with rows.pos, at rows.pos[t] of its own caches.
__global__ void kv_append_kernel(const bf16* k, const bf16* v, int64_t stride, int width, bf16* kc, bf16* vc,
                                 const int* pos0, KvRows rows) {
  pdl_enter();
  const int t = blockIdx.x;
  if (rows.pos) {
    kc = rows.k[t];
    vc = rows.v[t];
  }
  const int64_t dst = int64_t(rows.pos ? rows.pos[t] : *pos0 + t) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    kc[dst + i] = k[t * stride + i];
    vc[dst + i] = v[t * stride + i];
  }
}

// grid (T, Hq, splits). Partial record: [m, l, acc[D]] (unnormalised accumulator). Query t is at
// *pos0 + t of kc, vc; with rows.pos (a batched step), at rows.pos[t] of its own caches.
template <int PER>  // D / 32 elements per lane
__global__ void attention_partial_kernel(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, int Hq,
                                         int Hkv, const int* pos0, KvRows rows, float* partial) {
  pdl_enter();
  constexpr int D = PER * 32;
  const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = h / (Hq / Hkv);
  if (rows.pos) {
    kc = rows.k[t];
    vc = rows.v[t];
  }
  const int n_keys = (rows.pos ? rows.pos[t] : *pos0 + t) + 1;  // causal: keys 0..pos
  const int per_split = (n_keys + splits - 1) / splits;
  const int begin = split * per_split, end = min(n_keys, begin + per_split);
  const float scale = rsqrtf(float(D));
  float qv[PER], acc[PER];
  const bf16* qp = q + t * q_stride + int64_t(h) * D;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    qv[i] = __bfloat162float(qp[lane + 32 * i]) * scale;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t kv_stride = int64_t(Hkv) * D;
  for (int s = begin + warp; s < end; s += kWarps) {
    const bf16* kp = kc + s * kv_stride + int64_t(kvh) * D;
    float dotp = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) dotp += qv[i] * __bfloat162float(kp[lane + 32 * i]);
    const float score = warp_sum(dotp);
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new), p = __expf(score - m_new);
    l = l * corr + p;
    const bf16* vp = vc + s * kv_stride + int64_t(kvh) * D;
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] = acc[i] * corr + p * __bfloat162float(vp[lane + 32 * i]);
    m = m_new;
  }
  // Merge the warps of this block.
  __shared__ float sm_m[kWarps], sm_l[kWarps], sm_acc[kWarps][D];
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w]);
  float L = 0.0f;
  float out[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) out[i] = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    const float c = sm_m[w] == -INFINITY ? 0.0f : __expf(sm_m[w] - M);
    L += sm_l[w] * c;
#pragma unroll
    for (int i = 0; i < PER; ++i) out[i] += sm_acc[w][lane + 32 * i] * c;
  }
  float* rec = partial + ((int64_t(t) * Hq + h) * splits + split) * (D + 2);
  if (lane == 0) {
    rec[0] = M;
    rec[1] = L;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) rec[2 + lane + 32 * i] = out[i];
}

constexpr int kCombineGroup = 16;  // key ranges whose records one combine thread loads at once

// grid (T, Hq), a thread per head dimension: merges the splits, normalises, applies the sigmoid
// output gate. Latency decides its time: a thread issues the loads of kCombineGroup records' (m,
// l, its element) together, one round trip per group (one in all for up to 16 splits).
template <int PER>
__global__ void attention_combine_kernel(const float* partial, int Hq, int splits, const bf16* gate,
                                         int64_t gate_stride, bf16* out, int64_t out_stride) {
  pdl_enter();
  constexpr int D = PER * 32;
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const float* base = partial + (int64_t(t) * Hq + h) * splits * (D + 2);
  const int64_t col = int64_t(h) * D + i;
  const float g = gate ? sigmoidf_(__bfloat162float(gate[t * gate_stride + col])) : 1.0f;
  float M = -INFINITY, L = 0.0f, acc = 0.0f;  // running max, weight sum and element over the groups so far
  for (int s0 = 0; s0 < splits; s0 += kCombineGroup) {
    float m[kCombineGroup], l[kCombineGroup], a[kCombineGroup];
#pragma unroll
    for (int u = 0; u < kCombineGroup; ++u) {
      const float* rec = base + (s0 + u) * (D + 2);
      const bool in = s0 + u < splits;
      m[u] = in ? rec[0] : -INFINITY;
      l[u] = in ? rec[1] : 0.0f;
      a[u] = in ? rec[2 + i] : 0.0f;
    }
    float M_new = M;
#pragma unroll
    for (int u = 0; u < kCombineGroup; ++u) M_new = fmaxf(M_new, m[u]);
    const float carry = M == -INFINITY ? 0.0f : __expf(M - M_new);
    L *= carry;
    acc *= carry;
#pragma unroll
    for (int u = 0; u < kCombineGroup; ++u) {
      const float c = m[u] == -INFINITY ? 0.0f : __expf(m[u] - M_new);  // empty key ranges weigh nothing
      L += l[u] * c;
      acc += a[u] * c;
    }
    M = M_new;
  }
  out[t * out_stride + col] = __float2bfloat16(acc / L * g);
}

template <int PER>
void launch(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, const int* pos0,
            const KvRows& rows, int splits, float* partial, const bf16* gate, int64_t gate_stride, bf16* out,
            int64_t out_stride, cudaStream_t s) {
  launch_pdl(attention_partial_kernel<PER>, dim3(T, Hq, splits), 32 * kWarps, 0, s, q, q_stride, kc, vc, Hq, Hkv, pos0, rows, partial);
  PETREL_LAUNCHED("attention_partial");
  launch_pdl(attention_combine_kernel<PER>, dim3(T, Hq), 32 * PER, 0, s, partial, Hq, splits, gate, gate_stride, out, out_stride);
  PETREL_LAUNCHED("attention_combine");
}

// The split-K kernels for head_dim D.
void split_k(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
             const int* pos0, const KvRows& rows, int splits, float* partial, const bf16* gate, int64_t gate_stride,
             bf16* out, int64_t out_stride, cudaStream_t s) {
  check(splits >= 1 && splits <= kMaxSplits, "CUDA attention: " + std::to_string(splits) + " key ranges (1..64)");
  switch (D) {
    case 32: return launch<1>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, rows, splits, partial, gate, gate_stride, out, out_stride, s);
    case 64: return launch<2>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, rows, splits, partial, gate, gate_stride, out, out_stride, s);
    case 128: return launch<4>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, rows, splits, partial, gate, gate_stride, out, out_stride, s);
    case 256: return launch<8>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, rows, splits, partial, gate, gate_stride, out, out_stride, s);
  }
  throw Error("CUDA attention: head_dim " + std::to_string(D) + " is not supported (32, 64, 128 or 256)");
}

}  // namespace

void kv_append(const bf16* k, const bf16* v, int64_t stride, int T, int width, bf16* kc, bf16* vc, const int* pos0,
               cudaStream_t s) {
  launch_pdl(kv_append_kernel, T, 256, 0, s, k, v, stride, width, kc, vc, pos0, KvRows{});
  PETREL_LAUNCHED("kv_append");
}

void kv_append_rows(const bf16* k, const bf16* v, int64_t stride, int B, int width, const KvRows& rows,
                    cudaStream_t s) {
  check(rows.k && rows.v && rows.pos, "CUDA kv_append_rows: needs cache tables and positions");
  launch_pdl(kv_append_kernel, B, 256, 0, s, k, v, stride, width, nullptr, nullptr, nullptr, rows);
  PETREL_LAUNCHED("kv_append");
}

void attention(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
               const int* pos0, int splits, float* partial, const bf16* gate, int64_t gate_stride, bf16* out,
               int64_t out_stride, cudaStream_t s) {
  if (attention_prefill(q, q_stride, T, kc, vc, Hq, Hkv, D, pos0, gate, gate_stride, out, out_stride, s)) return;
  split_k(q, q_stride, T, kc, vc, Hq, Hkv, D, pos0, KvRows{}, splits, partial, gate, gate_stride, out, out_stride, s);
}

void attention_rows(const bf16* q, int64_t q_stride, int B, const KvRows& rows, int Hq, int Hkv, int D, int splits,
                    float* partial, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                    cudaStream_t s) {
  check(rows.k && rows.v && rows.pos, "CUDA attention_rows: needs cache tables and positions");
  split_k(q, q_stride, B, nullptr, nullptr, Hq, Hkv, D, nullptr, rows, splits, partial, gate, gate_stride, out,
          out_stride, s);
}

}  // namespace petrel::cuda
