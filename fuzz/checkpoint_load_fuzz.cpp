// A checkpoint folder made from the input, opened as `petrel inspect` and every model load open
// one (Checkpoint::open: config.json, safetensors headers, canonical weights). The input is files
// joined by kSeparator: config.json, model.safetensors, then optionally
// model.safetensors.index.json and shards model-00001.safetensors, model-00002.safetensors, ...
// Either a petrel::Error, or weights whose every matrix reads bytes of one tensor only.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/checkpoint.h"

namespace {

using petrel::Checkpoint;
using petrel::Matrix;
using petrel::fuzz::require;

constexpr std::string_view kSeparator = "\n--petrel-fuzz-file--\n";
constexpr size_t kMaxFiles = 8;

std::string file_name(size_t part) {
  if (part == 0) return "config.json";
  if (part == 1) return "model.safetensors";
  if (part == 2) return "model.safetensors.index.json";
  return "model-0000" + std::to_string(part - 2) + ".safetensors";
}

// Whether [p, p + n) lies inside the bytes of a single tensor.
bool inside_one_tensor(const Checkpoint& ck, const void* p, size_t n) {
  const auto* begin = static_cast<const uint8_t*>(p);
  for (const auto& file : ck.files())
    for (const auto& [name, t] : file->tensors())
      if (begin >= t.data && begin < t.data + t.nbytes) return n <= size_t(t.data + t.nbytes - begin);
  return false;
}

// One more than the largest stored row a matrix reads.
int64_t stored_rows(const Matrix& m) {
  int64_t rows = 0;
  for (int64_t r = 0; r < m.rows; ++r) rows = std::max(rows, m.stored_row(r) + 1);
  return rows;
}

void check_matrix(const Checkpoint& ck, const Matrix& m) {
  if (!m.valid()) return;
  const int64_t rows = stored_rows(m);
  const size_t es = petrel::dtype_size(m.dtype);
  if (m.format == petrel::MatrixFormat::Dense) {
    require(inside_one_tensor(ck, m.data, size_t(rows * m.cols) * es), m.name + ": rows outside its tensor");
  } else {
    const int64_t groups = m.cols / m.group;
    require(inside_one_tensor(ck, m.data, size_t(rows * m.cols * m.bits / 8)), m.name + ": codes outside its tensor");
    require(inside_one_tensor(ck, m.scales, size_t(rows * groups) * es), m.name + ": scales outside their tensor");
    require(inside_one_tensor(ck, m.biases, size_t(rows * groups) * es), m.name + ": biases outside their tensor");
  }
  std::vector<float> row(size_t(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.dequant_row(r, row.data());
}

void check_weights(const Checkpoint& ck) {
  const petrel::ModelWeights& w = ck.weights();
  check_matrix(ck, w.embed);
  check_matrix(ck, w.lm_head);
  for (const petrel::LayerWeights& l : w.layers) {
    for (const Matrix* m : {&l.attn.q, &l.attn.gate, &l.attn.k, &l.attn.v, &l.attn.o, &l.gdn.qkv, &l.gdn.z,
                            &l.gdn.b, &l.gdn.a, &l.gdn.out, &l.ffn.router, &l.ffn.shared_gate, &l.ffn.dense.gate,
                            &l.ffn.dense.up, &l.ffn.dense.down, &l.ffn.shared.gate, &l.ffn.shared.up,
                            &l.ffn.shared.down})
      check_matrix(ck, *m);
    for (const petrel::MlpWeights& e : l.ffn.experts)
      for (const Matrix* m : {&e.gate, &e.up, &e.down}) check_matrix(ck, *m);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const petrel::fuzz::ScratchDir dir;
  const auto parts = petrel::fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), kSeparator);
  if (parts.size() > kMaxFiles) return -1;  // not a checkpoint this target explores
  dir.clear();
  for (size_t i = 0; i < parts.size(); ++i) dir.write(file_name(i), parts[i]);
  try {
    check_weights(*Checkpoint::open(dir.path().string()));
  } catch (const petrel::Error&) {
  }
  return 0;
}
