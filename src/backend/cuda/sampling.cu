// Token selection on the device, so a decode step reads back one id instead of the logits.
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

// (value, index) pairs: larger value wins, the lower index on ties.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ void block_argmax(float& v, int& idx) {
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  for (int o = 16; o > 0; o >>= 1)
    keep_better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < int(blockDim.x / 32); ++w) keep_better(v, idx, best_v[w], best_i[w]);
}

// Each block reduces a strided share of the logits to one candidate.
__global__ void argmax_blocks_kernel(const float* logits, int n, float* cand_v, int* cand_i) {
  float v = -INFINITY;
  int idx = n;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) keep_better(v, idx, logits[i], i);
  block_argmax(v, idx);
  if (threadIdx.x == 0) {
    cand_v[blockIdx.x] = v;
    cand_i[blockIdx.x] = idx;
  }
}

__global__ void argmax_final_kernel(const float* cand_v, const int* cand_i, int blocks, int* out) {
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) keep_better(v, idx, cand_v[b], cand_i[b]);
  block_argmax(v, idx);
  if (threadIdx.x == 0) *out = idx;
}

}  // namespace

void argmax(const float* logits, int n, float* scratch, int* out, cudaStream_t s) {
  const int blocks = std::min(kArgmaxBlocks, div_up(n, 1024));
  int* cand_i = reinterpret_cast<int*>(scratch + kArgmaxBlocks);
  argmax_blocks_kernel<<<blocks, 256, 0, s>>>(logits, n, scratch, cand_i);
  PETREL_LAUNCHED("argmax blocks");
  argmax_final_kernel<<<1, 256, 0, s>>>(scratch, cand_i, blocks, out);
  PETREL_LAUNCHED("argmax");
}

}  // namespace petrel::cuda
