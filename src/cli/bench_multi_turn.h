// `petrel bench --multi-turn`: a chat whose every turn resends the whole conversation, served by
// the continuous-batching scheduler with and without the prefix cache; per turn the time to the
// first token both ways and how much of the previous turns the cache restored.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>

#include "runtime/forward.h"

namespace petrel::cli {

struct MultiTurnOptions {
  int system_tokens = 2048;  // the conversation's opening prompt
  int turns = 8;
  int final_tokens = 16384;  // the last turn's prompt; each turn grows it by the same step
  int reply_tokens = 128;    // generated (greedy) per turn, and resent with the next turn
  int turn_gap_ms = 0;       // the user's pause between a reply's end and the next turn
  int prefill_chunk = 8192;  // prompt tokens fed between two scheduler steps
  size_t cache_bytes = size_t(4096) << 20;
  size_t host_cache_bytes = 0;  // snapshots spilled to host memory (PrefixCacheOptions::host_budget_bytes)
  int runs = 5;  // timed conversations per mode after one warm-up
};

// Throws petrel::Error naming the option when the turns cannot be laid out in the model's context.
void check_multi_turn(const MultiTurnOptions& o, const ModelConfig& config);
// Runs the conversation runs + 1 times each way (the first as a warm-up) and returns per-turn
// medians with min, max and every run.
nlohmann::json multi_turn(Model& model, const MultiTurnOptions& o);
void print_multi_turn(const nlohmann::json& m);

}  // namespace petrel::cli
