// What the sampler does with a logits row: the knobs every front end (CLI, server) sets.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>

namespace petrel {

// Applied in this order (documented in docs/generation.md):
//   repetition penalty -> presence / frequency penalties -> logit bias -> temperature
//   -> top-k -> top-p -> min-p -> draw.
struct SamplingParams {
  float temperature = 1.0f;          // 0 (or below ~2.9e-39): greedy (argmax of the penalised, biased logits)
  int top_k = 0;                     // keep the k most likely tokens; 0: off
  float top_p = 1.0f;                // keep the smallest top set with probability >= top_p; 1: off
  float min_p = 0.0f;                // drop tokens with p < min_p * p_max; 0: off
  float repetition_penalty = 1.0f;   // CTRL / Hugging Face: divide positive logits, multiply negative ones
  float presence_penalty = 0.0f;     // OpenAI: subtract once from every token already generated
  float frequency_penalty = 0.0f;    // OpenAI: subtract once per earlier occurrence in the output
  int penalty_last_n = 0;            // penalties look at the last n tokens of the sequence; 0: all
  std::map<int32_t, float> logit_bias = {};  // added to the logit of each listed token
  uint64_t seed = 0;

  // Below ~2.9e-39, 1/T overflows a float and every token but the top one gets weight 0: such a
  // temperature samples greedily too (on every sampler, host and device).
  bool greedy() const { return temperature <= 0.0f || !std::isfinite(1.0f / temperature); }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // Throws petrel::Error naming the field when a value is out of range (vocab: logit_bias ids).
  void validate(int vocab) const;
};

}  // namespace petrel
