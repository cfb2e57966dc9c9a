// Continuous batching on one thread. Each turn of the loop: cancellations, admission of queued
// requests into free state slots, then one step: a batched decode step for every sequence past its
// prompt, carrying the next piece of the oldest sequence still reading its prompt (a piece that
// does not fit beside the rows runs alone after them). Logits stay in backend memory:
// each row is sampled there when the slot has a DeviceSampler, and copied to the host only when
// the request reads it there (host sampling, logprobs).
#include "runtime/scheduler.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/progress.h"
#include "generate/draft_policy.h"
#include "generate/mtp_draft.h"
#include "runtime/running_request.h"

namespace petrel {
namespace {

constexpr int kMaxTopLogprobs = 20;  // the OpenAI API's limit

void check_options(const SchedulerOptions& o, const Model& model) {
  const int max_batch = std::min(model.max_batch(), model.logit_rows());
  check(o.max_sequences >= 1 && o.max_sequences <= max_batch,
        "scheduler max_sequences: expected 1.." + std::to_string(max_batch) +
            " (at most the model's prefill chunk length and the logits rows a step keeps), found " +
            std::to_string(o.max_sequences));
  check(o.max_queued >= 0, "scheduler max_queued: expected >= 0, found " + std::to_string(o.max_queued));
  check(o.context >= 1, "scheduler context: expected >= 1 token, found " + std::to_string(o.context));
  check(o.prefill_chunk >= 1, "scheduler prefill_chunk: expected >= 1 token, found " + std::to_string(o.prefill_chunk));
  check(o.memory_fraction >= 0 && o.memory_fraction <= 1,
        "scheduler memory_fraction (--gpu-memory-fraction): expected 0..1, found " + std::to_string(o.memory_fraction));
  const SpeculativeOptions& spec = o.speculative;
  if (spec.draft == 0) return;
  check(spec.draft > 0 && spec.draft < max_batch, "scheduler speculative draft: expected 0 (off) or 1.." +
                                                      std::to_string(max_batch - 1) + ", found " +
                                                      std::to_string(spec.draft));
  check(spec.source == DraftSource::Mtp && !spec.forced_acceptance,
        "scheduler speculative: only drafts of the MTP head, verified, are served");
  check(model.has_mtp(),
        "--speculative mtp needs a checkpoint with a multi-token prediction head (mtp.* tensors); this one has none");
}

// Bytes the state slots may take: the share of the backend's free memory less the prefix cache's
// budget; none when there is no limit.
std::optional<size_t> slot_budget(Backend& backend, const SchedulerOptions& o) {
  if (o.memory_fraction <= 0) return std::nullopt;
  const std::optional<size_t> free = backend.free_memory();
  if (!free) return std::nullopt;
  const double share = double(*free) * o.memory_fraction - double(o.prefix_cache.budget_bytes);
  return size_t(std::max(0.0, share));
}

void check_request(const CompletionRequest& r, const StepCallback& callback, int vocab) {
  check(!r.prompt.empty(), "prompt: expected at least one token, found none");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    check(r.prompt[i] >= 0 && r.prompt[i] < vocab, "prompt: token id " + std::to_string(r.prompt[i]) +
                                                       " at position " + std::to_string(i) +
                                                       " is outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
  check(r.max_tokens == -1 || r.max_tokens > 0,
        "max_tokens: expected a positive count or -1 (no limit), found " + std::to_string(r.max_tokens));
  check(r.top_logprobs >= -1 && r.top_logprobs <= kMaxTopLogprobs,
        "top_logprobs: expected -1 (off) or 0.." + std::to_string(kMaxTopLogprobs) + ", found " +
            std::to_string(r.top_logprobs));
  r.sampling.validate(vocab);
  check(!r.grammar || r.grammar->vocab().rows == vocab,
        "grammar: made for " + std::to_string(r.grammar ? r.grammar->vocab().rows : 0) + " vocabulary rows, the model has " +
            std::to_string(vocab));
  check(bool(callback), "callback: expected a function, found none");
}

std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

// A slot fed a request's reply again for the prefix cache (Scheduler::Impl::start_replay says
// why): `tokens` from the prompt's snapshot on, in pieces that ride in decode steps as prompt
// pieces do. A live replay runs in a spare slot while its request decodes (follow_reply), so the
// reply is mostly fed when the request ends; otherwise the finished request's own slot replays.
// The slot is held, and the request counted in flight once it ended, until the last piece is fed.
struct Replay {
  Slot* slot = nullptr;
  std::vector<int32_t> tokens;  // the request's fed tokens up to the snapshot to take (so far, when live)
  const RunningRequest* live = nullptr;  // the decoding request followed; null once its reply is final
  SequenceState& state() const { return *slot->state; }
};

}  // namespace

struct Scheduler::Impl {
  Impl(Model& m, const SchedulerOptions& o);

