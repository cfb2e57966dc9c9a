// Token selection on the device, so a decode step reads back one id instead of the logits.
#include "backend/cuda/kernels.cuh"

namespace petrel::cuda {
namespace {

__global__ void argmax_kernel(const float* logits, int n, int* out) {
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  float v = -INFINITY;
  int idx = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (logits[i] > v) {
      v = logits[i];
      idx = i;
    }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    best_v[warp] = v;
    best_i[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w)
      if (best_v[w] > v || (best_v[w] == v && best_i[w] < idx)) {
        v = best_v[w];
        idx = best_i[w];
      }
    *out = idx;
  }
}

}  // namespace

void argmax(const float* logits, int n, int* out, cudaStream_t s) {
  argmax_kernel<<<1, 1024, 0, s>>>(logits, n, out);
  PETREL_LAUNCHED("argmax");
}

}  // namespace petrel::cuda
