// The continuous-batching scheduler on the CPU: concurrent requests give exactly what each gives
// alone through Generator (greedy and seeded sampling), slots are freed by every way a request can
// end (stop rules, cancel, a declining callback, an engine error), admission limits hold, and
// logprobs are the log-softmax of the model's logits.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "cpu_fixture.h"
#include "generate/generator.h"
#include "generate/host_decoder.h"
#include "runtime/scheduler.h"
#include "scheduler_gate.h"

namespace petrel {
namespace {

// Prefill pieces of 64 tokens both in the model (Generator's one-call prefill) and in the
// scheduler: the two feed prompts in the same pieces, so their logits can be compared exactly.
constexpr int kChunk = 64;
constexpr int kContext = 160;

struct Loaded : test::CpuFixture {
  explicit Loaded(const std::string& name) : CpuFixture(name, kChunk) {}
};

SchedulerOptions options(int max_sequences, int max_queued = 64) {
  SchedulerOptions o;
  o.max_sequences = max_sequences;
  o.max_queued = max_queued;
  o.context = kContext;
  o.prefill_chunk = kChunk;
  return o;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams seeded(uint64_t seed) {
  return {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f, .repetition_penalty = 1.2f, .presence_penalty = 0.3f,
          .logit_bias = {}, .seed = seed};
}

// Request i: prompt lengths from 1 to 140 tokens, budgets from 5 to 39 tokens, a few running into
// the context, one EOS id in some.
CompletionRequest request(int i, int vocab, const SamplingParams& sampling) {
  CompletionRequest r;
  const int length = 1 + (i * 53) % 140;
  for (int t = 0; t < length; ++t) r.prompt.push_back((t * 29 + i * 13 + 3) % vocab);
  r.sampling = sampling;
  r.max_tokens = i % 8 == 7 ? -1 : 5 + (i * 7) % 35;
  if (i % 3 == 0) r.eos_ids = {(i * 5) % vocab};
  return r;
}

struct Answer {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::MaxTokens;
};

Answer run_alone(Model& model, const CompletionRequest& r) {
  HostDecoder decoder(model);
  Generator generator(decoder);
  std::unique_ptr<SequenceState> st = model.new_sequence(kContext);
  GenerateRequest g;
  g.tokens = r.prompt;
  g.sampling = r.sampling;
  g.eos_ids = r.eos_ids;
  g.max_tokens = r.max_tokens;
  const GenerateResult res = generator.generate(st, g, [](int32_t) { return true; });
  return {res.tokens, res.reason};
}

// Events of one request, as the scheduler thread delivers them.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<StepEvent> events;
  bool done = false;

  StepCallback callback(std::function<bool(const StepEvent&)> reply = nullptr) {
    return [this, reply](const StepEvent& e) {
      const bool go_on = reply ? reply(e) : true;
      std::lock_guard lock(mu);
      events.push_back(e);
      done = e.done || !go_on;
      cv.notify_all();
      return go_on;
    };
  }
  void wait_for(size_t n) {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return events.size() >= n || done; }))
        << "timed out waiting for " << n << " events";
  }
  Answer answer() {
    std::lock_guard lock(mu);
    Answer a;
    for (const StepEvent& e : events)
      if (e.token >= 0) a.tokens.push_back(e.token);
    if (!events.empty()) a.reason = events.back().reason;
    return a;
  }
  StepEvent last() {
    std::lock_guard lock(mu);
    return events.back();
  }
};

void expect_idle(const Scheduler& s) {
  const SchedulerMetrics m = s.metrics();
  EXPECT_EQ(m.slots_in_use, 0);
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.queued, 0);
  EXPECT_EQ(m.kv_tokens_in_use, 0);
}

void expect_finish(const Answer& got, const Answer& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(finish_reason_name(got.reason), std::string(finish_reason_name(want.reason)));
}

std::vector<CompletionRequest> requests_of(int n, int vocab, const std::function<SamplingParams(int)>& sampling) {
  std::vector<CompletionRequest> out;
  for (int i = 0; i < n; ++i) out.push_back(request(i, vocab, sampling(i)));
  return out;
}

