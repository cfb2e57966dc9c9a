// The CUDA backend's DeviceSampler: samples a logits row in device memory on the backend's stream.
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "backend/device_sampler.h"

namespace petrel::cuda {

// The draws the backend's samplers have started and not yet launched, launched together.
class DrawBatch;
std::shared_ptr<DrawBatch> make_draw_batch(int vocab, cudaStream_t stream);

std::unique_ptr<DeviceSampler> make_sampler(int vocab, cudaStream_t stream, std::shared_ptr<DrawBatch> batch);

}  // namespace petrel::cuda
