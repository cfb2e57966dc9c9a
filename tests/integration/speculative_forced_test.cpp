// Forced acceptance (benchmarks on random weights): drafts are taken at the given rate whatever
// the model samples, and the sequence state afterwards is exactly the emitted tokens fed plainly,
// so the rollback that real acceptance needs has run, for both draft sources.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "cpu_fixture.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"

namespace petrel {
namespace {

constexpr int kTokens = 48;

// A short motif said over and over, so prompt lookup drafts too.
std::vector<int32_t> looping_prompt() {
  std::vector<int32_t> p;
  for (int i = 0; i < 6; ++i) p.insert(p.end(), {5, 200, 17, 93, 41});
  return p;
}

GenerateResult generate(Generator& generator, std::unique_ptr<SequenceState>& st, const std::vector<int32_t>& prompt,
                        DraftSource source, std::optional<double> rate) {
  GenerateRequest req;
  req.tokens = prompt;
  req.sampling.temperature = 0.0f;
  req.max_tokens = kTokens;
  req.speculative.draft = 3;
  req.speculative.ngram_min = 1;
  req.speculative.source = source;
  req.speculative.forced_acceptance = rate;
  return generator.generate(st, req, [](int32_t) { return true; });
}

void expect_same_state(const SequenceState& a, const SequenceState& b) {
  ASSERT_EQ(a.n_past, b.n_past);
  std::vector<float> x, y;
  ASSERT_TRUE(a.dump_state(x) && b.dump_state(y));
  ASSERT_EQ(x.size(), y.size());
  float max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(x[i]));
    max_diff = std::max(max_diff, std::fabs(x[i] - y[i]));
  }
  EXPECT_LE(max_diff, 1e-4f * max_abs) << "max |state| " << max_abs;
}

class ForcedAcceptance : public ::testing::TestWithParam<DraftSource> {};

TEST_P(ForcedAcceptance, TakesDraftsAtTheRateAndLeavesTheFedSequence) {
  test::CpuFixture f("qwen35moe-mtp");
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  const std::vector<int32_t> prompt = looping_prompt();
  for (double rate : {0.0, 0.6, 1.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    auto st = f.model->new_sequence(int(prompt.size()) + kTokens);
    const GenerateResult r = generate(generator, st, prompt, GetParam(), rate);
    ASSERT_EQ(int(r.tokens.size()), kTokens);
    const GenerationStats& s = r.stats;
    ASSERT_GT(s.drafted, 4);  // few at rate 0: drafting pauses after refusals
    if (rate == 0.0) {
      EXPECT_EQ(s.accepted, 0);
    } else if (rate == 1.0) {
      EXPECT_EQ(s.accepted, s.drafted);
    } else {
      EXPECT_GT(s.accepted, s.drafted / 4);
      EXPECT_LT(s.accepted, s.drafted);
    }
    std::vector<int32_t> fed = prompt;
    fed.insert(fed.end(), r.tokens.begin(), r.tokens.end() - 1);
    auto ref = f.model->new_sequence(int(fed.size()));
    f.model->forward(fed.data(), int(fed.size()), *ref, nullptr);
    expect_same_state(*st, *ref);
  }
}

TEST_P(ForcedAcceptance, RateOutsideZeroToOneIsRefused) {
  test::CpuFixture f("qwen35moe-mtp");
  HostDecoder decoder(*f.model);
  Generator generator(decoder);
  auto st = f.model->new_sequence(64);
  try {
    generate(generator, st, looping_prompt(), GetParam(), 1.5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forced draft acceptance rate: expected a probability in [0, 1], found 1.5"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Sources, ForcedAcceptance, ::testing::Values(DraftSource::Mtp, DraftSource::Ngram),
                         [](const auto& info) { return info.param == DraftSource::Mtp ? "Mtp" : "Ngram"; });

}  // namespace
}  // namespace petrel