  SubmitStatus submit(CompletionRequest request, StepCallback callback, uint64_t* id);
  void cancel(uint64_t id);
  void shutdown(bool drain);
  SchedulerMetrics metrics() const;

  void allocate_slots();

  // The scheduler thread.
  void run();
  bool wait_for_work();
  void apply_cancels();
  void admit();
  void end_unadmitted(const QueuedRequest& q, const std::string& error = {});
  void step();
  int chunk_end(int fed) const;
  std::span<const int32_t> next_piece(const RunningRequest& r) const;
  std::span<const int32_t> next_piece(const Replay& r) const;
  // A prompt being read and its next piece.
  struct Reading {
    RunningRequest* reader;
    std::span<const int32_t> piece;
  };
  std::vector<Reading> readings(size_t beside_rows) const;
  void decode_step(const std::vector<RunningRequest*>& rows, const std::vector<Reading>& reads, Replay* replay,
                   std::span<const int32_t> replay_piece);
  void prefill_step(RunningRequest& r, std::span<const int32_t> piece);
  void replay_step(Replay& r, std::span<const int32_t> piece);
  void piece_fed(RunningRequest& r, size_t tokens);
  void replay_fed(Replay& r, size_t tokens);
  bool emit(RunningRequest& r, const Tensor& row);
  void follow(RunningRequest& r, const int32_t* next, int n);
  bool speculate(RunningRequest& r);
  void verify(RunningRequest& r, const std::vector<int32_t>& draft);
  const float* host_copy(const RunningRequest& r, const Tensor& row);
  void fail(const std::vector<RunningRequest*>& rows, std::exception_ptr error);
  void finish(RunningRequest& r, const StepEvent& final_event);
  void declined(RunningRequest& r);
  std::unique_ptr<RunningRequest> release(RunningRequest& r);
  void ended_with_reply(RunningRequest& r);
  bool start_replay(Slot& slot, std::vector<int32_t> tokens, int prompt_size);
  void follow_reply(const RunningRequest& r);
  Replay* live_replay(const RunningRequest& r);
  void refresh(Replay& r);
  int live_piece_end(int fed) const;
  // A live replay's longest piece: long enough to cost few steps, short enough to keep up with
  // the reply (the shorter the pieces, the less is left to feed when it ends).
  static constexpr int kLivePiece = 256;
  bool continues_a_replay(std::span<const int32_t> prompt) const;
  void end_replay(Replay& r);
  void ended();
  void publish();

  Model& model;
  const SchedulerOptions options;
  const int vocab;
  std::vector<Slot> slots;  // allocated once, reused by every request
  PrefixCache prefix_cache;

  mutable std::mutex mu;
  std::condition_variable work_cv;  // wakes the scheduler thread
  std::condition_variable idle_cv;  // wakes shutdown() when nothing is left
  // Guarded by mu.
  std::deque<QueuedRequest> queue;
  std::vector<uint64_t> cancel_ids;
  bool accepting = true;
  bool cancel_all = false;
  int in_flight = 0;  // accepted and not yet ended (final callback returned): queued + running
  uint64_t next_id = 1;
  SchedulerMetrics published;

  // Scheduler thread only.
  std::vector<std::unique_ptr<RunningRequest>> running;  // in admission order
  std::vector<Slot*> free_slots;
  SchedulerMetrics counters;
  std::vector<int32_t> batch_ids;
  std::vector<SequenceState*> batch_states;
  std::vector<float> host_row;  // the latest logits row copied to the host (vocab floats)
  std::deque<Replay> replays;  // oldest first
  // Speculative decoding of a sequence running alone (options.speculative).
  std::unique_ptr<MtpDrafter> drafter;
  std::unique_ptr<SequenceState> scratch;  // the verify step's copy of the state
  std::optional<DraftPolicy> policy;
  const RunningRequest* followed = nullptr;  // the sequence whose trunk steps the head has read

