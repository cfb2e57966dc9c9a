// Synthetic models of real shapes for benchmarks: configs of released checkpoints and weights that
// have shapes but no host data (a device backend fills them with random values).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace petrel {

// "qwen3.5-35b-a3b", "qwen3-next-80b-a3b" or "qwen3-30b-a3b"; throws naming the choices otherwise.
ModelConfig synthetic_config(const std::string& name);
std::vector<std::string> synthetic_names();

// Weights of `config`'s shapes: matrices without data, norm/DeltaNet vectors filled with plausible
// constants (the vectors are small and live on the host like a checkpoint's).
std::unique_ptr<ModelWeights> synthetic_weights(const ModelConfig& config);

// The GGUF quantisation mixes a synthetic model can be stored as ("q4_0", "q4_k_m").
std::vector<std::string> synthetic_gguf_mixes();
// Marks every matrix of synthetic weights w as GGUF blocks of the types llama.cpp's quantiser
// gives it in `mix` (routers and shared gates stay float, as quantised files keep them), so a
// device backend stores them as it stores such a file's; throws naming the mixes otherwise.
void store_as_gguf_mix(ModelWeights& w, const std::string& mix);
// Marks a synthetic model's matrices as fine-grained FP8 (e4m3, 128x128 block scales), those an FP8
// release quantizes: the CUDA upload then fills them as FP8 codes.
void store_as_fp8(ModelWeights& w);

}  // namespace petrel
