#include "generate/mtp_draft.h"

#include <algorithm>

namespace petrel {

MtpDrafter::MtpDrafter(Model& model, int capacity) : model_(model), state_(model.new_mtp_sequence(capacity)) {}

void MtpDrafter::reset() {
  state_->reset();
  drafted_.clear();
}

void MtpDrafter::advance(const int32_t* next, int n) {
  drafted_.assign(1, model_.mtp_forward(next, n, /*from_trunk=*/true, *state_));
  chained_ = false;
}

std::vector<int32_t> MtpDrafter::draft(int k) {
  if (drafted_.empty() || k <= 0) return {};
  // Chained steps overwrite the head's last output, so a draft is made once per advance.
  if (!chained_) {
    const int kept = state_->n_past;
    while (int(drafted_.size()) < k && state_->n_past < state_->capacity)
      drafted_.push_back(model_.mtp_forward(&drafted_.back(), 1, /*from_trunk=*/false, *state_));
    state_->n_past = kept;  // KV rows past n_past are rewritten before they are read again
    chained_ = true;
  }
  return {drafted_.begin(), drafted_.begin() + std::min<size_t>(size_t(k), drafted_.size())};
}

}  // namespace petrel