  std::thread thread;  // last: starts once everything above exists
};

Scheduler::Impl::Impl(Model& m, const SchedulerOptions& o)
    : model(m),
      options(o),
      vocab(m.config().vocab),
      prefix_cache(
          o.prefix_cache, [&m](int capacity) { return m.new_sequence(capacity); },
          [&m](int capacity) { return m.new_host_sequence(capacity); }) {
  check_options(options, model);
  model.backend().release_calling_thread();  // the steps run on this scheduler's thread
  if (options.speculative.draft > 0) {
    drafter = std::make_unique<MtpDrafter>(model, options.context);
    scratch = model.new_sequence(options.context);
  }
  if (options.max_sequences > 1 || drafter) model.reserve_batch();  // verify steps keep every row too
  allocate_slots();
  counters.slots_total = published.slots_total = int(slots.size());
  thread = std::thread([this] { run(); });
}

// max_sequences slots, or as many as the memory share holds (one at least).
void Scheduler::Impl::allocate_slots() {
  const std::optional<size_t> budget = slot_budget(model.backend(), options);
  slots.reserve(size_t(options.max_sequences));  // free_slots points into it
  size_t used = 0;
  for (int i = 0; i < options.max_sequences; ++i) {
    if (budget && i > 0 && used + slots.front().state->bytes() > *budget) break;
    slots.push_back({model.new_sequence(options.context),
                     options.device_sampling ? model.backend().make_sampler(vocab) : nullptr});
    free_slots.push_back(&slots.back());
    used += slots.back().state->bytes();
    check(!budget || used <= *budget,
          "scheduler memory_fraction (--gpu-memory-fraction): one sequence of " + std::to_string(options.context) +
              " tokens needs " + format_bytes(double(used)) + ", the share of free memory leaves " +
              format_bytes(double(*budget)) + " after the prefix cache (raise the fraction, shorten the context or "
              "shrink the prefix cache)");
  }
}

SubmitStatus Scheduler::Impl::submit(CompletionRequest request, StepCallback callback, uint64_t* id) {
  check_request(request, callback, vocab);
  std::lock_guard lock(mu);
  if (!accepting) return SubmitStatus::ShuttingDown;
  if (int(request.prompt.size()) > options.context) return SubmitStatus::PromptTooLong;
  if (in_flight >= int(slots.size()) + options.max_queued) return SubmitStatus::QueueFull;
  ++in_flight;
  const uint64_t assigned = next_id++;
  if (id) *id = assigned;
  queue.push_back({assigned, std::move(request), std::move(callback), SchedulerClock::now()});
  work_cv.notify_one();
  return SubmitStatus::Accepted;
}

void Scheduler::Impl::cancel(uint64_t id) {
  std::lock_guard lock(mu);
  cancel_ids.push_back(id);
  work_cv.notify_one();
}

void Scheduler::Impl::shutdown(bool drain) {
  std::unique_lock lock(mu);
  accepting = false;
  if (!drain) cancel_all = true;
  work_cv.notify_one();
  idle_cv.wait(lock, [&] { return in_flight == 0; });
}

SchedulerMetrics Scheduler::Impl::metrics() const {
  std::lock_guard lock(mu);
  SchedulerMetrics m = published;
  m.queued = int(queue.size());
  return m;
}

void Scheduler::Impl::run() {
  while (wait_for_work()) {
    apply_cancels();
    admit();
    step();
    publish();
  }
}

// Sleeps while there is nothing to do; false when the scheduler has shut down and is idle.
bool Scheduler::Impl::wait_for_work() {
  std::unique_lock lock(mu);
  work_cv.wait(lock, [&] {
    return !running.empty() || !replays.empty() || !queue.empty() || !cancel_ids.empty() || cancel_all || !accepting;
  });
  return accepting || in_flight > 0;
}

void Scheduler::Impl::apply_cancels() {
  std::vector<QueuedRequest> dropped;
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mu);
    ids.swap(cancel_ids);
    for (auto it = queue.begin(); it != queue.end();) {
      const bool hit = cancel_all || std::find(ids.begin(), ids.end(), it->id) != ids.end();
      if (!hit) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(*it));
      it = queue.erase(it);
    }
  }
  for (QueuedRequest& q : dropped) end_unadmitted(q);
  std::vector<RunningRequest*> hit;
  for (auto& r : running)
    if (cancel_all || std::find(ids.begin(), ids.end(), r->id()) != ids.end()) hit.push_back(r.get());
  for (RunningRequest* r : hit) finish(*r, r->ending());
  while (cancel_all && !replays.empty()) end_replay(replays.front());
}

// Queued requests take free slots in arrival order; a request that finds none takes the slot of
// the oldest replay, which is dropped (a snapshot the cache may never need waits for no one). A
// request whose prompt continues a replay's tokens (a chat's next turn) waits for that replay's
// snapshot, which it restores, and the requests behind it wait in line.
void Scheduler::Impl::admit() {
  std::vector<QueuedRequest> admitted;
  {
    std::lock_guard lock(mu);
    while (!queue.empty() && admitted.size() < free_slots.size() + replays.size() &&
           !continues_a_replay(queue.front().request.prompt)) {
      admitted.push_back(std::move(queue.front()));
      queue.pop_front();
    }
  }
  while (free_slots.size() < admitted.size()) end_replay(replays.front());
  for (QueuedRequest& q : admitted) {
    Slot* slot = free_slots.back();
    try {
      slot->state->reset();
    } catch (...) {
      end_unadmitted(q, message_of(std::current_exception()));
      continue;
    }
    free_slots.pop_back();
    running.push_back(std::make_unique<RunningRequest>(std::move(q), *slot, vocab));
    RunningRequest& r = *running.back();
    try {
      r.restored(prefix_cache.restore(r.prompt(), r.state()));
      r.start_sampler();
    } catch (...) {
      fail({&r}, std::current_exception());
    }
  }
}

