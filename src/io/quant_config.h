// The weight quantization a checkpoint's config.json declares. Petrel reads MLX affine codes
// ("quantization"), fine-grained FP8 and GPTQ / AWQ (gemm) group-wise integer codes
// (quantization_config.quant_method "fp8", "gptq", "awq"); any other method (bitsandbytes,
// compressed-tensors, ...) or variant is refused here by name, before a tensor is looked at, so the
// error says why instead of which tensor is missing.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace petrel {

enum class QuantMethod { None, MlxAffine, Fp8, Gptq, Awq };

struct QuantConfig {
  QuantMethod method = QuantMethod::None;
  nlohmann::json mlx;  // MlxAffine: the "quantization" object (bits, group_size, per-module overrides)
  int block_rows = 0, block_cols = 0;  // Fp8: weight_block_size
  int bits = 0, group_size = 0;        // Gptq, Awq; group_size -1 is one group per row
  bool zeros_minus_one = false;        // Gptq: checkpoint_format "gptq" (v1) stores each zero point less 1
};

// Reads `root` (config.json at `cfg_path`); throws petrel::Error naming the field on an unsupported
// method or a malformed value.
QuantConfig parse_quant_config(const nlohmann::json& root, const std::string& cfg_path);

// Throws petrel::Error when tensor `name` of `file` is a part only another method's files have
// (GPTQ/AWQ ".qweight" where config.json declares neither, bitsandbytes ".absmax"): such folders
// may declare their method outside config.json, and would otherwise fail later on a missing ".weight".
void refuse_foreign_quant_tensor(const std::string& file, const std::string& name, QuantMethod declared);

}  // namespace petrel
