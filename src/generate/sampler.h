// Picking the next token from a logits row on the host (the CPU reference; see decoder.h for
// where a device backend plugs in its own).
#pragma once
#include <cstdint>
#include <vector>

#include "generate/penalties.h"
#include "generate/sampling_params.h"

namespace petrel {

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int n);

// A token's z: the log of its weight relative to the top token, (logit - top) / T, and 0 for
// every token level with the top (also an infinite one). The device sampler computes the same.
float relative_logit(float logit, float top, float inv_t);

// Penalties -> logit bias -> temperature -> top-k -> top-p -> min-p -> one draw. Filters use
// partial selection (nth_element, growing partial sorts), never a sort of the whole vocabulary.
// The draw accumulates the kept tokens' weights in token-id order.
// The draw's randomness is uniform01(seed, position): the same seed gives the same tokens, and
// a token's draw does not depend on how many draws came before it.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int vocab);

  const SamplingParams& params() const { return params_; }

  // Appends a token of the sequence to the penalty history; `generated` marks model output.
  void observe(int32_t token, bool generated) { penalties_.add(token, generated); }
  // Tokens whose bit is clear in `words` (token t: bit t % 32 of words[t / 32]) get logit -inf
  // in the samples that follow, as if banned; null lifts the mask. Structured output sets it
  // before each sample (grammar/matcher.h); the words must stay valid while set.
  void set_mask(const uint32_t* words) { mask_ = words; }

  // The token for sequence position `position`, drawn from `logits` (vocab floats, not modified).
  int32_t sample(const float* logits, uint64_t position);

  // The distribution sample() draws from, as probabilities over the whole vocabulary.
  std::vector<double> distribution(const float* logits);

 private:
  struct Candidate {
    float z;  // (logit - max logit) / temperature: log of the probability relative to the top token
    int32_t id;
  };
  // adjusted_ = logits with penalties and bias applied.
  void adjust(const float* logits);
  // candidates_ = the tokens every filter keeps; returns the sum of their weights exp(z).
  double select();
  void keep_top_k();
  void keep_top_p();
  void keep_min_p();
  void restore_id_order();

  SamplingParams params_;
  int vocab_;
  PenaltyState penalties_;
  const uint32_t* mask_ = nullptr;
  std::vector<float> adjusted_;
  std::vector<Candidate> candidates_;
};

}  // namespace petrel
