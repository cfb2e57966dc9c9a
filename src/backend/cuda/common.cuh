// Shared pieces of the CUDA kernels: error checks, bf16 helpers, the device weight formats and the
// 8-wide weight decoder every kernel reads matrices through.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/fp8.h"

namespace petrel::cuda {

using bf16 = __nv_bfloat16;

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}
#define PETREL_CUDA(call) ::petrel::cuda::check_cuda((call), #call)
#define PETREL_LAUNCHED(name) ::petrel::cuda::check_cuda(cudaGetLastError(), name)

// Device weight formats: bf16, MLX-style affine 4/8-bit (unsigned codes packed little-endian into
// u32 words along a row, w = scale·q + bias per group of `group` columns, bf16 scales and biases),
// or F8: e4m3 codes (a byte each, packed as 8-bit codes are) with w = e4m3(q)·(scale + bias): the
// group's fp32 block scale split into its bf16 rounding (`scales`) and the remainder (`biases`), so
// that everything that moves a group's scale and bias moves an FP8 scale unchanged and exactly
// (16 bits of mantissa against fp32's 24: an error of 2^-17 at most); or I4: GGUF's IQ4_NL and
// IQ4_XS, 4-bit codes (packed as 4-bit codes are) through their 16 levels, w = kIq4Levels[q]·(scale
// + bias), the group's scale split as F8's.
enum class WFormat : int { BF16 = 0, Q4 = 1, Q8 = 2, F8 = 3, I4 = 4 };

// The IQ4 levels (kIq4Levels) of the 4 codes in the low 16 bits of q (code i in bits 4i..4i+3) as 4
// int8 bytes, code i's in byte i: two byte permutes pick each code's level among the table's first
// and last 8 (its low 3 bits select a byte of two words), a third keeps the one its bit 3 names.
__device__ __forceinline__ uint32_t iq4_levels4(uint32_t q) {
  constexpr uint32_t t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;  // kIq4Levels
  const uint32_t low3 = q & 0x7777u;  // selector nibbles of 0-7: no sign-replicating mode
  const uint32_t first = __byte_perm(t0, t1, low3), last = __byte_perm(t2, t3, low3);
  return __byte_perm(first, last, 0x3210u | ((q & 0x8888u) >> 1));  // byte i of first, or (4 + i) of last
}

// 2^120: e4m3_top(w) times this is the value of the code in w's top byte.
constexpr float kE4m3Unscale = kE4m3TopUnscale;

// The e4m3 code in the top byte of w, times 2^-120 (e4m3_top_bits; exact: kernels are built
// without flushing denormals). A scale must stay below 2^8 to be multiplied by kE4m3Unscale in
// fp32; block scales of real weights are far smaller.
__device__ __forceinline__ float e4m3_top(uint32_t w) { return __uint_as_float(e4m3_top_bits(w)); }

// A [rows, cols] matrix in device memory, or a stack of `count` of them (experts) at fixed strides.
struct DeviceMatrix {
  WFormat format = WFormat::BF16;
  int rows = 0, cols = 0, group = 64, count = 1;
  const void* w = nullptr;  // bf16 elements or u32 words
  const bf16* scales = nullptr;
  const bf16* biases = nullptr;
  int64_t w_stride = 0;  // between stacked matrices, in bf16 elements (BF16) or u32 words (Q4/Q8)
  int64_t s_stride = 0;  // between stacked matrices' scales/biases, in elements

  __host__ __device__ int bits() const { return format == WFormat::Q4 || format == WFormat::I4 ? 4 : 8; }
  // The matrix of stack entry e.
  __host__ __device__ DeviceMatrix entry(int e) const {
    DeviceMatrix m = *this;
    m.count = 1;
    if (format == WFormat::BF16) {
      m.w = static_cast<const bf16*>(w) + e * w_stride;
    } else {
      m.w = static_cast<const uint32_t*>(w) + e * w_stride;
      m.scales = scales + e * s_stride;
      m.biases = biases + e * s_stride;
    }
    return m;
  }
  size_t bytes() const;
};

