// What one answer cost, and the one-line summary printed after it.
#pragma once
#include <string>

namespace petrel {

enum class FinishReason { Eos, StopString, MaxTokens, ContextFull, Cancelled };
const char* finish_reason_name(FinishReason r);

struct GenerationStats {
  int prompt_tokens = 0;  // length of the sequence before generation
  int prefilled = 0;      // of those, fed in this request (the rest came from a cache)
  int generated = 0;      // sampled tokens, EOS included
  double ttft_s = 0.0;    // start -> first sampled token
  double decode_s = 0.0;  // first -> last sampled token
  int drafted = 0, accepted = 0, verify_steps = 0;

  double decode_tokens_per_s() const { return decode_s > 0.0 ? (generated - 1) / decode_s : 0.0; }
  double acceptance() const { return drafted > 0 ? double(accepted) / drafted : 0.0; }
  // Mean accepted length: tokens a verify step emits (its accepted drafts and the one sampled after).
  double tokens_per_verify() const { return verify_steps > 0 ? double(accepted + verify_steps) / verify_steps : 0.0; }
};

// "prompt 812 tokens (790 cached), first token 0.21 s, 128 tokens at 41.3 tok/s,
//  drafts 61% accepted (203/333), 2.83 tokens per verify step, ended: max tokens"
std::string stats_line(const GenerationStats& s, FinishReason reason, bool speculative);

}  // namespace petrel
