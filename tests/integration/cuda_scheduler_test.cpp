// The continuous-batching scheduler on the GPU samples on the device: concurrent requests with
// mixed settings (greedy, seeded top-p, penalties over a window with a bias, logprobs, a one-token
// prompt, a prompt of several chunks) give the tokens the same scheduler gives when every row is
// copied to the host and sampled by the CPU Sampler. A gate holds the scheduler until every request
// is queued and no request can end early (no EOS ids, fixed budgets), so both runs batch the same
// rows in every step and read the same logits: only the sampler differs. With CUPTI, a one-stream
// run copies no logits row to the host. Skipped, with a message, without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "../unit/test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "cuda_fixture.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"
#include "runtime/scheduler.h"
#include "scheduler_gate.h"

#ifdef PETREL_HAVE_CUPTI
#include <cupti.h>
#endif

namespace petrel {
namespace {

constexpr int kContext = 256;
constexpr int kChunk = 32;  // prefill pieces: the longest prompt takes four

using GpuModel = test::CudaFixtureModel;

struct Case {
  std::string name;
  CompletionRequest request;
};

CompletionRequest make(int i, int vocab, int prompt_length, int max_tokens, const SamplingParams& sampling,
                       int top_logprobs = -1) {
  CompletionRequest r;
  for (int t = 0; t < prompt_length; ++t) r.prompt.push_back((t * 37 + i * 11 + 5) % vocab);
  r.sampling = sampling;
  r.max_tokens = max_tokens;  // no EOS ids: every request ends after exactly max_tokens tokens
  r.top_logprobs = top_logprobs;
  return r;
}

std::vector<Case> cases(int V) {
  const SamplingParams greedy{.temperature = 0.0f};
  return {
      {"greedy", make(0, V, 9, 24, greedy)},
      {"seeded top-p", make(1, V, 40, 30, {.temperature = 0.9f, .top_p = 0.95f, .seed = 11})},
      // The prompt is longer than the window, so early prompt tokens leave the history again.
      {"greedy, penalties over a window, bias",
       make(2, V, 70, 28,
            {.temperature = 0.0f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f, .frequency_penalty = 0.3f,
             .penalty_last_n = 8, .logit_bias = {{7, 2.0f}, {9, -1.0f}}})},
      {"seeded, penalties, every filter",
       make(3, V, 23, 36,
            {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.02f, .repetition_penalty = 1.2f,
             .frequency_penalty = 0.2f, .penalty_last_n = 16, .seed = 12})},
      {"seeded with logprobs", make(4, V, 33, 20, {.temperature = 1.2f, .top_p = 0.9f, .seed = 13}, 3)},
      {"greedy with logprobs, one-token prompt", make(5, V, 1, 16, greedy, 0)},
      {"seeded, prompt of four chunks", make(6, V, 100, 24, {.temperature = 1.0f, .seed = 14})},
  };
}


SchedulerOptions options(int max_sequences, bool device_sampling) {
  SchedulerOptions o;
  o.max_sequences = max_sequences;
  o.context = kContext;
  o.prefill_chunk = kChunk;
  o.device_sampling = device_sampling;
  return o;
}

// Every request's events. A one-token request holds the scheduler at its only event while the
// others are queued, so they are admitted together and every run steps through the same batches.
std::vector<std::vector<StepEvent>> run(Model& model, const std::vector<Case>& cs, bool device_sampling) {
  std::vector<std::vector<StepEvent>> events(cs.size());
  Scheduler scheduler(model, options(int(cs.size()), device_sampling));
  Gate gate;
  CompletionRequest holder;
  holder.prompt = {1};
  holder.max_tokens = 1;
  const StepCallback hold = [&gate](const StepEvent&) {
    gate.pass();
    return true;
  };
  EXPECT_EQ(scheduler.submit(holder, hold), SubmitStatus::Accepted);
  gate.wait_arrival();
  for (size_t i = 0; i < cs.size(); ++i) {
    // Callbacks run on the scheduler thread; shutdown(true) returns after the last one.
    const StepCallback collect = [&events, i](const StepEvent& e) {
      events[i].push_back(e);
      return true;
    };
    EXPECT_EQ(scheduler.submit(cs[i].request, collect), SubmitStatus::Accepted);
  }
  gate.release();
  scheduler.shutdown(true);
  EXPECT_EQ(scheduler.metrics().requests_finished, cs.size() + 1);
  return events;
}

std::vector<int32_t> tokens_of(const std::vector<StepEvent>& events) {
  std::vector<int32_t> out;
  for (const StepEvent& e : events) out.push_back(e.token);
  return out;
}

// Every request runs its budget out; logprobs, where asked, come with every token.
void expect_complete(const Case& c, const std::vector<StepEvent>& events) {
  ASSERT_EQ(int(events.size()), c.request.max_tokens);
  EXPECT_TRUE(events.back().done);
  EXPECT_EQ(events.back().reason, FinishReason::MaxTokens);
  EXPECT_TRUE(events.back().error.empty()) << events.back().error;
  for (const StepEvent& e : events) {
    ASSERT_GE(e.token, 0);
    if (c.request.top_logprobs < 0) continue;
    EXPECT_EQ(e.chosen.token, e.token);
    EXPECT_EQ(int(e.top.size()), c.request.top_logprobs);
  }
}

TEST(CudaScheduler, DeviceSamplingGivesWhatHostSamplingDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  GpuModel m("qwen35moe-vlm-fused");
  ASSERT_NE(m.backend->make_sampler(m.vocab()), nullptr) << "the CUDA backend offers a DeviceSampler";
  const std::vector<Case> cs = cases(m.vocab());
  const auto device = run(*m.model, cs, true), host = run(*m.model, cs, false);
  for (size_t i = 0; i < cs.size(); ++i) {
    const Case& c = cs[i];
    SCOPED_TRACE(c.name);
    expect_complete(c, device[i]);
    expect_complete(c, host[i]);
    if (HasFatalFailure()) return;
    const std::vector<int32_t> a = tokens_of(device[i]), b = tokens_of(host[i]);
    if (c.request.sampling.greedy()) {
      // The argmax of the same penalised logits: exact.
      EXPECT_EQ(a, b);
    } else {
      // Only a draw within rounding of a CDF boundary may differ (the device sums the kept weights
      // in double in another order; cuda_sampler_test.cpp): the bound of CudaSamplerModel.
      int same = 0;
      for (size_t t = 0; t < a.size(); ++t) same += a[t] == b[t];
      std::printf("note: %s: %d of %zu tokens as with host sampling\n", c.name.c_str(), same, a.size());
      EXPECT_GE(same * 100, int(a.size()) * 95) << "tokens equal to host sampling's";
    }
    // Up to the first different token both runs read the same logits rows: identical logprobs.
    for (size_t t = 0; t < a.size() && a[t] == b[t]; ++t) {
      EXPECT_EQ(device[i][t].chosen.logprob, host[i][t].chosen.logprob) << "token " << t;
      ASSERT_EQ(device[i][t].top.size(), host[i][t].top.size());
      for (size_t k = 0; k < device[i][t].top.size(); ++k) {
        EXPECT_EQ(device[i][t].top[k].token, host[i][t].top[k].token) << "token " << t << ", alternative " << k;
        EXPECT_EQ(device[i][t].top[k].logprob, host[i][t].top[k].logprob) << "token " << t << ", alternative " << k;
      }
    }
  }
}

// memory_fraction sizes the slots from the GPU's free memory: a share that holds 3.5 states gets 3
// of the 8 asked for; one that holds half a state is refused, naming the option.
TEST(CudaScheduler, SlotsFitTheShareOfFreeMemory) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  GpuModel m("qwen35moe-vlm-fused");
  const double state = double(m.model->new_sequence(kContext)->bytes());
  const std::optional<size_t> free = m.backend->free_memory();
  ASSERT_TRUE(free.has_value()) << "the CUDA backend reports its free memory";
  SchedulerOptions o = options(8, true);
  o.memory_fraction = 3.5 * state / double(*free);
  {
    Scheduler scheduler(*m.model, o);
    EXPECT_EQ(scheduler.metrics().slots_total, 3);
  }
  o.memory_fraction = 0.5 * state / double(*free);
  try {
    Scheduler scheduler(*m.model, o);
    ADD_FAILURE() << "a share smaller than one state was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory_fraction"), std::string::npos) << e.what();
  }
}

