// JSON read from checkpoint files (config.json, the index, safetensors headers), parsed with a cap
// on nesting: values are later walked recursively (dump() in error messages), so a file of a
// million '[' must be an error, not a stack overflow.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace petrel {

// Deeper than any checkpoint file nests (config.json: 3 levels, safetensors headers: 3).
constexpr int kMaxCheckpointJsonDepth = 64;

// Parses `input` (a stream or an iterator pair's range, as nlohmann::json::parse takes); `where`
// begins every error message ("DIR/config.json" or "FILE: malformed header").
template <class... Input>
nlohmann::json parse_checkpoint_json(const std::string& where, Input&&... input) {
  try {
    return nlohmann::json::parse(std::forward<Input>(input)...,
                                 [&where](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
                                   check(depth <= kMaxCheckpointJsonDepth,
                                         where + ": JSON nests deeper than " +
                                             std::to_string(kMaxCheckpointJsonDepth) + " levels");
                                   return true;
                                 });
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace petrel
