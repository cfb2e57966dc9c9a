#include "generate/make_decoder.h"

#include "generate/device_decoder.h"
#include "generate/host_decoder.h"

namespace petrel {

std::unique_ptr<Decoder> make_decoder(Model& model) {
  if (auto sampler = model.backend().make_sampler(model.config().vocab))
    return std::make_unique<DeviceDecoder>(model, std::move(sampler));
  return std::make_unique<HostDecoder>(model);
}

}  // namespace petrel
