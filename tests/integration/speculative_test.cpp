// Speculative decoding is exact: on every fixture model the tokens equal plain decoding's (greedy,
// and seeded sampling), and the sequence state afterwards equals the plain run's, so rejected
// drafts leave nothing behind in the KV cache, the conv state or the DeltaNet recurrent state.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "generate/speculative.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

const std::vector<std::string> kFixtures = {"qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",
                                            "qwen3next-sharded",   "qwen3moe",                  "qwen3-dense-f32",
                                            "mlx-qwen35moe-4bit",  "mlx-qwen3next-8bit"};
constexpr int kTokens = 128;

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  CpuBackend backend;
  std::unique_ptr<Model> model;
  explicit Loaded(const std::string& name) : ck(Checkpoint::open(test::fixture_model(name))) {
    model = std::make_unique<Model>(ck->config(), ck->weights(), backend);
  }
};

std::vector<int32_t> reference_prompt(const std::string& name) {
  const auto j = nlohmann::json::parse(std::ifstream(test::fixture_model(name) + "/reference.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

// The fixture prompt repeats a long stretch; this one never repeats a token.
std::vector<int32_t> distinct_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 48; ++i) p.push_back((i * 37 + 11) % 256);
  return p;
}

// A short motif said over and over: drafts from the prompt itself.
std::vector<int32_t> looping_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 12; ++i) p.insert(p.end(), {5, 200, 17, 93, 41});
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::unique_ptr<SequenceState> st;
  GenerationStats stats;
};

Outcome generate(Model& model, const std::vector<int32_t>& prompt, const SamplingParams& sampling, int draft) {
  HostDecoder decoder(model);
  Generator generator(decoder);
  Outcome r;
  r.st = model.new_sequence(int(prompt.size()) + kTokens);
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling = sampling;
  req.max_tokens = kTokens;
  req.speculative.draft = draft;
  req.speculative.ngram_min = 1;
  GenerateResult res = generator.generate(r.st, req, [](int32_t) { return true; });
  r.tokens = res.tokens;
  r.stats = res.stats;
  return r;
}

std::vector<float> state_of(const SequenceState& st) {
  std::vector<float> out;
  EXPECT_TRUE(st.dump_state(out)) << "the backend cannot dump sequence state";
  return out;
}

// States equal bit for bit: verify steps feed their tokens as decode steps do (KeepLogits::Drafted).
// A rejected token left in the state would be O(1) off; a verify step in the chunked form ~1e-6.
void expect_same_state(const SequenceState& a, const SequenceState& b) {
  ASSERT_EQ(a.n_past, b.n_past);
  const std::vector<float> x = state_of(a), y = state_of(b);
  ASSERT_EQ(x.size(), y.size());
  ASSERT_FALSE(x.empty());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(x[i]));
    max_diff = std::max(max_diff, std::fabs(x[i] - y[i]));
  }
  EXPECT_EQ(max_diff, 0.0f) << "max |state| " << max_abs;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

class Speculative : public ::testing::TestWithParam<std::string> {};

TEST_P(Speculative, GreedyEqualsPlainGreedyAndLeavesTheSameState) {
  Loaded m(GetParam());
  int accepted = 0;
  // A repetition penalty below 1 rewards repeating: the model loops and most drafts are accepted,
  // which also checks that the penalty history is the same under speculation.
  SamplingParams sticky = greedy();
  sticky.repetition_penalty = 0.3f;
  for (const auto& [prompt, sampling] : {std::pair{reference_prompt(GetParam()), greedy()}, {distinct_prompt(), greedy()},
                                         {looping_prompt(), greedy()}, {looping_prompt(), sticky}}) {
    const Outcome plain = generate(*m.model, prompt, sampling, 0);
    ASSERT_EQ(int(plain.tokens.size()), kTokens);
    for (int draft : {3, 8}) {
      SCOPED_TRACE("prompt of " + std::to_string(prompt.size()) + " tokens, draft " + std::to_string(draft));
      const Outcome spec = generate(*m.model, prompt, sampling, draft);
      EXPECT_EQ(spec.tokens, plain.tokens);
      expect_same_state(*spec.st, *plain.st);
      EXPECT_GT(spec.stats.verify_steps, 0);
      accepted += spec.stats.accepted;
      if (sampling.repetition_penalty < 1.0f) {
        EXPECT_GE(spec.stats.accepted, 20) << "the looping run should accept many drafts";
      }
    }
  }
  EXPECT_GT(accepted, 0) << "no draft was ever accepted: the test did not exercise acceptance";
}

TEST_P(Speculative, SeededSamplingEqualsPlainSampling) {
  Loaded m(GetParam());
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.repetition_penalty = 1.1f;
  p.seed = 99;
  const auto prompt = reference_prompt(GetParam());
  const Outcome plain = generate(*m.model, prompt, p, 0);
  const Outcome spec = generate(*m.model, prompt, p, 6);
  EXPECT_EQ(spec.tokens, plain.tokens);
  expect_same_state(*spec.st, *plain.st);
}

// verify_draft on chosen drafts: all wrong, right for a while, all right. Each must leave the
// state the plain run has after the same emitted tokens.
TEST_P(Speculative, RejectedDraftTokensLeaveNoTrace) {
  Loaded m(GetParam());
  const auto prompt = reference_prompt(GetParam());
  const Outcome plain = generate(*m.model, prompt, greedy(), 0);  // the true continuation
  const std::vector<int32_t>& truth = plain.tokens;
  const int V = m.ck->config().vocab;
  for (int right : {0, 3, 6}) {
    SCOPED_TRACE(std::to_string(right) + " of 6 drafted tokens right");
    std::vector<int32_t> draft(truth.begin() + 1, truth.begin() + 1 + right);
    while (draft.size() < 6) draft.push_back((truth[draft.size() + 1] + 1) % V);  // surely wrong

    HostDecoder decoder(*m.model);
    decoder.reset(greedy());
    auto st = m.model->new_sequence(int(prompt.size()) + kTokens);
    auto scratch = m.model->new_sequence(int(prompt.size()) + kTokens);
    decoder.feed(prompt.data(), int(prompt.size()), *st, KeepLogits::Last);
    ASSERT_EQ(decoder.sample(0, prompt.size()), truth[0]);
    std::vector<int32_t> emitted;
    const VerifyOutcome v = verify_draft(decoder, st, scratch, truth[0], draft, [&](int32_t t) {
      emitted.push_back(t);
      return true;
    });
    EXPECT_EQ(v.accepted, right);
    EXPECT_EQ(emitted, std::vector<int32_t>(truth.begin() + 1, truth.begin() + 2 + right));
    EXPECT_EQ(v.last, emitted.back());

    // Plain decoding up to the same point: prompt, then truth[0 .. right] fed.
    auto ref = m.model->new_sequence(int(prompt.size()) + kTokens);
    m.model->forward(prompt.data(), int(prompt.size()), *ref, nullptr);
    for (int i = 0; i <= right; ++i) m.model->forward(&truth[size_t(i)], 1, *ref, nullptr);
    expect_same_state(*st, *ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Speculative, ::testing::ValuesIn(kFixtures), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
});

}  // namespace
}  // namespace petrel
