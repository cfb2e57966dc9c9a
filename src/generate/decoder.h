// The seam between the generation loop and where logits live. The loop feeds tokens and asks for
// the token after a fed row; it never touches logits itself. HostDecoder copies logits to the
// host and samples there with the CPU Sampler; DeviceDecoder keeps them in device memory and
// samples there with the backend's DeviceSampler, so only the token id reaches the host.
// make_decoder.h picks one for a model.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "generate/sampling_params.h"
#include "runtime/forward.h"

namespace petrel {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual int vocab() const = 0;
  virtual std::unique_ptr<SequenceState> new_sequence(int capacity) = 0;
  // Starts a new answer: sampling parameters and an empty penalty history.
  virtual void reset(const SamplingParams& params) = 0;
  // Appends a token of the sequence to the penalty history (`generated`: produced by the model).
  virtual void observe(int32_t token, bool generated) = 0;
  // A token mask for the following sample() calls (see Sampler::set_mask); null: none. Cleared
  // by reset().
  virtual void set_mask(const uint32_t* words) = 0;
  // Consumes `n` tokens continuing `st`, keeping the logits `keep` says for sample().
  virtual void feed(const int32_t* ids, int n, SequenceState& st, KeepLogits keep) = 0;
  // The token for sequence position `position` from kept row `row` (0 with KeepLogits::Last),
  // under the penalty history observed so far.
  virtual int32_t sample(int row, uint64_t position) = 0;
  // The model the decoder runs, for drafters that read its hidden states; null where none.
  virtual Model* model() { return nullptr; }
};

// What HostDecoder and DeviceDecoder share: the model they run.
class ModelDecoder : public Decoder {
 public:
  explicit ModelDecoder(Model& model) : model_(model) {}
  int vocab() const override { return model_.config().vocab; }
  std::unique_ptr<SequenceState> new_sequence(int capacity) override { return model_.new_sequence(capacity); }
  Model* model() override { return &model_; }

 protected:
  Model& model_;
};

}  // namespace petrel