std::vector<Answer> run_each_alone(Model& model, const std::vector<CompletionRequest>& requests) {
  std::vector<Answer> out;
  for (const CompletionRequest& r : requests) out.push_back(run_alone(model, r));
  return out;
}

// The requests submitted over time from another thread into 8 slots (so slots are reused), then
// drained; each request's tokens and finish reason must equal its run alone.
SchedulerMetrics expect_concurrent_equals_alone(Model& model, const std::vector<CompletionRequest>& requests,
                                                const std::vector<Answer>& alone) {
  std::vector<Collector> got(requests.size());
  Scheduler scheduler(model, options(8));
  std::thread submitter([&] {
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(scheduler.submit(requests[i], got[i].callback()), SubmitStatus::Accepted);
      if (i % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  submitter.join();
  scheduler.shutdown(true);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + " (prompt " + std::to_string(requests[i].prompt.size()) + " tokens)");
    expect_finish(got[i].answer(), alone[i]);
    EXPECT_TRUE(got[i].last().done);
  }
  expect_idle(scheduler);
  return scheduler.metrics();
}

TEST(Scheduler, ConcurrentGreedyEqualsEachRequestAlone) {
  Loaded m("qwen35moe-vlm-fused");
  const auto requests = requests_of(32, m.vocab(), [](int) { return greedy(); });
  const SchedulerMetrics after = expect_concurrent_equals_alone(*m.model, requests, run_each_alone(*m.model, requests));
  EXPECT_EQ(after.requests_finished, 32u);
  EXPECT_GT(after.decode_steps, 0u);
  EXPECT_EQ(after.slots_total, 8);
}

TEST(Scheduler, ConcurrentGreedyEqualsAloneOnQwen3Next) {
  Loaded m("qwen3next-sharded");
  const auto requests = requests_of(32, m.vocab(), [](int) { return greedy(); });
  expect_concurrent_equals_alone(*m.model, requests, run_each_alone(*m.model, requests));
}

// Twice: timing, and so which requests share a batch, differs between runs; the tokens must not.
TEST(Scheduler, SeededSamplingEqualsAloneAndRepeats) {
  Loaded m("qwen35moe-vlm-fused");
  const auto requests = requests_of(32, m.vocab(), [](int i) { return seeded(1000 + uint64_t(i)); });
  const std::vector<Answer> alone = run_each_alone(*m.model, requests);
  expect_concurrent_equals_alone(*m.model, requests, alone);
  expect_concurrent_equals_alone(*m.model, requests, alone);
}

// A request that would run until the context is full; its callback can hold the scheduler thread.
CompletionRequest long_request(int vocab) {
  CompletionRequest r = request(1, vocab, greedy());
  r.max_tokens = -1;
  r.eos_ids.clear();
  return r;
}

// Submits `first`, holds the scheduler at its first token while `waiting` queue, then drains it:
// every request must give what it gives alone. `after` gets the metrics at the end.
void run_held_then_waiting(Model& model, const SchedulerOptions& o, const CompletionRequest& first,
                           const std::vector<CompletionRequest>& waiting, SchedulerMetrics& after) {
  Scheduler scheduler(model, o);
  Collector held;
  std::vector<Collector> got(waiting.size());
  Gate gate;
  ASSERT_EQ(scheduler.submit(first, held.callback(gate.at_event(1))), SubmitStatus::Accepted);
  gate.wait_arrival();  // the scheduler holds at the first request's first token
  for (size_t i = 0; i < waiting.size(); ++i)
    ASSERT_EQ(scheduler.submit(waiting[i], got[i].callback()), SubmitStatus::Accepted);
  gate.release();
  scheduler.shutdown(true);
  expect_finish(held.answer(), run_alone(model, first));
  for (size_t i = 0; i < waiting.size(); ++i) {
    SCOPED_TRACE("waiting request " + std::to_string(i));
    expect_finish(got[i].answer(), run_alone(model, waiting[i]));
  }
  after = scheduler.metrics();
}

// Prompts that wait together are read in one step beside the decoding row (their 15 tokens fit the
// 64-token prefill chunk).
TEST(Scheduler, PromptsWaitingTogetherAreReadInOneStep) {
  Loaded m("qwen35moe-vlm-fused");
  const CompletionRequest first = request(3, m.vocab(), greedy());  // a 20-token prompt
  std::vector<CompletionRequest> waiting;
  for (int i : {0, 8, 16}) waiting.push_back(request(i, m.vocab(), greedy()));  // 1, 5 and 9 tokens
  SchedulerMetrics after;
  ASSERT_NO_FATAL_FAILURE(run_held_then_waiting(*m.model, options(4), first, waiting, after));
  EXPECT_EQ(after.prompt_pieces, 4u);
  EXPECT_EQ(after.prompt_steps, 2u) << "the first prompt alone, then the three waiting ones together";
}

// With no row decoding, the prompts that wait together are read in one step of up to the burst
// (194 tokens here, over three times the 64-token chunk; each prompt within a chunk). The first
// request ends at its first token, so none decodes when the others are read.
TEST(Scheduler, PromptsWaitingWithNoRowDecodingAreReadInABurst) {
  constexpr int kBurst = 256;
  test::CpuFixture m("qwen35moe-vlm-fused", kBurst);
  SchedulerOptions o = options(4);
  o.prefill_burst = kBurst;
  CompletionRequest first = request(3, m.vocab(), greedy());
  first.max_tokens = 1;
  std::vector<CompletionRequest> waiting;
  for (int i : {1, 9, 14, 6}) waiting.push_back(request(i, m.vocab(), greedy()));  // 54, 58, 43 and 39 tokens
  SchedulerMetrics after;
  ASSERT_NO_FATAL_FAILURE(run_held_then_waiting(*m.model, o, first, waiting, after));
  EXPECT_EQ(after.prompt_pieces, 5u);
  EXPECT_EQ(after.prompt_steps, 2u) << "the first prompt alone, then the four waiting ones together";
}

TEST(Scheduler, CancelEndsRunningAndQueuedRequestsAndFreesTheSlot) {
  Loaded m("qwen35moe-vlm-fused");
  Scheduler scheduler(*m.model, options(1));
  Collector running, queued, after;
  Gate gate;
  uint64_t running_id = 0, queued_id = 0;
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), running.callback(gate.at_event(3)), &running_id),
            SubmitStatus::Accepted);
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), queued.callback(), &queued_id), SubmitStatus::Accepted);
  gate.wait_arrival();
  scheduler.cancel(queued_id);
  scheduler.cancel(running_id);
  gate.release();
  running.wait_for(1000);
  queued.wait_for(1000);
  const StepEvent r = running.last(), q = queued.last();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.token, -1);
  EXPECT_EQ(r.reason, FinishReason::Cancelled);
  EXPECT_EQ(r.stats.generated, 3);
  EXPECT_EQ(q.reason, FinishReason::Cancelled);
  EXPECT_TRUE(queued.answer().tokens.empty());

  // The one slot serves the next request, which matches its run alone.
  const CompletionRequest next = request(5, m.vocab(), greedy());
  ASSERT_EQ(scheduler.submit(next, after.callback()), SubmitStatus::Accepted);
  scheduler.shutdown(true);
  expect_finish(after.answer(), run_alone(*m.model, next));
  expect_idle(scheduler);
  EXPECT_EQ(scheduler.metrics().requests_finished, 2u);  // the queued request never held a slot
}

