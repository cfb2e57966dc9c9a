// One request between its HTTP handler and the scheduler. The scheduler thread feeds it events
// (on_event, which must be quick: text and stop strings are handled there so that a stop ends the
// sequence at once); the handler thread takes what they produced (next) and writes it out.
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/answer_stream.h"

namespace petrel::server {

struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

struct JobFinish {
  FinishReason reason = FinishReason::MaxTokens;
  std::string error;          // non-empty when the engine failed
  int completion_tokens = 0;  // sampled tokens, EOS included
  int cached_tokens = 0;      // prompt tokens restored from the prefix cache
  int tool_calls = 0;
  double ttft_s = 0.0;        // submit -> first token
  double tpot_s = 0.0;        // mean time per output token after the first; 0 with fewer than 2
};

// What happened since the handler last looked.
struct JobUpdate {
  Delta delta;
  std::vector<TokenLogprobs> logprobs;  // of the tokens behind `delta` (EOS left out)
  std::optional<JobFinish> finish;      // set once, in the last update
};

class CompletionJob {
 public:
  // `logprobs`: keep each token's logprobs for the response.
  CompletionJob(std::unique_ptr<AnswerStream> stream, bool logprobs);

  // Scheduler thread. False ends the request: a stop string matched, or the client is gone.
  bool on_event(const StepEvent& event);
  // Handler thread: waits up to `timeout` for news and takes it (an empty update when none came).
  JobUpdate next(std::chrono::milliseconds timeout);
  // Handler thread: waits for the end and takes everything.
  JobUpdate wait_all();
  // The client is gone: the next event ends the request.
  void close();

 private:
  void take_token(const StepEvent& event);
  void finish(FinishReason reason, const std::string& error);
  bool has_news() const { return !pending_.delta.empty() || !pending_.logprobs.empty() || pending_.finish.has_value(); }

  using Clock = std::chrono::steady_clock;
  std::unique_ptr<AnswerStream> stream_;
  const bool want_logprobs_;
  std::mutex mutex_;
  std::condition_variable changed_;
  JobUpdate pending_;
  bool finished_ = false, closed_ = false;
  int generated_ = 0;
  int cached_tokens_ = 0;  // from the final event
  Clock::time_point start_ = Clock::now(), first_, last_;
};

}  // namespace petrel::server
