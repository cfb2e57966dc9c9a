// The device sampler: the CPU Sampler's steps as kernels (sampling.cu) over preallocated scratch.
// Per sample: penalties and bias into `adjusted`, the argmax (greedy ends here), relative logits z,
// top-k / top-p as cuts found by radix selection, the draw; only the token id is read back (posted
// to mapped memory by the last kernel). A draw is queued as a job of the backend's DrawBatch, and
// the first finish() launches every queued job at once: a step of B rows costs the launches of one.
#include "backend/cuda/cuda_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.cuh"
#include "generate/rng.h"

namespace petrel::cuda {
namespace {

// History changes wait on the host until the next sample (one copy, one launch); a long prompt
// flushes whenever this many are pending.
constexpr int kPendingDeltas = 4096;

}  // namespace

// The draws queued since the last launch, as a job table in pinned memory; launch() copies it to
// the device in one transfer and runs sample_rows over it.
class DrawBatch {
 public:
  DrawBatch(int vocab, cudaStream_t stream) : vocab_(vocab), stream_(stream) {
    PETREL_CUDA(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  }
  ~DrawBatch() {
    cudaEventSynchronize(copied_);  // cudaFree waits for kernels still reading the device table
    cudaEventDestroy(copied_);
    cudaFree(device_);
    cudaFreeHost(host_);
  }
  DrawBatch(const DrawBatch&) = delete;
  DrawBatch& operator=(const DrawBatch&) = delete;

  // `mask`: vocab bits (null: none), copied here.
  void add(const void* owner, const SampleJob& job, const uint32_t* mask) {
    owners_.push_back(owner);
    jobs_.push_back(job);
    mask_index_.push_back(mask ? int(masks_.size() / mask_words()) : -1);
    if (mask) masks_.insert(masks_.end(), mask, mask + mask_words());
  }
  // Drops the queued job of `owner`, if any (its sampler was reset or destroyed before a finish).
  void drop(const void* owner) {
    const auto it = std::find(owners_.begin(), owners_.end(), owner);
    if (it == owners_.end()) return;
    const size_t i = size_t(it - owners_.begin());
    if (mask_index_[i] >= 0) {  // later jobs' masks move down
      const auto first = masks_.begin() + ptrdiff_t(size_t(mask_index_[i]) * mask_words());
      masks_.erase(first, first + ptrdiff_t(mask_words()));
      for (size_t k = i + 1; k < jobs_.size(); ++k)
        if (mask_index_[k] >= 0) --mask_index_[k];
    }
    jobs_.erase(jobs_.begin() + ptrdiff_t(i));
    mask_index_.erase(mask_index_.begin() + ptrdiff_t(i));
    owners_.erase(it);
  }
  void launch() {
    if (jobs_.empty()) return;
    // The last launch's copy must have read the pinned table: long since, once the host has read
    // that launch's token, so a query (no blocking call) settles it; else wait.
    const cudaError_t copied = cudaEventQuery(copied_);
    if (copied == cudaErrorNotReady) PETREL_CUDA(cudaEventSynchronize(copied_));
    else PETREL_CUDA(copied);
    const size_t job_bytes = sizeof(SampleJob) * jobs_.size(), bytes = job_bytes + sizeof(uint32_t) * masks_.size();
    reserve(bytes);
    const auto* device_masks = reinterpret_cast<const uint32_t*>(device_ + job_bytes);
    for (size_t i = 0; i < jobs_.size(); ++i)
      if (mask_index_[i] >= 0) jobs_[i].allowed = device_masks + size_t(mask_index_[i]) * mask_words();
    std::memcpy(host_, jobs_.data(), job_bytes);
    std::memcpy(host_ + job_bytes, masks_.data(), sizeof(uint32_t) * masks_.size());
    SampleBatch b;
    b.rows = int(jobs_.size());
    for (const SampleJob& j : jobs_) {
      b.max_bias = std::max(b.max_bias, j.n_bias);
      b.adjust = b.adjust || j.scores == j.adjusted;  // penalties, bias or a mask
      b.sampled = b.sampled || !j.greedy;
      b.top_k = b.top_k || (!j.greedy && j.top_k > 0);
      b.top_p = b.top_p || (!j.greedy && j.top_p < 1.0f);
    }
    PETREL_CUDA(cudaMemcpyAsync(device_, host_, bytes, cudaMemcpyHostToDevice, stream_));
    PETREL_CUDA(cudaEventRecord(copied_, stream_));
    sample_rows(reinterpret_cast<const SampleJob*>(device_), b, vocab_, stream_);
    jobs_.clear();
    owners_.clear();
    mask_index_.clear();
    masks_.clear();
  }

 private:
  size_t mask_words() const { return size_t(vocab_ + 31) / 32; }

  void reserve(size_t bytes) {
    if (bytes <= capacity_) return;
    cudaFree(device_);  // waits for kernels still reading it
    cudaFreeHost(host_);
    capacity_ = std::max(bytes, 2 * capacity_);
    PETREL_CUDA(cudaMalloc(&device_, capacity_));
    PETREL_CUDA(cudaMallocHost(&host_, capacity_));
  }

  int vocab_;
  cudaStream_t stream_;
  std::vector<const void*> owners_;
  std::vector<SampleJob> jobs_;
  std::vector<int> mask_index_;  // per job: its mask in masks_, or -1
  std::vector<uint32_t> masks_;
  size_t capacity_ = 0;          // bytes of each buffer: the jobs, then their masks
  unsigned char* host_ = nullptr;  // pinned
  unsigned char* device_ = nullptr;
  cudaEvent_t copied_ = nullptr;
};

namespace {

class CudaSampler final : public DeviceSampler {
 public:
  CudaSampler(int vocab, cudaStream_t stream, std::shared_ptr<DrawBatch> batch)
      : vocab_(vocab), stream_(stream), batch_(std::move(batch)) {
    const int blocks = sample_blocks(vocab);
    adjusted_ = device_alloc<float>(size_t(vocab));
    z_ = device_alloc<float>(size_t(vocab));
    counts_.in_window = device_alloc<int>(size_t(vocab));
    counts_.generated = device_alloc<int>(size_t(vocab));
    bias_ids_ = device_alloc<int>(size_t(vocab));
    bias_ = device_alloc<float>(size_t(vocab));
    argmax_scratch_ = device_alloc<float>(2 * size_t(kArgmaxBlocks));
    hist_ = device_alloc<unsigned long long>(256 * size_t(blocks));
    partial_ = device_alloc<double>(size_t(blocks));
    state_ = device_alloc<SelectState>(1);
    top_ = device_alloc<int>(1);
    deltas_ = device_alloc<CountDelta>(kPendingDeltas);
    PETREL_CUDA(cudaMallocHost(&h_deltas_, sizeof(CountDelta) * kPendingDeltas));
  }

