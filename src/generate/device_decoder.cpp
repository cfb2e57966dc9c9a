#include "generate/device_decoder.h"

#include <string>
#include <utility>

#include "core/error.h"

namespace petrel {

DeviceDecoder::DeviceDecoder(Model& model, std::unique_ptr<DeviceSampler> sampler)
    : ModelDecoder(model), sampler_(std::move(sampler)) {
  check(sampler_ != nullptr, "DeviceDecoder needs a device sampler");
}

void DeviceDecoder::reset(const SamplingParams& params) {
  sampler_->reset(params);
  ready_ = true;
}

void DeviceDecoder::observe(int32_t token, bool generated) {
  check(ready_, "DeviceDecoder::observe before reset");
  sampler_->observe(token, generated);
}

void DeviceDecoder::set_mask(const uint32_t* words) {
  check(ready_, "DeviceDecoder::set_mask before reset");
  sampler_->set_mask(words);
}

void DeviceDecoder::feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) {
  logits_ = model_.forward_device(ids, n, st, keep);
}

int32_t DeviceDecoder::sample(int row, uint64_t position) {
  check(ready_, "DeviceDecoder::sample before reset");
  check(row >= 0 && row < logits_.rows, "DeviceDecoder::sample: row " + std::to_string(row) + " of " +
                                            std::to_string(logits_.rows) + " kept logits rows");
  return sampler_->sample(logits_.rows_view(row, 1), position);
}

}  // namespace petrel