TEST(Scheduler, CallbackReturningFalseEndsTheRequestAndFreesTheSlot) {
  Loaded m("qwen35moe-vlm-fused");
  Scheduler scheduler(*m.model, options(1));
  Collector stopped, after;
  int seen = 0;
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), stopped.callback([&](const StepEvent&) { return ++seen < 3; })),
            SubmitStatus::Accepted);
  const CompletionRequest next = request(6, m.vocab(), greedy());
  ASSERT_EQ(scheduler.submit(next, after.callback()), SubmitStatus::Accepted);
  scheduler.shutdown(true);
  EXPECT_EQ(stopped.events.size(), 3u) << "no event after the callback declined";
  EXPECT_FALSE(stopped.events.back().done);
  expect_finish(after.answer(), run_alone(*m.model, next));
  expect_idle(scheduler);
  EXPECT_EQ(scheduler.metrics().requests_finished, 2u);
}

TEST(Scheduler, EngineErrorEndsOnlyThatRequest) {
  Loaded m("qwen35moe-vlm-fused");
  Scheduler scheduler(*m.model, options(4));
  CompletionRequest banned = request(2, m.vocab(), seeded(3));
  for (int t = 0; t < m.vocab(); ++t) banned.sampling.logit_bias[t] = -INFINITY;  // the sampler must refuse
  const CompletionRequest fine = request(4, m.vocab(), greedy());
  Collector failed, ok;
  ASSERT_EQ(scheduler.submit(banned, failed.callback()), SubmitStatus::Accepted);
  ASSERT_EQ(scheduler.submit(fine, ok.callback()), SubmitStatus::Accepted);
  scheduler.shutdown(true);
  const StepEvent e = failed.last();
  EXPECT_TRUE(e.done);
  EXPECT_EQ(e.token, -1);
  EXPECT_NE(e.error.find("every token has logit -inf"), std::string::npos) << e.error;
  expect_finish(ok.answer(), run_alone(*m.model, fine));
  expect_idle(scheduler);
}

