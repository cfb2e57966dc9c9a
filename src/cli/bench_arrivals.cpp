#include "cli/bench_arrivals.h"

#include <algorithm>
#include <atomic>
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

using Clock = std::chrono::steady_clock;

constexpr int kStreamPrompt = 128;

std::vector<int32_t> prompt_of(int n, uint32_t offset, int vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t((1103515245u * (offset + uint32_t(i)) + 12345u) % uint32_t(vocab));
  return ids;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Every stream's token times, and the arrivals' times to first token.
struct Record {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<Clock::time_point>> tokens;  // per stream
  std::vector<char> ended;                             // per stream: its request ended (EOS, full context)
  std::vector<double> ttft_ms;                         // per arrival, once answered
  std::string error;
  std::atomic<bool> stop{false};
};

// Gaps between consecutive tokens of a stream that both fall inside [t0, t1], in milliseconds.
std::vector<double> gaps(const Record& r, Clock::time_point t0, Clock::time_point t1) {
  std::vector<double> out;
  for (const auto& times : r.tokens)
    for (size_t i = 1; i < times.size(); ++i)
      if (times[i - 1] >= t0 && times[i] <= t1) out.push_back(ms(times[i] - times[i - 1]));
  return out;
}

nlohmann::json window(const Record& r, Clock::time_point t0, Clock::time_point t1) {
  const std::vector<double> g = gaps(r, t0, t1);
  return {{"itl_p50_ms", percentile(g, 0.5)},
          {"itl_p99_ms", percentile(g, 0.99)},
          {"tok_per_s", double(g.size()) / (ms(t1 - t0) / 1e3)}};
}

// Waits until every stream still running has two tokens from t0 on (one gap inside a window that
// starts there), so that a window cut short by a loaded machine still measures something.
void wait_for_a_gap_each(Record& r, Clock::time_point t0) {
  std::unique_lock lock(r.mu);
  r.cv.wait(lock, [&] {
    if (!r.error.empty()) return true;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const auto& t = r.tokens[i];
      if (!r.ended[i] && t.end() - std::lower_bound(t.begin(), t.end(), t0) < 2) return false;
    }
    return true;
  });
}

void submit(Scheduler& s, CompletionRequest request, StepCallback callback, const char* what) {
  const SubmitStatus status = s.submit(std::move(request), std::move(callback));
  check(status == SubmitStatus::Accepted, std::string("--arrivals: the scheduler refused ") + what);
}

void start_streams(Scheduler& s, Record& r, int streams, int vocab) {
  r.tokens.resize(size_t(streams));
  r.ended.assign(size_t(streams), 0);
  for (int i = 0; i < streams; ++i) {
    CompletionRequest req;
    req.prompt = prompt_of(kStreamPrompt, uint32_t(i) * 131u, vocab);
    req.sampling.temperature = 0.0f;
    submit(s, std::move(req), [&r, i](const StepEvent& e) {
      std::lock_guard lock(r.mu);
      if (e.token >= 0) r.tokens[size_t(i)].push_back(Clock::now());
      if (e.done) r.ended[size_t(i)] = 1;
      if (e.done && !e.error.empty()) r.error = e.error;
      r.cv.notify_all();
      return !r.stop.load();
    }, "a stream");
  }
}

// Each arrival one token long: its time to first token is its whole life.
void arrive(Scheduler& s, Record& r, int k, const ArrivalOptions& o, int vocab) {
  CompletionRequest req;
  req.prompt = prompt_of(o.prompt_tokens, 1000003u * uint32_t(k + 1), vocab);
  req.sampling.temperature = 0.0f;
  req.max_tokens = 1;
  submit(s, std::move(req), [&r](const StepEvent& e) {
    if (!e.done) return true;
    std::lock_guard lock(r.mu);
    if (!e.error.empty()) r.error = e.error;
    r.ttft_ms.push_back(e.stats.ttft_s * 1e3);
    r.cv.notify_all();
    return true;
  }, "an arrival");
}

}  // namespace

