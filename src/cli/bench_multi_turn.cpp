#include "cli/bench_multi_turn.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/scheduler.h"

namespace petrel::cli {
namespace {

// Filler text: `offset` (the message's place in the conversation) keeps every message distinct.
std::vector<int32_t> filler(int n, int offset, int vocab) {
  std::vector<int32_t> ids(size_t(std::max(n, 0)));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t((1103515245u * uint32_t(offset + i) + 12345u) % uint32_t(vocab));
  return ids;
}

// Turn t's prompt (t from 1): the system prompt grown by t equal steps, the last to final_tokens.
int prompt_length(const MultiTurnOptions& o, int t) {
  return o.system_tokens + int(int64_t(o.final_tokens - o.system_tokens) * t / o.turns);
}

struct Reply {
  std::vector<int32_t> tokens;
  double ttft_s = 0;
  std::string error;
};

// One greedy request, waited for: its reply and the scheduler's time from submission to its first token.
Reply ask(Scheduler& scheduler, const std::vector<int32_t>& prompt, int reply_tokens) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Reply reply;
  CompletionRequest request;
  request.prompt = prompt;
  request.sampling.temperature = 0.0f;
  request.max_tokens = reply_tokens;
  const SubmitStatus status = scheduler.submit(std::move(request), [&](const StepEvent& e) {
    std::lock_guard lock(mu);
    if (e.token >= 0) reply.tokens.push_back(e.token);
    if (e.done) {
      reply.ttft_s = e.stats.ttft_s;
      reply.error = e.error;
      done = true;
      cv.notify_all();
    }
    return true;
  });
  check(status == SubmitStatus::Accepted, "--multi-turn: the scheduler refused a " + std::to_string(prompt.size()) +
                                              "-token turn");
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  check(reply.error.empty(), "--multi-turn: " + reply.error);
  return reply;
}

struct Turn {
  int prompt_tokens = 0;
  int shared_tokens = 0;  // the conversation so far: earlier turns' prompts and replies
  int cached_tokens = 0;  // of the prompt, restored by the prefix cache (its hit counter)
  double ttft_s = 0;
  std::vector<int32_t> reply;
};

struct Conversation {
  std::vector<Turn> turns;
  PrefixCacheStats cache;  // at the end
};

// The whole conversation on a fresh scheduler (and so an empty prefix cache): each turn sends the
// history plus a new user message and appends the generated reply.
Conversation converse(Model& model, const MultiTurnOptions& o, bool cached) {
  SchedulerOptions so;
  so.max_sequences = 2;  // one chat, and a spare slot in which the cache follows each reply
  so.max_queued = 1;  // a turn may come while the last one's final callback is still returning
  so.context = o.final_tokens + o.reply_tokens;
  so.prefill_chunk = o.prefill_chunk;
  so.prefix_cache.budget_bytes = cached ? o.cache_bytes : 0;
  so.prefix_cache.host_budget_bytes = o.host_cache_bytes;
  Scheduler scheduler(model, so);
  const int vocab = model.config().vocab;
  std::vector<int32_t> history = filler(o.system_tokens, 0, vocab);
  Conversation c;
  for (int t = 1; t <= o.turns; ++t) {
    Turn turn;
    turn.shared_tokens = t == 1 ? 0 : int(history.size());
    const int offset = int(history.size());
    const std::vector<int32_t> user = filler(prompt_length(o, t) - offset, offset, vocab);
    history.insert(history.end(), user.begin(), user.end());
    turn.prompt_tokens = int(history.size());
    const uint64_t hits = scheduler.metrics().prefix_cache.hit_tokens;
    Reply reply = ask(scheduler, history, o.reply_tokens);
    turn.cached_tokens = int(scheduler.metrics().prefix_cache.hit_tokens - hits);
    turn.ttft_s = reply.ttft_s;
    history.insert(history.end(), reply.tokens.begin(), reply.tokens.end());
    turn.reply = std::move(reply.tokens);
    c.turns.push_back(std::move(turn));
    if (t < o.turns) std::this_thread::sleep_for(std::chrono::milliseconds(o.turn_gap_ms));
  }
  c.cache = scheduler.metrics().prefix_cache;
  scheduler.shutdown(true);
  return c;
}

// Median, min, max and every run (in the order they ran), in milliseconds.
nlohmann::json summary_ms(std::vector<double> runs_s) {
  std::vector<double> ms;
  for (double s : runs_s) ms.push_back(1e3 * s);
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  return {{"median", sorted[sorted.size() / 2]}, {"min", sorted.front()}, {"max", sorted.back()}, {"runs", ms}};
}

}  // namespace