  ~CudaSampler() override {
    batch_->drop(this);
    cudaStreamSynchronize(stream_);
    for (void* p : allocations_) cudaFree(p);
    cudaFreeHost(h_deltas_);
  }

  void reset(const SamplingParams& params) override {
    params.validate(vocab_);
    params_ = params;
    window_.clear();
    n_pending_ = 0;
    started_ = false;  // an unread draw of the slot's last request is dropped
    batch_->drop(this);
    mask_ = nullptr;
    PETREL_CUDA(cudaMemsetAsync(counts_.in_window, 0, sizeof(int) * size_t(vocab_), stream_));
    PETREL_CUDA(cudaMemsetAsync(counts_.generated, 0, sizeof(int) * size_t(vocab_), stream_));
    std::vector<int> ids;
    std::vector<float> bias;
    for (const auto& [id, b] : params.logit_bias) {
      ids.push_back(id);
      bias.push_back(b);
    }
    n_bias_ = int(ids.size());
    if (n_bias_ > 0) {  // from pageable vectors: wait for the copies before they go out of scope
      PETREL_CUDA(cudaMemcpyAsync(bias_ids_, ids.data(), sizeof(int) * ids.size(), cudaMemcpyHostToDevice, stream_));
      PETREL_CUDA(cudaMemcpyAsync(bias_, bias.data(), sizeof(float) * bias.size(), cudaMemcpyHostToDevice, stream_));
      PETREL_CUDA(cudaStreamSynchronize(stream_));
    }
  }

  // The window logic of PenaltyState::add, with the count changes queued for the device. Without
  // penalties the history is never read, so it is not kept.
  void observe(int32_t token, bool generated) override {
    if (!params_.has_penalties()) return;
    check(token >= 0 && token < vocab_, "DeviceSampler::observe: token id " + std::to_string(token) +
                                            " is outside the vocabulary");
    queue({token, 1, generated ? 1 : 0});
    if (params_.penalty_last_n <= 0) return;
    window_.emplace_back(token, generated);
    if (int(window_.size()) > params_.penalty_last_n) {
      const auto [old, old_generated] = window_.front();
      window_.pop_front();
      queue({old, -1, old_generated ? -1 : 0});
    }
  }

  void set_mask(const uint32_t* words) override { mask_ = words; }

