// The op interface the forward pass is written against. Backends differ in how an op is computed,
// never in what it computes; the CPU backend is the numerical reference for every op.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/device_sampler.h"
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
  // Copies every cache and state of `other` (same backend and model; its n_past within this
  // one's capacity, which may differ from other's) into this one.
  virtual void copy_from(const SequenceState& other) = 0;
  // Bytes of memory the state holds (its KV caches at full capacity, conv and recurrent states).
  virtual size_t bytes() const = 0;
  // Forgets every token, keeping the memory: n_past = 0, conv and recurrent state zero (KV rows
  // are rewritten before they are read again). A server reuses states this way.
  virtual void reset() = 0;
  // Appends, as fp32 in a fixed order, everything that decides what the sequence computes next:
  // the KV rows of its n_past tokens, the conv state and the recurrent state, for tests that
  // compare states. False (nothing appended) where the backend does not offer it.
  virtual bool dump_state(std::vector<float>& out) const {
    (void)out;
    return false;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Called once before any op: upload / repack weights as the device wants them.
  virtual void prepare(const ModelConfig& config, const ModelWeights& weights) = 0;
  // Sizes scratch for chunks of up to max_tokens tokens; called once after prepare.
  virtual void reserve(int max_tokens) { (void)max_tokens; }
  // A persistent activation buffer, zero-filled, freed with the backend. fp32 forces 32-bit
  // floats (logits) where the backend would otherwise use its activation type.
  virtual Tensor alloc(int64_t rows, int64_t cols, bool fp32 = false) = 0;
  virtual std::unique_ptr<SequenceState> new_sequence(int capacity) = 0;
  virtual void to_host(const Tensor& t, float* dst) = 0;      // rows x cols floats, densely packed
  virtual void from_host(const float* src, Tensor t) = 0;     // the inverse, for tests and tools

  // Stages the inputs of one forward chunk: token ids and their positions st.n_past, st.n_past+1, ...
  // Host-side only; the ops that follow read the staged values.
  virtual void begin_forward(const int32_t* ids, int n, const SequenceState& st) = 0;
  // Stages one decode step over B sequences with one new token each: row b is ids[b] at position
  // seqs[b]->n_past. Row-wise ops (embed, norms, linear, mlp, moe) then run over the B rows at
  // once; qk_norm_rope uses each row's position, and the *_batch ops each row's own state.
  virtual void begin_batch(const int32_t* ids, SequenceState* const* seqs, int B) = 0;
  // Runs the device work of one decode step. A backend may record it on the first call for `st`
  // and replay the recording afterwards (CUDA graphs), so `ops` must issue the same op sequence
  // every time and depend on nothing but staged inputs and device state.
  virtual void run_decode_step(SequenceState& st, const std::function<void()>& ops) { (void)st; ops(); }
  // Waits for queued device work (a no-op where ops are synchronous).
  virtual void synchronize() {}
  // Per-op device time, for `petrel bench --breakdown`. While enabled, every op is timed on its
  // own (decode steps are not recorded as graphs); false where the backend cannot time ops.
  virtual bool time_ops(bool enable) {
    (void)enable;
    return false;
  }
  // Seconds spent per op label since the last call, in order of first appearance.
  virtual std::vector<std::pair<std::string, double>> take_op_times() { return {}; }
  // Queues the index of the largest value of a one-row fp32 logits tensor (lowest index on ties)
  // for greedy_token(). A decode step queues it inside its ops, so a recorded step records it too.
  virtual void queue_argmax(const Tensor& logits) = 0;
  // Says that queue_argmax(logits) follows the next op that writes `logits` (the LM head), which
  // may then do the argmax's first stage on the way. A hint: ignored by default.
  virtual void expect_argmax(const Tensor& logits) { (void)logits; }
  // The token of the last queue_argmax since begin_forward: the only value a greedy decode step
  // reads back from the device.
  virtual int32_t greedy_token() = 0;
  // A sampler over logits rows in this backend's memory, or nullptr where logits are read on the
  // host anyway (CPU): generation then samples with the CPU Sampler. It must not outlive the backend.
  virtual std::unique_ptr<DeviceSampler> make_sampler(int vocab) {
    (void)vocab;
    return nullptr;
  }

  // out[t] = embedding row of staged id t
  virtual void embed(const Matrix& table, Tensor out) = 0;
  // out = x · rsqrt(mean(x²) + eps) · w   (w already holds the effective multiplier)
  virtual void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) = 0;
  // out = x · Wᵀ
  virtual void linear(const Tensor& x, const Matrix& w, Tensor out) = 0;
  // outs[i] = x · ws[i]ᵀ for several matrices reading one input (a layer's input projections),
  // in one pass over x where the backend can.
  virtual void linear_many(const Tensor& x, const Matrix* const* ws, const Tensor* outs, int n) {
    for (int i = 0; i < n; ++i) linear(x, *ws[i], outs[i]);
  }
  // h += a
  virtual void add(Tensor h, const Tensor& a) = 0;
  // What a layer's input projections feed: a backend may start the mixer's step beside them.
  enum class Feeds { Other, DeltaNet, Attention };
  // outs[i] = rms_norm(h)·w · ws[i]ᵀ: a layer's input norm and projections. x holds the normed rows
  // where the backend does not fold the norm into the projections.
  virtual void rms_norm_linear_many(const Tensor& h, const std::vector<float>& w, float eps, Tensor x,
                                    const Matrix* const* ws, const Tensor* outs, int n, Feeds /*feeds*/ = Feeds::Other) {
    rms_norm(h, w, eps, x);
    linear_many(x, ws, outs, n);
  }
  // h += x · Wᵀ: an output projection meeting the residual stream (scratch holds x · Wᵀ where unfused).
  virtual void linear_add(const Tensor& x, const Matrix& w, Tensor h, Tensor scratch) {
    linear(x, w, scratch);
    add(h, scratch);
  }
  // linear_add(x, w, h, scratch), then rms_norm_moe_add(h, norm, eps, xn, ffn, ffn_out): a mixer's
  // output projection and the MoE block after it. A backend may compute the router beside the
  // projection: the router is linear in the normed h, whose rsqrt is one scalar.
  virtual void linear_add_moe_add(const Tensor& x, const Matrix& w, Tensor h, Tensor scratch,
                                  const std::vector<float>& norm, float eps, Tensor xn, const FfnWeights& ffn,
                                  Tensor ffn_out) {
    linear_add(x, w, h, scratch);
    rms_norm_moe_add(h, norm, eps, xn, ffn, ffn_out);
  }
  // The tensors a DeltaNet mixer writes on its way (its projections' outputs and the step's).
  struct DeltaNetScratch {
    Tensor qkv, z, b, a, o;
  };
  // One token's whole DeltaNet MoE layer `layer`: h += the mixer of rms_norm(h)·input_norm, then
  // h += the MoE block of rms_norm(h)·post_norm, as one fused operation of the backend's own;
  // false, doing nothing, where it has none for these shapes (the caller runs the ops one by one).
  virtual bool deltanet_moe_layer(int /*layer*/, const LayerWeights& /*w*/, float /*eps*/, Tensor /*h*/,
                                  const DeltaNetScratch& /*scratch*/, SequenceState& /*st*/) {
    return false;
  }
  // Per-head RMSNorm of q and k over head_dim, then NeoX RoPE on the first rotary_dim dims at the
  // staged positions.
  virtual void qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w) = 0;
  // Appends k, v to attention layer `layer`'s cache at st.n_past.., then causal GQA attention of q
  // over the whole cache; out = softmax(q·kᵀ/√D)·v, times sigmoid(gate) when gate is given.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                         SequenceState& st, Tensor out) = 0;
  // qk_norm_rope, then attention: one operation where a backend fuses the two (a short context's
  // single decode launch on the GPU); q and k may be left unnormalised.
  virtual void qk_norm_rope_attention(Tensor q, Tensor k, const Tensor& v, const Tensor* gate,
                                      const AttentionWeights& w, int layer, SequenceState& st, Tensor out) {
    qk_norm_rope(q, k, w);
    attention(q, k, v, gate, layer, st, out);
  }
  // Gated DeltaNet mixer up to (not including) out_proj: causal conv + SiLU over qkv (continuing the
  // conv state), L2-normed q/k, gates β=σ(b), g=-exp(A_log)·softplus(a+dt_bias), the delta rule on
  // the fp32 state (chunked form for T>1, recurrent for T=1), then gated RMSNorm with z.
  virtual void deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                        const DeltaNetWeights& w, int layer, SequenceState& st, Tensor out) = 0;
  // attention() for a step staged by begin_batch: row b appends to and attends over seqs[b]'s cache.
  // The default runs the single-sequence op on each row (right where that op reads positions from
  // its state, as the CPU does).
  virtual void attention_batch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                               SequenceState* const* seqs, Tensor out) {
    for (int64_t r = 0; r < q.rows; ++r) {
      const Tensor gate_row = gate ? gate->rows_view(r, 1) : Tensor{};
      attention(q.rows_view(r, 1), k.rows_view(r, 1), v.rows_view(r, 1), gate ? &gate_row : nullptr, layer,
                *seqs[r], out.rows_view(r, 1));
    }
  }
  // deltanet() for a step staged by begin_batch: row b continues seqs[b]'s conv and recurrent state.
  virtual void deltanet_batch(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                              const DeltaNetWeights& w, int layer, SequenceState* const* seqs, Tensor out) {
    for (int64_t r = 0; r < qkv.rows; ++r)
      deltanet(qkv.rows_view(r, 1), z.rows_view(r, 1), b.rows_view(r, 1), a.rows_view(r, 1), w, layer, *seqs[r],
               out.rows_view(r, 1));
  }
  // out = down(silu(gate·x) ⊙ up·x)
  virtual void mlp(const Tensor& x, const MlpWeights& w, Tensor out) = 0;
  // Router softmax → top-k → (renormalise) → weighted experts, plus the sigmoid-gated shared expert.
  virtual void moe(const Tensor& x, const FfnWeights& w, Tensor out) = 0;
  // h += moe(rms_norm(h)·norm): the post-attention norm, the MoE block and its residual add (x and
  // scratch hold the normed rows and the block's output where unfused).
  virtual void rms_norm_moe_add(Tensor h, const std::vector<float>& norm, float eps, Tensor x, const FfnWeights& w,
                                Tensor scratch) {
    rms_norm(h, norm, eps, x);
    moe(x, w, scratch);
    add(h, scratch);
  }
};

}  // namespace petrel
