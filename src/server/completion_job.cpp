#include "server/completion_job.h"

namespace petrel::server {

CompletionJob::CompletionJob(std::unique_ptr<AnswerStream> stream, bool logprobs)
    : stream_(std::move(stream)), want_logprobs_(logprobs) {}

void CompletionJob::take_token(const StepEvent& e) {
  last_ = Clock::now();
  if (++generated_ == 1) first_ = last_;
  if (e.done && e.reason == FinishReason::Eos) return;  // EOS has no text
  if (want_logprobs_) pending_.logprobs.push_back({e.chosen, e.top});
  if (!stream_->push(e.token, pending_.delta)) finish(FinishReason::StopString, "");
}

void CompletionJob::finish(FinishReason reason, const std::string& error) {
  if (finished_) return;
  finished_ = true;
  stream_->finish(pending_.delta);
  JobFinish f;
  f.reason = reason;
  f.error = error;
  f.completion_tokens = generated_;
  f.cached_tokens = cached_tokens_;
  f.tool_calls = stream_->tool_calls();
  if (generated_ > 0) f.ttft_s = std::chrono::duration<double>(first_ - start_).count();
  if (generated_ > 1) f.tpot_s = std::chrono::duration<double>(last_ - first_).count() / (generated_ - 1);
  pending_.finish = f;
}

bool CompletionJob::on_event(const StepEvent& e) {
  std::lock_guard lock(mutex_);
  if (finished_) return false;
  try {
    if (e.token >= 0) take_token(e);
    if (e.done) {
      cached_tokens_ = e.stats.prompt_tokens - e.stats.prefilled;
      finish(e.reason, e.error);
    }
  } catch (const std::exception& error) {  // never let an exception reach the scheduler thread
    finish(FinishReason::Cancelled, std::string("internal error: ") + error.what());
  }
  changed_.notify_all();
  return !finished_ && !closed_;
}

JobUpdate CompletionJob::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return has_news(); });
  return std::exchange(pending_, JobUpdate{});
}

JobUpdate CompletionJob::wait_all() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return pending_.finish.has_value(); });
  return std::exchange(pending_, JobUpdate{});
}

void CompletionJob::close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
}

}  // namespace petrel::server
