// The plain ops a forward step is made of, as data: the model writes a step as a list of them
// (model/step_ops.h) and a backend runs the list, fusing neighbours where it has a faster form.
// Each op says what it computes; none says how.
#pragma once
#include <cstdint>
#include <variant>
#include <vector>

#include "model/weights.h"

namespace petrel {

// A 2-D activation block [rows, cols] in backend memory. The element type is the backend's
// (fp32 on the CPU, bf16 on the GPU) unless allocated as fp32; views share the buffer.
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

class SequenceState;  // a sequence's caches and recurrent state, owned by the backend (backend/backend.h)

// A prompt piece in a mixed step: `rows` consecutive rows continuing `state` as a chunk.
struct StepPiece {
  SequenceState* state = nullptr;
  int rows = 0;
};

// Whose state the rows of a step continue: one sequence for all rows (a chunk of its tokens), one
// sequence per row (a batched decode step: rows[b] for row b), or a mixed step: prompt pieces of
// other sequences first, each its rows in order, then row (their rows) + b continues rows[b].
struct StepStates {
  SequenceState* chunk = nullptr;
  SequenceState* const* rows = nullptr;
  const StepPiece* pieces = nullptr;  // a mixed step's pieces (with rows, or alone)
  int n_pieces = 0;
  int piece_rows() const {
    int n = 0;
    for (int i = 0; i < n_pieces; ++i) n += pieces[i].rows;
    return n;
  }
};

namespace op {

// out[t] = embedding row of the step's staged token t
struct Embed {
  const Matrix* table;
  Tensor out;
};
// out = x · rsqrt(mean(x²) + eps) · w   (w already holds the effective multiplier)
struct RmsNorm {
  Tensor x;
  const std::vector<float>* w;
  float eps;
  Tensor out;
};
// out = x · Wᵀ
struct Linear {
  Tensor x;
  const Matrix* w;
  Tensor out;
};
// h += a
struct Add {
  Tensor h, a;
};
// Per-head RMSNorm of q and k over head_dim, then NeoX RoPE on the first rotary_dim dims at each
// row's position, in place.
struct QkNormRope {
  Tensor q, k;
  const AttentionWeights* w;
};
// Appends k, v to attention layer `layer`'s cache of each row's sequence, then causal GQA attention
// of q over that cache: out = softmax(q·kᵀ/√D)·v, times sigmoid(gate) where gate.data is set.
struct Attention {
  Tensor q, k, v, gate;
  int layer;
  StepStates states;
  Tensor out;
};
// Gated DeltaNet mixer up to (not including) out_proj: causal conv + SiLU over qkv (continuing the
// conv state), L2-normed q/k, gates β=σ(b), g=-exp(A_log)·softplus(a+dt_bias), the delta rule on
// the fp32 state, then gated RMSNorm with z.
struct DeltaNet {
  Tensor qkv, z, b, a;
  const DeltaNetWeights* w;
  int layer;
  StepStates states;
  Tensor out;
};
// out = down(silu(gate·x) ⊙ up·x)
struct Mlp {
  Tensor x;
  const MlpWeights* w;
  Tensor out;
};
// Router softmax → top-k → (renormalise) → weighted experts, plus the sigmoid-gated shared expert.
struct Moe {
  Tensor x;
  const FfnWeights* w;
  Tensor out;
};
// The index of the largest value of one fp32 logits row (lowest on ties), for Backend::greedy_token.
struct Argmax {
  Tensor logits;
};

}  // namespace op

using Op = std::variant<op::Embed, op::RmsNorm, op::Linear, op::Add, op::QkNormRope, op::Attention, op::DeltaNet,
                        op::Mlp, op::Moe, op::Argmax>;
using OpList = std::vector<Op>;

}  // namespace petrel
