// Picks how generation samples a model's logits: on the device when its backend offers a
// DeviceSampler (CUDA), else on the host with the CPU Sampler.
#pragma once
#include <memory>

#include "generate/decoder.h"
#include "runtime/forward.h"

namespace petrel {

std::unique_ptr<Decoder> make_decoder(Model& model);

}  // namespace petrel
