// Sampling a logits row where it lives, for backends whose logits are in device memory. Same
// semantics as the CPU Sampler (src/generate/sampler.h), so only the token id crosses to the host.
// Plain C++17: nvcc compiles the CUDA implementation against this header.
#pragma once
#include <cstdint>

#include "generate/sampling_params.h"

namespace petrel {

struct Tensor;

class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;
  // Starts a new answer: parameters (validated; petrel::Error names a bad field) and an empty
  // penalty history.
  virtual void reset(const SamplingParams& params) = 0;
  // Appends a token of the sequence to the penalty history (`generated`: produced by the model).
  virtual void observe(int32_t token, bool generated) = 0;
  // The tokens the draws started from now on may take, a bit each (token t: bit t % 32 of word
  // t / 32), as the CPU Sampler's set_mask: a structured output's grammar::Matcher::mask. The
  // words are read when start() is called; null, or reset(), lifts the mask.
  virtual void set_mask(const uint32_t* words) = 0;
  // Queues the draw of the token for sequence position `position` from a one-row fp32 logits tensor
  // in device memory, drawn with uniform01(seed, position) as the CPU Sampler draws it (the row is
  // not modified); finish() waits for it. A batched step starts every row's draw before it waits
  // for the first, so the host waits once a step, not once a row.
  virtual void start(const Tensor& logits_row, uint64_t position) = 0;
  virtual int32_t finish() = 0;
  int32_t sample(const Tensor& logits_row, uint64_t position) {
    start(logits_row, position);
    return finish();
  }
};

}  // namespace petrel
