// A checkpoint (an HF safetensors folder, single or sharded, or MLX affine-quantized; or a GGUF
// file, single or split) opened into ModelConfig + canonical ModelWeights that view the mapped
// files without copying.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace petrel {

enum class CheckpointFormat { HuggingFace, Mlx, Gguf };

struct CheckpointInfo {
  CheckpointFormat format = CheckpointFormat::HuggingFace;
  std::string format_name;   // "hf-bf16", "hf-fp8", "mlx-4bit", "gguf Q4_K/Q6_K", ...
  bool norms_preshifted = false;
  size_t weight_bytes = 0;   // bytes of all tensors used by the model
  int64_t parameters = 0;    // logical parameter count of the tensors used
  int64_t active_parameters = 0;  // per token: routed experts counted top_k of n_experts
  std::vector<std::string> skipped;  // tensors ignored (vision tower, an unused MTP head, ...)
};

// Called with (bytes done, bytes total) while the mapped weights are paged in.
using LoadProgress = std::function<void(size_t, size_t)>;

class Checkpoint {
 public:
  // Opens `dir`, a checkpoint folder or a .gguf file (any shard of a split one); throws
  // petrel::Error naming the file/tensor/field on any defect.
  static std::unique_ptr<Checkpoint> open(const std::string& dir, const LoadProgress& progress = {});

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const CheckpointInfo& info() const { return info_; }
  // The mapped safetensors files that the weights view (none for a GGUF checkpoint).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Checkpoint() = default;
  void open_files();
  void open_gguf();
  void choose_mtp_layers(const std::string& cfg_path);
  // Pages the mapped weights in and runs the repacks, reporting both to `progress`.
  void page_in(const LoadProgress& progress);
  void count_parameters();

  std::string dir_;
  ModelConfig config_;
  ModelWeights weights_;
  CheckpointInfo info_;
  QuantConfig quant_;  // what config.json declares
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;  // canonical name -> tensor
  std::map<std::string, std::string> original_name_;  // canonical name -> name in the file
  std::unique_ptr<GgufModel> gguf_;  // a GGUF checkpoint's files, instead of files_
  std::vector<std::vector<uint8_t>> rewritten_;  // GGUF tensors whose columns had to be reordered
  // A GPTQ/AWQ tensor set rewritten into petrel's affine layout while the weights are paged in:
  // `run` reads `sources` (paged in by it, not separately) and fills buffers of `owned_`.
  struct Repack {
    std::vector<std::span<const uint8_t>> sources;
    std::function<void()> run;
  };
  std::vector<Repack> repacks_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // repacked codes, scales and biases

  friend class WeightMapper;
  friend class GgufWeightMapper;
};

}  // namespace petrel
