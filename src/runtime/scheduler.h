// Continuous batching: requests join and leave the running batch at every step. One scheduler
// thread owns the model; each step is one batched decode step for every running sequence that
// carries a piece of the oldest waiting prompt, so long prompts never stall running streams.
// The HTTP layer (src/server) talks to the model only through this interface.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "generate/sampling_params.h"
#include "generate/speculative_options.h"
#include "generate/stats.h"
#include "grammar/matcher.h"
#include "runtime/forward.h"
#include "runtime/logprobs.h"
#include "runtime/prefix_cache.h"

namespace petrel {

struct SchedulerOptions {
  int max_sequences = 16;  // sequences decoding at once (state slots allocated up front)
  // Where the backend manages its own memory (Backend::free_memory): the share of what is free at
  // start that state slots and the prefix cache may take; fewer than max_sequences slots are
  // allocated when they do not fit (SchedulerMetrics::slots_total says how many). 0: no limit.
  double memory_fraction = 0;
  int max_queued = 64;     // requests waiting for a slot beyond that; submit() refuses more
  int context = 4096;      // tokens per sequence (prompt + output); longer prompts are refused
  // Prompt tokens a step carries besides its decode rows: pieces of the prompts being read, oldest
  // first. They ride in the decode step when they fit the model's rows (Model::max_batch) beside
  // it, else the oldest prompt's piece runs as a step of its own.
  int prefill_chunk = 256;
  // Prompt tokens a step may carry while no sequence decodes (no stream to hold back): prompts that
  // wait together are read in fewer, fuller steps, each still cut at prefill_chunk multiples, so
  // every prompt is fed in the same pieces as alone. Capped by the model's rows; at least
  // prefill_chunk.
  int prefill_burst = 2048;
  // Sample each row where the logits are when the backend offers a DeviceSampler (only the token
  // id, and the rows of requests that want logprobs, reach the host); false samples every row on
  // the host with the CPU Sampler.
  bool device_sampling = true;
  // Speculative decoding with the model's MTP head (source Mtp; draft 0: off) while one sequence
  // runs alone. A second sequence turns it off: a batched step already shares each weight read
  // among its rows, where verify rows would add work; it resumes once a sequence is alone again.
  SpeculativeOptions speculative{};
  // Snapshots of prompt prefixes and finished replies that later requests restore (runtime/prefix_cache.h);
  // off unless given a budget.
  PrefixCacheOptions prefix_cache{.budget_bytes = 0};
};

struct CompletionRequest {
  std::vector<int32_t> prompt;  // at least one token
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;  // a sampled EOS ends the sequence (reason Eos) and is reported
  int max_tokens = -1;           // -1: until EOS or the context is full
  int top_logprobs = -1;         // -1: no logprobs; 0..20: the token's logprob plus that many alternatives
  // Structured output: the answer is held to this grammar (null: free text), after the reasoning
  // when `reasoning` gives the model's tags. Such rows are sampled on the host.
  std::shared_ptr<const grammar::TokenGrammar> grammar;
  std::optional<grammar::ReasoningTags> reasoning;
};

// One event per sampled token; the last event of a request has done = true (and token = -1 when
// the request ended without a new token: cancelled, or an error).
struct StepEvent {
  int32_t token = -1;
  TokenLogprob chosen;               // valid when top_logprobs >= 0
  std::vector<TokenLogprob> top;     // top_logprobs alternatives, most likely first
  bool done = false;
  FinishReason reason = FinishReason::MaxTokens;
  GenerationStats stats;             // filled on the last event
  std::string error;                 // non-empty when the request failed inside the engine (reason Cancelled)
};

// Runs on the scheduler thread. Return false to end the request now (stop string matched, client
// gone): its slot is freed before the next step and no further event is sent.
using StepCallback = std::function<bool(const StepEvent&)>;

enum class SubmitStatus { Accepted, QueueFull, PromptTooLong, ShuttingDown };

struct SchedulerMetrics {
  int running = 0, queued = 0;
  int slots_total = 0, slots_in_use = 0;
  int64_t kv_tokens_in_use = 0;  // tokens held in the KV caches of slots in use
  int last_batch_size = 0;       // sequences in the most recent decode step
  uint64_t requests_finished = 0, prompt_tokens = 0, generated_tokens = 0, decode_steps = 0;
  uint64_t verify_steps = 0, drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding
  // Steps that read prompt tokens, and the prompt pieces they read (several prompts waiting
  // together share a step up to SchedulerOptions::prefill_chunk tokens).
  uint64_t prompt_steps = 0, prompt_pieces = 0;
  // Tokens fed again to snapshot replies for the prefix cache; of those, the ones fed in steps of
  // their own (no sequence was decoding), and the ones fed while their reply was being generated.
  uint64_t replay_tokens = 0, replay_tokens_alone = 0, replay_tokens_live = 0;
  PrefixCacheStats prefix_cache;  // prompt_tokens counts only the tokens prefilled, not those restored
};

// Callbacks run on the scheduler thread and must not call shutdown() or destroy the scheduler.
class Scheduler {
 public:
  // Allocates options.max_sequences states of options.context tokens (fewer under memory_fraction)
  // and starts the thread. Throws petrel::Error naming the option when one is out of range
  // (max_sequences may not exceed the model's batch limit, Model::max_batch()) or when not one
  // state fits.
  Scheduler(Model& model, const SchedulerOptions& options);
  ~Scheduler();  // cancels everything still running or queued, then joins the thread

  // Thread-safe. On Accepted, `id` identifies the request for cancel(). A malformed request (empty
  // prompt, token id outside the vocabulary, max_tokens, top_logprobs or a sampling value out of
  // range) throws petrel::Error naming the field; a prompt longer than the context is PromptTooLong.
  // QueueFull when max_sequences + max_queued requests are already running or waiting.
  SubmitStatus submit(CompletionRequest request, StepCallback callback, uint64_t* id = nullptr);
  // Thread-safe; the request's callback gets a final done event with reason Cancelled.
  void cancel(uint64_t id);
  // Stops accepting; finishes running requests when `drain` (queued ones too), else cancels them.
  // Blocks until idle; the thread then ends. Calling it again is harmless.
  void shutdown(bool drain);
  // Thread-safe snapshot. After a request's final event, its slot is already counted as free.
  SchedulerMetrics metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace petrel
