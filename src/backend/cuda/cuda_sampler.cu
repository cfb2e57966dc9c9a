// The device sampler: the CPU Sampler's steps as kernels (sampling.cu) over preallocated scratch.
// Per sample: penalties and bias into `adjusted`, the argmax (greedy ends here), relative logits z,
// top-k / top-p as cuts found by radix selection, the draw; only the token id is read back (posted
// to mapped memory by the last kernel).
#include "backend/cuda/cuda_sampler.h"

#include <cmath>
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

class CudaSampler final : public DeviceSampler {
 public:
  CudaSampler(int vocab, cudaStream_t stream) : vocab_(vocab), stream_(stream) {
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

  void start(const Tensor& logits_row, uint64_t position) override {
    check(logits_row.elem_size == 4 && logits_row.rows == 1 && logits_row.cols == vocab_,
          "DeviceSampler::start needs one fp32 row of " + std::to_string(vocab_) + " logits");
    check(!started_, "DeviceSampler::start: the last draw was not finished");
    flush();
    const float* logits = static_cast<const float*>(logits_row.data);
    const PenaltyParams pp{params_.repetition_penalty, params_.presence_penalty, params_.frequency_penalty};
    adjust_logits(logits, vocab_, params_.has_penalties() ? &counts_ : nullptr, pp, bias_ids_, bias_, n_bias_,
                  adjusted_, stream_);
    const TokenPost post = token_.next();
    if (params_.greedy()) argmax(adjusted_, vocab_, argmax_scratch_, nullptr, post, stream_);
    else {
      argmax(adjusted_, vocab_, argmax_scratch_, top_, TokenPost{}, stream_);
      filter_and_draw(position, post);
    }
    started_ = true;
  }

  int32_t finish() override {
    check(started_, "DeviceSampler::finish: no draw was started");
    started_ = false;
    const int32_t token = token_.wait(stream_);
    check(token >= 0 && token < vocab_,
          "sampling: no token has a finite logit (is every token banned by the logit bias? are the logits NaN?)");
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

  // Temperature, the cuts of top-k and top-p, then the draw with min-p's threshold; the same
  // constants the CPU Sampler computes (1/T, ln min_p) so the kernels round as it does.
  void filter_and_draw(uint64_t position, TokenPost post) {
    relative_logits(adjusted_, top_, vocab_, 1.0f / params_.temperature, z_, stream_);
    PETREL_CUDA(cudaMemsetAsync(state_, 0, sizeof(SelectState), stream_));  // cut 0: all kept
    if (params_.top_k > 0) select_top_k(z_, vocab_, params_.top_k, state_, hist_, stream_);
    if (params_.top_p < 1.0f) select_top_p(z_, vocab_, params_.top_p, state_, hist_, stream_);
    const float min_z = params_.min_p > 0.0f ? std::log(params_.min_p) : -INFINITY;
    draw_token(z_, vocab_, state_, min_z, uniform01(params_.seed, position), partial_, post, stream_);
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

std::unique_ptr<DeviceSampler> make_sampler(int vocab, cudaStream_t stream) {
  return std::make_unique<CudaSampler>(vocab, stream);
}

}  // namespace petrel::cuda
