#include "runtime/running_request.h"

#include <algorithm>

#include "core/error.h"

namespace petrel {
namespace {

double seconds(SchedulerClock::time_point a, SchedulerClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

StepEvent ending_event(const GenerationStats& stats, const std::string& error) {
  StepEvent e;
  e.done = true;
  e.reason = FinishReason::Cancelled;
  e.stats = stats;
  e.error = error;
  return e;
}

bool deliver(const StepCallback& callback, const StepEvent& event) {
  try {
    return callback(event);
  } catch (...) {
    return false;
  }
}

RunningRequest::RunningRequest(QueuedRequest queued, Slot& slot, int vocab)
    : id_(queued.id),
      request_(std::move(queued.request)),
      callback_(std::move(queued.callback)),
      slot_(slot),
      vocab_(vocab),
      device_(slot.sampler.get()),
      submitted_(queued.submitted) {
  check(state().n_past == 0, "RunningRequest: the state slot was not reset");
  // Up front, so that no decode step allocates: a reply ends with the context or max_tokens.
  const int most = state().capacity - prompt_size() + 1;
  reply_.reserve(size_t(std::max(request_.max_tokens > 0 ? std::min(request_.max_tokens, most) : most, 0)));
}

void RunningRequest::start_sampler() {
  if (device_) device_->reset(request_.sampling);
  else sampler_.emplace(request_.sampling, vocab_);
  if (request_.grammar) matcher_.emplace(request_.grammar, request_.eos_ids, request_.reasoning);
  // The penalty history starts with the prompt, as in Generator::generate.
  for (int32_t t : request_.prompt) observe(t, false);
}

void RunningRequest::observe(int32_t token, bool generated) {
  if (device_) device_->observe(token, generated);
  else sampler_->observe(token, generated);
}

std::span<const int32_t> RunningRequest::next_prompt_piece(int max) const {
  const int fed = state().n_past;
  return std::span<const int32_t>(request_.prompt).subspan(size_t(fed), size_t(std::min(max, prompt_size() - fed)));
}

std::vector<int32_t> RunningRequest::fed_tokens() const {
  std::vector<int32_t> out = request_.prompt;
  if (!reply_.empty()) out.insert(out.end(), reply_.begin(), reply_.end() - 1);
  return out;
}

int RunningRequest::draft_budget() const {
  int k = state().capacity - state().n_past - 1;
  if (request_.max_tokens > 0) k = std::min(k, request_.max_tokens - generated_ - 1);
  return k;
}

void RunningRequest::start_verify(int drafted) {
  drafted_ += drafted;
  ++verify_steps_;
}

StepEvent RunningRequest::sample(const Tensor& row, const float* host_row, int unfed, int32_t drafted) {
  check(host_row || !needs_host_row(), "RunningRequest::sample: the logits row is needed on the host");
  // The position is the sequence's length after the fed token, as in Generator::generate.
  const uint64_t position = uint64_t(state().n_past + unfed);
  if (matcher_ && !device_) sampler_->set_mask(matcher_->mask());
  if (device_ && !draw_started_) start_draw(row, unfed);
  if (device_) draw_started_ = false;
  const int32_t t = device_ ? device_->finish() : sampler_->sample(host_row, position);
  observe(t, true);
  if (matcher_) matcher_->accept(t);
  last_token_ = SchedulerClock::now();
  if (generated_ == 0) first_token_ = last_token_;
  ++generated_;
  if (t == drafted) ++accepted_;
  pending_ = t;
  reply_.push_back(t);

  StepEvent e;
  e.token = t;
  if (request_.top_logprobs >= 0) add_logprobs(host_row, e);
  e.done = finished_by(t, position, e.reason);
  if (e.done) e.stats = stats();
  return e;
}

void RunningRequest::start_draw(const Tensor& row, int unfed) {
  if (!device_ || draw_started_) return;
  if (matcher_) device_->set_mask(matcher_->mask());
  device_->start(row, uint64_t(state().n_past + unfed));
  draw_started_ = true;
}

void RunningRequest::add_logprobs(const float* logits, StepEvent& event) const {
  const double log_norm = log_sum_exp(logits, vocab_);
  event.chosen = {event.token, float(double(logits[event.token]) - log_norm)};
  event.top = top_logprobs(logits, vocab_, request_.top_logprobs, log_norm);
}

// The order of Generator::generate: EOS, then the token budget, then the context (the next step
// would have to feed this token).
bool RunningRequest::finished_by(int32_t t, uint64_t position, FinishReason& reason) const {
  const auto& eos = request_.eos_ids;
  if (std::find(eos.begin(), eos.end(), t) != eos.end()) reason = FinishReason::Eos;
  else if (request_.max_tokens > 0 && generated_ >= request_.max_tokens) reason = FinishReason::MaxTokens;
  else if (position >= uint64_t(state().capacity)) reason = FinishReason::ContextFull;
  else return false;
  return true;
}

GenerationStats RunningRequest::stats() const {
  GenerationStats s;
  s.prompt_tokens = prompt_size();
  s.prefilled = std::min(state().n_past, prompt_size()) - restored_;
  s.drafted = drafted_;
  s.accepted = accepted_;
  s.verify_steps = verify_steps_;
  s.generated = generated_;
  if (generated_ > 0) {
    s.ttft_s = seconds(submitted_, first_token_);
    s.decode_s = seconds(first_token_, last_token_);
  }
  return s;
}

}  // namespace petrel
