// `--quantize fp8` on the CPU: the float matrices of a model as e4m3 codes with one fp32 scale per
// 128x128 block, made at load the way fine-grained FP8 checkpoints are made (block max -> scale
// 448 / max, codes rounded to nearest even, partial edge blocks), so a bf16 checkpoint computes
// what its FP8 release would. The embedding, the LM head, routers and shared-expert gates stay as
// stored, as those releases keep them.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "model/weights.h"

namespace petrel {

class Fp8Copy {
 public:
  explicit Fp8Copy(const ModelWeights& source);
  Fp8Copy(const Fp8Copy&) = delete;
  Fp8Copy& operator=(const Fp8Copy&) = delete;

  const ModelWeights& weights() const { return weights_; }

 private:
  // One stored tensor, quantized once for every view of it (q and gate gather rows of q_proj).
  struct Codes {
    int64_t rows = 0;
    std::vector<uint8_t> codes;
    std::vector<float> scales;
  };
  void convert(Matrix& m);

  ModelWeights weights_;
  std::map<const void*, Codes> stored_;
};

// Calls fn for every matrix FP8 releases quantize: all but the embedding, the LM head, the routers
// and the shared-expert gates.
void for_each_fp8_matrix(ModelWeights& w, const std::function<void(Matrix&)>& fn);

// Quantizes a [rows, cols] fp32 matrix (row-major) in blocks of br x bc: codes [rows, cols] and
// inverse scales [ceil(rows / br), ceil(cols / bc)].
void quantize_fp8_blocks(const float* w, int64_t rows, int64_t cols, int br, int bc, uint8_t* codes,
                         float* inv_scales);

}  // namespace petrel
