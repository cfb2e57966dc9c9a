#include "generate/stats.h"

#include <cstdio>

namespace petrel {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::StopString: return "stop string";
    case FinishReason::MaxTokens: return "max tokens";
    case FinishReason::ContextFull: return "context full";
    case FinishReason::Cancelled: return "interrupted";
  }
  return "?";
}

std::string stats_line(const GenerationStats& s, FinishReason reason, bool speculative) {
  char buf[256];
  std::string line = "prompt " + std::to_string(s.prompt_tokens) + " tokens";
  if (s.prefilled < s.prompt_tokens) line += " (" + std::to_string(s.prompt_tokens - s.prefilled) + " cached)";
  std::snprintf(buf, sizeof buf, ", first token %.2f s, %d tokens at %.1f tok/s", s.ttft_s, s.generated,
                s.decode_tokens_per_s());
  line += buf;
  if (speculative) {
    std::snprintf(buf, sizeof buf, ", drafts %.0f%% accepted (%d/%d), %.2f tokens per verify step",
                  100.0 * s.acceptance(), s.accepted, s.drafted, s.tokens_per_verify());
    line += buf;
  }
  return line + ", ended: " + finish_reason_name(reason);
}

}  // namespace petrel
