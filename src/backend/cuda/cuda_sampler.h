// The CUDA backend's DeviceSampler: samples a logits row in device memory on the backend's stream.
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "backend/device_sampler.h"

namespace petrel::cuda {

std::unique_ptr<DeviceSampler> make_sampler(int vocab, cudaStream_t stream);

}  // namespace petrel::cuda