#ifdef PETREL_HAVE_CUPTI
// Device-to-host copies of at least `min_bytes` (a logits row) the process issues.
struct RowCopies {
  size_t min_bytes = 0;
  std::atomic<int> count{0};
};

void CUPTIAPI count_copy(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API || cb->callbackSite != CUPTI_API_ENTER) return;
  size_t bytes = 0;
  cudaMemcpyKind kind = cudaMemcpyDefault;
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020) {
    const auto* p = static_cast<const cudaMemcpyAsync_v3020_params*>(cb->functionParams);
    bytes = p->count;
    kind = p->kind;
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020) {
    const auto* p = static_cast<const cudaMemcpy2DAsync_v3020_params*>(cb->functionParams);
    bytes = p->width * p->height;
    kind = p->kind;
  } else {
    return;
  }
  auto* copies = static_cast<RowCopies*>(user);
  if (kind == cudaMemcpyDeviceToHost && bytes >= copies->min_bytes) ++copies->count;
}

// Logits-row copies to the host while one request of `tokens` tokens runs through the scheduler.
int row_copies(GpuModel& m, bool device_sampling, int tokens) {
  RowCopies copies;
  copies.min_bytes = size_t(m.vocab()) * sizeof(float);
  CUpti_SubscriberHandle subscriber;
  EXPECT_EQ(cuptiSubscribe(&subscriber, count_copy, &copies), CUPTI_SUCCESS);
  EXPECT_EQ(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
  {
    Scheduler scheduler(*m.model, options(1, device_sampling));
    CompletionRequest r = make(0, m.vocab(), 20, tokens,
                               {.temperature = 0.8f, .top_p = 0.9f, .repetition_penalty = 1.1f, .seed = 3});
    int got = 0;
    const StepCallback count = [&got](const StepEvent&) { return ++got > 0; };
    EXPECT_EQ(scheduler.submit(r, count), SubmitStatus::Accepted);
    scheduler.shutdown(true);
    EXPECT_EQ(got, tokens);
  }
  cuptiUnsubscribe(subscriber);
  return copies.count.load();
}

TEST(CudaScheduler, OneStreamCopiesNoLogitsRowToTheHost) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
  GpuModel m("qwen35moe-vlm-fused");
  constexpr int kTokens = 24;
  EXPECT_EQ(row_copies(m, true, kTokens), 0) << "logits rows copied to the host with device sampling";
  // The counter sees the host path's copies: one row per token (the prompt's last, then each step's).
  EXPECT_EQ(row_copies(m, false, kTokens), kTokens) << "logits rows copied to the host with host sampling";
}
#else
TEST(CudaScheduler, CountsLogitsCopies) {
  GTEST_SKIP() << "built without CUPTI: the scheduler's device-to-host copies cannot be counted";
}
#endif

}  // namespace
}  // namespace petrel
