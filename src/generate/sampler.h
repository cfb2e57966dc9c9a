// Picking the next token from logits.
#pragma once
#include <cstdint>
#include <random>

namespace petrel {

// Index of the largest logit (lowest index on ties).
int32_t argmax(const float* logits, int n);

// temperature 0 -> argmax; otherwise a draw from softmax(logits / temperature).
class Sampler {
 public:
  Sampler(float temperature, uint64_t seed) : temperature_(temperature), rng_(seed) {}
  int32_t sample(const float* logits, int n);

 private:
  float temperature_;
  std::mt19937_64 rng_;
};

}  // namespace petrel
