// A safetensors file as the input's bytes, opened by SafetensorsFile: either a petrel::Error or
// tensors whose bytes lie in the data section, match shape x dtype and do not overlap.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {

using petrel::fuzz::require;

void check_tensors(const petrel::SafetensorsFile& file) {
  const std::span<const uint8_t> bytes = file.bytes();
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const uint8_t* data_begin = bytes.data() + 8 + header_len;
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
  unsigned sum = 0;
  for (const auto& [name, t] : file.tensors()) {
    require(t.data >= data_begin && t.nbytes <= size_t(bytes.data() + bytes.size() - t.data),
            "tensor '" + name + "' lies outside the data section");
    require(uint64_t(t.numel()) * petrel::dtype_size(t.dtype) == t.nbytes,
            "tensor '" + name + "' holds " + std::to_string(t.nbytes) + " bytes for shape " + t.shape_str());
    for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    if (t.nbytes) ranges.emplace_back(t.data, t.data + t.nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) require(ranges[i - 1].second <= ranges[i].first, "tensors overlap");
  static volatile unsigned sink;
  sink = sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const petrel::fuzz::ScratchDir dir;
  dir.write("model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const petrel::SafetensorsFile file((dir.path() / "model.safetensors").string());
    check_tensors(file);
  } catch (const petrel::Error&) {
  }
  return 0;
}
