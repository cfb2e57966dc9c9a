// The flags `petrel run` and `petrel chat` share (sampling, stop rules, speculation, thinking,
// context), resolved against the checkpoint's own defaults.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "generate/conversation.h"
#include "model/config.h"
#include "petrel/tokenizer.h"

namespace petrel::cli {

struct GenerationFlags {
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int repeat_last_n = 0;
  std::vector<std::string> logit_bias;  // "ID=BIAS"
  uint64_t seed = 0;
  int max_tokens = -1;
  std::vector<std::string> stops;
  bool ignore_eos = false;
  std::string speculative;  // "", "ngram" or "mtp"
  int draft = kNgramDraft, ngram_min = 2, ngram_max = 4;  // draft: the n-gram default (MTP's is kMtpDraft)
  int context = 0;
  std::string system;
  bool no_think = false, show_thinking = false;
};

void add_generation_flags(CLI::App* cmd, GenerationFlags& f);

// generation_config.json defaults (greedy when it says nothing), the eos ids of config.json,
// generation_config.json and the tokenizer, then every flag given on top. A random seed unless
// --seed is given. Capacity is left for the command to set.
ConversationOptions resolve_generation(const CLI::App& cmd, const GenerationFlags& f, const std::string& dir,
                                       const ModelConfig& config, const Tokenizer* tokenizer);

// "greedy" or "temperature 0.6, top-k 20, top-p 0.95, seed 1234" (only what is active).
std::string describe_sampling(const SamplingParams& p);
// "speculative ngram (draft 6)" or "speculative mtp (draft 3)".
std::string describe_speculative(const SpeculativeOptions& s);

}  // namespace petrel::cli
