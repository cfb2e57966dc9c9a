// The generation loop: prefill, then sample token after token (optionally drafting and verifying
// several at once) until a stop rule fires. Text, stop strings and printing live in the caller's
// TokenSink; this file deals in token ids only.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "generate/decoder.h"
#include "generate/mtp_draft.h"
#include "generate/sampling_params.h"
#include "generate/speculative_options.h"
#include "generate/stats.h"
#include "grammar/matcher.h"

namespace petrel {

struct GenerateRequest {
  // The whole sequence so far. The state passed to generate() already holds its first n_past
  // tokens; the rest (at least one) is prefilled.
  std::span<const int32_t> tokens;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  int max_tokens = -1;  // -1: until EOS or the context is full
  SpeculativeOptions speculative;
  const std::atomic<bool>* cancel = nullptr;  // checked after every token
  // Structured output: the answer is held to this grammar (null: free text), which starts after
  // the reasoning when the model has `reasoning` tags (ThinkFilter::reasoning). Not with
  // speculation.
  std::shared_ptr<const grammar::TokenGrammar> grammar;
  std::optional<grammar::ReasoningTags> reasoning;
  // Origin of the time-to-first-token, for callers that did work (e.g. a prefix checkpoint) first.
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

struct GenerateResult {
  // Every sampled token in order, EOS included; empty when cancelled during the prefill (the
  // state then holds part of the prompt: its first n_past tokens).
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::MaxTokens;
  GenerationStats stats;
  // The state passed in now holds request.tokens followed by all of `tokens` but the last.
};

// Called with every sampled token except EOS ids; returning false ends the answer (stop string).
using TokenSink = std::function<bool(int32_t)>;

class Generator {
 public:
  explicit Generator(Decoder& decoder) : decoder_(decoder) {}

  // `st` may be swapped for an equivalent state object (speculation verifies on a scratch copy
  // and keeps it when every drafted token was accepted).
  GenerateResult generate(std::unique_ptr<SequenceState>& st, const GenerateRequest& request, const TokenSink& sink);

 private:
  // Feeds the tokens `st` does not hold yet, keeping the last row's logits; false if cancelled.
  // With an MTP drafter, every step but the last is followed by the head's; the last step's first
  // row is returned (the head reads it once the next token is sampled).
  bool prefill(SequenceState& st, const GenerateRequest& req, int* last_step);
  // The MTP drafter for `req`'s sequence of `capacity` tokens, made or reused; null without MTP.
  MtpDrafter* mtp_for(const GenerateRequest& req, int capacity);

  Decoder& decoder_;
  std::unique_ptr<SequenceState> scratch_;  // verification copy, reused across calls
  std::unique_ptr<MtpDrafter> mtp_;        // reused across calls
};

}  // namespace petrel
