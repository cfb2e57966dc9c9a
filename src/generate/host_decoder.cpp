#include "generate/host_decoder.h"

#include <string>

#include "core/error.h"

namespace petrel {

void HostDecoder::reset(const SamplingParams& params) { sampler_ = std::make_unique<Sampler>(params, vocab()); }

void HostDecoder::observe(int32_t token, bool generated) {
  check(sampler_ != nullptr, "HostDecoder::observe before reset");
  sampler_->observe(token, generated);
}

void HostDecoder::set_mask(const uint32_t* words) {
  check(sampler_ != nullptr, "HostDecoder::set_mask before reset");
  sampler_->set_mask(words);
}

void HostDecoder::feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) {
  const size_t V = size_t(vocab());
  rows_ = keep == KeepLogits::None ? 0 : keep == KeepLogits::Last ? 1 : n;
  if (logits_.size() < size_t(rows_) * V) logits_.resize(size_t(rows_) * V);
  if (keep == KeepLogits::Drafted)
    return model_.backend().to_host(model_.forward_device(ids, n, st, keep), logits_.data());
  model_.forward(ids, n, st, keep == KeepLogits::Last ? logits_.data() : nullptr,
                 keep == KeepLogits::All ? logits_.data() : nullptr);
}

int32_t HostDecoder::sample(int row, uint64_t position) {
  check(sampler_ != nullptr, "HostDecoder::sample before reset");
  check(row >= 0 && row < rows_, "HostDecoder::sample: row " + std::to_string(row) + " of " +
                                     std::to_string(rows_) + " kept logits rows");
  return sampler_->sample(logits_.data() + size_t(row) * size_t(vocab()), position);
}

}  // namespace petrel
