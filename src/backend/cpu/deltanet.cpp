// CPU Gated DeltaNet: causal conv, the recurrent delta rule, and the chunked (WY) form.
// All in fp32; model-spec.md §2.5 and §3 give the math these follow.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernels.h"

namespace petrel::cpu {

void causal_conv_silu(const float* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state,
                      float* out) {
  const int hist = K - 1;
#pragma omp parallel for schedule(static) if (int64_t(T) * C * K >= (1 << 16))
  for (int c = 0; c < C; ++c) {
    // window holds the K-1 previous inputs then the current one, oldest first.
    float window[16];
    for (int j = 0; j < hist; ++j) window[j] = conv_state[int64_t(j) * C + c];
    const float* wc = w + int64_t(c) * K;
    for (int t = 0; t < T; ++t) {
      window[hist] = x[t * x_stride + c];
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) acc += wc[j] * window[j];
      out[int64_t(t) * C + c] = silu(acc);
      for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
    }
    for (int j = 0; j < hist; ++j) conv_state[int64_t(j) * C + c] = window[j];
  }
}

void delta_rule_recurrent(const DeltaNetDims& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* state, float* out) {
  const int r = d.Hv / d.Hk;
#pragma omp parallel for schedule(static) if (int64_t(T) * d.Hv * d.dk * d.dv >= (1 << 16))
  for (int j = 0; j < d.Hv; ++j) {
    const int kh = j / r;  // HF order: consecutive value heads share a key head
    float* S = state + int64_t(j) * d.dk * d.dv;
    std::vector<float> m(d.dv);
    for (int t = 0; t < T; ++t) {
      const float* kt = k + (int64_t(t) * d.Hk + kh) * d.dk;
      const float* qt = q + (int64_t(t) * d.Hk + kh) * d.dk;
      const float* vt = v + (int64_t(t) * d.Hv + j) * d.dv;
      const float decay = std::exp(g[int64_t(t) * d.Hv + j]);
      const float b = beta[int64_t(t) * d.Hv + j];
      for (int i = 0; i < d.dk * d.dv; ++i) S[i] *= decay;
      std::fill(m.begin(), m.end(), 0.0f);
      for (int i = 0; i < d.dk; ++i)
        for (int e = 0; e < d.dv; ++e) m[e] += S[i * d.dv + e] * kt[i];
      for (int e = 0; e < d.dv; ++e) m[e] = b * (vt[e] - m[e]);  // δ
      for (int i = 0; i < d.dk; ++i)
        for (int e = 0; e < d.dv; ++e) S[i * d.dv + e] += kt[i] * m[e];
      float* ot = out + (int64_t(t) * d.Hv + j) * d.dv;
      for (int e = 0; e < d.dv; ++e) ot[e] = 0.0f;
      for (int i = 0; i < d.dk; ++i)
        for (int e = 0; e < d.dv; ++e) ot[e] += S[i * d.dv + e] * qt[i];
    }
  }
}