void check_arrivals(const ArrivalOptions& o, const Model& model) {
  check(o.prompt_tokens >= 1, "--arrivals: expected a prompt length >= 1, found " + std::to_string(o.prompt_tokens));
  check(o.every_s > 0, "--arrival-every: expected seconds > 0, found " + std::to_string(o.every_s));
  check(o.count >= 1, "--arrival-count: expected >= 1, found " + std::to_string(o.count));
  check(o.prefill_chunk >= 1 && o.prefill_chunk <= model.max_batch(),
        "--serving-chunk: expected 1.." + std::to_string(model.max_batch()) + " (at most --chunk), found " +
            std::to_string(o.prefill_chunk));
}

nlohmann::json serving_with_arrivals(Model& model, int streams, const ArrivalOptions& o) {
  const int vocab = model.config().vocab;
  SchedulerOptions so;
  so.max_sequences = streams + o.count;  // an arrival never waits for a slot, only for the steps
  so.max_queued = 0;
  so.context = std::max(o.prompt_tokens + 8, 4096);
  so.prefill_chunk = o.prefill_chunk;
  check(so.max_sequences <= model.max_batch(),
        "--arrivals: " + std::to_string(streams) + " streams and " + std::to_string(o.count) +
            " arrivals need --chunk >= " + std::to_string(so.max_sequences));
  Scheduler scheduler(model, so);
  Record r;
  start_streams(scheduler, r, streams, vocab);
  wait_for_a_gap_each(r, Clock::time_point{});  // every stream past its prompt and decoding
  const auto span = std::chrono::duration<double>(o.every_s * o.count);
  const Clock::time_point quiet0 = Clock::now();
  std::this_thread::sleep_for(span);
  wait_for_a_gap_each(r, quiet0);
  const Clock::time_point quiet1 = Clock::now(), busy0 = quiet1;
  for (int k = 0; k < o.count; ++k) {
    arrive(scheduler, r, k, o, vocab);
    std::this_thread::sleep_until(busy0 + std::chrono::duration_cast<Clock::duration>(span * (k + 1) / o.count));
  }
  {
    std::unique_lock lock(r.mu);
    r.cv.wait(lock, [&] { return !r.error.empty() || int(r.ttft_ms.size()) == o.count; });
  }
  wait_for_a_gap_each(r, busy0);
  const Clock::time_point busy1 = Clock::now();
  r.stop = true;
  scheduler.shutdown(false);
  check(r.error.empty(), "--arrivals: " + r.error);
  nlohmann::json out = {{"streams", streams},
                        {"arrival_tokens", o.prompt_tokens},
                        {"every_s", o.every_s},
                        {"arrivals", o.count},
                        {"serving_chunk", o.prefill_chunk},
                        {"quiet", window(r, quiet0, quiet1)},
                        {"with_arrivals", window(r, busy0, busy1)},
                        {"ttft_p50_ms", percentile(r.ttft_ms, 0.5)},
                        {"ttft_p99_ms", percentile(r.ttft_ms, 0.99)}};
  const double quiet_p99 = out["quiet"]["itl_p99_ms"].get<double>();
  out["itl_p99_ratio"] = quiet_p99 > 0 ? out["with_arrivals"]["itl_p99_ms"].get<double>() / quiet_p99 : 0.0;
  return out;
}

void print_arrivals(const nlohmann::json& rows) {
  std::printf("\n%-8s %-24s %-24s %-10s %s\n", "streams", "quiet ITL p50/p99 ms", "arrivals ITL p50/p99 ms",
              "p99 ratio", "arrivals' TTFT p50/p99 ms");
  for (const auto& r : rows)
    std::printf("%-8d %9.1f / %-12.1f %9.1f / %-12.1f %-10.2f %.0f / %.0f   (%d-token prompt every %.2f s, "
                "%.0f vs %.0f tok/s)\n",
                r["streams"].get<int>(), r["quiet"]["itl_p50_ms"].get<double>(),
                r["quiet"]["itl_p99_ms"].get<double>(), r["with_arrivals"]["itl_p50_ms"].get<double>(),
                r["with_arrivals"]["itl_p99_ms"].get<double>(), r["itl_p99_ratio"].get<double>(),
                r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>(), r["arrival_tokens"].get<int>(),
                r["every_s"].get<double>(), r["quiet"]["tok_per_s"].get<double>(),
                r["with_arrivals"]["tok_per_s"].get<double>());
}

}  // namespace petrel::cli
