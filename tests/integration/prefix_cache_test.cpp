// The prefix cache on the CPU: snapshots restore exactly the state their prefix left (the same
// bits), a restored prefix gives the very logits a full prefill gives (shared prefixes ending on
// and between block boundaries), and requests served with the cache (sequentially, concurrently,
// under a budget so small that snapshots are evicted all the time) give the very tokens and
// logprobs they give without it. A chat's next turn restores the previous reply too, with the
// same bits, and only a request that ended normally snapshots its reply. Snapshots the device
// budget pushes out spill to a host budget and restore from there with the same bits.
#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "cpu_fixture.h"
#include "runtime/scheduler.h"

namespace petrel {
namespace {

constexpr int kChunk = 64;  // prompt pieces; a multiple of the cache block, so pieces stay aligned
constexpr int kContext = 320;

PrefixCacheOptions cache_options(size_t budget, size_t host_budget = 0) {
  return {.budget_bytes = budget, .block = 64, .interval = 128, .host_budget_bytes = host_budget};
}

struct Fixture : test::CpuFixture {
  explicit Fixture(int max_chunk = kChunk) : CpuFixture("qwen35moe-vlm-fused", max_chunk) {}
  std::unique_ptr<SequenceState> state(int capacity = kContext) { return model->new_sequence(capacity); }
  // Feeds prompt[fed, end) in pieces of at most kChunk tokens.
  void feed(std::span<const int32_t> prompt, SequenceState& st, int end) {
    while (st.n_past < end) {
      const int n = std::min(kChunk, end - st.n_past);
      model->forward(prompt.data() + st.n_past, n, st, nullptr);
    }
  }
};

std::vector<int32_t> tokens(int n, int seed, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (i * 31 + seed * 17 + 5) % vocab;
  return t;
}

std::vector<float> dump(const SequenceState& st) {
  std::vector<float> out;
  EXPECT_TRUE(st.dump_state(out));
  return out;
}

TEST(PrefixCache, SnapshotPositionsAreIntervalsAndThePromptsLastBlock) {
  Fixture f;
  PrefixCache cache(cache_options(1 << 30), [&](int n) { return f.state(n); });
  EXPECT_EQ(cache.next_snapshot(0, 300), 128);
  EXPECT_EQ(cache.next_snapshot(128, 300), 256);
  EXPECT_EQ(cache.next_snapshot(256, 300), 300) << "past the last block: none";
  EXPECT_EQ(cache.next_snapshot(0, 100), 64) << "the last block boundary comes before the interval";
  EXPECT_EQ(cache.next_snapshot(0, 40), 40);
  EXPECT_EQ(cache.next_snapshot(0, 128), 128) << "the prompt's end is a block boundary";
  EXPECT_EQ(cache.next_snapshot(0, 129), 64) << "a snapshot at 128 would leave a one-token piece";
  EXPECT_EQ(cache.next_snapshot(64, 129), 129);
  PrefixCache off(cache_options(0), [&](int n) { return f.state(n); });
  EXPECT_EQ(off.next_snapshot(0, 300), 300);
}

// Snapshots at 64 (the last block of a 100-token prompt) and 128 (the interval of a 200-token
// one that continues it); prompts sharing 128, 64 or no tokens of them restore what they share (at
// most all but their last token), bit for bit.
TEST(PrefixCache, RestoresTheLongestSnapshotBitForBit) {
  Fixture f;
  PrefixCache cache(cache_options(1 << 30), [&](int n) { return f.state(n); });
  const std::vector<int32_t> prompt = tokens(200, 1, f.vocab());
  auto st = f.state();
  f.feed(prompt, *st, 64);
  cache.offer(std::span(prompt).first(100), *st);
  const std::vector<float> at64 = dump(*st);
  f.feed(prompt, *st, 128);
  cache.offer(prompt, *st);
  const std::vector<float> at128 = dump(*st);
  EXPECT_EQ(cache.stats().entries, 2);

  auto restored = f.state();
  EXPECT_EQ(cache.restore(prompt, *restored), 128);
  EXPECT_EQ(restored->n_past, 128);
  EXPECT_EQ(dump(*restored), at128);

  std::vector<int32_t> diverging = prompt;
  diverging[100] = (diverging[100] + 1) % f.vocab();
  auto partial = f.state();
  EXPECT_EQ(cache.restore(diverging, *partial), 64);
  EXPECT_EQ(dump(*partial), at64);

  auto whole = f.state();  // exactly the cached 128 tokens: the last one must still be fed
  EXPECT_EQ(cache.restore(std::span(prompt).first(128), *whole), 64);

  std::vector<int32_t> other = tokens(200, 2, f.vocab());
  auto none = f.state();
  EXPECT_EQ(cache.restore(other, *none), 0);
  EXPECT_EQ(none->n_past, 0);
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.hit_tokens, 128u + 64u + 64u);
  EXPECT_EQ(s.queried_tokens, 200u + 200u + 128u + 200u);
}

// A budget of one snapshot keeps the most recently used; a snapshot bigger than the budget is not
// kept at all.
TEST(PrefixCache, EvictsTheLeastRecentlyUsedUnderItsBudget) {
  Fixture f;
  const std::vector<int32_t> a = tokens(100, 3, f.vocab()), b = tokens(100, 4, f.vocab());
  size_t one = 0;
  {
    PrefixCache probe(cache_options(1 << 30), [&](int n) { return f.state(n); });
    auto st = f.state();
    f.feed(a, *st, 64);
    probe.offer(a, *st);
    one = probe.stats().bytes;
  }
  ASSERT_GT(one, 0u);
  PrefixCache cache(cache_options(one + one / 2), [&](int n) { return f.state(n); });
  for (const auto* p : {&a, &b}) {
    auto st = f.state();
    f.feed(*p, *st, 64);
    cache.offer(*p, *st);
  }
  EXPECT_EQ(cache.stats().entries, 1);
  EXPECT_EQ(cache.stats().evictions, 1u);
  auto st = f.state();
  EXPECT_EQ(cache.restore(a, *st), 0) << "a was evicted";
  EXPECT_EQ(cache.restore(b, *st), 64);

  PrefixCache tiny(cache_options(one / 2), [&](int n) { return f.state(n); });
  auto fed = f.state();
  f.feed(a, *fed, 64);
  tiny.offer(a, *fed);
  EXPECT_EQ(tiny.stats().entries, 0);
}

// Bytes of a snapshot of `prompt`'s first `n` tokens.
size_t snapshot_bytes(Fixture& f, std::span<const int32_t> prompt, int n) {
  PrefixCache probe(cache_options(1 << 30), [&](int c) { return f.state(c); });
  auto st = f.state();
  f.feed(prompt, *st, n);
  probe.offer(prompt.first(size_t(n)), *st);
  return probe.stats().bytes;
}

// A device budget of one snapshot and a host budget of two: each new snapshot spills the least
// recently used one to host memory, which restores it bit for bit; a third spill drops the oldest
// host entry.
TEST(PrefixCache, SpillsToHostMemoryAndRestoresFromThereBitForBit) {
  Fixture f;
  const std::vector<int32_t> a = tokens(100, 3, f.vocab()), b = tokens(100, 4, f.vocab()),
                             c = tokens(100, 5, f.vocab()), d = tokens(100, 6, f.vocab());
  const size_t one = snapshot_bytes(f, a, 64);
  PrefixCache cache(cache_options(one + one / 2, 2 * one + one / 2), [&](int n) { return f.state(n); },
                    [&](int n) { return f.state(n); });
  std::vector<std::vector<float>> at64;
  for (const auto* p : {&a, &b}) {
    auto st = f.state();
    f.feed(*p, *st, 64);
    cache.offer(*p, *st);
    at64.push_back(dump(*st));
  }
  PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.spills, 1u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.host_entries, 1);
  EXPECT_EQ(s.bytes, one);
  EXPECT_EQ(s.host_bytes, one);
  auto st = f.state();
  EXPECT_EQ(cache.restore(a, *st), 64) << "a was spilled, not dropped";
  EXPECT_EQ(dump(*st), at64[0]);
  EXPECT_EQ(cache.stats().host_hit_tokens, 64u);
  auto from_device = f.state();
  EXPECT_EQ(cache.restore(b, *from_device), 64);
  EXPECT_EQ(dump(*from_device), at64[1]);
  EXPECT_EQ(cache.stats().host_hit_tokens, 64u) << "b is on the device";