// Ends a request that never got a slot: cancelled, or failed when `error` is non-empty.
void Scheduler::Impl::end_unadmitted(const QueuedRequest& q, const std::string& error) {
  GenerationStats stats;
  stats.prompt_tokens = int(q.request.prompt.size());
  deliver(q.callback, ending_event(stats, error));
  ended();
}

// Every decoding row, and the next pieces of the prompts being read, oldest first, up to the
// prefill chunk in all: in the same step when they fit beside the rows (their tokens then cost no
// weight reads of their own), else the oldest alone. A replay's piece goes where no prompt is
// being read.
void Scheduler::Impl::step() {
  std::vector<RunningRequest*> rows;
  for (auto& r : running)
    if (!r->prefilling()) rows.push_back(r.get());
  const std::vector<Reading> reads = readings(rows.size());
  const bool reading = std::any_of(running.begin(), running.end(), [](const auto& r) { return r->prefilling(); });
  Replay* replay = nullptr;  // the oldest replay with a piece to feed (a live one may have none yet)
  for (Replay& r : replays) {
    if (reading) break;
    refresh(r);
    if (!next_piece(r).empty()) {
      replay = &r;
      break;
    }
  }
  if (rows.size() == 1 && !reading && !replay && speculate(*rows[0])) return;
  const std::span<const int32_t> replay_piece = replay ? next_piece(*replay) : std::span<const int32_t>{};
  const Slot* replay_slot = replay ? replay->slot : nullptr;
  const bool replay_mixed =
      !replay_piece.empty() && !rows.empty() && rows.size() + replay_piece.size() <= size_t(model.max_batch());
  // One prompt alone keeps its own step, where the draft head can follow it.
  if (!rows.empty() || reads.size() > 1)
    decode_step(rows, reads, replay_mixed ? replay : nullptr,
                replay_mixed ? replay_piece : std::span<const int32_t>{});
  if (reading && reads.empty()) {  // the oldest prompt's piece fits no step beside the rows
    for (auto& r : running)
      if (r->prefilling()) return prefill_step(*r, next_piece(*r));
  }
  if (rows.empty() && reads.size() == 1) return prefill_step(*reads[0].reader, reads[0].piece);
  if (!replay || replay_mixed) return;
  // The rows' ends may have ended replays, this one too: it is found again by its slot.
  for (Replay& r : replays)
    if (r.slot == replay_slot) {
      const std::span<const int32_t> piece = next_piece(r);
      if (!piece.empty()) replay_step(r, piece);
      return;
    }
}

// The next pieces of the prompts being read, oldest first, while their tokens fit the prefill
// chunk (the burst when no row decodes) and, with `beside_rows` decode rows, the model's rows.
std::vector<Scheduler::Impl::Reading> Scheduler::Impl::readings(size_t beside_rows) const {
  std::vector<Reading> out;
  const size_t budget = size_t(beside_rows == 0 ? std::max(options.prefill_burst, options.prefill_chunk)
                                                : options.prefill_chunk);
  size_t tokens = 0;
  for (const auto& r : running) {
    if (!r->prefilling()) continue;
    const std::span<const int32_t> piece = next_piece(*r);
    if (tokens + piece.size() > budget ||
        beside_rows + tokens + piece.size() > size_t(model.max_batch()))
      break;
    out.push_back({r.get(), piece});
    tokens += piece.size();
  }
  return out;
}

// A piece ends where the prefix cache snapshots the prompt, so that the state is exactly there,
// and at multiples of the chunk, as without a restore: a restored prompt's last piece is then
// one token exactly where it is without the cache (a one-token piece rounds as a decode step).
std::span<const int32_t> Scheduler::Impl::next_piece(const RunningRequest& r) const {
  const int fed = r.state().n_past;
  const int until = prefix_cache.next_snapshot(fed, r.prompt_size());
  return r.next_prompt_piece(std::min(chunk_end(fed), until) - fed);
}

