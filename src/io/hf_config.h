// Reads a Hugging Face / MLX config.json into ModelConfig (VLM-wrapped Qwen3.5 form included).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace petrel {

// `path` is used in error messages only.
ModelConfig parse_hf_config(const nlohmann::json& root, const std::string& path);
// The parsed config.json, with an error naming the file when it is missing or not JSON.
nlohmann::json read_hf_config_json(const std::string& config_json_path);

}  // namespace petrel