  for (const auto* p : {&c, &d}) {  // spill b, then c, which drops the least recently used host entry, a
    auto fed = f.state();
    f.feed(*p, *fed, 64);
    cache.offer(*p, *fed);
  }
  s = cache.stats();
  EXPECT_EQ(s.spills, 3u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.host_entries, 2);
  EXPECT_LE(s.host_bytes, 2 * one + one / 2);
  auto gone = f.state();
  EXPECT_EQ(cache.restore(a, *gone), 0) << "a was used before b: it went first";
  EXPECT_EQ(cache.restore(b, *gone), 64);
  EXPECT_EQ(dump(*gone), at64[1]);
}

// Feeds `prompt` past st.n_past as the scheduler does with a prefill chunk longer than the prompt:
// one piece up to each snapshot position, offered to `cache` (when given). The last token's logits.
std::vector<float> prefill(Fixture& f, PrefixCache* cache, std::span<const int32_t> prompt, SequenceState& st) {
  std::vector<float> logits(size_t(f.vocab()));
  const int size = int(prompt.size());
  while (st.n_past < size) {
    const int until = cache ? cache->next_snapshot(st.n_past, size) : size;
    f.model->forward(prompt.data() + st.n_past, until - st.n_past, st, logits.data());
    if (cache) cache->offer(prompt, st);
  }
  return logits;
}