// Decodes the 8 weights at columns [8·c8, 8·c8+8) of `row` into fp32.
__device__ __forceinline__ void load8(const DeviceMatrix& m, int64_t row, int c8, float out[8]) {
  if (m.format == WFormat::BF16) {
    const uint4 v = reinterpret_cast<const uint4*>(static_cast<const bf16*>(m.w) + row * m.cols)[c8];
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(p[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
    return;
  }
  const int64_t gi = row * (m.cols / m.group) + (c8 * 8) / m.group;
  const float s = __bfloat162float(m.scales[gi]), b = __bfloat162float(m.biases[gi]);
  if (m.format == WFormat::Q4) {
    const uint32_t q = static_cast<const uint32_t*>(m.w)[row * (m.cols / 8) + c8];
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = s * float((q >> (4 * i)) & 15u) + b;
  } else if (m.format == WFormat::I4) {
    const uint32_t q = static_cast<const uint32_t*>(m.w)[row * (m.cols / 8) + c8];
    const float scale = s + b;  // the scale's two parts (WFormat)
    const uint32_t levels[2] = {iq4_levels4(q), iq4_levels4(q >> 16)};
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = scale * float(int8_t(levels[i / 4] >> (8 * (i % 4))));
  } else if (m.format == WFormat::F8) {
    const uint2 q = reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(m.w) + row * (m.cols / 4))[c8];
    const float scale = (s + b) * kE4m3Unscale;  // the scale's two parts (WFormat)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[i] = e4m3_top(q.x << (24 - 8 * i)) * scale;
      out[4 + i] = e4m3_top(q.y << (24 - 8 * i)) * scale;
    }
  } else {
    const uint2 q = reinterpret_cast<const uint2*>(static_cast<const uint32_t*>(m.w) + row * (m.cols / 4))[c8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[i] = s * float((q.x >> (8 * i)) & 255u) + b;
      out[4 + i] = s * float((q.y >> (8 * i)) & 255u) + b;
    }
  }
}

// The 16-byte-load path for 4-bit rows: one uint4 holds 32 weights of one group. Usable when
// cols and group are multiples of 32 (every released shape; tiny fixtures may fall back to load8).
__host__ __device__ inline bool q4_wide(const DeviceMatrix& m) {
  return m.format == WFormat::Q4 && m.cols % 32 == 0 && m.group % 32 == 0;
}

// Codes (0..15) of weights [32·c32, 32·c32 + 32) of `row`, with their group's scale and bias.
__device__ __forceinline__ void load32_q4(const DeviceMatrix& m, int64_t row, int c32, uint32_t words[4], float* scale,
                                          float* bias) {
  const uint4 q = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(m.w) + row * (m.cols / 8))[c32];
  words[0] = q.x;
  words[1] = q.y;
  words[2] = q.z;
  words[3] = q.w;
  const int64_t gi = row * (m.cols / m.group) + (int64_t(c32) * 32) / m.group;
  *scale = __bfloat162float(m.scales[gi]);
  *bias = __bfloat162float(m.biases[gi]);
}

