// `petrel bench --speculative mtp|ngram`: batch-1 decode through the generation loop, plainly and
// with speculative decoding, and how many drafted tokens were accepted. Random (synthetic) weights
// never draft right, so a forced acceptance rate stands in for a real checkpoint's: the head still
// drafts, the target still verifies every draft in one step and the state is still rolled back to
// the accepted position, so the device work is that of real acceptance at that rate.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "generate/generator.h"
#include "runtime/forward.h"

namespace petrel::cli {

struct SpeculativeBench {
  SpeculativeOptions speculative;  // draft source and length, and the forced acceptance if any
  int decode_tokens = 64;          // timed tokens per run, after the first (the prefill's)
  int runs = 5;                    // timed runs per mode after one warm-up
};

// Greedy decoding after `prompt` (`context` names the row), plain and speculative, each runs + 1
// times: tokens per second (median, min, max, every run), the speedup of the medians, and the
// drafts' totals over the timed runs with the acceptance rate and the mean accepted length
// (tokens one verify step emits: its accepted drafts and the token sampled after them).
nlohmann::json speculative_decode(Model& model, const SpeculativeBench& o, int context,
                                  const std::vector<int32_t>& prompt);
void print_speculative_decode(const nlohmann::json& row);
// One speculative generation as speculative_decode times it (after two that record what it
// replays), to run under a kernel trace.
std::function<void()> speculative_generation(Model& model, const SpeculativeBench& o,
                                             const std::vector<int32_t>& prompt);

}  // namespace petrel::cli