  void start(const Tensor& logits_row, uint64_t position) override {
    check(logits_row.elem_size == 4 && logits_row.rows == 1 && logits_row.cols == vocab_,
          "DeviceSampler::start needs one fp32 row of " + std::to_string(vocab_) + " logits");
    check(!started_, "DeviceSampler::start: the last draw was not finished");
    flush();
    batch_->add(this, job(static_cast<const float*>(logits_row.data), position), mask_);
    started_ = true;
  }

  int32_t finish() override {
    check(started_, "DeviceSampler::finish: no draw was started");
    started_ = false;
    batch_->launch();  // no-op when an earlier finish() launched this draw
    const int32_t token = token_.wait(stream_);
    check(token >= 0 && token < vocab_,
          "sampling: no token has a finite logit (is every token banned by the logit bias or a structured output's grammar? are the logits NaN?)");
    return token;
  }

 private:
  template <typename T>
  T* device_alloc(size_t n) {
    void* p = nullptr;
    PETREL_CUDA(cudaMalloc(&p, n * sizeof(T)));
    allocations_.push_back(p);
    return static_cast<T*>(p);
  }

  // This draw's parameters and scratch; the same constants the CPU Sampler computes (1/T, ln
  // min_p) so the kernels round as it does.
  SampleJob job(const float* logits, uint64_t position) {
    SampleJob j;
    j.logits = logits;
    j.adjusted = adjusted_;
    const bool adjust = params_.has_penalties() || n_bias_ > 0 || mask_;
    j.scores = adjust ? adjusted_ : logits;
    j.z = z_;
    j.counts = counts_;
    j.pp = {params_.repetition_penalty, params_.presence_penalty, params_.frequency_penalty};
    j.penalties = params_.has_penalties();
    j.bias_ids = bias_ids_;
    j.bias = bias_;
    j.n_bias = n_bias_;
    j.argmax_scratch = argmax_scratch_;
    j.top = top_;
    j.greedy = params_.greedy();
    if (!j.greedy) {
      j.inv_t = 1.0f / params_.temperature;
      j.top_k = params_.top_k;
      j.top_p = params_.top_p;
      j.min_z = params_.min_p > 0.0f ? std::log(params_.min_p) : -INFINITY;
      j.u = uniform01(params_.seed, position);
    }
    j.state = state_;
    j.hist = hist_;
    j.partial = partial_;
    j.post = token_.next();
    return j;
  }

  void queue(CountDelta d) {
    if (n_pending_ == kPendingDeltas) {
      flush();
      PETREL_CUDA(cudaStreamSynchronize(stream_));  // the copy has read the pinned buffer
    }
    h_deltas_[n_pending_++] = d;
  }

  // Sends the queued history changes; sample() waits for its token, posted by a kernel that runs
  // after the copy, before the buffer is written again.
  void flush() {
    if (n_pending_ == 0) return;
    PETREL_CUDA(cudaMemcpyAsync(deltas_, h_deltas_, sizeof(CountDelta) * size_t(n_pending_), cudaMemcpyHostToDevice,
                                stream_));
    apply_count_deltas(counts_, deltas_, n_pending_, stream_);
    n_pending_ = 0;
  }

  int vocab_;
  cudaStream_t stream_;
  std::shared_ptr<DrawBatch> batch_;  // shared by every sampler of the backend
  const uint32_t* mask_ = nullptr;     // set_mask's, on the host
  bool started_ = false;  // a draw is queued and its token not read
  SamplingParams params_;
  std::deque<std::pair<int32_t, bool>> window_;  // the last penalty_last_n tokens, when set
  std::vector<void*> allocations_;
  float *adjusted_ = nullptr, *z_ = nullptr, *bias_ = nullptr, *argmax_scratch_ = nullptr;
  PenaltyCounts counts_;
  int* bias_ids_ = nullptr;
  int n_bias_ = 0;
  unsigned long long* hist_ = nullptr;
  double* partial_ = nullptr;
  SelectState* state_ = nullptr;
  int* top_ = nullptr;
  CountDelta* deltas_ = nullptr;
  CountDelta* h_deltas_ = nullptr;  // pinned
  int n_pending_ = 0;
  TokenMailbox token_;
};

}  // namespace

std::shared_ptr<DrawBatch> make_draw_batch(int vocab, cudaStream_t stream) {
  return std::make_shared<DrawBatch>(vocab, stream);
}

std::unique_ptr<DeviceSampler> make_sampler(int vocab, cudaStream_t stream, std::shared_ptr<DrawBatch> batch) {
  return std::make_unique<CudaSampler>(vocab, stream, std::move(batch));
}

}  // namespace petrel::cuda
