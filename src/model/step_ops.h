// The forward pass of one step, written once as a list of plain ops (model/ops.h) that every
// backend runs: the model's math lives here and nowhere else.
#pragma once
#include "model/config.h"
#include <utility>
#include <vector>

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
  // The logits of the last logits.rows rows (final norm and LM head) go here, or of the rows
  // logit_rows names, in its order, where it is set; none when it has no rows.
  Tensor logits;
  bool argmax = false;  // the argmax of the last logits row follows (Backend::greedy_token)
  std::vector<int> logit_rows;
  // DeltaNet layers take the rows one at a time (one-row ops: the recurrent form a decode step
  // takes), so that the rows' state and outputs are what that many decode steps give.
  bool rows_one_at_a_time = false;
};

// The ops of one step: embedding, every layer, then the logits and argmax `shape` asks for.
OpList step_ops(const ModelConfig& config, const ModelWeights& weights, const StepBuffers& buffers,
                const StepShape& shape);

// A step of the multi-token prediction head writes the trunk's scratch, except for these: its own
// residual stream (so the trunk's rows it reads stay intact) and the fc input.
struct MtpBuffers {
  Tensor h;       // [rows, H] residual stream
  Tensor concat;  // [rows, 2H] [normed embedding | normed hidden]
};

// The hidden rows an MTP step starts from: residual streams before their last norm, which the
// step applies. Backends may fuse a norm into the LM head that follows it and never write the
// normed rows, so the residual is the value every backend leaves behind.
struct MtpInput {
  Tensor hidden;                         // [rows, H]: the trunk's h, or a previous MTP step's
  const std::vector<float>* norm = nullptr;  // final_norm for trunk rows, mtp.norm for the head's own
};

// The ops of one MTP step (model-spec §5): row t pairs the staged token x_{t+1} with hidden row t:
// u = [RMSNorm(Embed x_{t+1}) | RMSNorm(norm(h_t))] · fcᵀ, the head's decoder layers (KV caches
// n_layers + j of shape.states), then mtp.norm and the shared LM head for the logits rows asked.
OpList mtp_step_ops(const ModelConfig& config, const ModelWeights& weights, const StepBuffers& buffers,
                    const MtpBuffers& mtp, const MtpInput& input, const StepShape& shape);

}  // namespace petrel
