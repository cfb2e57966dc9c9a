// Decoder for backends whose logits are read on the host: Model::forward into a host buffer,
// then the CPU Sampler.
#pragma once
#include <memory>
#include <vector>

#include "generate/decoder.h"
#include "generate/sampler.h"
#include "runtime/forward.h"

namespace petrel {

class HostDecoder final : public ModelDecoder {
 public:
  explicit HostDecoder(Model& model) : ModelDecoder(model) {}

  void reset(const SamplingParams& params) override;
  void observe(int32_t token, bool generated) override;
  void set_mask(const uint32_t* words) override;
  void feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) override;
  int32_t sample(int row, uint64_t position) override;

 private:
  std::unique_ptr<Sampler> sampler_;
  std::vector<float> logits_;  // kept rows, [rows, vocab]
  int rows_ = 0;
};

}  // namespace petrel
