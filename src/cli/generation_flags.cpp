#include "cli/generation_flags.h"

#include <algorithm>
#include <random>

#include "cli/number_flags.h"
#include "core/error.h"
#include "generate/generation_config.h"

namespace petrel::cli {
namespace {

bool given(const CLI::App& cmd, const char* name) { return cmd.count(name) > 0; }

// "ID=BIAS" (or ID:BIAS) -> entry of the logit bias map.
std::pair<int32_t, float> parse_bias(const std::string& text) {
  const size_t sep = text.find_first_of("=:");
  int32_t id = -1;
  float bias = 0.0f;
  bool ok = sep != std::string::npos;
  if (ok) {
    try {
      size_t used_id = 0, used_bias = 0;
      id = std::stoi(text.substr(0, sep), &used_id);
      bias = std::stof(text.substr(sep + 1), &used_bias);
      ok = used_id == sep && used_bias == text.size() - sep - 1;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  check(ok, "--logit-bias: expected TOKEN_ID=BIAS (e.g. 151643=-100), found '" + text + "'");
  return {id, bias};
}

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

}  // namespace

void add_generation_flags(CLI::App* cmd, GenerationFlags& f) {
  const std::string from_config = " (default: the checkpoint's generation_config.json)";
  cmd->add_option("--temperature,--temp", f.temperature, "Sampling temperature; 0 = greedy" + from_config)
      ->check(number_in(0.0f));
  cmd->add_option("--top-k", f.top_k, "Keep the k most likely tokens; 0 = off" + from_config)->check(integer_in(0));
  cmd->add_option("--top-p", f.top_p, "Keep the smallest set of tokens with probability >= p; 1 = off" + from_config)
      ->check(number_in(0.0f, 1.0f));
  cmd->add_option("--min-p", f.min_p, "Drop tokens less likely than p x the top token's probability; 0 = off" + from_config)
      ->check(number_in(0.0f, 1.0f));
  cmd->add_option("--repeat-penalty", f.repeat_penalty,
                  "Divide positive (multiply negative) logits of tokens already in the sequence; 1 = off" + from_config)
      ->check(number_above(0.0f));
  cmd->add_option("--presence-penalty", f.presence_penalty, "Subtract from tokens already generated (default 0)")
      ->check(number_in(std::numeric_limits<float>::lowest()));
  cmd->add_option("--frequency-penalty", f.frequency_penalty, "Subtract per earlier occurrence in the output (default 0)")
      ->check(number_in(std::numeric_limits<float>::lowest()));
  cmd->add_option("--repeat-last-n", f.repeat_last_n, "Penalties look at the last n tokens; 0 = all (default)")
      ->check(integer_in(0));
  cmd->add_option("--logit-bias", f.logit_bias, "Add BIAS to a token's logit: ID=BIAS, repeatable (-inf bans)");
  cmd->add_option("--seed", f.seed, "Random seed: the same seed gives the same answer (default: random)")
      ->check(integer_in(uint64_t(0)));
  cmd->add_option("-n,--max-tokens", f.max_tokens,
                  "Most tokens to generate; -1 = until end of turn or a full context" + from_config)
      ->check(integer_in(-1));
  cmd->add_option("--stop", f.stops, "Stop when the answer contains this text (not printed); repeatable");
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_option("--speculative", f.speculative,
                  "Speculative decoding: ngram (draft by prompt lookup) or mtp (the checkpoint's draft head)")
      ->check(CLI::IsMember({"ngram", "mtp"}));
  cmd->add_option("--draft,--draft-tokens", f.draft,
                  "Most tokens drafted per step with --speculative (default 6 for ngram, 3 for mtp)")
      ->check(integer_in(1));
  cmd->add_option("--ngram-min", f.ngram_min, "Shortest n-gram the drafter matches")->capture_default_str()
      ->check(integer_in(1));
  cmd->add_option("--ngram-max", f.ngram_max, "Longest n-gram the drafter matches (tried first)")->capture_default_str()
      ->check(integer_in(1));
  cmd->add_option("-c,--context,--ctx-size", f.context, "Tokens the context holds (prompt, history and answers)")
      ->check(integer_in(1));
  cmd->add_option("--system", f.system, "System message");
  cmd->add_flag("--no-think", f.no_think, "Answer without thinking first (chat template enable_thinking=false)");
  cmd->add_flag("--show-thinking", f.show_thinking, "Print the model's reasoning (dimmed on a terminal)");
}

ConversationOptions resolve_generation(const CLI::App& cmd, const GenerationFlags& f, const std::string& dir,
                                       const ModelConfig& config, const Tokenizer* tokenizer) {
  const GenerationDefaults d = load_generation_defaults(dir, [&](const std::string& text) -> std::optional<int32_t> {
    if (!tokenizer) return std::nullopt;
    const auto id = tokenizer->token_id(text);
    return id ? std::optional<int32_t>(int32_t(*id)) : std::nullopt;
  });
  ConversationOptions o;
  SamplingParams& s = o.sampling;
  s = d.sampling;
  if (given(cmd, "--temperature")) s.temperature = f.temperature;
  if (given(cmd, "--top-k")) s.top_k = f.top_k;
  if (given(cmd, "--top-p")) s.top_p = f.top_p;
  if (given(cmd, "--min-p")) s.min_p = f.min_p;
  if (given(cmd, "--repeat-penalty")) s.repetition_penalty = f.repeat_penalty;
  s.presence_penalty = f.presence_penalty;
  s.frequency_penalty = f.frequency_penalty;
  s.penalty_last_n = f.repeat_last_n;
  for (const std::string& b : f.logit_bias) {
    const auto [id, bias] = parse_bias(b);
    check(id >= 0 && id < config.vocab, "--logit-bias: token id " + std::to_string(id) +
                                            " is outside the vocabulary (0.." + std::to_string(config.vocab - 1) + ")");
    s.logit_bias[id] = bias;
  }
  s.seed = given(cmd, "--seed") ? f.seed : std::random_device{}();
  s.validate(config.vocab);

  if (!f.ignore_eos) {
    for (int id : config.eos_ids) add_unique(o.eos_ids, id);
    for (int32_t id : d.eos_ids) add_unique(o.eos_ids, id);
  }
  o.max_tokens = given(cmd, "--max-tokens") ? f.max_tokens : d.max_new_tokens.value_or(-1);
  check(o.max_tokens == -1 || o.max_tokens > 0,
        "--max-tokens: expected a positive count or -1 (no limit), found " + std::to_string(o.max_tokens));
  o.stops = f.stops;
  check(!given(cmd, "--draft") || !f.speculative.empty(), "--draft / --draft-tokens: only with --speculative");
  check((!given(cmd, "--ngram-min") && !given(cmd, "--ngram-max")) || f.speculative == "ngram",
        "--ngram-min / --ngram-max: only with --speculative ngram");
  if (!f.speculative.empty()) {
    const bool mtp = f.speculative == "mtp";
    o.speculative.source = mtp ? DraftSource::Mtp : DraftSource::Ngram;
    o.speculative.draft = mtp && !given(cmd, "--draft") ? kMtpDraft : f.draft;
    o.speculative.ngram_min = f.ngram_min;
    o.speculative.ngram_max = f.ngram_max;
  }
  check(f.ngram_min <= f.ngram_max, "--ngram-min (" + std::to_string(f.ngram_min) + ") must not exceed --ngram-max (" +
                                        std::to_string(f.ngram_max) + ")");
  o.system = f.system;
  o.thinking = !f.no_think;
  return o;
}

std::string describe_speculative(const SpeculativeOptions& s) {
  return std::string("speculative ") + (s.source == DraftSource::Mtp ? "mtp" : "ngram") + " (draft " +
         std::to_string(s.draft) + ")";
}

std::string describe_sampling(const SamplingParams& p) {
  if (p.greedy()) return "greedy";
  char buf[64];
  std::string s;
  const auto add = [&](const char* fmt, double v) {
    std::snprintf(buf, sizeof buf, fmt, v);
    s += (s.empty() ? "" : ", ") + std::string(buf);
  };
  add("temperature %g", p.temperature);
  if (p.top_k > 0) add("top-k %g", p.top_k);
  if (p.top_p < 1.0f) add("top-p %g", p.top_p);
  if (p.min_p > 0.0f) add("min-p %g", p.min_p);
  if (p.repetition_penalty != 1.0f) add("repeat penalty %g", p.repetition_penalty);
  if (p.presence_penalty != 0.0f) add("presence penalty %g", p.presence_penalty);
  if (p.frequency_penalty != 0.0f) add("frequency penalty %g", p.frequency_penalty);
  return s + ", seed " + std::to_string(p.seed);
}

}  // namespace petrel::cli