// The replay's next piece, cut as a prompt's (above) so that its snapshot holds the same bits. A
// live replay feeds whole pieces of at most kLivePiece tokens before the reply's end, whatever it
// turns out to be, also cut at chunk multiples and snapshot intervals: pieces start and end on
// block boundaries, which is all the bits depend on (tests/integration/prefix_cache_test.cpp).
std::span<const int32_t> Scheduler::Impl::next_piece(const Replay& r) const {
  const int fed = r.state().n_past, end = int(r.tokens.size());
  if (r.live) {
    const int until = live_piece_end(fed);
    if (until > end) return {};
    return std::span(r.tokens).subspan(size_t(fed), size_t(until - fed));
  }
  const int until = std::min(chunk_end(fed), prefix_cache.next_snapshot(fed, end));
  return std::span(r.tokens).subspan(size_t(fed), size_t(until - fed));
}

// The multiple of the prefill chunk after `fed`.
int Scheduler::Impl::chunk_end(int fed) const { return (fed / options.prefill_chunk + 1) * options.prefill_chunk; }

// One row for each of `rows` (maybe none), after the pieces of `reads` and of `replay`'s tokens
// when one is set. Every row's draw is queued before the first is awaited.
void Scheduler::Impl::decode_step(const std::vector<RunningRequest*>& rows, const std::vector<Reading>& reads,
                                  Replay* replay, std::span<const int32_t> replay_piece) {
  const int B = int(rows.size());
  batch_ids.clear();
  batch_states.clear();
  for (RunningRequest* r : rows) {
    batch_ids.push_back(r->pending_token());
    batch_states.push_back(&r->state());
  }
  std::vector<Model::PromptPiece> pieces;
  std::vector<RunningRequest*> done;  // readers whose piece ends their prompt
  for (const Reading& read : reads) {
    const bool ends = read.reader->state().n_past + int(read.piece.size()) == read.reader->prompt_size();
    if (ends) done.push_back(read.reader);
    pieces.push_back({read.piece.data(), int(read.piece.size()), &read.reader->state(), ends});
  }
  if (replay) pieces.push_back({replay_piece.data(), int(replay_piece.size()), &replay->state(), false});
  Tensor logits;
  try {
    logits = model.forward_mixed_device(batch_ids.data(), batch_states.data(), B, pieces);
  } catch (...) {
    std::vector<RunningRequest*> all = rows;
    for (const Reading& read : reads) all.push_back(read.reader);
    if (replay) end_replay(*replay);
    return fail(all, std::current_exception());
  }
  if (B > 0) {
    ++counters.decode_steps;
    counters.last_batch_size = B;
  }
  if (!reads.empty()) ++counters.prompt_steps;
  counters.prompt_pieces += reads.size();
  for (const Reading& read : reads) piece_fed(*read.reader, read.piece.size());
  if (replay) replay_fed(*replay, replay_piece.size());
  // Logits rows: each reader's last prompt token when it ends its prompt, then one per row.
  std::vector<std::pair<RunningRequest*, Tensor>> draws;
  for (size_t i = 0; i < done.size(); ++i) draws.emplace_back(done[i], logits.rows_view(int64_t(i), 1));
  const auto first_row = int64_t(done.size());
  for (int b = 0; b < B; ++b) draws.emplace_back(rows[size_t(b)], logits.rows_view(first_row + b, 1));
  std::vector<char> drawn(draws.size(), 0);  // rows whose device draw is queued (or sampled on the host)
  for (size_t i = 0; i < draws.size(); ++i) {
    try {
      draws[i].first->start_draw(draws[i].second);
      drawn[i] = 1;
    } catch (...) {
      fail({draws[i].first}, std::current_exception());
    }
  }
  const bool alone = B == 1 && reads.empty() && !replay;  // the head reads the step's first rows
  if (!alone) followed = nullptr;  // the head reads no batched step
  for (size_t i = 0; i < draws.size(); ++i)
    if (drawn[i] && emit(*draws[i].first, draws[i].second) && alone) {
      const int32_t next = rows[0]->pending_token();
      follow(*rows[0], &next, 1);
    }
}

// A piece alone; the draft head follows it while its request runs alone.
void Scheduler::Impl::prefill_step(RunningRequest& r, std::span<const int32_t> piece) {
  const int fed = r.state().n_past;
  const bool last = fed + int(piece.size()) == r.prompt_size();
  Tensor logits;
  try {
    const KeepLogits keep = last ? KeepLogits::Last : KeepLogits::None;
    logits = model.forward_device(piece.data(), int(piece.size()), r.state(), keep);
  } catch (...) {
    return fail({&r}, std::current_exception());
  }
  ++counters.prompt_steps;
  ++counters.prompt_pieces;
  piece_fed(r, piece.size());
  const std::span<const int32_t> prompt = r.prompt();
  if (!last) return follow(r, prompt.data() + fed + 1, int(piece.size()));
  if (!emit(r, logits)) return;
  std::vector<int32_t> next(prompt.begin() + fed + 1, prompt.end());
  next.push_back(r.pending_token());
  follow(r, next.data(), int(next.size()));
}

