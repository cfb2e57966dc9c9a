// Decoder for backends whose logits are read on the host: Model::forward into a host buffer,
// then the CPU Sampler.
#pragma once
#include <memory>
#include <vector>

#include "generate/decoder.h"
#include "generate/sampler.h"
#include "model/forward.h"

namespace petrel {

class HostDecoder final : public Decoder {
 public:
  explicit HostDecoder(Model& model) : model_(model) {}

  int vocab() const override { return model_.config().vocab; }
  std::unique_ptr<SequenceState> new_sequence(int capacity) override { return model_.new_sequence(capacity); }
  void reset(const SamplingParams& params) override;
  void observe(int32_t token, bool generated) override;
  void feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) override;
  int32_t sample(int row, uint64_t position) override;

 private:
  Model& model_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<float> logits_;  // kept rows, [rows, vocab]
  int rows_ = 0;
};

}  // namespace petrel
