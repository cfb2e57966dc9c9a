// NumPy .npy files (version 1.0, little-endian float32, C order) for logits dumps and fixtures.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace petrel {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
NpyArray read_npy_f32(const std::string& path);

}  // namespace petrel