TEST(Scheduler, QueueFullPromptTooLongAndShuttingDown) {
  Loaded m("qwen35moe-vlm-fused");
  Scheduler scheduler(*m.model, options(1, 1));
  Gate gate;
  Collector first, second;
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), first.callback(gate.at_event(1))), SubmitStatus::Accepted);
  ASSERT_EQ(scheduler.submit(request(3, m.vocab(), greedy()), second.callback()), SubmitStatus::Accepted);
  EXPECT_EQ(scheduler.submit(request(4, m.vocab(), greedy()), [](const StepEvent&) { return true; }),
            SubmitStatus::QueueFull);

  CompletionRequest too_long, just_fits;
  too_long.prompt.assign(kContext + 1, 7);
  just_fits.prompt.assign(kContext, 7);
  EXPECT_EQ(scheduler.submit(too_long, [](const StepEvent&) { return true; }), SubmitStatus::PromptTooLong);
  gate.release();
  second.wait_for(1000);
  Collector full;
  ASSERT_EQ(scheduler.submit(just_fits, full.callback()), SubmitStatus::Accepted);
  scheduler.shutdown(true);
  EXPECT_EQ(scheduler.submit(request(5, m.vocab(), greedy()), [](const StepEvent&) { return true; }),
            SubmitStatus::ShuttingDown);
  // A prompt that fills the context still gets the token its last row predicts.
  const Answer a = full.answer();
  EXPECT_EQ(a.tokens.size(), 1u);
  EXPECT_EQ(a.reason, FinishReason::ContextFull);
  expect_idle(scheduler);
}

TEST(Scheduler, ShutdownWithoutDrainCancelsRunningAndQueued) {
  Loaded m("qwen35moe-vlm-fused");
  Scheduler scheduler(*m.model, options(1));
  Collector running, queued;
  Gate gate;
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), running.callback(gate.at_event(1))), SubmitStatus::Accepted);
  ASSERT_EQ(scheduler.submit(long_request(m.vocab()), queued.callback()), SubmitStatus::Accepted);
  gate.wait_arrival();
  // shutdown() blocks until idle, so it runs on its own thread while the gate holds the scheduler.
  std::thread stopper([&] { scheduler.shutdown(false); });
  CompletionRequest probe;  // too long to be accepted: only tells when shutdown has begun
  probe.prompt.assign(kContext + 1, 7);
  const StepCallback ignore = [](const StepEvent&) { return true; };
  while (scheduler.submit(probe, ignore) != SubmitStatus::ShuttingDown) std::this_thread::yield();
  gate.release();
  stopper.join();
  EXPECT_EQ(running.last().reason, FinishReason::Cancelled);
  EXPECT_EQ(running.last().token, -1);
  EXPECT_EQ(running.last().stats.generated, 1);
  EXPECT_EQ(queued.last().reason, FinishReason::Cancelled);
  EXPECT_EQ(queued.events.size(), 1u);
  expect_idle(scheduler);
}

