// CPU reference kernels on plain fp32 arrays. CpuBackend composes them; tests (and the CUDA tests)
// use them directly as the ground truth for each op.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace petrel::cpu {

float dot(const float* a, const float* b, int64_t n);
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// PyTorch's softplus (beta 1, threshold 20).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// y[T, rows] = x[T, cols] · Wᵀ, strides in elements.
void linear(const float* x, int64_t x_stride, int64_t T, const Matrix& w, float* y, int64_t y_stride);
// Row-wise RMSNorm over n elements.
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out);
// NeoX (half-split) rotation of the first `rotary_dim` dims of one head at position `pos`.
void rope_neox(float* head, int rotary_dim, int pos, float theta);

// Causal GQA attention for T queries at positions n_past.. over a cache of n_past+T keys.
// q/out: [T, Hq·D] (row stride q_stride/out_stride); kc/vc: [n_past+T, Hkv·D].
void attention(const float* q, int64_t q_stride, int T, int n_past, const float* kc, const float* vc, int Hq,
               int Hkv, int D, float* out, int64_t out_stride);

struct DeltaNetDims {
  int Hk = 0, Hv = 0, dk = 0, dv = 0;
};

// Depthwise causal conv (kernel K, weights [C, K]) + SiLU over x [T, C], continuing from
// `conv_state` [K-1, C] (the previous K-1 raw inputs, oldest first), which is updated.
void causal_conv_silu(const float* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state,
                      float* out);
// The gated delta rule, token by token (the ground truth). q, k: [T, Hk, dk] (q pre-scaled, both
// L2-normed); v: [T, Hv, dv]; beta, g: [T, Hv]; state: [Hv, dk, dv] fp32, updated; out: [T, Hv, dv].
void delta_rule_recurrent(const DeltaNetDims& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* state, float* out);
// The same function computed chunk by chunk in the WY form (chunk length `chunk`, normally 64).
void delta_rule_chunked(const DeltaNetDims& d, int T, const float* q, const float* k, const float* v,
                        const float* beta, const float* g, float* state, float* out, int chunk = 64);

}  // namespace petrel::cpu
