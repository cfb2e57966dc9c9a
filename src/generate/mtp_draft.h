// Drafting with the checkpoint's multi-token prediction head (model-spec §5). The head keeps one
// cache row per trunk position: after each trunk step it reads the step's hidden rows, each paired
// with the token that followed it, and its last row guesses the token after the pending one.
// Longer drafts chain the head on its own output; those rows are dropped again, since the trunk's
// hidden states replace them once the draft is verified.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/forward.h"

namespace petrel {

class MtpDrafter {
 public:
  // `model` must have an MTP head; `capacity` is the trunk sequence's.
  MtpDrafter(Model& model, int capacity);

  int capacity() const { return state_->capacity; }
  // Most rows one advance takes: a trunk step's.
  int max_rows() const { return model_.max_batch(); }
  // Forgets the sequence. A sequence whose start came from a cache is drafted with the head
  // attending to the part fed since (drafts only decide speed, never the output).
  void reset();
  // The last trunk step fed n tokens; next[i] is the token after its i-th (the last one the
  // token just sampled, not yet fed).
  void advance(const int32_t* next, int n);
  // Up to k tokens guessed to follow the pending token (next[n-1] of the last advance). The
  // first call after an advance chains the head from the model's last head step, so no other
  // drafter of the model may advance in between; later calls return a prefix of its draft.
  std::vector<int32_t> draft(int k);

 private:
  Model& model_;
  std::unique_ptr<SequenceState> state_;
  std::vector<int32_t> drafted_;  // since the last advance: the head's guess, then the chained ones
  bool chained_ = false;
};

}  // namespace petrel
