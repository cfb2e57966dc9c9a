// PTX wrappers of the tensor-core kernels (gemm.cu, linear_rows.cu, attention_prefill.cu):
// asynchronous 16-byte copies into shared memory, ldmatrix, the m16n8k16 bf16 mma with fp32
// accumulators, and the 4-bit, 8-bit, FP8 and IQ4 dequantisation that feeds it.
#pragma once
#include "backend/cuda/common.cuh"

namespace petrel::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (address `dst`), bypassing L1; zero-filled (nothing read) when !ok.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
// The first `bytes` (0 to 16) of 16 bytes global -> shared, the rest zero-filled.
__device__ __forceinline__ void cp_async16_part(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 bytes global -> shared through L1 (the smallest asynchronous copy: scatters a row into the
// mma's fragment order).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, r[i] its fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, each matrix transposed (a row-major tile read as the col-major mma operand).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 b16 matrices; lanes 8i..8i+7 (i < 2) give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// d += a·b for one m16n8k16 tile, bf16 inputs, fp32 accumulator.
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, the lower column in the low half (the mma operand order).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 8 codes of a 4-bit word (k order) -> 4 bf16 pairs s·q + b. 0x4300|q is the bf16 128+q exactly;
// nibbles i and i+4 land in one word's halves, so a byte permute restores the k order.
__device__ __forceinline__ void dequant_q4(uint32_t w, __nv_bfloat162 s, __nv_bfloat162 b, uint32_t out[4]) {
  uint32_t p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // (q_i, q_i+4)
  const uint32_t pairs[4] = {__byte_perm(p[0], p[1], 0x5410), __byte_perm(p[2], p[3], 0x5410),
                             __byte_perm(p[0], p[1], 0x7632), __byte_perm(p[2], p[3], 0x7632)};
  const __nv_bfloat162 bias128 = __floats2bfloat162_rn(128.0f, 128.0f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 q = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[i]), bias128);
    const __nv_bfloat162 v = __hfma2(q, s, b);
    out[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// 4 codes of an 8-bit word (k order) -> 2 bf16 pairs s·q + b, in fp32 (8-bit codes are not exact
// behind a bf16 magic number): 0x4B000000|q is the float 2^23 + q exactly.
__device__ __forceinline__ void dequant_q8(uint32_t w, float s, float b, uint32_t out[2]) {
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = fmaf(__int_as_float(0x4B000000u | ((w >> (8 * i)) & 255u)) - 8388608.0f, s, b);
  out[0] = pack_bf16(v[0], v[1]);
  out[1] = pack_bf16(v[2], v[3]);
}

// 4 e4m3 codes of a word (k order) -> 2 bf16 pairs e4m3(q)·scale, where `scale` is the group's
// scale (its two parts summed, WFormat::F8) times kE4m3Unscale: one rounding, to bf16.
__device__ __forceinline__ void dequant_f8(uint32_t w, float scale, uint32_t out[2]) {
  out[0] = pack_bf16(e4m3_top(w << 24) * scale, e4m3_top(w << 16) * scale);
  out[1] = pack_bf16(e4m3_top(w << 8) * scale, e4m3_top(w) * scale);
}

// 8 IQ4 codes of a word (k order) -> 4 bf16 pairs level[q]·scale (its two parts summed, WFormat::I4).
__device__ __forceinline__ void dequant_i4(uint32_t w, float scale, uint32_t out[4]) {
  const uint32_t levels[2] = {iq4_levels4(w), iq4_levels4(w >> 16)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t l = levels[i / 2] >> (16 * (i % 2));
    out[i] = pack_bf16(float(int8_t(l)) * scale, float(int8_t(l >> 8)) * scale);
  }
}

}  // namespace petrel::cuda
