// What speculative decoding drafts with and how much (petrel run/chat/bench, and the scheduler).
#pragma once
#include <optional>

namespace petrel {

// Where drafts come from: prompt lookup, or the checkpoint's multi-token prediction head.
enum class DraftSource { Ngram, Mtp };

// Default draft lengths: prompt lookup drafts for free; each further MTP draft costs a step of the
// head and is right less often than the one before.
constexpr int kNgramDraft = 6, kMtpDraft = 3;

struct SpeculativeOptions {
  int draft = 0;      // most tokens drafted per step; 0: no speculation
  int ngram_min = 2;  // shortest suffix n-gram the drafter looks up
  int ngram_max = 4;  // longest (tried first)
  DraftSource source = DraftSource::Ngram;
  // Benchmarks only (petrel bench --draft-accept-rate): each drafted token is taken with this
  // probability, up to the first one refused, whatever the model samples; the device work is that
  // of real acceptance, the output is not the model's. Unset: drafts are verified (exact).
  std::optional<double> forced_acceptance{};
};

}  // namespace petrel
