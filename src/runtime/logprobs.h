// Log-probabilities of a raw logits row (log-softmax before penalties and temperature), as the
// OpenAI API reports them: the chosen token's and the most likely alternatives.
#pragma once
#include <cstdint>
#include <vector>

namespace petrel {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // log-softmax of the raw model logits (before penalties / temperature)
};

// log Σ exp(logits[i]) over the row, computed stably in double.
double log_sum_exp(const float* logits, int vocab);

// The `n` most likely tokens of the row (lower id first on ties), most likely first.
std::vector<TokenLogprob> top_logprobs(const float* logits, int vocab, int n, double log_norm);

}  // namespace petrel
