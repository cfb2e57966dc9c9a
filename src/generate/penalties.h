// Penalties and logit bias: the sampler's adjustments of a logits row before temperature.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>

#include "generate/sampling_params.h"

namespace petrel {

// How often each token occurs in the sequence so far. The repetition penalty reads every token in
// the window (prompt included, as in Hugging Face); presence and frequency penalties read only
// generated tokens in the window (as in the OpenAI API and vLLM). Sparse: apply() costs O(distinct
// tokens seen), not O(vocab).
class PenaltyState {
 public:
  explicit PenaltyState(int last_n = 0) : last_n_(last_n) {}

  // Appends the next token of the sequence; `generated` marks tokens the model produced.
  void add(int32_t token, bool generated);

  // In place, for every token t seen in the window:
  //   repetition:  l_t = l_t > 0 ? l_t / r : l_t * r
  //   presence / frequency (generated tokens only):  l_t -= presence + frequency * count_t
  void apply(const SamplingParams& p, float* logits) const;

 private:
  struct Count {
    int in_window = 0;  // occurrences anywhere in the window
    int generated = 0;  // occurrences among generated tokens in the window
  };
  void bump(int32_t token, bool generated, int delta);

  int last_n_;
  std::unordered_map<int32_t, Count> counts_;
  std::deque<std::pair<int32_t, bool>> window_;  // only kept when last_n_ > 0
};

// logits[id] += bias for every entry.
void apply_logit_bias(const std::map<int32_t, float>& bias, float* logits);

}  // namespace petrel