TEST(Scheduler, MalformedRequestsAndOptionsNameTheField) {
  Loaded m("qwen3-dense-f32");
  const auto refuses = [&](const std::function<void()>& f, const std::string& field) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error naming " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SchedulerOptions too_many = options(1);
  too_many.max_sequences = m.model->max_batch() + 1;
  refuses([&] { Scheduler s(*m.model, too_many); }, "max_sequences");
  SchedulerOptions share = options(3);
  share.memory_fraction = 1.5;
  refuses([&] { Scheduler s(*m.model, share); }, "memory_fraction");
  share.memory_fraction = 0.5;  // the CPU backend manages no memory of its own: no limit
  EXPECT_EQ(Scheduler(*m.model, share).metrics().slots_total, 3);
  Scheduler scheduler(*m.model, options(2));
  const StepCallback ignore = [](const StepEvent&) { return true; };
  CompletionRequest r = request(1, m.vocab(), greedy());
  CompletionRequest empty = r, outside = r, budget = r, logprobs = r, sampling = r;
  empty.prompt.clear();
  outside.prompt[0] = m.vocab();
  budget.max_tokens = 0;
  logprobs.top_logprobs = 21;
  sampling.sampling.top_p = 0.0f;
  refuses([&] { scheduler.submit(empty, ignore); }, "prompt");
  refuses([&] { scheduler.submit(outside, ignore); }, "outside the vocabulary");
  refuses([&] { scheduler.submit(budget, ignore); }, "max_tokens");
  refuses([&] { scheduler.submit(logprobs, ignore); }, "top_logprobs");
  refuses([&] { scheduler.submit(sampling, ignore); }, "top_p");
  refuses([&] { scheduler.submit(r, nullptr); }, "callback");
}

// Log-softmax of one logits row, in double, written out separately from the scheduler's.
std::vector<double> log_softmax(const float* row, int n) {
  double mx = row[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, double(row[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(row[i]) - mx);
  std::vector<double> out(size_t(n), 0.0);
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(row[i]) - mx - std::log(sum);
  return out;
}

TEST(Scheduler, LogprobsAreTheLogSoftmaxOfTheModelLogits) {
  Loaded m("qwen35moe-vlm-fused");
  const int V = m.vocab();
  CompletionRequest r = request(9, V, seeded(7));
  r.sampling.temperature = 1.5f;  // draws that are often not the most likely token
  r.max_tokens = 24;
  r.eos_ids.clear();
  r.top_logprobs = 5;
  Collector c;
  {
    Scheduler scheduler(*m.model, options(2));
    ASSERT_EQ(scheduler.submit(r, c.callback()), SubmitStatus::Accepted);
    scheduler.shutdown(true);
  }
  // The logits after every prefix, from one multi-token forward of prompt + answer.
  std::vector<int32_t> seq = r.prompt;
  for (const StepEvent& e : c.events) seq.push_back(e.token);
  std::vector<float> all(seq.size() * size_t(V));
  auto st = m.model->new_sequence(int(seq.size()));
  m.model->forward(seq.data(), int(seq.size()), *st, nullptr, all.data());
  ASSERT_EQ(c.events.size(), 24u);
  int not_top = 0;
  for (size_t i = 0; i < c.events.size(); ++i) {
    const StepEvent& e = c.events[i];
    SCOPED_TRACE("token " + std::to_string(i));
    const std::vector<double> want = log_softmax(&all[(r.prompt.size() - 1 + i) * size_t(V)], V);
    EXPECT_EQ(e.chosen.token, e.token);
    EXPECT_NEAR(e.chosen.logprob, want[size_t(e.token)], 1e-4);
    ASSERT_EQ(e.top.size(), 5u);
    double mass = 0;
    for (size_t k = 0; k < e.top.size(); ++k) {
      EXPECT_NEAR(e.top[k].logprob, want[size_t(e.top[k].token)], 1e-4);
      if (k > 0) {
        EXPECT_GE(e.top[k - 1].logprob, e.top[k].logprob);
      }
      mass += std::exp(double(e.top[k].logprob));
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
    EXPECT_LE(e.chosen.logprob, e.top[0].logprob);
    not_top += e.token != e.top[0].token;
  }
  EXPECT_GT(not_top, 0) << "every draw was the most likely token: the chosen logprob was not tested apart from top[0]";
}

}  // namespace
}  // namespace petrel