namespace {

// One chunk of one value head: L tokens, entering state S (dk x dv), updated in place.
struct ChunkScratch {
  std::vector<float> gamma, A, U, W, Delta;
  void resize(int L, int dk, int dv) {
    gamma.resize(L);
    A.resize(size_t(L) * L);
    U.resize(size_t(L) * dv);
    W.resize(size_t(L) * dk);
    Delta.resize(size_t(L) * dv);
  }
};

void chunk_step(const DeltaNetDims& d, int L, const float* const* qr, const float* const* kr, const float* const* vr,
                const float* betar, const float* gr, float* S, float* const* outr, ChunkScratch& s) {
  const int dk = d.dk, dv = d.dv;
  s.resize(L, dk, dv);
  // 1. In-chunk cumulative log decay γ.
  float acc = 0.0f;
  for (int t = 0; t < L; ++t) s.gamma[t] = (acc += gr[t]);
  // 2-3. A[t][u] = β_t (k_t·k_u) e^{γ_t − γ_u} for t > u; the exponent is a difference, never a product.
  for (int t = 0; t < L; ++t)
    for (int u = 0; u < t; ++u)
      s.A[size_t(t) * L + u] = betar[t] * dot(kr[t], kr[u], dk) * std::exp(s.gamma[t] - s.gamma[u]);
  // 4-5. Forward substitution with (I + A): U = (I+A)⁻¹ diag(β) V, W = (I+A)⁻¹ diag(β e^γ) K.
  for (int t = 0; t < L; ++t) {
    float* Ut = &s.U[size_t(t) * dv];
    float* Wt = &s.W[size_t(t) * dk];
    const float bg = betar[t] * std::exp(s.gamma[t]);
    for (int e = 0; e < dv; ++e) Ut[e] = betar[t] * vr[t][e];
    for (int i = 0; i < dk; ++i) Wt[i] = bg * kr[t][i];
    for (int u = 0; u < t; ++u) {
      const float a = s.A[size_t(t) * L + u];
      const float* Uu = &s.U[size_t(u) * dv];
      const float* Wu = &s.W[size_t(u) * dk];
      for (int e = 0; e < dv; ++e) Ut[e] -= a * Uu[e];
      for (int i = 0; i < dk; ++i) Wt[i] -= a * Wu[i];
    }
  }
  // 6. Δ = U − W·S0 (the per-token deltas of the recurrence).
  for (int t = 0; t < L; ++t) {
    float* Dt = &s.Delta[size_t(t) * dv];
    std::memcpy(Dt, &s.U[size_t(t) * dv], sizeof(float) * dv);
    const float* Wt = &s.W[size_t(t) * dk];
    for (int i = 0; i < dk; ++i)
      for (int e = 0; e < dv; ++e) Dt[e] -= Wt[i] * S[i * dv + e];
  }
  // 7. O_t = e^{γ_t} q_t·S0 + Σ_{u≤t} (q_t·k_u) e^{γ_t − γ_u} Δ_u.
  for (int t = 0; t < L; ++t) {
    float* o = outr[t];
    const float gt = std::exp(s.gamma[t]);
    for (int e = 0; e < dv; ++e) o[e] = 0.0f;
    for (int i = 0; i < dk; ++i) {
      const float qi = qr[t][i] * gt;
      for (int e = 0; e < dv; ++e) o[e] += qi * S[i * dv + e];
    }
    for (int u = 0; u <= t; ++u) {
      const float c = dot(qr[t], kr[u], dk) * std::exp(s.gamma[t] - s.gamma[u]);
      const float* Du = &s.Delta[size_t(u) * dv];
      for (int e = 0; e < dv; ++e) o[e] += c * Du[e];
    }
  }
  // 8. S ← e^{γ_L} S0 + Σ_u e^{γ_L − γ_u} k_u Δ_uᵀ.
  const float gl = std::exp(s.gamma[L - 1]);
  for (int i = 0; i < dk * dv; ++i) S[i] *= gl;
  for (int u = 0; u < L; ++u) {
    const float c = std::exp(s.gamma[L - 1] - s.gamma[u]);
    const float* Du = &s.Delta[size_t(u) * dv];
    for (int i = 0; i < dk; ++i) {
      const float ki = kr[u][i] * c;
      for (int e = 0; e < dv; ++e) S[i * dv + e] += ki * Du[e];
    }
  }
}

}  // namespace

void delta_rule_chunked(const DeltaNetDims& d, int T, const float* q, const float* k, const float* v,
                        const float* beta, const float* g, float* state, float* out, int chunk) {
  const int r = d.Hv / d.Hk;
#pragma omp parallel if (int64_t(T) * d.Hv * d.dk * d.dv >= (1 << 16))
  {
    ChunkScratch scratch;
    std::vector<const float*> qr(chunk), kr(chunk), vr(chunk);
    std::vector<float*> outr(chunk);
    std::vector<float> br(chunk), gr(chunk);
#pragma omp for schedule(static)
    for (int j = 0; j < d.Hv; ++j) {
      const int kh = j / r;
      float* S = state + int64_t(j) * d.dk * d.dv;
      for (int c0 = 0; c0 < T; c0 += chunk) {
        const int L = std::min(chunk, T - c0);
        for (int t = 0; t < L; ++t) {
          const int64_t tt = c0 + t;
          qr[t] = q + (tt * d.Hk + kh) * d.dk;
          kr[t] = k + (tt * d.Hk + kh) * d.dk;
          vr[t] = v + (tt * d.Hv + j) * d.dv;
          outr[t] = out + (tt * d.Hv + j) * d.dv;
          br[t] = beta[tt * d.Hv + j];
          gr[t] = g[tt * d.Hv + j];
        }
        chunk_step(d, L, qr.data(), kr.data(), vr.data(), br.data(), gr.data(), S, outr.data(), scratch);
      }
    }
  }
}

}  // namespace petrel::cpu
