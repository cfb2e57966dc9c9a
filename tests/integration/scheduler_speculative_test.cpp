// Speculative decoding in the scheduler: a request running alone is drafted by the MTP head and
// verified, with exactly the tokens of plain decoding; a second running request turns it off and
// it resumes once a request is alone again.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "core/error.h"
#include "cpu_fixture.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "runtime/scheduler.h"
#include "scheduler_gate.h"

namespace petrel {
namespace {

constexpr int kChunk = 64;
constexpr int kContext = 200;

SchedulerOptions speculative(int max_sequences, int draft = 3) {
  SchedulerOptions o;
  o.max_sequences = max_sequences;
  o.context = kContext;
  o.prefill_chunk = kChunk;
  o.speculative.draft = draft;
  o.speculative.source = DraftSource::Mtp;
  return o;
}

// The model loops on a repeated motif under a strong repetition penalty below 1, so the random
// head's drafts are sometimes right and rows after an accepted draft are sampled too.
CompletionRequest looping(int repeats, int max_tokens, const SamplingParams& sampling) {
  CompletionRequest r;
  for (int i = 0; i < repeats; ++i) r.prompt.insert(r.prompt.end(), {5, 200, 17, 93, 41});
  r.sampling = sampling;
  r.max_tokens = max_tokens;
  return r;
}

SamplingParams sticky() {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 0.3f;
  return p;
}

SamplingParams seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.seed = seed;
  return p;
}

std::vector<int32_t> alone(Model& model, const CompletionRequest& r) {
  HostDecoder decoder(model);
  Generator generator(decoder);
  auto st = model.new_sequence(kContext);
  GenerateRequest g;
  g.tokens = r.prompt;
  g.sampling = r.sampling;
  g.max_tokens = r.max_tokens;
  return generator.generate(st, g, [](int32_t) { return true; }).tokens;
}

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  GenerationStats stats;
  bool done = false;

  StepCallback callback(std::function<bool(const StepEvent&)> before = nullptr) {
    return [this, before](const StepEvent& e) {
      if (before) before(e);
      std::lock_guard lock(mu);
      if (e.token >= 0) tokens.push_back(e.token);
      if (e.done) stats = e.stats;
      done = e.done;
      cv.notify_all();
      return true;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; })) << "timed out";
  }
};

// One request at a time: greedy and seeded, a prompt of several chunks, one running into the
// context. Each equals plain decoding, and each was speculated.
TEST(SchedulerSpeculative, ARequestAloneIsDraftedAndExact) {
  test::CpuFixture f("qwen3next-mtp", kChunk);
  Scheduler scheduler(*f.model, speculative(4));
  const std::vector<CompletionRequest> requests = {looping(3, 60, sticky()), looping(30, 40, sticky()),
                                                   looping(4, 50, seeded(7)), looping(20, -1, sticky())};
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    Collector got;
    ASSERT_EQ(scheduler.submit(requests[i], got.callback()), SubmitStatus::Accepted);
    got.wait();
    EXPECT_EQ(got.tokens, alone(*f.model, requests[i]));
    EXPECT_GT(got.stats.verify_steps, 0);
    EXPECT_GT(got.stats.drafted, 0);
  }
  const SchedulerMetrics m = scheduler.metrics();
  EXPECT_GT(m.verify_steps, 0u);
  EXPECT_GT(m.accepted_tokens, 0u) << "no draft accepted: the rows after an acceptance were not exercised";
  EXPECT_LE(m.accepted_tokens, m.drafted_tokens);
}

// A runs alone (speculated), then B joins while A waits in its sixth event: B, short, only ever
// runs beside A and is never speculated; both equal plain decoding.
TEST(SchedulerSpeculative, ASecondRunningRequestTurnsItOff) {
  test::CpuFixture f("qwen3next-mtp", kChunk);
  Scheduler scheduler(*f.model, speculative(4));
  const CompletionRequest a = looping(3, 80, sticky()), b = looping(4, 8, seeded(3));
  Gate gate;
  Collector got_a, got_b;
  ASSERT_EQ(scheduler.submit(a, got_a.callback(gate.at_event(6))), SubmitStatus::Accepted);
  gate.wait_arrival();
  ASSERT_EQ(scheduler.submit(b, got_b.callback()), SubmitStatus::Accepted);
  gate.release();
  got_b.wait();
  got_a.wait();
  EXPECT_EQ(got_a.tokens, alone(*f.model, a));
  EXPECT_EQ(got_b.tokens, alone(*f.model, b));
  EXPECT_GT(got_a.stats.verify_steps, 0);
  EXPECT_EQ(got_b.stats.verify_steps, 0);
}

TEST(SchedulerSpeculative, OptionsNameTheProblem) {
  const auto error = [](Model& model, const SchedulerOptions& o) {
    try {
      Scheduler s(model, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  test::CpuFixture plain("qwen35moe-text-per-expert", kChunk);
  EXPECT_NE(error(*plain.model, speculative(1)).find("--speculative mtp needs a checkpoint with a multi-token "
                                                     "prediction head"),
            std::string::npos);
  test::CpuFixture mtp("qwen3next-mtp", kChunk);
  EXPECT_NE(error(*mtp.model, speculative(1, kChunk)).find("scheduler speculative draft: expected 0 (off) or 1..63, "
                                                           "found 64"),
            std::string::npos);
  SchedulerOptions ngram = speculative(1);
  ngram.speculative.source = DraftSource::Ngram;
  EXPECT_NE(error(*mtp.model, ngram).find("only drafts of the MTP head"), std::string::npos);
}

}  // namespace
}  // namespace petrel
