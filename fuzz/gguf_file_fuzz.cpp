// A GGUF file as the input's bytes, opened by GgufFile and then by Checkpoint::open: either a
// petrel::Error, or tensors that lie in the data section, hold exactly their blocks and do not
// overlap, and (for a checkpoint) weight rows that decode from bytes of their own tensor.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "io/gguf.h"

namespace {

using petrel::fuzz::require;

volatile float decoded_sum;  // keeps the decoding of check_weights from being optimised away

void check_tensors(const petrel::GgufFile& file) {
  const std::span<const uint8_t> bytes = file.bytes();
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
  for (const petrel::GgufTensor& t : file.tensors()) {
    require(t.data >= bytes.data() + file.data_offset() && t.nbytes <= size_t(bytes.data() + bytes.size() - t.data),
            "tensor '" + t.name + "' lies outside the data section");
    const uint64_t expected = t.rows() == 0 ? 0 : uint64_t(t.rows()) * uint64_t(petrel::ggml_row_bytes(t.type, t.row_length()));
    require(expected == t.nbytes,
            "tensor '" + t.name + "' holds " + std::to_string(t.nbytes) + " bytes for " + t.shape_str() + " of " +
                petrel::ggml_type_name(t.type));
    if (t.nbytes) ranges.emplace_back(t.data, t.data + t.nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) require(ranges[i - 1].second <= ranges[i].first, "tensors overlap");
}

// Decodes the first and last row of every matrix: under AddressSanitizer a row that reaches past
// its tensor's mapping is a crash.
void check_weights(const petrel::ModelWeights& w) {
  std::vector<const petrel::Matrix*> all = {&w.embed, &w.lm_head};
  for (const auto& L : w.layers) {
    for (const petrel::Matrix* m : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o, &L.ffn.router, &L.ffn.dense.gate,
                                    &L.ffn.dense.up, &L.ffn.dense.down})
      all.push_back(m);
    for (const auto& e : L.ffn.experts)
      for (const petrel::Matrix* m : {&e.gate, &e.up, &e.down}) all.push_back(m);
  }
  float sum = 0;
  for (const petrel::Matrix* m : all) {
    if (!m->valid()) continue;
    std::vector<float> row(size_t(m->cols));
    for (int64_t r : {int64_t(0), m->rows - 1}) {
      m->dequant_row(r, row.data());
      for (float x : row) sum += x;
    }
  }
  decoded_sum = sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const petrel::fuzz::ScratchDir dir;
  dir.write("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  const std::string path = (dir.path() / "model.gguf").string();
  try {
    const petrel::GgufFile file(path);
    check_tensors(file);
    check_weights(petrel::Checkpoint::open(path)->weights());
  } catch (const petrel::Error&) {
  }
  return 0;
}
