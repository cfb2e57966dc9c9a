// `petrel run DIR --prompt-ids 1,2,3 -n N [--temperature T] [--output-ids]`: generate from token ids.
#include <chrono>
#include <cstdio>

#include "cli/common.h"
#include "cli/registry.h"
#include "core/error.h"
#include "generate/sampler.h"

namespace petrel::cli {
namespace {

struct Args {
  std::string dir, ids;
  int n = 32;
  float temperature = 0.0f;
  uint64_t seed = 0;
  bool output_ids = false;
  LoadOptions load;
};

void run(const Args& a) {
  const std::vector<int32_t> prompt = parse_ids(a.ids, "--prompt-ids");
  LoadedModel m = load_model(a.dir, a.load);
  std::fprintf(stderr, "%s\n", m.summary().c_str());
  const int V = m.config().vocab;
  const int capacity = int(prompt.size()) + a.n;
  check(capacity <= m.config().max_position || m.config().max_position == 0,
        "prompt (" + std::to_string(prompt.size()) + ") + -n " + std::to_string(a.n) +
            " tokens exceed the model's context of " + std::to_string(m.config().max_position));
  auto seq = m.model->new_sequence(capacity);
  std::vector<float> logits(V);
  Sampler sampler(a.temperature, a.seed);
  const auto t0 = std::chrono::steady_clock::now();
  m.model->forward(prompt.data(), int(prompt.size()), *seq, logits.data());
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> out;
  for (int i = 0; i < a.n; ++i) {
    int32_t next = sampler.sample(logits.data(), V);
    out.push_back(next);
    if (i + 1 < a.n) m.model->forward(&next, 1, *seq, logits.data());
  }
  const auto t2 = std::chrono::steady_clock::now();
  std::string line;
  for (size_t i = 0; i < out.size(); ++i) line += (i ? " " : "") + std::to_string(out[i]);
  std::printf("%s\n", line.c_str());
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s), generated %d tokens at %.1f tok/s\n",
               prompt.size(), prefill_s, prompt.size() / prefill_s, a.n, a.n > 1 ? (a.n - 1) / decode_s : 0.0);
}

void add(CLI::App& app) {
  static Args a;
  auto* cmd = app.add_subcommand("run", "Generate tokens from a prompt");
  cmd->add_option("dir", a.dir, "Checkpoint folder")->required();
  cmd->add_option("--prompt-ids", a.ids, "Prompt token ids, comma separated")->required();
  cmd->add_option("-n,--max-tokens", a.n, "Tokens to generate")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", a.temperature, "0 = greedy")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a.seed, "Random seed for sampling")->capture_default_str();
  cmd->add_flag("--output-ids", a.output_ids, "Print the generated token ids, space separated, on one line");
  add_load_flags(cmd, a.load);
  cmd->callback([] { run(a); });
}

CommandRegistrar reg(add);

}  // namespace
}  // namespace petrel::cli
