#include "generate/penalties.h"

namespace petrel {

void PenaltyState::bump(int32_t token, bool generated, int delta) {
  Count& c = counts_[token];
  c.in_window += delta;
  if (generated) c.generated += delta;
  if (c.in_window == 0) counts_.erase(token);
}

void PenaltyState::add(int32_t token, bool generated) {
  bump(token, generated, +1);
  if (last_n_ <= 0) return;
  window_.emplace_back(token, generated);
  if (int(window_.size()) > last_n_) {
    const auto [old, old_generated] = window_.front();
    window_.pop_front();
    bump(old, old_generated, -1);
  }
}

void PenaltyState::apply(const SamplingParams& p, float* logits) const {
  const float r = p.repetition_penalty;
  for (const auto& [token, c] : counts_) {
    float& l = logits[token];
    if (r != 1.0f) l = l > 0.0f ? l / r : l * r;
    if (c.generated > 0) l -= p.presence_penalty + p.frequency_penalty * float(c.generated);
  }
}

void apply_logit_bias(const std::map<int32_t, float>& bias, float* logits) {
  for (const auto& [token, b] : bias) logits[token] += b;
}

}  // namespace petrel
