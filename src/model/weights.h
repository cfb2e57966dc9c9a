// Canonical weights: every checkpoint format is mapped into these roles by io/checkpoint.cpp.
// The model never sees a file name or a format quirk (norm shifts, grouped qkvz, fused experts).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/gguf_quants.h"
#include "model/config.h"

namespace petrel {

enum class MatrixFormat { Dense, Affine, Gguf, Fp8 };

// A [rows, cols] weight used as y = x · Wᵀ, viewed in place (usually inside the mmapped checkpoint).
// Affine: MLX scheme, `bits`-bit unsigned codes packed little-endian into u32 words along a row,
// w = scale·q + bias per group of `group` consecutive columns.
// Gguf: each row is ggml blocks of type `ggml` (a block-quantized type such as Q4_K; GGUF's float
// types are viewed as Dense), rows back to back, decoded as gguf-py decodes them.
// Fp8: e4m3 codes (core/fp8.h), one byte a weight, rows back to back; w = code value · scale of its
// block of `fp8.block_rows` x `fp8.block_cols` weights. Each [slab_rows, cols] slab of a stacked
// tensor has its own scale grid of [ceil(slab_rows / block_rows), ceil(cols / block_cols)]; edge
// blocks are partial.
struct Fp8Blocks {
  int block_rows = 0, block_cols = 0;
  int64_t slab_rows = 0;
  int64_t first_row = 0;  // the tensor row that stored row 0 is (a slice keeps its place in the grid)
  int64_t grid_cols(int64_t cols) const { return (cols + block_cols - 1) / block_cols; }
  int64_t grid_rows() const { return (slab_rows + block_rows - 1) / block_rows; }
};

struct Matrix {
  std::string name;  // source tensor, for messages
  int64_t rows = 0, cols = 0;
  MatrixFormat format = MatrixFormat::Dense;
  DType dtype = DType::F32;  // Dense: element type; Affine, Fp8: type of the scales (and biases)
  const void* data = nullptr;  // Dense elements, packed words or fp8 codes
  const void* scales = nullptr;
  const void* biases = nullptr;
  int bits = 0, group = 0;
  GgmlType ggml = GgmlType::F32;  // Gguf: the block type of every row
  Fp8Blocks fp8;
  // Optional row gather: logical row r reads stored row row_map[r] (de-interleaves without copying).
  std::shared_ptr<const std::vector<int32_t>> row_map;

  bool valid() const { return rows > 0; }  // synthetic (benchmark) matrices have shape but no host data
  int64_t stored_row(int64_t r) const { return row_map ? (*row_map)[r] : r; }
  // Decodes logical row r into `out` (cols floats).
  void dequant_row(int64_t r, float* out) const;
  // Fp8: the scale of stored row sr's block that holds column col.
  float fp8_scale(int64_t sr, int64_t col) const;
  // Bytes a full read of this matrix moves (weights + scales + biases).
  size_t bytes() const;
  // Stored rows [row0, row0 + nrows) as a matrix of their own (one expert of a stacked tensor);
  // for a matrix without a row map.
  Matrix slice_rows(int64_t row0, int64_t nrows) const;
};

struct AttentionWeights {
  Matrix q;                // [Hq·D, H] queries
  Matrix gate;             // [Hq·D, H] output gate (Qwen3-Next / Qwen3.5); invalid otherwise
  Matrix k, v, o;          // [Hkv·D, H], [Hkv·D, H], [H, Hq·D]
  std::vector<float> q_norm, k_norm;  // [D] effective RMSNorm multipliers
};

struct DeltaNetWeights {
  Matrix qkv;   // [2·Hk·dk + Hv·dv, H], channels [q | k | v], v heads in HF order
  Matrix z;     // [Hv·dv, H]
  Matrix b, a;  // [Hv, H]
  Matrix out;   // [H, Hv·dv]
  std::vector<float> conv;     // [C, K] depthwise causal conv, conv[c·K + K-1] hits the current token
  std::vector<float> A_log;    // [Hv]
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;     // [dv] gated RMSNorm weight (plain, not zero-centred)
};

struct MlpWeights {
  Matrix gate, up, down;  // SwiGLU: down(silu(gate·x) ⊙ up·x)
};

struct FfnWeights {
  bool moe = false;
  MlpWeights dense;               // when !moe
  Matrix router;                  // [E, H]
  std::vector<MlpWeights> experts;
  bool has_shared = false;
  MlpWeights shared;
  Matrix shared_gate;             // [1, H], sigmoid scalar gate on the shared expert
};

struct LayerWeights {
  LayerKind kind = LayerKind::FullAttention;
  std::vector<float> input_norm, post_norm;  // effective multipliers (zero-centred +1 already applied)
  AttentionWeights attn;
  DeltaNetWeights gdn;
  FfnWeights ffn;
};

// The multi-token prediction head: from the trunk's final hidden state h_t and the embedding of
// the token after it, predicts the token after that (model/step_ops.h mtp_step_ops). It shares the
// trunk's embedding and LM head.
struct MtpWeights {
  std::vector<float> embed_norm, hidden_norm;  // pre_fc_norm_embedding, pre_fc_norm_hidden
  Matrix fc;                                   // [H, 2H] over [normed embedding | normed hidden]
  std::vector<LayerWeights> layers;            // full-attention decoder layers
  std::vector<float> norm;                     // applied before the shared LM head
};

struct ModelWeights {
  Matrix embed;  // [V, H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  Matrix lm_head;  // [V, H]
  MtpWeights mtp;  // no layers when config.mtp_layers is 0
};

}  // namespace petrel
