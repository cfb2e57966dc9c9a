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

}  // namespace petrel