// A replay's piece alone (no row decodes).
void Scheduler::Impl::replay_step(Replay& r, std::span<const int32_t> piece) {
  followed = nullptr;  // the forward overwrites what the draft head reads
  try {
    model.forward_device(piece.data(), int(piece.size()), r.state(), KeepLogits::None);
  } catch (const std::exception&) {  // no snapshot then; admit() resets the slot before its next use
    return end_replay(r);
  }
  counters.replay_tokens_alone += piece.size();
  replay_fed(r, piece.size());
}

// Offers the replay's state; its last piece ends it. A live replay offers only interval positions
// (its reply's end is not known yet).
void Scheduler::Impl::replay_fed(Replay& r, size_t tokens) {
  counters.replay_tokens += tokens;
  if (r.live) counters.replay_tokens_live += tokens;
  if (r.live && !prefix_cache.at_interval(r.state().n_past)) return;
  try {
    prefix_cache.offer(r.tokens, r.state());
  } catch (const Error&) {  // no memory for a snapshot: the replay goes on without one
  }
  if (!r.live && r.state().n_past == int(r.tokens.size())) end_replay(r);
}

void Scheduler::Impl::piece_fed(RunningRequest& r, size_t tokens) {
  counters.prompt_tokens += tokens;
  try {
    prefix_cache.offer(r.prompt(), r.state());
  } catch (const Error&) {  // no memory for a snapshot: the request goes on without one
  }
  if (!r.prefilling()) follow_reply(r);
}

// After a trunk step of r that fed n tokens (next[i]: the token after its i-th): the head reads
// the step's rows while r runs alone, restarting from this step when it followed none or another.
void Scheduler::Impl::follow(RunningRequest& r, const int32_t* next, int n) {
  if (!drafter) return;
  if (running.size() != 1 || n > drafter->max_rows()) {
    followed = nullptr;
    return;
  }
  if (followed != &r) {
    drafter->reset();
    policy.emplace(options.speculative.draft);
    followed = &r;
  }
  try {
    drafter->advance(next, n);
  } catch (...) {
    followed = nullptr;
    fail({&r}, std::current_exception());
  }
}

// A verify step in place of r's decode step, when r runs alone and the head read its last step;
// false when there is nothing to verify (the draft policy pauses, or the budget is spent).
bool Scheduler::Impl::speculate(RunningRequest& r) {
  if (!drafter || followed != &r || running.size() != 1) return false;
  const int k = std::min(policy->length(), r.draft_budget());
  std::vector<int32_t> draft;
  try {
    if (k > 0) draft = drafter->draft(k);
  } catch (...) {
    fail({&r}, std::current_exception());
    return true;
  }
  if (draft.empty()) return false;
  verify(r, draft);
  return true;
}

// Feeds the pending token and the draft in one forward on a copy of the state, samples each row in
// order and emits it while it equals the drafted token (generate/speculative.cpp says why this is
// exact), then brings the state to the last emitted token: the copy when all were accepted, else
// the untouched state re-fed the accepted part.
void Scheduler::Impl::verify(RunningRequest& r, const std::vector<int32_t>& draft) {
  const int d = int(draft.size());
  std::vector<int32_t> fed{r.pending_token()};
  fed.insert(fed.end(), draft.begin(), draft.end());
  Tensor logits;
  try {
    scratch->copy_from(r.state());
    logits = model.forward_device(fed.data(), d + 1, *scratch, KeepLogits::Drafted);
  } catch (...) {
    return fail({&r}, std::current_exception());
  }
  ++counters.decode_steps;
  ++counters.verify_steps;
  counters.drafted_tokens += uint64_t(d);
  counters.last_batch_size = 1;
  r.start_verify(d);
  int m = 0;
  for (;; ++m) {
    const Tensor row = logits.rows_view(m, 1);
    StepEvent e;
    try {
      e = r.sample(row, host_copy(r, row), m + 1, m < d ? draft[size_t(m)] : -1);
    } catch (...) {
      return fail({&r}, std::current_exception());
    }
    ++counters.generated_tokens;
    const bool agrees = m < d && e.token == draft[size_t(m)];
    counters.accepted_tokens += agrees;
    if (e.done) return finish(r, e);
    if (!r.deliver(e)) return declined(r);
    if (!agrees) break;
  }
  if (m == d) {
    std::swap(r.slot().state, scratch);
  } else {
    try {
      model.forward_device(fed.data(), m + 1, r.state(), KeepLogits::Drafted);
    } catch (...) {
      return fail({&r}, std::current_exception());
    }
  }
  policy->update(d, m);
  std::vector<int32_t> next(draft.begin(), draft.begin() + m);
  next.push_back(r.pending_token());
  follow(r, next.data(), m + 1);
}

