#include "generate/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "generate/rng.h"

namespace petrel {
namespace {

// Descending by z, ties broken by the lower id, so the kept set never depends on library details.
template <class C>
bool before(const C& a, const C& b) {
  return a.z > b.z || (a.z == b.z && a.id < b.id);
}

}  // namespace

// Tokens level with the top one get z = 0 even when the top is +inf (a tiny repetition penalty
// can overflow a logit), where (top - top) would be NaN and leave no candidate at all. A top of
// -inf means every token is banned: NaN then, so that none is a candidate.
float relative_logit(float logit, float top, float inv_t) {
  return logit == top && top > -INFINITY ? 0.0f : (logit - top) * inv_t;
}

int32_t argmax(const float* logits, int n) {
  return int32_t(std::max_element(logits, logits + n) - logits);
}

Sampler::Sampler(const SamplingParams& params, int vocab)
    : params_(params), vocab_(vocab), penalties_(params.penalty_last_n), adjusted_(size_t(vocab)) {
  params_.validate(vocab);
  candidates_.reserve(size_t(vocab));
}

void Sampler::adjust(const float* logits) {
  std::copy(logits, logits + vocab_, adjusted_.begin());
  if (params_.has_penalties()) penalties_.apply(params_, adjusted_.data());
  apply_logit_bias(params_.logit_bias, adjusted_.data());
  if (!mask_) return;
  for (int i = 0; i < vocab_; ++i)
    if (!((mask_[i / 32] >> (i % 32)) & 1u)) adjusted_[size_t(i)] = -INFINITY;
}

void Sampler::keep_top_k() {
  const size_t k = size_t(params_.top_k);
  if (k == 0 || k >= candidates_.size()) return;
  std::nth_element(candidates_.begin(), candidates_.begin() + ptrdiff_t(k), candidates_.end(), before<Candidate>);
  candidates_.resize(k);
}

// Keeps the smallest most-likely prefix whose probability reaches top_p (the token that crosses
// the threshold stays), renormalised over the tokens top-k left, as Hugging Face and vLLM do. The
// prefix is sorted in growing steps, so a peaked distribution sorts a few dozen tokens.
void Sampler::keep_top_p() {
  if (params_.top_p >= 1.0f) return;
  double total = 0.0;
  for (const Candidate& c : candidates_) total += std::exp(double(c.z));
  const double target = double(params_.top_p) * total;
  const size_t n = candidates_.size();
  double cum = 0.0;
  size_t sorted = 0, step = std::min<size_t>(n, 64);
  while (sorted < n) {
    std::partial_sort(candidates_.begin() + ptrdiff_t(sorted), candidates_.begin() + ptrdiff_t(step),
                      candidates_.end(), before<Candidate>);
    for (size_t i = sorted; i < step; ++i) {
      cum += std::exp(double(candidates_[i].z));
      if (cum >= target) {
        candidates_.resize(i + 1);
        return;
      }
    }
    sorted = step;
    step = std::min(n, step * 4);
  }
}

// p / p_max = exp(z), so "p >= min_p * p_max" is "z >= ln(min_p)"; the top token always stays.
void Sampler::keep_min_p() {
  if (params_.min_p <= 0.0f) return;
  const float threshold = std::log(params_.min_p);
  std::erase_if(candidates_, [&](const Candidate& c) { return c.z < threshold; });
}

// Top-k and top-p leave the kept tokens in selection order (unspecified after nth_element). The
// draw walks them in token-id order instead, an order any implementation can reproduce without
// sorting (the device sampler accumulates its CDF the same way).
void Sampler::restore_id_order() {
  if (params_.top_k == 0 && params_.top_p >= 1.0f) return;  // never reordered
  std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
}

double Sampler::select() {
  const float top = *std::max_element(adjusted_.begin(), adjusted_.end());
  check(top > -INFINITY, "sampling: every token has logit -inf (is every token banned by the logit bias?)");
  const float inv_t = 1.0f / params_.temperature;
  candidates_.clear();
  for (int i = 0; i < vocab_; ++i) {
    const float z = relative_logit(adjusted_[size_t(i)], top, inv_t);
    if (z > -INFINITY) candidates_.push_back({z, i});
  }
  keep_top_k();
  keep_top_p();
  keep_min_p();
  restore_id_order();
  double weight = 0.0;
  for (const Candidate& c : candidates_) weight += std::exp(double(c.z));
  return weight;
}

int32_t Sampler::sample(const float* logits, uint64_t position) {
  adjust(logits);
  if (params_.greedy()) {
    const int32_t t = argmax(adjusted_.data(), vocab_);
    check(!mask_ || adjusted_[size_t(t)] > -INFINITY, "sampling: the token mask allows no token");
    return t;
  }
  const double target = uniform01(params_.seed, position) * select();
  double cum = 0.0;
  for (const Candidate& c : candidates_) {
    cum += std::exp(double(c.z));
    if (target < cum) return c.id;
  }
  return candidates_.back().id;  // target == total after rounding
}

std::vector<double> Sampler::distribution(const float* logits) {
  adjust(logits);
  std::vector<double> p(size_t(vocab_), 0.0);
  if (params_.greedy()) {
    p[size_t(argmax(adjusted_.data(), vocab_))] = 1.0;
    return p;
  }
  const double weight = select();
  for (const Candidate& c : candidates_) p[size_t(c.id)] = std::exp(double(c.z)) / weight;
  return p;
}

}  // namespace petrel
