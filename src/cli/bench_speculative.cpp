#include "cli/bench_speculative.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "generate/make_decoder.h"

namespace petrel::cli {
namespace {

struct Timed {
  std::vector<double> tok_per_s;  // per timed run, in the order they ran
  GenerationStats drafts;         // drafted, accepted and verify steps summed over the timed runs
};

// One greedy generation of `o.decode_tokens` + 1 tokens after `prompt`; run r seeds the forced
// acceptance's draws.
GenerateResult generate(Generator& generator, Decoder& decoder, const SpeculativeBench& o,
                        const SpeculativeOptions& spec, const std::vector<int32_t>& prompt, int r) {
  auto st = decoder.new_sequence(int(prompt.size()) + o.decode_tokens + 1);
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling.temperature = 0.0f;
  req.sampling.seed = uint64_t(r);
  req.max_tokens = o.decode_tokens + 1;
  req.speculative = spec;
  return generator.generate(st, req, [](int32_t) { return true; });
}

// Runs 0 .. runs of one mode; run 0 warms up (graph capture, the verify scratch state, the head).
Timed time_mode(Generator& generator, Decoder& decoder, const SpeculativeBench& o, const SpeculativeOptions& spec,
                const std::vector<int32_t>& prompt) {
  Timed t;
  for (int r = 0; r <= o.runs; ++r) {
    const GenerateResult res = generate(generator, decoder, o, spec, prompt, r);
    if (r == 0) continue;
    t.tok_per_s.push_back(res.stats.decode_tokens_per_s());
    t.drafts.drafted += res.stats.drafted;
    t.drafts.accepted += res.stats.accepted;
    t.drafts.verify_steps += res.stats.verify_steps;
  }
  return t;
}

nlohmann::json summary(const std::vector<double>& runs) {
  std::vector<double> v = runs;
  std::sort(v.begin(), v.end());
  return {{"tok_per_s", v[v.size() / 2]}, {"min", v.front()}, {"max", v.back()}, {"runs_tok_per_s", runs}};
}

}  // namespace

nlohmann::json speculative_decode(Model& model, const SpeculativeBench& o, int context,
                                  const std::vector<int32_t>& prompt) {
  const auto decoder = make_decoder(model);
  Generator generator(*decoder);
  const Timed plain = time_mode(generator, *decoder, o, SpeculativeOptions{}, prompt);
  const Timed spec = time_mode(generator, *decoder, o, o.speculative, prompt);
  nlohmann::json row = {{"context", context},
                        {"plain", summary(plain.tok_per_s)},
                        {"speculative", summary(spec.tok_per_s)},
                        {"drafted", spec.drafts.drafted},
                        {"accepted", spec.drafts.accepted},
                        {"verify_steps", spec.drafts.verify_steps},
                        {"acceptance_rate", spec.drafts.acceptance()},
                        {"mean_accepted_length", spec.drafts.tokens_per_verify()}};
  row["speedup"] = row["speculative"]["tok_per_s"].get<double>() / row["plain"]["tok_per_s"].get<double>();
  return row;
}

std::function<void()> speculative_generation(Model& model, const SpeculativeBench& o,
                                             const std::vector<int32_t>& prompt) {
  std::shared_ptr<Decoder> decoder = make_decoder(model);
  auto generator = std::make_shared<Generator>(*decoder);
  for (int r = 0; r < 2; ++r) generate(*generator, *decoder, o, o.speculative, prompt, r);  // recorded, replayed
  return [=] { generate(*generator, *decoder, o, o.speculative, prompt, 0); };
}

void print_speculative_decode(const nlohmann::json& row) {
  const int ctx = row["context"].get<int>();
  for (const char* mode : {"plain", "speculative"}) {
    const nlohmann::json& m = row[mode];
    std::printf("decode ctx=%-6d %-11s %8.1f/s %10.1f/s %10.1f/s\n", ctx, mode, m["tok_per_s"].get<double>(),
                m["min"].get<double>(), m["max"].get<double>());
  }
  std::printf("  speedup %.2fx, drafts %.0f%% accepted (%d/%d), mean accepted length %.2f tokens per verify step\n",
              row["speedup"].get<double>(), 100.0 * row["acceptance_rate"].get<double>(), row["accepted"].get<int>(),
              row["drafted"].get<int>(), row["mean_accepted_length"].get<double>());
}

}  // namespace petrel::cli
