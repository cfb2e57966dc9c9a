#include "runtime/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace petrel {

double log_sum_exp(const float* logits, int vocab) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return mx + std::log(sum);
}

std::vector<TokenLogprob> top_logprobs(const float* logits, int vocab, int n, double log_norm) {
  n = std::clamp(n, 0, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // A partial sort of the vocabulary: only the first n places are ordered.
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<TokenLogprob> out;
  out.reserve(size_t(n));
  for (int i = 0; i < n; ++i) out.push_back({ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - log_norm)});
  return out;
}

}  // namespace petrel
