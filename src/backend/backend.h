// What a backend implements: memory for activations and sequence states, and the plain ops of
// model/ops.h, run as lists (Backend::run). Backends differ in how an op is computed (and which
// neighbours they run as one), never in what it computes; the CPU backend is the numerical
// reference for every op.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/device_sampler.h"
#include "model/config.h"
#include "model/ops.h"
#include "model/weights.h"

namespace petrel {

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
  // A state in host memory, for holding a copy of a device state off the device: it may only be
  // filled by copy_from a state of new_sequence, and be copied from into one.
  virtual std::unique_ptr<SequenceState> new_host_sequence(int capacity) = 0;
  // Bytes the backend could still allocate for states, where it manages a memory of its own (a
  // GPU's); none on the host, where the operating system decides.
  virtual std::optional<size_t> free_memory() const { return std::nullopt; }
  // The calling thread hands the model's work to another thread (a scheduler's) and runs none of
  // it for a while: it lets go of what it holds for parallel work, so that the thread that runs
  // the steps has the cores.
  virtual void release_calling_thread() {}
  // The state of the multi-token prediction head for one sequence: the KV caches of its layers,
  // which ops address as layers n_layers + j, and nothing of the trunk.
  virtual std::unique_ptr<SequenceState> new_mtp_sequence(int capacity) = 0;
  virtual void to_host(const Tensor& t, float* dst) = 0;      // rows x cols floats, densely packed
  virtual void from_host(const float* src, Tensor t) = 0;     // the inverse, for tests and tools

  // Stages the inputs of one forward chunk: token ids and their positions st.n_past, st.n_past+1, ...
  // Host-side only; the ops that follow read the staged values.
  virtual void begin_forward(const int32_t* ids, int n, const SequenceState& st) = 0;
  // Stages one decode step over B sequences with one new token each (B may be 0 with pieces), after
  // the `n_pieces` prompt pieces (none by default): ids holds each piece's ids in turn, then row
  // b's id at position seqs[b]->n_past. Row-wise ops then run over all rows at once; QkNormRope
  // uses each row's position, and Attention and DeltaNet each row's own state (StepStates).
  virtual void begin_batch(const int32_t* ids, SequenceState* const* seqs, int B, const StepPiece* pieces = nullptr,
                           int n_pieces = 0) = 0;
  // Runs the ops of the staged step in order. A backend may run neighbouring ops as one (it then
  // leaves unwritten any tensor that no later op of the list reads before writing it). Where
  // `recorded` is set the list is a step of that sequence (a decode step, a verify step of a few
  // rows, a draft head's step) that is the same ops on the same tensors every time for its row
  // count and `variant`, depending on nothing but staged inputs and device state: a backend may
  // record it and replay the recording afterwards (CUDA graphs).
  virtual void run(const OpList& ops, SequenceState* recorded = nullptr, int variant = 0) {
    (void)recorded;
    (void)variant;
    for (const Op& o : ops) run_op(o);
  }
  // Runs a batched step staged by begin_batch. For a given row count the list is the same ops on
  // the same tensors every step, and its per-row ops read positions and states only through what
  // begin_batch staged: a backend may record it once per row count and replay the recording.
  virtual void run_batch(const OpList& ops) { run(ops); }
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
  // The token of the last Argmax op since begin_forward: the only value a greedy decode step
  // reads back from the device.
  virtual int32_t greedy_token() = 0;
  // A sampler over logits rows in this backend's memory, or nullptr where logits are read on the
  // host anyway (CPU): generation then samples with the CPU Sampler. It must not outlive the backend.
  virtual std::unique_ptr<DeviceSampler> make_sampler(int vocab) {
    (void)vocab;
    return nullptr;
  }

  // The ops one by one (model/ops.h says what each computes). attention and deltanet continue
  // one sequence's state; their _batch forms, for a step staged by begin_batch, continue each
  // row's own.
  virtual void embed(const Matrix& table, Tensor out) = 0;
  virtual void rms_norm(const Tensor& x, const std::vector<float>& w, float eps, Tensor out) = 0;
  virtual void linear(const Tensor& x, const Matrix& w, Tensor out) = 0;
  virtual void add(Tensor h, const Tensor& a) = 0;
  virtual void qk_norm_rope(Tensor q, Tensor k, const AttentionWeights& w) = 0;
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* gate, int layer,
                         SequenceState& st, Tensor out) = 0;
  virtual void deltanet(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                        const DeltaNetWeights& w, int layer, SequenceState& st, Tensor out) = 0;
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
  virtual void deltanet_batch(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                              const DeltaNetWeights& w, int layer, SequenceState* const* seqs, Tensor out) {
    for (int64_t r = 0; r < qkv.rows; ++r)
      deltanet(qkv.rows_view(r, 1), z.rows_view(r, 1), b.rows_view(r, 1), a.rows_view(r, 1), w, layer, *seqs[r],
               out.rows_view(r, 1));
  }
  virtual void mlp(const Tensor& x, const MlpWeights& w, Tensor out) = 0;
  virtual void moe(const Tensor& x, const FfnWeights& w, Tensor out) = 0;
  // Queues the argmax of a one-row fp32 logits tensor for greedy_token().
  virtual void argmax(const Tensor& logits) = 0;

 protected:
  // Runs one op by the virtual above that computes it.
  void run_op(const Op& o);

 private:
  void run_attention(const op::Attention& a);
  void run_deltanet(const op::DeltaNet& d);
};

}  // namespace petrel
