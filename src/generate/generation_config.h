// A checkpoint's generation defaults (generation_config.json), which command-line flags and
// request fields override.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "generate/sampling_params.h"

namespace petrel {

struct GenerationDefaults {
  // temperature, top_k, top_p, min_p, repetition_penalty as given; do_sample false or absent
  // means greedy (temperature 0), as in Hugging Face's generate().
  SamplingParams sampling = [] {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }();
  // eos_token_id of generation_config.json, plus the tokenizer's eos_token (the end-of-turn
  // token of chat models, e.g. <|im_end|>) when tokenizer_config.json names one in the vocabulary.
  std::vector<int32_t> eos_ids;
  std::optional<int> max_new_tokens;
};

// Reads DIR/generation_config.json (absent: defaults above). `eos_token_id` resolves the
// tokenizer's eos_token string to an id (nullopt when unknown). Bad fields throw naming them.
GenerationDefaults load_generation_defaults(const std::filesystem::path& dir,
                                            const std::function<std::optional<int32_t>(const std::string&)>& eos_token_id);

}  // namespace petrel
