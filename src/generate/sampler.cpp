#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace petrel {

int32_t argmax(const float* logits, int n) {
  return int32_t(std::max_element(logits, logits + n) - logits);
}

int32_t Sampler::sample(const float* logits, int n) {
  if (temperature_ <= 0.0f) return argmax(logits, n);
  const float mx = *std::max_element(logits, logits + n);
  std::vector<double> p(static_cast<size_t>(n));
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += (p[i] = std::exp(double(logits[i] - mx) / temperature_));
  std::uniform_real_distribution<double> u(0.0, sum);
  double x = u(rng_);
  for (int i = 0; i < n; ++i) {
    if ((x -= p[i]) <= 0.0) return i;
  }
  return n - 1;
}

}  // namespace petrel
