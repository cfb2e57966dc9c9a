// Device-side weight preparation: MLX-scheme affine quantisation (--quantize int4) and random
// fills for synthetic benchmark models.
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

// One thread per group, exactly the MLX CPU algorithm (edge value kept exact, fp32 scale and bias,
// stored as bf16).
__global__ void quantize_kernel(const bf16* w, int64_t groups, int group, int bits, uint32_t* q, bf16* scales,
                                bf16* biases) {
  const int64_t gidx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gidx >= groups) return;
  const bf16* p = w + gidx * group;
  float w_min = INFINITY, w_max = -INFINITY;
  for (int i = 0; i < group; ++i) {
    const float v = __bfloat162float(p[i]);
    w_min = fminf(w_min, v);
    w_max = fmaxf(w_max, v);
  }
  const float n_bins = float((1 << bits) - 1);
  const bool mask = fabsf(w_min) > fabsf(w_max);
  float scale = fmaxf((w_max - w_min) / n_bins, 1e-7f);
  scale = mask ? scale : -scale;
  const float edge = mask ? w_min : w_max;
  const float q0 = rintf(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  scales[gidx] = __float2bfloat16(scale);
  biases[gidx] = __float2bfloat16(bias);
  const int per_word = 32 / bits;
  uint32_t* out = q + gidx * group / per_word;
  for (int wi = 0; wi < group / per_word; ++wi) {
    uint32_t word = 0;
    for (int j = 0; j < per_word; ++j) {
      const float v = __bfloat162float(p[wi * per_word + j]);
      const float code = fminf(fmaxf(rintf((v - bias) / scale), 0.0f), n_bins);
      word |= uint32_t(code) << (bits * j);
    }
    out[wi] = word;
  }
}

__device__ uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

__global__ void random_bf16_kernel(bf16* p, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull)) >> 40) / float(1 << 24);
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void random_u32_kernel(uint32_t* p, int64_t n, uint64_t seed, uint32_t mask) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(mix64(seed ^ (uint64_t(i) * 0x9e3779b97f4a7c15ull))) & mask;
}

}  // namespace

void quantize_affine(const bf16* w, int rows, int cols, int bits, int group, uint32_t* q, bf16* scales, bf16* biases,
                     cudaStream_t s) {
  const int64_t groups = int64_t(rows) * (cols / group);
  quantize_kernel<<<div_up(groups, 256), 256, 0, s>>>(w, groups, group, bits, q, scales, biases);
  PETREL_LAUNCHED("quantize_affine");
}

void fill_random_bf16(bf16* p, int64_t n, float scale, uint64_t seed, cudaStream_t s) {
  random_bf16_kernel<<<1024, 256, 0, s>>>(p, n, scale, seed);
  PETREL_LAUNCHED("fill_random_bf16");
}

void fill_random_u32(uint32_t* p, int64_t n, uint64_t seed, cudaStream_t s, uint32_t mask) {
  random_u32_kernel<<<1024, 256, 0, s>>>(p, n, seed, mask);
  PETREL_LAUNCHED("fill_random_u32");
}

}  // namespace petrel::cuda
