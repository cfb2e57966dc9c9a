// GGUF metadata -> ModelConfig, for the GGUF architectures Petrel reads (qwen3, qwen3moe, qwen35,
// qwen35moe, qwen3next). The keys are those llama.cpp's converter (convert_hf_to_gguf.py,
// TextModel.set_gguf_parameters and the Qwen model classes) writes from config.json.
#pragma once
#include "io/gguf.h"
#include "model/config.h"

namespace petrel {

// Throws petrel::Error naming the file and key on a missing or out-of-range value, and naming
// the architecture (with the supported ones) when general.architecture is not read.
ModelConfig parse_gguf_config(const GgufModel& model);

}  // namespace petrel
