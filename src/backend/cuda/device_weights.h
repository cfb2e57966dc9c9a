// Model weights in device memory: every canonical Matrix uploaded (row gathers applied, bf16 or
// affine 4/8-bit; GGUF block types in their own affine form or IQ4's levels; FP8 as its codes and
// block scales),
// experts stacked per layer so kernels index them by expert id, norm and DeltaNet vectors in fp32. Streams from the mapped checkpoint through one pinned staging buffer.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.cuh"
#include "model/config.h"
#include "model/weights.h"

namespace petrel::cuda {

struct UploadOptions {
  bool int4 = false;     // quantise float matrices to 4-bit (router/shared gate 8-bit), group 64
  bool progress = true;
};

struct ExpertStacks {
  DeviceMatrix gate, up, down;  // count = n_experts
};

// Throws a clear error when the device lacks `bytes` of free memory for `what`.
void check_device_memory(size_t bytes, const std::string& what);

class DeviceWeights {
 public:
  DeviceWeights(const ModelConfig& config, const ModelWeights& weights, const UploadOptions& options,
                cudaStream_t stream);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const DeviceMatrix& matrix(const Matrix& m) const;
  const float* vec(const std::vector<float>& v) const;
  const ExpertStacks& experts(const FfnWeights& f) const;
  // The router columns of an MoE block (RouteSums with cols, ld and n set), null where not built.
  const RouteSums* route(const FfnWeights& f) const;
  size_t bytes() const { return bytes_; }

 private:
  struct Plan {
    const Matrix* m;
    WFormat format;
    int group;
  };
  Plan plan(const Matrix& m, bool router_like) const;
  DeviceMatrix allocate(const Plan& p, int count);
  void fill(const Plan& p, const DeviceMatrix& dst);
  using UnpackRow = std::function<void(int64_t row, uint32_t* codes, uint16_t* first, uint16_t* second)>;
  void upload_coded_rows(const Matrix& m, const DeviceMatrix& dst, const UnpackRow& unpack);
  void fill_gguf_affine(const Matrix& m, const DeviceMatrix& dst);
  void fill_fp8(const Matrix& m, const DeviceMatrix& dst);
  void fill_gguf_iq4(const Matrix& m, const DeviceMatrix& dst);
  void upload_rows(int64_t rows, size_t row_bytes, const std::function<void(int64_t, uint8_t*)>& row, void* dst);
  void add_matrix(const Matrix& m, bool router_like);
  void add_experts(const FfnWeights& f);
  void add_vector(const std::vector<float>& v);
  void add_route(const LayerWeights& L);
  void* device_alloc(size_t bytes);

  UploadOptions opt_;
  cudaStream_t stream_;
  uint8_t* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  size_t bytes_ = 0, planned_ = 0, done_ = 0;
  std::function<void(size_t, size_t)> progress_;
  std::unordered_map<const Matrix*, DeviceMatrix> matrices_;
  std::unordered_map<const void*, DeviceMatrix> by_data_;  // dedupes tied embeddings / LM heads
  std::unordered_map<const std::vector<float>*, float*> vectors_;
  std::unordered_map<const FfnWeights*, ExpertStacks> experts_;
  std::unordered_map<const FfnWeights*, RouteSums> routes_;
  std::vector<void*> allocations_;
};

}  // namespace petrel::cuda