// `logits` and the logits after each of `steps` greedy tokens decoded from them.
std::vector<std::vector<float>> greedy(Fixture& f, std::vector<float> logits, SequenceState& st, int steps) {
  std::vector<std::vector<float>> out{logits};
  for (int i = 0; i < steps; ++i) {
    const int32_t token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    f.model->forward(&token, 1, st, logits.data());
    out.push_back(logits);
  }
  return out;
}

// Prompt b shares its first `shared` tokens with a cached prompt a. Restoring the longest snapshot
// and prefilling the rest gives the logits of b prefilled from scratch, bit for bit, and the same
// greedy continuation. Snapshots of a are at 128 (the interval) and at its last block boundary.
TEST(PrefixCache, RestoredPrefixesGiveTheLogitsOfAFullPrefill) {
  Fixture f(256);  // a prompt's stretch between snapshots is one forward piece
  struct Case {
    const char* name;
    int a, shared, b, restored;
  };
  const Case cases[] = {
      {"the shared prefix ends on a snapshot's boundary", 128, 128, 165, 128},
      {"the shared prefix ends between block boundaries", 100, 100, 140, 64},
      {"one token past a snapshot (a one-token rest is never restored)", 128, 128, 129, 0},
      {"the prompt ends at a snapshot (its last token is fed again)", 200, 192, 192, 128},
      {"diverging one token before a snapshot", 200, 191, 220, 128},
      {"diverging before the first snapshot", 200, 100, 220, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PrefixCache cache(cache_options(1 << 30), [&](int n) { return f.state(n); });
    const std::vector<int32_t> a = tokens(c.a, 5, f.vocab());
    std::vector<int32_t> b(a.begin(), a.begin() + c.shared);
    const std::vector<int32_t> rest = tokens(c.b - c.shared, 6, f.vocab());
    b.insert(b.end(), rest.begin(), rest.end());
    const size_t cut = size_t(c.shared);
    if (cut < b.size() && b[cut] == a[cut]) b[cut] = (b[cut] + 1) % f.vocab();  // b differs right after
    auto fed_a = f.state();
    prefill(f, &cache, a, *fed_a);

    auto plain = f.state();
    const auto want = greedy(f, prefill(f, nullptr, b, *plain), *plain, 4);
    auto restored = f.state();
    EXPECT_EQ(cache.restore(b, *restored), c.restored);
    EXPECT_EQ(greedy(f, prefill(f, &cache, b, *restored), *restored, 4), want);
  }
}

// What a request gave: its tokens, their logprobs and how many prompt tokens came from the cache.
struct Answer {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each token, then of its top_logprobs alternatives
  int cached = 0;
};

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  Answer answer;
  bool done = false;
  StepCallback callback() {
    return [this](const StepEvent& e) {
      std::lock_guard lock(mu);
      if (e.token >= 0) {
        answer.tokens.push_back(e.token);
        answer.logprobs.push_back(e.chosen.logprob);
        for (const TokenLogprob& t : e.top) answer.logprobs.push_back(t.logprob);
      }
      if (e.done) {
        answer.cached = e.stats.prompt_tokens - e.stats.prefilled;
        done = true;
        cv.notify_all();
      }
      return true;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

// Multi-turn prompts: each request's prompt is the previous one's plus a few tokens, with some
// branching off mid-way and some unrelated.
std::vector<CompletionRequest> conversation(int vocab) {
  std::vector<CompletionRequest> out;
  std::vector<int32_t> history = tokens(70, 9, vocab);
  for (int turn = 0; turn < 12; ++turn) {
    CompletionRequest r;
    r.prompt = history;
    if (turn % 4 == 3) r.prompt.resize(r.prompt.size() / 2 + 3);  // a branch from the middle
    if (turn % 5 == 4) r.prompt = tokens(90 + turn, 20 + turn, vocab);  // unrelated
    r.sampling.temperature = 0.0f;
    r.max_tokens = 6;
    r.top_logprobs = 0;
    out.push_back(r);
    const std::vector<int32_t> more = tokens(13 + turn % 3 * 9, 40 + turn, vocab);
    history.insert(history.end(), more.begin(), more.end());
  }
  return out;
}

SchedulerOptions scheduler_options(const PrefixCacheOptions& cache, int prefill_chunk = kChunk, int max_sequences = 4) {
  SchedulerOptions o;
  o.max_sequences = max_sequences;
  o.context = kContext;
  o.prefill_chunk = prefill_chunk;
  o.prefix_cache = cache;
  return o;
}

std::vector<Answer> serve(Model& model, const std::vector<CompletionRequest>& requests, const PrefixCacheOptions& cache,
                          bool concurrent, PrefixCacheStats* stats = nullptr, int prefill_chunk = kChunk,
                          SchedulerMetrics* metrics = nullptr, int max_sequences = 4) {
  Scheduler scheduler(model, scheduler_options(cache, prefill_chunk, max_sequences));
  std::vector<Collector> got(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(scheduler.submit(requests[i], got[i].callback()), SubmitStatus::Accepted);
    if (!concurrent) got[i].wait();
  }
  scheduler.shutdown(true);
  if (stats) *stats = scheduler.metrics().prefix_cache;
  if (metrics) *metrics = scheduler.metrics();
  std::vector<Answer> out;
  for (Collector& c : got) out.push_back(c.answer);
  return out;
}

std::vector<Answer> serve(Model& model, const std::vector<CompletionRequest>& requests, size_t budget,
                          bool concurrent, PrefixCacheStats* stats = nullptr, int prefill_chunk = kChunk,
                          SchedulerMetrics* metrics = nullptr, int max_sequences = 4) {
  return serve(model, requests, cache_options(budget), concurrent, stats, prefill_chunk, metrics, max_sequences);
}

// A greedy request of `max_tokens` with the top `top_logprobs` logprobs of each token.
CompletionRequest greedy_request(std::vector<int32_t> prompt, int max_tokens, int top_logprobs) {
  CompletionRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.top_logprobs = top_logprobs;
  return r;
}

// A chat's next turn: the first turn's prompt and reply, then a 20-token message (from `seed`).
CompletionRequest next_turn(const CompletionRequest& first, const std::vector<int32_t>& reply, int seed, int vocab) {
  CompletionRequest second = first;
  second.prompt.insert(second.prompt.end(), reply.begin(), reply.end());
  const std::vector<int32_t> user = tokens(20, seed, vocab);
  second.prompt.insert(second.prompt.end(), user.begin(), user.end());
  second.max_tokens = 6;
  return second;
}

void expect_same(const std::vector<Answer>& got, const std::vector<Answer>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "request " << i;
  }
}

// Prompts of 129 tokens, one past a multiple of the prefill chunk (128): without the cache their
// last token is fed alone, as a decode step; with it, after a restore of 64 tokens or none, it
// must be too, and a prompt one token past a snapshot is not restored to a one-token rest.
TEST(PrefixCache, PiecesAfterARestoreEndWhereTheyEndWithoutTheCache) {
  Fixture f(128);
  const std::vector<int32_t> a = tokens(100, 21, f.vocab()), c = tokens(128, 22, f.vocab());
  std::vector<CompletionRequest> requests(4);
  requests[0].prompt = a;  // snapshot at 64
  requests[1].prompt = a;  // restores 64
  requests[1].prompt.resize(129);
  std::copy_n(c.begin(), 29, requests[1].prompt.begin() + 100);
  requests[2].prompt = c;  // snapshot at 128
  requests[3].prompt = c;  // a restore of 128 would leave one token
  requests[3].prompt.push_back(7);
  for (CompletionRequest& r : requests) {
    r.sampling.temperature = 0.0f;
    r.max_tokens = 4;
    r.top_logprobs = 20;
  }
  const std::vector<Answer> plain = serve(*f.model, requests, 0, false, nullptr, 2 * kChunk);
  const std::vector<Answer> cached = serve(*f.model, requests, size_t(1) << 30, false, nullptr, 2 * kChunk);
  expect_same(cached, plain);
  EXPECT_EQ(cached[1].cached, 64);
  EXPECT_EQ(cached[3].cached, 0);
}

TEST(PrefixCache, TurnsOfAConversationRestoreTheirHistory) {
  Fixture f;
  const auto requests = conversation(f.vocab());
  const std::vector<Answer> plain = serve(*f.model, requests, 0, false);
  PrefixCacheStats stats;
  const std::vector<Answer> cached = serve(*f.model, requests, size_t(1) << 30, false, &stats);
  expect_same(cached, plain);
  // Turn 1 continues turn 0 (70 tokens, snapshot at 64); turn 2 continues turn 1 (83 tokens).
  EXPECT_EQ(plain[1].cached, 0);
  EXPECT_EQ(cached[0].cached, 0);
  EXPECT_EQ(cached[1].cached, 64);
  EXPECT_EQ(cached[2].cached, 64);
  int hits = 0;
  for (const Answer& a : cached) hits += a.cached > 0;
  EXPECT_GE(hits, 8);
  EXPECT_GT(stats.hit_tokens, 0u);
  EXPECT_GT(stats.queried_tokens, stats.hit_tokens);
}

// Turn 2 of a chat resends turn 1's prompt (70 tokens, snapshot at 64) and reply (123 tokens, the
// last never fed) with a new message: it restores up to the reply's last block boundary, 192, and
// both turns give the very tokens and logprobs they give without the cache, also under a budget
// too small for all the snapshots.
TEST(PrefixCache, ANextTurnRestoresThePreviousReply) {
  Fixture f;
  const CompletionRequest first = greedy_request(tokens(70, 31, f.vocab()), 123, 20);
  const std::vector<Answer> reply = serve(*f.model, {first}, 0, false);
  const CompletionRequest second = next_turn(first, reply[0].tokens, 32, f.vocab());

  const std::vector<Answer> plain = serve(*f.model, {first, second}, 0, false);
  PrefixCacheStats stats;
  const std::vector<Answer> cached = serve(*f.model, {first, second}, size_t(1) << 30, false, &stats);
  expect_same(cached, plain);
  EXPECT_EQ(cached[0].cached, 0);
  EXPECT_EQ(cached[1].cached, 192);
  EXPECT_EQ(stats.snapshots, 3u) << "the prompt's at 64, the reply's at 128 (an interval) and 192";
  EXPECT_EQ(stats.hit_tokens, 192u);
  EXPECT_EQ(stats.queried_tokens, uint64_t(first.prompt.size() + second.prompt.size()));

  PrefixCacheStats small;
  expect_same(serve(*f.model, {first, second}, stats.bytes / 2, false, &small), plain);
  EXPECT_GT(small.evictions, 0u);
  EXPECT_LE(small.bytes, stats.bytes / 2);
}

// A reply is fed again for its snapshot in pieces that ride in the steps of sequences still
// decoding: none runs a step of its own while another request decodes. A request alone has its
// reply followed live in a spare slot, in its own decode steps; with no spare slot its reply is
// fed after it ends, in steps of its own. The second request's answer is what it is without the
// cache.
TEST(PrefixCache, ReplaysRideInTheStepsOfDecodingSequences) {
  Fixture f(kChunk + 4);  // a piece beside every decoding row, as petrel serve sizes its steps
  CompletionRequest short_one;  // 120-token prompt (snapshot at 64) + 10 tokens: replayed to 128
  short_one.prompt = tokens(120, 41, f.vocab());
  short_one.sampling.temperature = 0.0f;
  short_one.max_tokens = 10;
  CompletionRequest long_one;  // 10 + 50 tokens: no block boundary, nothing to replay
  long_one.prompt = tokens(10, 42, f.vocab());
  long_one.sampling.temperature = 0.0f;
  long_one.max_tokens = 50;
  SchedulerMetrics m, m_alone;
  const std::vector<Answer> with_cache =
      serve(*f.model, {short_one, long_one}, size_t(1) << 30, /*concurrent=*/true, nullptr, kChunk, &m);
  EXPECT_EQ(m.replay_tokens, 64u) << "the reply fed again from 64 to 128";
  EXPECT_EQ(m.replay_tokens_alone, 0u) << "replay pieces in steps of their own while a sequence decoded";
  EXPECT_EQ(m.prefix_cache.snapshots, 2u);
  expect_same(with_cache, serve(*f.model, {short_one, long_one}, 0, /*concurrent=*/true));
  serve(*f.model, {short_one}, size_t(1) << 30, /*concurrent=*/true, nullptr, kChunk, &m_alone);
  EXPECT_EQ(m_alone.replay_tokens, 64u);
  EXPECT_EQ(m_alone.replay_tokens_live, 64u) << "the reply's piece 64..128 fed while it was generated";
  EXPECT_EQ(m_alone.replay_tokens_alone, 0u);
  SchedulerMetrics one_slot;
  serve(*f.model, {short_one}, size_t(1) << 30, /*concurrent=*/true, nullptr, kChunk, &one_slot, /*max_sequences=*/1);
  EXPECT_EQ(one_slot.replay_tokens, 64u);
  EXPECT_EQ(one_slot.replay_tokens_live, 0u) << "no spare slot to follow the reply in";
  EXPECT_EQ(one_slot.replay_tokens_alone, 64u) << "nothing decodes beside the last request's replay";
}

// With long prompt pieces (512) and intervals (1024), a live replay cuts the reply where a prompt
// would not: 64..320 while it is generated (a piece of kLivePiece), then 320..448 after it ends;
// the next turn without the cache reads its 490 tokens in one piece. The answers are the same bits.
TEST(PrefixCache, ALiveReplaysOwnCutsChangeNoBit) {
  Fixture f(512);
  const CompletionRequest first = greedy_request(tokens(70, 61, f.vocab()), 400, 5);
  std::vector<Answer> answers[2];
  SchedulerMetrics m;
  for (int cached = 0; cached < 2; ++cached) {
    SchedulerOptions o;
    o.max_sequences = 2;
    o.context = 1024;
    o.prefill_chunk = 512;
    o.prefix_cache = {.budget_bytes = cached ? size_t(1) << 30 : 0, .block = 64, .interval = 1024};
    Scheduler scheduler(*f.model, o);
    Collector a, b;
    ASSERT_EQ(scheduler.submit(first, a.callback()), SubmitStatus::Accepted);
    a.wait();
    ASSERT_EQ(a.answer.tokens.size(), 400u);
    ASSERT_EQ(scheduler.submit(next_turn(first, a.answer.tokens, 62, f.vocab()), b.callback()), SubmitStatus::Accepted);
    b.wait();
    scheduler.shutdown(true);
    answers[cached] = {a.answer, b.answer};
    if (cached) m = scheduler.metrics();
  }
  expect_same(answers[1], answers[0]);
  EXPECT_EQ(answers[1][1].cached, 448);
  EXPECT_EQ(m.replay_tokens_live, 256u);
  EXPECT_EQ(m.replay_tokens, 384u);
}

// A long reply (70-token prompt, snapshot at 64; 200 tokens) is followed live: its pieces up to 256,
// the last block boundary of what it fed, are all fed while it is generated (the interval at 128
// and the end snapshotted), so the next turn, sent the moment the reply ends, restores 256 tokens
// without waiting for a replay, and both turns answer as without the cache. A follower dropped
// for a request that needs its slot leaves the answers unchanged too.
TEST(PrefixCache, ALiveReplayFollowsALongReply) {
  Fixture f;
  const CompletionRequest first = greedy_request(tokens(70, 51, f.vocab()), 200, 5);
  const std::vector<Answer> reply = serve(*f.model, {first}, 0, false);
  ASSERT_EQ(reply[0].tokens.size(), 200u);
  const CompletionRequest second = next_turn(first, reply[0].tokens, 52, f.vocab());

  const std::vector<Answer> plain = serve(*f.model, {first, second}, 0, false);
  SchedulerMetrics m;
  const std::vector<Answer> cached = serve(*f.model, {first, second}, size_t(1) << 30, false, nullptr, kChunk, &m);
  expect_same(cached, plain);
  EXPECT_EQ(cached[1].cached, 256);
  EXPECT_EQ(m.replay_tokens, 192u);
  EXPECT_EQ(m.replay_tokens_live, 192u);
  EXPECT_EQ(m.prefix_cache.snapshots, 3u) << "the prompt's at 64, the reply's at 128 (an interval) and 256";

  // Two slots, and a request arriving mid-reply (the first request's callback holds the scheduler
  // at its 150th token until it is queued): it takes the follower's slot, and the reply is fed
  // again after it ends instead. Every answer is still the one without the cache.
  const CompletionRequest other = greedy_request(tokens(90, 53, f.vocab()), 4, -1);
  for (const size_t budget : {size_t(0), size_t(1) << 30}) {
    Scheduler scheduler(*f.model, scheduler_options(cache_options(budget), kChunk, /*max_sequences=*/2));
    Collector a, b, c;
    std::promise<void> queued;
    std::shared_future<void> go = queued.get_future().share();
    StepCallback first_callback = [&, inner = a.callback(), n = 0](const StepEvent& e) mutable {
      if (e.token >= 0 && ++n == 150) go.wait();
      return inner(e);
    };
    ASSERT_EQ(scheduler.submit(first, first_callback), SubmitStatus::Accepted);
    while (true) {  // until the first request decodes
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (scheduler.metrics().generated_tokens > 0) break;
    }
    ASSERT_EQ(scheduler.submit(other, b.callback()), SubmitStatus::Accepted);
    queued.set_value();
    a.wait();
    b.wait();
    ASSERT_EQ(scheduler.submit(second, c.callback()), SubmitStatus::Accepted);
    c.wait();
    scheduler.shutdown(true);
    expect_same({a.answer, c.answer}, plain);
    if (budget == 0) continue;
    const SchedulerMetrics sm = scheduler.metrics();
    EXPECT_EQ(c.answer.cached, 256);
    EXPECT_LT(sm.replay_tokens_live, 192u) << "the follower gave its slot up";
    EXPECT_GE(sm.replay_tokens, 192u);
  }
}

// Prompts of 193 tokens snapshot at 128; a reply after one would snapshot at 192. It does when the
// request ends normally, not when it fails in the engine or is cancelled.
TEST(PrefixCache, OnlyARequestThatEndsNormallySnapshotsItsReply) {
  Fixture f;
  CompletionRequest ok;
  ok.prompt = tokens(193, 33, f.vocab());
  ok.sampling.temperature = 0.0f;
  ok.max_tokens = 3;
  CompletionRequest failing = ok;
  failing.sampling.temperature = 1.0f;  // a draw, which refuses when every token is banned
  for (int t = 0; t < f.vocab(); ++t) failing.sampling.logit_bias[t] = -INFINITY;
  CompletionRequest cancelled = ok;
  cancelled.max_tokens = 100;
  struct Case {
    const char* name;
    const CompletionRequest& request;
    bool cancel;
    uint64_t snapshots;
  };
  for (const Case& c : {Case{"ends normally", ok, false, 2}, Case{"fails", failing, false, 1},
                        Case{"is cancelled", cancelled, true, 1}}) {
    SCOPED_TRACE(c.name);
    Scheduler scheduler(*f.model, scheduler_options(cache_options(size_t(1) << 30)));
    uint64_t id = 0;
    Collector got;
    const StepCallback collect = got.callback();
    ASSERT_EQ(scheduler.submit(c.request, [&](const StepEvent& e) {
      if (c.cancel && e.token >= 0) scheduler.cancel(id);
      return collect(e);
    }, &id), SubmitStatus::Accepted);
    scheduler.shutdown(true);
    EXPECT_EQ(got.answer.tokens.empty(), c.request.sampling.temperature > 0);
    EXPECT_EQ(scheduler.metrics().prefix_cache.snapshots, c.snapshots);
  }
}

// Concurrent requests, and a budget that holds one snapshot: restores and evictions interleave
// with running sequences, and no output changes.
TEST(PrefixCache, ConcurrentRequestsAndEvictionsChangeNoOutput) {
  Fixture f;
  const auto requests = conversation(f.vocab());
  const std::vector<Answer> plain = serve(*f.model, requests, 0, true);
  expect_same(serve(*f.model, requests, size_t(1) << 30, true), plain);
  size_t one = 0;
  {
    PrefixCache probe(cache_options(1 << 30), [&](int n) { return f.state(n); });
    const std::vector<int32_t> longest = requests[requests.size() - 2].prompt;
    auto st = f.state();
    f.feed(longest, *st, 128);
    probe.offer(longest, *st);
    one = probe.stats().bytes;
  }
  PrefixCacheStats stats;
  expect_same(serve(*f.model, requests, one + 1024, false, &stats), plain);
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_LE(stats.entries, 1);
}

// The conversation with top-20 logprobs under a device budget of one 64-token snapshot: each new
// snapshot spills the last one to host memory, later turns restore from there, and every token and
// logprob is what it is without the cache. A host budget of one and a half such snapshots drops
// spilled ones (and the larger ones outright) all the time, and still changes no output.
TEST(PrefixCache, SpilledSnapshotsServeLaterTurnsWithTheSameOutputs) {
  Fixture f;
  std::vector<CompletionRequest> requests = conversation(f.vocab());
  for (CompletionRequest& r : requests) r.top_logprobs = 20;
  const std::vector<Answer> plain = serve(*f.model, requests, 0, false);
  const size_t one = snapshot_bytes(f, requests[0].prompt, 64);
  PrefixCacheStats stats;
  expect_same(serve(*f.model, requests, cache_options(one + one / 2, 16 * one), false, &stats), plain);
  EXPECT_GT(stats.spills, 0u);
  EXPECT_GT(stats.host_hit_tokens, 0u) << "no turn restored a spilled snapshot";
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_LE(stats.entries, 1);
  EXPECT_EQ(uint64_t(stats.host_entries), stats.spills);

  PrefixCacheStats small;
  expect_same(serve(*f.model, requests, cache_options(one + one / 2, one + one / 2), false, &small), plain);
  EXPECT_GT(small.spills, uint64_t(small.host_entries)) << "spilled snapshots were dropped from host memory";
  EXPECT_GT(small.evictions, 0u);
  EXPECT_LE(small.host_bytes, one + one / 2);
}

// Forty requests at once, branches of three shared histories cut anywhere (some on block
// boundaries), under a budget of two snapshots and a prefill chunk of two blocks: restores,
// snapshots and evictions interleave with running sequences, and every request gives the tokens
// and logprobs it gives alone, without a cache; also with a host budget of four snapshots more,
// where spills, restores from host memory and drops from it interleave too.
TEST(PrefixCache, ManyOverlappingRequestsUnderASmallBudgetMatchEachAlone) {
  Fixture f;
  std::mt19937 rng(7);
  const std::vector<int32_t> roots[] = {tokens(260, 11, f.vocab()), tokens(260, 12, f.vocab()),
                                        tokens(260, 13, f.vocab())};
  std::vector<CompletionRequest> requests;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int32_t>& root = roots[rng() % 3];
    const int shared = i % 5 == 0 ? 64 * int(1 + rng() % 4) : int(1 + rng() % 256);
    const std::vector<int32_t> tail = tokens(int(rng() % 40), 100 + i, f.vocab());
    CompletionRequest r;
    r.prompt.assign(root.begin(), root.begin() + shared);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.sampling.temperature = 0.0f;
    r.max_tokens = 1 + int(rng() % 6);
    r.top_logprobs = 0;
    requests.push_back(r);
  }
  size_t one = 0;
  {
    PrefixCache probe(cache_options(1 << 30), [&](int n) { return f.state(n); });
    auto st = f.state();
    f.feed(roots[0], *st, 256);
    probe.offer(roots[0], *st);
    one = probe.stats().bytes;
  }
  const std::vector<Answer> alone = serve(*f.model, requests, 0, false, nullptr, 2 * kChunk);
  PrefixCacheStats stats;
  const std::vector<Answer> cached = serve(*f.model, requests, 2 * one, true, &stats, 2 * kChunk);
  expect_same(cached, alone);
  int hits = 0;
  for (const Answer& a : cached) hits += a.cached > 0;
  EXPECT_GE(hits, 10);
  EXPECT_GT(stats.evictions, 10u);
  EXPECT_LE(stats.bytes, 2 * one);

  PrefixCacheStats spilled;
  expect_same(serve(*f.model, requests, cache_options(2 * one, 4 * one), true, &spilled, 2 * kChunk), alone);
  EXPECT_GT(spilled.host_hit_tokens, 0u);
  EXPECT_GT(spilled.spills, uint64_t(spilled.host_entries)) << "host memory dropped spilled snapshots too";
  EXPECT_LE(spilled.host_bytes, 4 * one);
}

}  // namespace
}  // namespace petrel