// Samples the request's next token and hands its event over; ends the request when a stop rule
// fires or the callback declines. True when the request goes on.
bool Scheduler::Impl::emit(RunningRequest& r, const Tensor& row) {
  StepEvent e;
  try {
    e = r.sample(row, host_copy(r, row));
  } catch (...) {
    fail({&r}, std::current_exception());
    return false;
  }
  ++counters.generated_tokens;
  if (e.done) {
    finish(r, e);
    return false;
  }
  if (r.deliver(e)) return true;
  declined(r);
  return false;
}

// The row on the host when the request reads it there, else null (it stays in backend memory).
const float* Scheduler::Impl::host_copy(const RunningRequest& r, const Tensor& row) {
  if (!r.needs_host_row()) return nullptr;
  host_row.resize(size_t(vocab));
  model.backend().to_host(row, host_row.data());
  return host_row.data();
}

// The engine failed while computing these rows: their states are unusable, so they end with an error.
void Scheduler::Impl::fail(const std::vector<RunningRequest*>& rows, std::exception_ptr error) {
  const std::string message = message_of(error);
  for (RunningRequest* r : rows) finish(*r, r->ending(message));
}

// The slot is free (and counted free) before the final event reaches the callback.
// A final event with a token ends the request normally (EOS, max_tokens, a full context).
void Scheduler::Impl::finish(RunningRequest& r, const StepEvent& final_event) {
  std::unique_ptr<RunningRequest> owned = release(r);
  if (final_event.token < 0) {
    if (Replay* live = live_replay(*owned)) end_replay(*live);  // a failed or cancelled reply is not kept
    free_slots.push_back(&owned->slot());
  }
  owned->deliver(final_event);
  if (final_event.token >= 0) ended_with_reply(*owned);
  else ended();
}

// The callback declined the event it was given (a stop string, or the client left): the reply up
// to that token stands, as after any normal end.
void Scheduler::Impl::declined(RunningRequest& r) { ended_with_reply(*release(r)); }

std::unique_ptr<RunningRequest> Scheduler::Impl::release(RunningRequest& r) {
  const auto it = std::find_if(running.begin(), running.end(), [&](const auto& p) { return p.get() == &r; });
  std::unique_ptr<RunningRequest> owned = std::move(*it);
  running.erase(it);
  if (followed == &r) followed = nullptr;
  ++counters.requests_finished;
  publish();
  return owned;
}

// The request's slot replays its tokens for the prefix cache, or is free at once. The request
// counts as in flight until the replay ends, so that shutdown() returns with its snapshot in the
// published metrics.
void Scheduler::Impl::ended_with_reply(RunningRequest& r) {
  if (Replay* live = live_replay(r)) {
    std::vector<int32_t> tokens = r.fed_tokens();
    const int end = prefix_cache.reply_snapshot(r.prompt_size(), int(tokens.size()));
    if (end > 0 && end >= live->state().n_past) {  // it goes on to the reply's last block boundary
      tokens.resize(size_t(end));
      live->tokens = std::move(tokens);
      live->live = nullptr;  // from here it holds the request's count in flight
      free_slots.push_back(&r.slot());
      if (live->state().n_past == end) replay_fed(*live, 0);  // all fed already: snapshot and end it
      return;
    }
    end_replay(*live);
  }
  if (start_replay(r.slot(), r.fed_tokens(), r.prompt_size())) return;
  free_slots.push_back(&r.slot());
  ended();
}

// The slot's own state will not do for a snapshot of the reply: its reply was fed by decode steps,
// and a one-token step takes DeltaNet's recurrent form where a prompt piece takes the chunked one,
// so it differs in the last bits from the state the next turn's prompt reaches without the cache.
// So the slot restarts from the cache's snapshot of the prompt and is fed the rest up to the
// reply's last block boundary in the pieces that prompt would be cut into (block multiples, chunk
// multiples, snapshot intervals): its snapshot then holds the very bits of that state. This costs
// what the next turn's prefill saves (at most a block and the reply), and the pieces ride in decode
// steps. False when there is nothing to replay (the cache is off, or the prompt's snapshot is gone).
bool Scheduler::Impl::start_replay(Slot& slot, std::vector<int32_t> tokens, int prompt_size) {
  if (!prefix_cache.enabled()) return false;
  const int end = prefix_cache.reply_snapshot(prompt_size, int(tokens.size()));
  if (end == 0) return false;
  tokens.resize(size_t(end));
  SequenceState& st = *slot.state;
  try {
    st.reset();
    const int resumed = prefix_cache.resume(tokens, st);
    if (resumed < prefix_cache.last_snapshot(prompt_size) || resumed >= end) return false;
  } catch (const std::exception&) {  // admit() resets the slot before its next use
    return false;
  }
  replays.push_back({&slot, std::move(tokens)});
  return true;
}

