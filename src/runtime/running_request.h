// A request that holds a state slot: how much of its prompt is fed, its sampler (penalty history,
// seed), and the stop rules that turn each sampled token into a StepEvent. The scheduler decides
// when its tokens are fed; this class decides what a logits row means for the request.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/device_sampler.h"
#include "generate/sampler.h"
#include "grammar/matcher.h"
#include "runtime/scheduler.h"

namespace petrel {

using SchedulerClock = std::chrono::steady_clock;

// A request accepted by submit(), before it gets a slot.
struct QueuedRequest {
  uint64_t id = 0;
  CompletionRequest request;
  StepCallback callback;
  SchedulerClock::time_point submitted;
};

// The final event of a request that ends without a new token: cancelled, or failed when `error`
// is non-empty.
StepEvent ending_event(const GenerationStats& stats, const std::string& error = {});
// Runs a request's callback; false when it asks to stop. A throwing callback counts as stopping:
// the caller's failure ends its own request, never the scheduler.
bool deliver(const StepCallback& callback, const StepEvent& event);

// What the scheduler allocates once per concurrent sequence: the state, and the device sampler
// that serves whichever request holds the slot (null where rows are sampled on the host), so no
// request pays for device allocations.
struct Slot {
  std::unique_ptr<SequenceState> state;
  std::unique_ptr<DeviceSampler> sampler;
};

class RunningRequest {
 public:
  // The slot's state must be empty (n_past 0); the slot stays owned by the scheduler.
  RunningRequest(QueuedRequest queued, Slot& slot, int vocab);

  uint64_t id() const { return id_; }
  Slot& slot() { return slot_; }
  // The slot's state (the slot may swap it for an equal one: a verify step's copy).
  SequenceState& state() { return *slot_.state; }
  const SequenceState& state() const { return *slot_.state; }
  std::span<const int32_t> prompt() const { return request_.prompt; }
  int prompt_size() const { return int(request_.prompt.size()); }
  // Says that the state came with the prompt's first n tokens (a prefix cache restored them).
  void restored(int n) { restored_ = n; }
  bool prefilling() const { return state().n_past < prompt_size(); }
  // The prompt tokens not fed yet, at most `max` of them.
  std::span<const int32_t> next_prompt_piece(int max) const;
  // The last sampled token: what the next decode step feeds.
  int32_t pending_token() const { return pending_; }
  // The tokens the sequence holds once every sampled token but the pending one is fed: the prompt,
  // then the reply in order. (A verify step may end the request before its state caught up.)
  std::vector<int32_t> fed_tokens() const;
  int fed_count() const { return prompt_size() + std::max(int(reply_.size()) - 1, 0); }
  // Most tokens a verify step may draft: its forward must fit the context, and the token after a
  // fully accepted draft should still be wanted.
  int draft_budget() const;
  // A verify step of `drafted` tokens starts (for the statistics).
  void start_verify(int drafted);

  // Sets the sampler to the request's parameters with the prompt as penalty history. Apart from the
  // constructor: the device sampler's calls can fail, and the scheduler then ends the request.
  void start_sampler();
  // Whether sample() reads the row on the host: host sampling, or logprobs to report.
  bool needs_host_row() const { return !device_ || request_.top_logprobs >= 0; }
  // Samples the token after the sequence's last fed token from its logits row (`row`: one fp32 row
  // in backend memory; `host_row`: its vocab floats copied to the host when needs_host_row(), else
  // null) and returns its event; done when EOS, max_tokens or a full context ends the request.
  // A verify step's row m follows `unfed` = m + 1 tokens the state does not hold yet (it ran on a
  // copy); `drafted` is the token drafted for the row (-1: none), counted when sampled.
  StepEvent sample(const Tensor& row, const float* host_row, int unfed = 0, int32_t drafted = -1);
  // Queues the device draw of sample() ahead of it where the row stays in backend memory (a no-op
  // otherwise), so a batched step's draws run back to back and the host waits once.
  void start_draw(const Tensor& row, int unfed = 0);
  // The final event when the request ends without a new token (see ending_event).
  StepEvent ending(const std::string& error = {}) const { return ending_event(stats(), error); }
  bool deliver(const StepEvent& event) const { return petrel::deliver(callback_, event); }

 private:
  void observe(int32_t token, bool generated);
  void add_logprobs(const float* logits, StepEvent& event) const;
  // The reason the request ends with token `t`, or none.
  // `position`: the sequence's length with the token's predecessor fed.
  bool finished_by(int32_t t, uint64_t position, FinishReason& reason) const;
  GenerationStats stats() const;

  uint64_t id_;
  CompletionRequest request_;
  StepCallback callback_;
  Slot& slot_;
  int vocab_;
  // The slot's sampler, or null (rows sampled on the host). A grammar's mask goes to whichever
  // sampler draws.
  DeviceSampler* device_;
  bool draw_started_ = false;  // start_draw queued this step's device draw
  std::optional<Sampler> sampler_;  // the host sampler, when there is no device one
  std::optional<grammar::Matcher> matcher_;  // structured output
  int32_t pending_ = -1;
  std::vector<int32_t> reply_;  // every sampled token, pending_ last
  int generated_ = 0;
  int drafted_ = 0, accepted_ = 0, verify_steps_ = 0;
  int restored_ = 0;  // prompt tokens the state came with
  SchedulerClock::time_point submitted_, first_token_, last_token_;
};

}  // namespace petrel