// 8 consecutive bf16 activations as fp32 (16-byte load; the pointer must be 16-byte aligned).
__device__ __forceinline__ void load8_act(const bf16* p, float out[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// 8 consecutive activations of either element type (2: bf16, 4: fp32) starting at element i.
__device__ __forceinline__ void load8_x(const void* x, int elem, int64_t i, float out[8]) {
  if (elem == 2) return load8_act(static_cast<const bf16*>(x) + i, out);
  const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + i);
  const float4 a = p[0], b = p[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
  out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// Σ w·x over 32 weights given as 4-bit codes: scale·Σ q·x + bias·Σ x (two FMAs per weight saved).
__device__ __forceinline__ float dot32_q4(const uint32_t words[4], float scale, float bias, const void* x, int elem,
                                          int64_t i) {
  float qx = 0.0f, sx = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    float xv[8];
    load8_x(x, elem, i + 8 * w, xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      qx += float((words[w] >> (4 * j)) & 15u) * xv[j];
      sx += xv[j];
    }
  }
  return scale * qx + bias * sx;
}

// Floats as unsigned numbers of the same order, -0 as +0 (they compare equal); never 0 for a float.
__device__ __forceinline__ unsigned ordered_bits(float f) {
  const unsigned b = __float_as_uint(f == 0.0f ? 0.0f : f);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Four values' warp sums at once, in warp_sum's butterfly order (so each total is bit for bit
// warp_sum's): lane l ends with the total of v[((l >> 4) & 1) * 2 + ((l >> 3) & 1)]. Seven shuffles
// for four sums instead of twenty.
__device__ __forceinline__ float warp_sum4(const float (&v)[4]) {
  const int lane = threadIdx.x % 32;
  const bool up16 = lane & 16, up8 = lane & 8;
  const float k0 = (up16 ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, up16 ? v[0] : v[2], 16);
  const float k1 = (up16 ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, up16 ? v[1] : v[3], 16);
  float k = (up8 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, up8 ? k0 : k1, 8);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
  return k;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Argmax pairs (value, index): the larger value wins, the lower index on ties. A NaN never wins, so
// a reduction started from (-inf, n) ends there only where every value is NaN.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}
// Whole block (whole warps): thread 0 ends with the block's best pair.
__device__ inline void block_argmax(float& v, int& idx) {
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
constexpr int kBlockArgmaxSmem = 32 * (4 + 4);  // block_argmax's shared memory

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + __expf(-x)); }

// Stores to an activation of either element type (bf16 activations, fp32 logits).
__device__ __forceinline__ void store_act(void* base, int elem_size, int64_t i, float v) {
  if (elem_size == 2) static_cast<bf16*>(base)[i] = __float2bfloat16(v);
  else static_cast<float*>(base)[i] = v;
}
__device__ __forceinline__ float load_act(const void* base, int elem_size, int64_t i) {
  return elem_size == 2 ? __bfloat162float(static_cast<const bf16*>(base)[i]) : static_cast<const float*>(base)[i];
}

// Dynamic shared memory beside which no second such block fits: a grid of one wave asks for at
// least this, so that blocks launched early (PDL) beside a predecessor still take one SM each,
// while leaving ~110 KB for a successor's block.
constexpr size_t kOneBlockPerSmSmem = 116 * 1024;

// Programmatic dependent launch (PDL). A kernel started with launch_pdl may begin while the kernel
// before it in the stream still runs: everything before pdl_wait() must touch only memory no
// earlier kernel writes (weights), and pdl_wait() returns once the earlier kernels have finished
// and their writes are visible. pdl_launch_dependents() lets the next kernel start early (its
// blocks then take free room on the multiprocessors and wait there). Both are no-ops on a kernel
// launched the ordinary way, and before Hopper.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The usual prologue of a decode kernel: let the next kernel start, then wait for the previous one.
__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}

// Starts pulling [p, p + bytes) into L2 without waiting for it (Hopper's bulk prefetch; a hint,
// nothing on older chips). The range is widened to 16-byte bounds, which stay inside the allocation.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~uintptr_t(15);
  for (uintptr_t a = b; a < e; a += uintptr_t(1) << 20) {  // at most 1 MB a request
    const uint32_t n = uint32_t(e - a < (uintptr_t(1) << 20) ? e - a : uintptr_t(1) << 20);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
  }
#endif
}

// Whole block: asks L1 for `rows` rows of `bytes` bytes each, `stride` bytes apart (a request per
// 128-byte line, nothing waits for it), so that loads issued after another round trip find them
// there rather than making a round trip of their own.
__device__ __forceinline__ void prefetch_l1_rows(const void* p, int rows, int64_t stride, int bytes) {
  const char* c = static_cast<const char*>(p);
  const int lines = (bytes + 127) / 128;
  for (int i = threadIdx.x; i < rows * lines; i += blockDim.x)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(c + (i / lines) * stride + (i % lines) * 128));
}

// Multiprocessors of the current device (cached).
int sm_count();

// The virtual architecture (80, 90, ...) the kernels the device runs were compiled from: 90 where
// the sm_90a binary loads, the portable PTX's 80 where it had to be compiled for the device.
int loaded_ptx_version();

// True on Hopper and later running the sm_90a binary, where kernels may overlap through PDL
// (cached for the current device). A later chip that runs the portable PTX has no pdl_wait()
// compiled into its kernels, so they must not overlap there.
inline bool pdl_supported() {
  static const bool yes = [] {
    int device = 0, major = 0;
    PETREL_CUDA(cudaGetDevice(&device));
    PETREL_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9 && loaded_ptx_version() >= 90;
  }();
  return yes;
}

// Launches kernel K with PDL allowed (see pdl_wait): K must call pdl_wait() before it reads what
// earlier kernels write or writes what they read. Before Hopper it is an ordinary launch.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_supported() ? 1 : 0;
  PETREL_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

__host__ __device__ inline int div_up(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// Lets kernel K launch with `bytes` of dynamic shared memory (beyond 48 KB needs an opt-in); the
// attribute is set once per kernel and raised only when a larger size comes.
template <auto K>
void allow_dynamic_smem(size_t bytes) {
  static size_t allowed = 48 * 1024;
  if (bytes <= allowed) return;
  PETREL_CUDA(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  allowed = bytes;
}

}  // namespace petrel::cuda