// A request whose prompt is read follows its reply with a live replay in a spare slot, restored
// from the prompt's last snapshot: the reply's whole pieces are fed while it is generated, so that
// when the request ends only its last piece is left and a chat's next turn, sent at once, waits
// for that alone. None when no slot is free (a request being admitted takes a live replay's slot
// back) or the prompt's snapshot is not in the cache.
void Scheduler::Impl::follow_reply(const RunningRequest& r) {
  if (!prefix_cache.enabled() || free_slots.empty()) return;
  Slot& slot = *free_slots.back();
  const std::span<const int32_t> prompt = r.prompt();
  try {
    slot.state->reset();
    if (prefix_cache.resume(prompt, *slot.state) != prefix_cache.last_snapshot(r.prompt_size())) return;
  } catch (const std::exception&) {  // admit() resets the slot before its next use
    return;
  }
  free_slots.pop_back();
  replays.push_back({&slot, std::vector<int32_t>(prompt.begin(), prompt.end()), &r});
}

Replay* Scheduler::Impl::live_replay(const RunningRequest& r) {
  for (Replay& x : replays)
    if (x.live == &r) return &x;
  return nullptr;
}

// Where a live replay's piece from `fed` (a block boundary) ends.
int Scheduler::Impl::live_piece_end(int fed) const {
  const int block = prefix_cache.block(), most = std::max(block, kLivePiece / block * block);
  return std::min({chunk_end(fed), prefix_cache.next_interval(fed), fed + most});
}

// A live replay's tokens: its request's reply so far, up to its last block boundary, taken once a
// whole piece of them is there to feed.
void Scheduler::Impl::refresh(Replay& r) {
  if (!r.live || !next_piece(r).empty()) return;
  const int until = live_piece_end(r.state().n_past);
  if (prefix_cache.reply_snapshot(r.live->prompt_size(), r.live->fed_count()) < until) return;
  r.tokens = r.live->fed_tokens();
  r.tokens.resize(size_t(until));
}

// A live replay's tokens are not final, and a next turn cannot come before its request ends.
bool Scheduler::Impl::continues_a_replay(std::span<const int32_t> prompt) const {
  return std::any_of(replays.begin(), replays.end(), [&](const Replay& r) {
    return !r.live && prompt.size() > r.tokens.size() &&
           std::equal(r.tokens.begin(), r.tokens.end(), prompt.begin());
  });
}

// Frees the replay's slot (its snapshot offered, or dropped unfinished). Its request's end is
// counted here unless the replay was live (the request is still running, or ends on its own).
void Scheduler::Impl::end_replay(Replay& r) {
  const bool holds_request = r.live == nullptr;
  free_slots.push_back(r.slot);
  const auto it = std::find_if(replays.begin(), replays.end(), [&](const Replay& x) { return &x == &r; });
  replays.erase(it);
  if (holds_request) ended();
}

// A request's last callback has returned: it no longer counts against the queue limit. The
// metrics are published first, so that shutdown() returns with this request's counts in them.
void Scheduler::Impl::ended() {
  publish();
  std::lock_guard lock(mu);
  if (--in_flight == 0) idle_cv.notify_all();
}

void Scheduler::Impl::publish() {
  counters.running = counters.slots_in_use = int(running.size());
  counters.kv_tokens_in_use = 0;
  for (const auto& r : running) counters.kv_tokens_in_use += r->state().n_past;
  counters.prefix_cache = prefix_cache.stats();
  std::lock_guard lock(mu);
  published = counters;
}

Scheduler::Scheduler(Model& model, const SchedulerOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

Scheduler::~Scheduler() {
  impl_->shutdown(false);
  impl_->thread.join();
}

SubmitStatus Scheduler::submit(CompletionRequest request, StepCallback callback, uint64_t* id) {
  return impl_->submit(std::move(request), std::move(callback), id);
}

void Scheduler::cancel(uint64_t id) { impl_->cancel(id); }

void Scheduler::shutdown(bool drain) { impl_->shutdown(drain); }

SchedulerMetrics Scheduler::metrics() const { return impl_->metrics(); }

}  // namespace petrel