void check_multi_turn(const MultiTurnOptions& o, const ModelConfig& config) {
  check(o.system_tokens >= 1, "--system-tokens: expected >= 1, found " + std::to_string(o.system_tokens));
  check(o.turns >= 1, "--turns: expected >= 1, found " + std::to_string(o.turns));
  check(o.reply_tokens >= 1, "--reply-tokens: expected >= 1, found " + std::to_string(o.reply_tokens));
  check(o.runs >= 1, "--runs: expected >= 1, found " + std::to_string(o.runs));
  check(o.turn_gap_ms >= 0, "--turn-gap-ms: expected >= 0, found " + std::to_string(o.turn_gap_ms));
  check(o.final_tokens > o.system_tokens, "--final-tokens: expected more than --system-tokens (" +
                                              std::to_string(o.system_tokens) + "), found " +
                                              std::to_string(o.final_tokens));
  const int step = (o.final_tokens - o.system_tokens) / o.turns;
  check(o.reply_tokens < step, "--reply-tokens: expected fewer than each turn's growth ((--final-tokens - "
                               "--system-tokens) / --turns = " + std::to_string(step) + " tokens), found " +
                                   std::to_string(o.reply_tokens));
  const int last = o.final_tokens + o.reply_tokens;
  check(config.max_position <= 0 || last <= config.max_position,
        "--final-tokens: the last turn (" + std::to_string(o.final_tokens) + " prompt + " +
            std::to_string(o.reply_tokens) + " reply tokens) exceeds the model's " +
            std::to_string(config.max_position) + " positions");
}

nlohmann::json multi_turn(Model& model, const MultiTurnOptions& o) {
  std::vector<std::vector<double>> ttft[2];  // [uncached, cached][turn][run]
  for (auto& mode : ttft) mode.resize(size_t(o.turns));
  std::vector<Conversation> last(2);
  bool same_replies = true;
  for (int r = 0; r <= o.runs; ++r) {  // run 0 warms up
    for (int cached = 0; cached < 2; ++cached) {
      last[size_t(cached)] = converse(model, o, cached == 1);
      if (r == 0) continue;
      for (int t = 0; t < o.turns; ++t) ttft[cached][size_t(t)].push_back(last[size_t(cached)].turns[size_t(t)].ttft_s);
    }
    for (int t = 0; t < o.turns; ++t) same_replies &= last[0].turns[size_t(t)].reply == last[1].turns[size_t(t)].reply;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (int t = 0; t < o.turns; ++t) {
    const Turn& turn = last[1].turns[size_t(t)];
    nlohmann::json row = {{"turn", t + 1},
                          {"prompt_tokens", turn.prompt_tokens},
                          {"shared_prefix_tokens", turn.shared_tokens},
                          {"cached_tokens", turn.cached_tokens},
                          {"ttft_cached_ms", summary_ms(ttft[1][size_t(t)])},
                          {"ttft_uncached_ms", summary_ms(ttft[0][size_t(t)])}};
    row["cached_share"] = turn.shared_tokens > 0 ? nlohmann::json(double(turn.cached_tokens) / turn.shared_tokens)
                                                 : nlohmann::json(nullptr);
    row["ttft_ratio"] = row["ttft_cached_ms"]["median"].get<double>() / row["ttft_uncached_ms"]["median"].get<double>();
    rows.push_back(row);
  }
  const PrefixCacheStats& cache = last[1].cache;
  return {{"system_tokens", o.system_tokens},
          {"turns", o.turns},
          {"final_tokens", o.final_tokens},
          {"reply_tokens", o.reply_tokens},
          {"turn_gap_ms", o.turn_gap_ms},
          {"prefill_chunk", o.prefill_chunk},
          {"prefix_cache_bytes", o.cache_bytes},
          {"prefix_cache_host_bytes", o.host_cache_bytes},
          {"runs", o.runs},
          {"same_replies", same_replies},
          {"rows", rows},
          {"cache_at_end",
           {{"entries", cache.entries},
            {"bytes", cache.bytes},
            {"host_entries", cache.host_entries},
            {"host_bytes", cache.host_bytes},
            {"spills", cache.spills},
            {"evictions", cache.evictions}}}};
}

void print_multi_turn(const nlohmann::json& m) {
  std::printf("\nmulti-turn chat through the scheduler: system prompt %d tokens, %d turns to %d, replies of %d tokens, "
              "%d ms between a reply and the next turn, median of %d runs\n",
              m["system_tokens"].get<int>(), m["turns"].get<int>(), m["final_tokens"].get<int>(),
              m["reply_tokens"].get<int>(), m["turn_gap_ms"].get<int>(), m["runs"].get<int>());
  std::printf("%5s %8s %8s %8s %7s %14s %14s %9s\n", "turn", "prompt", "shared", "cached", "share", "TTFT cached",
              "TTFT uncached", "ratio");
  for (const auto& r : m["rows"]) {
    char share[16] = "-";
    if (!r["cached_share"].is_null())
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * r["cached_share"].get<double>());
    std::printf("%5d %8d %8d %8d %7s %11.1f ms %11.1f ms %9.3f\n", r["turn"].get<int>(), r["prompt_tokens"].get<int>(),
                r["shared_prefix_tokens"].get<int>(), r["cached_tokens"].get<int>(), share,
                r["ttft_cached_ms"]["median"].get<double>(), r["ttft_uncached_ms"]["median"].get<double>(),
                r["ttft_ratio"].get<double>());
  }
  const auto& c = m["cache_at_end"];
  std::printf("replies with and without the cache: %s; cache at the end: %d snapshots, %.1f MB, %d in host memory, "
              "%.1f MB, %d spilled, %d evicted\n",
              m["same_replies"].get<bool>() ? "identical" : "different", c["entries"].get<int>(),
              double(c["bytes"].get<size_t>()) / 1e6, c["host_entries"].get<int>(),
              double(c["host_bytes"].get<size_t>()) / 1e6, c["spills"].get<int>(), c["evictions"].get<int>());
}

}  // namespace petrel::cli
