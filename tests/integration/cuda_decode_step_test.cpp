// A decode step on the GPU makes no blocking CUDA call (the host spins on the token the step posts
// to mapped pinned memory) and never allocates device or pinned memory: CUPTI counts every
// blocking or allocating CUDA runtime call the process makes during a run of greedy decode steps,
// of sampled ones (DeviceDecoder), and of batched ones (forward_batch, which reads its logits with
// one sync).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "generate/device_decoder.h"
#include "generate/make_decoder.h"
#include "io/checkpoint.h"
#include "runtime/forward.h"

#ifdef PETREL_HAVE_CUPTI
#include <cupti.h>
#endif

namespace petrel {
namespace {

#ifdef PETREL_HAVE_CUPTI
struct RuntimeCalls {
  std::atomic<int> syncs{0}, allocations{0}, copies{0};
};

void CUPTIAPI count_call(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  if (static_cast<const CUpti_CallbackData*>(data)->callbackSite != CUPTI_API_ENTER) return;
  auto* calls = static_cast<RuntimeCalls*>(user);
  switch (id) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:  // the synchronous copies
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2D_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020:
      ++calls->syncs;
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
      ++calls->allocations;
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
      ++calls->copies;
      break;
    default:
      break;
  }
}

// The blocking and allocating runtime calls `run` makes.
void count_calls(const std::function<void()>& run, RuntimeCalls& calls) {
  CUpti_SubscriberHandle subscriber;
  ASSERT_EQ(cuptiSubscribe(&subscriber, count_call, &calls), CUPTI_SUCCESS);
  ASSERT_EQ(cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
  run();
  cuptiUnsubscribe(subscriber);
}

// A fixture model on the GPU and its reference prompt; the tests skip without a GPU.
class CudaDecodeStep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no GPU: " << cuda_device_summary();
    const std::string dir = test::fixture_model("qwen35moe-vlm-fused");
    ck_ = Checkpoint::open(dir);
    prompt_ = nlohmann::json::parse(std::ifstream(dir + "/reference.json"))["prompt_ids"].get<std::vector<int32_t>>();
    CudaOptions o;
    o.progress = false;
    backend_ = make_cuda_backend(o);
    model_ = std::make_unique<Model>(ck_->config(), ck_->weights(), *backend_);
  }

  std::unique_ptr<Checkpoint> ck_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> prompt_;
};

constexpr int kSteps = 16;

TEST_F(CudaDecodeStep, NoBlockingCallAndNoAllocation) {
  auto seq = model_->new_sequence(int(prompt_.size()) + kSteps + 4);
  int32_t tok = model_->forward_greedy(prompt_.data(), int(prompt_.size()), *seq);
  for (int i = 0; i < 2; ++i) tok = model_->forward_greedy(&tok, 1, *seq);  // records the step's graph

  RuntimeCalls calls;
  count_calls([&] {
    for (int i = 0; i < kSteps; ++i) tok = model_->forward_greedy(&tok, 1, *seq);
  }, calls);

  EXPECT_EQ(calls.syncs.load(), 0) << "blocking CUDA calls in " << kSteps << " decode steps";
  // The id and position reach the replayed graph through mapped memory, and the token comes back so.
  EXPECT_EQ(calls.copies.load(), 0) << "async copies in " << kSteps << " decode steps";
  EXPECT_EQ(calls.allocations.load(), 0) << "allocations in " << kSteps << " decode steps";
  EXPECT_GE(tok, 0);
}

// The same for sampled decoding: DeviceDecoder's steps (penalty history, bias, top-k, top-p,
// min-p, the draw) read back the posted token id and nothing else.
TEST_F(CudaDecodeStep, SampledStepNoBlockingCallAndNoAllocation) {
  auto decoder = make_decoder(*model_);
  ASSERT_NE(dynamic_cast<DeviceDecoder*>(decoder.get()), nullptr);
  decoder->reset({.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .min_p = 0.01f, .repetition_penalty = 1.2f,
                  .frequency_penalty = 0.2f, .penalty_last_n = 8, .logit_bias = {{1, 2.0f}}});
  for (int32_t t : prompt_) decoder->observe(t, false);
  auto seq = decoder->new_sequence(int(prompt_.size()) + kSteps + 4);
  decoder->feed(prompt_.data(), int(prompt_.size()), *seq, KeepLogits::Last);
  int32_t tok = decoder->sample(0, uint64_t(seq->n_past));
  auto step = [&] {
    decoder->observe(tok, true);
    decoder->feed(&tok, 1, *seq, KeepLogits::Last);
    tok = decoder->sample(0, uint64_t(seq->n_past));
  };
  for (int i = 0; i < 2; ++i) step();  // records the step's graph

  RuntimeCalls calls;
  count_calls([&] {
    for (int i = 0; i < kSteps; ++i) step();
  }, calls);

  EXPECT_EQ(calls.syncs.load(), 0) << "blocking CUDA calls in " << kSteps << " sampled decode steps";
  EXPECT_EQ(calls.allocations.load(), 0) << "allocations in " << kSteps << " sampled decode steps";
  EXPECT_GE(tok, 0);
}
// A batched step (forward_batch) of sequences at different positions: its positions and state
// pointer table go through pinned buffers sized at reserve, and the logits read is its one sync.
TEST_F(CudaDecodeStep, BatchedStepOneSyncForTheLogitsAndNoAllocation) {
  constexpr int B = 3;
  ASSERT_GT(prompt_.size(), size_t(B));
  std::vector<std::unique_ptr<SequenceState>> seqs;
  std::vector<SequenceState*> states;
  std::vector<int32_t> ids;
  for (int b = 0; b < B; ++b) {
    seqs.push_back(model_->new_sequence(int(prompt_.size()) + kSteps + 4));
    states.push_back(seqs.back().get());
    ids.push_back(model_->forward_greedy(prompt_.data(), int(prompt_.size()) - b, *seqs.back()));
  }
  const int64_t V = model_->config().vocab;
  std::vector<float> logits(size_t(B * V));
  auto step = [&] {
    model_->forward_batch(ids.data(), states.data(), B, logits.data());
    for (int b = 0; b < B; ++b) {
      const auto row = logits.begin() + b * V;
      ids[size_t(b)] = int32_t(std::max_element(row, row + V) - row);
    }
  };
  step();  // the first batch allocates the model's logits rows

  RuntimeCalls calls;
  count_calls([&] {
    for (int i = 0; i < kSteps; ++i) step();
  }, calls);

  EXPECT_EQ(calls.syncs.load(), kSteps) << "blocking CUDA calls in " << kSteps << " batched steps";
  EXPECT_EQ(calls.allocations.load(), 0) << "allocations in " << kSteps << " batched steps";
}
#else
TEST(CudaDecodeStep, CountsRuntimeCalls) {
  GTEST_SKIP() << "built without CUPTI: the runtime calls of a decode step cannot be counted";
}
#endif

}  // namespace
}  // namespace petrel
