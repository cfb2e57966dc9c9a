// The forward pass of one step, written once as a list of plain ops (model/ops.h) that every
// backend runs: the model's math lives here and nowhere else.
#pragma once
#include "model/config.h"
#include <utility>

#include "model/ops.h"
#include "model/weights.h"

namespace petrel {

// The activation buffers a step writes, each [rows, width] in backend memory with at least as
// many rows as the step has. gate, qkv, z, b, a and gdn are needed only by models that use them.
struct StepBuffers {
  Tensor h;    // residual stream
  Tensor x;    // norm output
  Tensor mix;  // a mixer's output projection
  Tensor ffn;  // the feed-forward block's output
  Tensor q, gate, k, v, attn;  // attention
  Tensor qkv, z, b, a, gdn;    // DeltaNet
};

// What one step computes: its rows, whose state they continue, and which logits come out.
struct StepShape {
  int rows = 1;
  StepStates states;
  // The logits of the last logits.rows rows (final norm and LM head) go here; none when it has no rows.
  Tensor logits;
  bool argmax = false;  // the argmax of the last logits row follows (Backend::greedy_token)
};

// The ops of one step: embedding, every layer, then the logits and argmax `shape` asks for.
OpList step_ops(const ModelConfig& config, const ModelWeights& weights, const StepBuffers& buffers,
                const StepShape& shape);

}  // namespace petrel
