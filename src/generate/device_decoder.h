// Decoder for backends that sample where the logits are: the kept logits rows stay in backend
// memory and the backend's DeviceSampler picks the token, so only its id reaches the host.
#pragma once
#include <memory>

#include "backend/device_sampler.h"
#include "generate/decoder.h"
#include "runtime/forward.h"

namespace petrel {

class DeviceDecoder final : public ModelDecoder {
 public:
  // `sampler` comes from model.backend().make_sampler(vocab).
  DeviceDecoder(Model& model, std::unique_ptr<DeviceSampler> sampler);

  void reset(const SamplingParams& params) override;
  void observe(int32_t token, bool generated) override;
  // Only null: token masks are applied on the host (structured output uses a HostDecoder).
  void set_mask(const uint32_t* words) override;
  void feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) override;
  int32_t sample(int row, uint64_t position) override;

 private:
  std::unique_ptr<DeviceSampler> sampler_;
  bool ready_ = false;  // reset() was called
  Tensor logits_;       // kept rows in backend memory, [rows, vocab] fp32
};

}  // namespace petrel
