// The generation loop's stop rules and bookkeeping, on a fixture model: max tokens, EOS, a sink
// that stops (stop strings), cancellation, the context guard, and what the state holds afterwards.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

class GenerateLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = test::fixture_model("qwen35moe-vlm-fused");
    ck_ = Checkpoint::open(dir);
    model_ = std::make_unique<Model>(ck_->config(), ck_->weights(), backend_);
    prompt_ = nlohmann::json::parse(std::ifstream(dir + "/reference.json"))["prompt_ids"].get<std::vector<int32_t>>();
    prompt_.resize(40);
    decoder_ = std::make_unique<HostDecoder>(*model_);
    generator_ = std::make_unique<Generator>(*decoder_);
  }

  GenerateResult run(int capacity, GenerateRequest req, const TokenSink& sink = [](int32_t) { return true; }) {
    st_ = model_->new_sequence(capacity);
    req.tokens = prompt_;
    req.sampling.temperature = 0.0f;
    return generator_->generate(st_, req, sink);
  }

  std::unique_ptr<Checkpoint> ck_;
  CpuBackend backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<HostDecoder> decoder_;
  std::unique_ptr<Generator> generator_;
  std::unique_ptr<SequenceState> st_;
  std::vector<int32_t> prompt_;
};

TEST_F(GenerateLoop, StopsAtMaxTokensAndTheStateHoldsAllButTheLastToken) {
  GenerateRequest req;
  req.max_tokens = 12;
  const GenerateResult r = run(100, req);
  EXPECT_EQ(r.reason, FinishReason::MaxTokens);
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(st_->n_past, 40 + 11);
  EXPECT_EQ(r.stats.prompt_tokens, 40);
  EXPECT_EQ(r.stats.prefilled, 40);
  EXPECT_EQ(r.stats.generated, 12);
}

TEST_F(GenerateLoop, StopsAtAnEosIdWithoutPassingItToTheSink) {
  GenerateRequest req;
  req.max_tokens = 12;
  const std::vector<int32_t> plain = run(100, req).tokens;
  req.eos_ids = {plain[5]};
  std::vector<int32_t> seen;
  const GenerateResult r = run(100, req, [&](int32_t t) {
    seen.push_back(t);
    return true;
  });
  const size_t first = size_t(std::find(plain.begin(), plain.end(), plain[5]) - plain.begin());
  EXPECT_EQ(r.reason, FinishReason::Eos);
  EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.begin(), plain.begin() + ptrdiff_t(first) + 1));
  EXPECT_EQ(seen, std::vector<int32_t>(plain.begin(), plain.begin() + ptrdiff_t(first)));
}

TEST_F(GenerateLoop, ASinkReturningFalseEndsTheAnswer) {
  GenerateRequest req;
  for (int draft : {0, 4}) {
    req.speculative.draft = draft;
    int n = 0;
    const GenerateResult r = run(100, req, [&](int32_t) { return ++n < 3; });
    EXPECT_EQ(r.reason, FinishReason::StopString);
    EXPECT_EQ(r.tokens.size(), 3u);
    EXPECT_EQ(st_->n_past, 40 + 2);
  }
}

TEST_F(GenerateLoop, CancelFlagStopsAfterTheCurrentToken) {
  std::atomic<bool> cancel{false};
  GenerateRequest req;
  req.cancel = &cancel;
  int n = 0;
  const GenerateResult r = run(100, req, [&](int32_t) {
    if (++n == 4) cancel = true;
    return true;
  });
  EXPECT_EQ(r.reason, FinishReason::Cancelled);
  EXPECT_EQ(r.tokens.size(), 4u);
}

TEST_F(GenerateLoop, ContextGuardStopsWhenTheContextIsFullWithAndWithoutSpeculation) {
  GenerateRequest req;
  const GenerateResult plain = run(50, req);
  EXPECT_EQ(plain.reason, FinishReason::ContextFull);
  EXPECT_EQ(plain.tokens.size(), 11u);  // 10 more fit in the cache; the 11th is sampled, not fed
  EXPECT_EQ(st_->n_past, 50);
  req.speculative.draft = 8;
  req.speculative.ngram_min = 1;
  const GenerateResult spec = run(50, req);
  EXPECT_EQ(spec.reason, FinishReason::ContextFull);
  EXPECT_EQ(spec.tokens, plain.tokens);
}

TEST_F(GenerateLoop, APromptLongerThanTheContextIsAClearError) {
  try {
    run(30, GenerateRequest{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the prompt is 40 tokens but the context holds at most 30");
  }
}

TEST_F(GenerateLoop, ContinuesAStateThatAlreadyHoldsPartOfThePrompt) {
  GenerateRequest req;
  req.max_tokens = 16;
  const GenerateResult fresh = run(100, req);
  st_ = model_->new_sequence(100);
  model_->forward(prompt_.data(), 25, *st_, nullptr);
  req.tokens = prompt_;
  req.sampling.temperature = 0.0f;
  const GenerateResult cont = generator_->generate(st_, req, [](int32_t) { return true; });
  EXPECT_EQ(cont.tokens, fresh.tokens);
  EXPECT_EQ(cont.stats.prefilled, 15);
}

}  // namespace
}  // namespace petrel
