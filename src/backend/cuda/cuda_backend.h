// The CUDA backend: bf16 activations, fp32 accumulation and recurrent state, weights in bf16 or
// affine 4/8-bit on the device, routing on the device, decode steps replayed as CUDA graphs.
// This header is plain C++ so the CLI can create the backend without CUDA headers.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace petrel {

enum class DeviceWeights { AsStored, Int4 };

struct CudaOptions {
  int device = 0;
  // AsStored: bf16/f16/f32 checkpoints upload as bf16, MLX ones keep their 4/8-bit codes.
  // Int4: bf16 checkpoints are quantised at load with MLX's affine scheme (group 64; router and
  // shared-expert gate 8-bit).
  DeviceWeights weights = DeviceWeights::AsStored;
  bool graphs = true;     // replay decode steps as CUDA graphs
  bool progress = true;   // upload progress bar
};

// A decode step whose context (its new key included) has at most this many keys runs each
// attention layer as one launch (cuda::attention_short), recorded apart from longer contexts' steps.
constexpr int kCudaShortAttentionKeys = 128;
// Past it, up to this many keys, the same one launch runs on a cluster of blocks per KV head
// (cuda::attention_cluster, Hopper), recorded apart from the longer contexts' steps too. Its 16
// blocks a KV head read every key, so longer contexts go faster split over more multiprocessors.
constexpr int kCudaClusterAttentionKeys = 2048;
// Past it, up to this many keys, the same launch takes several clusters a KV head (more
// multiprocessors pulling the keys), merged by the new key's cluster; its steps are recorded apart.
constexpr int kCudaWideClusterAttentionKeys = 8192;

// True when this build has CUDA and a device is present.
bool cuda_available();
// One line naming the device and its memory, or why there is none.
std::string cuda_device_summary();
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);
// Device-to-device copy bandwidth (bytes read + written per second), median of several 2 GiB copies:
// the practical HBM limit benchmarks compare against.
double cuda_copy_bandwidth();

}  // namespace petrel
