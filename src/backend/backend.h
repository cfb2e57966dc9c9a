// The op interface the forward pass is written against. Backends differ in how an op is computed,
// never in what it computes; the CPU backend is the numerical reference for every op.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/weights.h"

namespace petrel {

// A 2-D activation block [rows, cols] in backend memory. The element type is the backend's
// (fp32 on the CPU, bf16 on the GPU); views share the buffer.
struct Tensor {
  void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t stride = 0;  // elements between consecutive rows
  int elem_size = 4;

  Tensor rows_view(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + r0 * stride * elem_size;
    t.rows = n;
    return t;
  }
  Tensor cols_view(int64_t c0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + c0 * elem_size;
    t.cols = n;
    return t;
  }
};

// Per-sequence state the backend owns: KV cache per attention layer, conv + fp32 recurrent state
// per DeltaNet layer, and how many tokens have been consumed.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  int n_past = 0;
  int capacity = 0;  // tokens the KV cache can hold
  // Copies every cache and state of `other` (same backend and model) into this one.
  virtual void copy_from(const SequenceState& other) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Called once before any op: upload / repack weights as the device wants them.
  virtual void prepare(const ModelConfig& config, const ModelWeights& weights) = 0;
  // A persistent activation buffer, zero-filled, freed with the backend.
  virtual Tensor alloc(int64_t rows, int64_t cols) = 0;
  virtual std::unique_ptr<SequenceState> new_sequence(int capacity) = 0;
  virtual void to_host(const Tensor& t, float* dst) = 0;  // rows x cols floats, densely packed

  // out[t] = embedding row ids[t]
  virtual void embed(const Matrix& table, const int32_t* ids, int n, Tensor out) = 0;
  // out = x · rsqrt(mean(x²) + eps) · w   (w already holds the effective multiplier)
  virtual void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) = 0;
  // out = x · Wᵀ
  virtual void linear(const Tensor& x, const Matrix& w, Tensor out) = 0;
  // h += a
  virtual void add(Tensor h, const Tensor& a) = 0;
  // Per-head RMSNorm of q and k over head_dim, then NeoX RoPE on the first rotary_dim dims at
  // positions pos0, pos0+1, ...
  virtual void qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w, int pos0) = 0;
  // Appends k, v to attention layer `layer`'s cache at st.n_past.., then causal GQA attention of q
  // over the whole cache; out = softmax(q·kᵀ/√D)·v, times sigmoid(gate) when gate is given.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                         SequenceState& st, Tensor out) = 0;
  // Gated DeltaNet mixer up to (not including) out_proj: causal conv + SiLU over qkv (continuing the
  // conv state), L2-normed q/k, gates β=σ(b), g=-exp(A_log)·softplus(a+dt_bias), the delta rule on
  // the fp32 state (chunked form for T>1, recurrent for T=1), then gated RMSNorm with z.
  virtual void deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                        const DeltaNetWeights& w, int layer, SequenceState& st, Tensor out) = 0;
  // out = down(silu(gate·x) ⊙ up·x)
  virtual void mlp(const Tensor& x, const MlpWeights& w, Tensor out) = 0;
  // Router softmax → top-k → (renormalise) → weighted experts, plus the sigmoid-gated shared expert.
  virtual void moe(const Tensor& x, const FfnWeights& w, Tensor out) = 0;
};

}  // namespace petrel
