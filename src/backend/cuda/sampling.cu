// Token selection on the device, so a decode step reads back one id instead of the logits: the
// greedy argmax, and the steps of the device sampler (penalties, top-k / top-p by radix selection
// over the float bits, the draw by a blocked CDF in token-id order; docs/generation.md).
#include "backend/cuda/kernels.cuh"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace petrel::cuda {
namespace {

// Each block reduces a strided share of the logits to one candidate.
__device__ void argmax_block(const float* logits, int n, float* cand_v, int* cand_i) {
  float v = -INFINITY;
  int idx = n;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) keep_better(v, idx, logits[i], i);
  block_argmax(v, idx);
  if (threadIdx.x == 0) {
    cand_v[blockIdx.x] = v;
    cand_i[blockIdx.x] = idx;
  }
}

__global__ void argmax_blocks_kernel(const float* logits, int n, float* cand_v, int* cand_i) {
  pdl_enter();
  argmax_block(logits, n, cand_v, cand_i);
}

// The best of `blocks` candidates, in thread 0.
__device__ int argmax_of_candidates(const float* cand_v, const int* cand_i, int blocks) {
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) keep_better(v, idx, cand_v[b], cand_i[b]);
  block_argmax(v, idx);
  return idx;
}

// The post with its sequence number in hand: a recorded kernel's is read from mapped host memory
// (a PCIe round trip).
__device__ __forceinline__ TokenPost with_seq(TokenPost post) {
  if (post.seq_at) post.seq = *static_cast<const volatile unsigned int*>(post.seq_at);
  post.seq_at = nullptr;
  return post;
}

// One system-scope 8-byte store: the host sees the token and its sequence number together.
__device__ __forceinline__ void post_token(TokenPost post, int token) {
  post = with_seq(post);
  const unsigned long long word = static_cast<unsigned long long>(post.seq) << 32 | static_cast<unsigned int>(token);
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(post.word), "l"(word) : "memory");
}

__global__ void argmax_final_kernel(const float* cand_v, const int* cand_i, int blocks, int* out, TokenPost post) {
  pdl_launch_dependents();
  // The host writes the number before it launches the graph: its round trip overlaps the wait.
  if (threadIdx.x == 0) post = with_seq(post);
  pdl_wait();
  const int idx = argmax_of_candidates(cand_v, cand_i, blocks);
  if (threadIdx.x != 0) return;
  if (out) *out = idx;
  if (post.word) post_token(post, idx);
}

// ---- device sampler ------------------------------------------------------------------------------
// Rounding matches the CPU Sampler: explicit _rn intrinsics keep nvcc from fusing into FMAs. Every
// kernel below runs grid row blockIdx.y on job blockIdx.y and returns at once for a job that does
// not need its step.

__global__ void count_deltas_kernel(PenaltyCounts c, const CountDelta* d, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(&c.in_window[d[i].token], d[i].window);  // a token may appear in several deltas
  atomicAdd(&c.generated[d[i].token], d[i].generated);
}

__device__ __forceinline__ bool masked_out(const uint32_t* allowed, int i) {
  return allowed && !((allowed[i / 32] >> (i % 32)) & 1u);
}

__global__ void penalise_kernel(const SampleJob* jobs, int n) {
  const SampleJob& j = jobs[blockIdx.y];
  if (j.scores != j.adjusted) return;
  const PenaltyCounts c = j.counts;
  const PenaltyParams p = j.pp;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float l = j.logits[i];
    if (j.penalties && c.in_window[i] > 0) {
      if (p.repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, p.repetition) : __fmul_rn(l, p.repetition);
      const int g = c.generated[i];
      if (g > 0) l = __fsub_rn(l, __fadd_rn(p.presence, __fmul_rn(p.frequency, float(g))));
    }
    j.adjusted[i] = masked_out(j.allowed, i) ? -INFINITY : l;
  }
}

__global__ void bias_kernel(const SampleJob* jobs) {
  const SampleJob& j = jobs[blockIdx.y];
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= j.n_bias) return;
  const int t = j.bias_ids[b];
  if (!masked_out(j.allowed, t)) j.adjusted[t] = __fadd_rn(j.adjusted[t], j.bias[b]);  // the mask comes last
}

__global__ void sample_argmax_blocks_kernel(const SampleJob* jobs, int n) {
  const SampleJob& j = jobs[blockIdx.y];
  const ArgmaxCandidates cand = argmax_candidates(j.argmax_scratch);
  argmax_block(j.scores, n, cand.v, cand.i);
}

// Greedy rows post their token; sampled ones keep it as the top and start with everything kept.
__global__ void sample_argmax_final_kernel(const SampleJob* jobs, int n, int blocks) {
  const SampleJob& j = jobs[blockIdx.y];
  const ArgmaxCandidates cand = argmax_candidates(j.argmax_scratch);
  const int idx = argmax_of_candidates(cand.v, cand.i, blocks);
  if (threadIdx.x != 0) return;
  if (j.greedy) {
    const bool none = j.allowed && !(idx < n && j.scores[idx] > -INFINITY);  // as the CPU Sampler's check
    post_token(j.post, none ? -1 : idx);
    return;
  }
  *j.top = idx;
  *j.state = SelectState{};
}

__global__ void relative_logits_kernel(const SampleJob* jobs, int n) {
  const SampleJob& j = jobs[blockIdx.y];
  if (j.greedy) return;
  const int k = *j.top;
  const float t = k < n ? j.scores[k] : NAN;  // argmax finds no index when every logit is NaN
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float a = j.scores[i];
    j.z[i] = a == t && t > -INFINITY ? 0.0f : __fmul_rn(__fsub_rn(a, t), j.inv_t);  // as relative_logit (sampler.cpp)
  }
}

// A token's place in the CPU Sampler's order (larger z first, then the lower id) as one unsigned
// number, unique per token; 0 for tokens that are not candidates (z = -inf or NaN).
__device__ __forceinline__ unsigned long long sort_key(float z, int i) {
  if (!(z > -INFINITY)) return 0;
  return (static_cast<unsigned long long>(ordered_bits(z)) << 32) | (0xFFFFFFFFu - static_cast<unsigned int>(i));
}

// Token weights for top-p in 2^-40 fixed point: integer sums are exact in any order, so the cut is
// deterministic and consistent across passes (the quantisation, ~1e-12 of the top weight, only
// matters for targets that close to a boundary).
__device__ __forceinline__ unsigned long long fixed_weight(float z) {
  return __double2ull_rn(exp(static_cast<double>(z)) * 0x1p40);
}

enum class SelectBy { Count, Weight };

__device__ __forceinline__ bool selects(const SampleJob& j, SelectBy by) {
  return !j.greedy && (by == SelectBy::Count ? j.top_k > 0 : j.top_p < 1.0f);
}

// One radix pass: per block, a histogram (count or weight) of the 8-bit digit at `pass` (most
// significant first) of the kept keys whose higher digits equal the prefix chosen so far.
template <SelectBy kBy>
__global__ void select_hist_kernel(const SampleJob* jobs, int n, int pass) {
  const SampleJob& j = jobs[blockIdx.y];
  if (!selects(j, kBy)) return;
  __shared__ unsigned long long h[256];
  h[threadIdx.x] = 0;  // blockDim.x == 256
  __syncthreads();
  const SelectState s = *j.state;
  if (pass == 0 || !s.done) {  // pass 0's finder (re)sets done
    const int shift = 56 - 8 * pass;
    const unsigned long long fixed = pass == 0 ? 0ull : ~0ull << (shift + 8);  // digits already chosen
    const int first = blockIdx.x * kSampleChunk;
    for (int t = threadIdx.x; t < kSampleChunk; t += blockDim.x) {
      const int i = first + t;
      if (i >= n) break;
      const float zi = j.z[i];
      const unsigned long long key = sort_key(zi, i);
      if (key == 0 || key < s.cut || (key & fixed) != (s.prefix & fixed)) continue;
      atomicAdd(&h[(key >> shift) & 255], kBy == SelectBy::Count ? 1ull : fixed_weight(zi));
    }
  }
  __syncthreads();
  j.hist[blockIdx.x * 256 + threadIdx.x] = h[threadIdx.x];
}

// One radix pass, continued on one block: sums the block histograms, picks the digit whose bucket
// holds the target (counting from the largest keys down), and after the last pass moves the cut
// to the key found. Pass 0 sets the target: k tokens, or ceil(top_p · kept weight).
template <SelectBy kBy>
__global__ void select_find_kernel(const SampleJob* jobs, int blocks, int pass) {
  const SampleJob& j = jobs[blockIdx.y];
  if (!selects(j, kBy)) return;
  __shared__ unsigned long long total[256];
  unsigned long long t = 0;
  for (int b = 0; b < blocks; ++b) t += j.hist[b * 256 + threadIdx.x];
  total[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x != 0) return;
  SelectState s = *j.state;
  if (pass == 0) {
    unsigned long long all = 0;
    for (int d = 0; d < 256; ++d) all += total[d];
    unsigned long long target = static_cast<unsigned long long>(j.top_k);
    if (kBy == SelectBy::Weight) {
      const unsigned long long w = __double2ull_ru(static_cast<double>(j.top_p) * static_cast<double>(all));
      target = w < all ? w : all;
    }
    s.prefix = 0;
    s.remaining = target;
    s.done = target == 0 || target > all;  // fewer candidates than k (or none): the cut stays
  }
  if (s.done) {
    *j.state = s;
    return;
  }
  // remaining >= 1 and the buckets sum to >= remaining (exact integers), so a digit is found.
  unsigned long long above = 0;
  int digit = 0;
  for (int d = 255; d >= 0; --d) {
    if (above + total[d] >= s.remaining) {
      digit = d;
      break;
    }
    above += total[d];
  }
  s.prefix |= static_cast<unsigned long long>(digit) << (56 - 8 * pass);
  s.remaining -= above;
  if (pass == 7) s.cut = s.prefix;
  *j.state = s;
}

// The draw walks kept tokens in id order: block b covers ids [b·kSampleChunk, (b+1)·kSampleChunk),
// its thread t the kDrawRun ids from b·kSampleChunk + t·kDrawRun.
constexpr int kDrawThreads = 256;
constexpr int kDrawRun = kSampleChunk / kDrawThreads;

__device__ __forceinline__ bool kept(float z, int i, unsigned long long cut, float min_z) {
  const unsigned long long key = sort_key(z, i);
  return key != 0 && key >= cut && z >= min_z;
}

__device__ double run_weight(const float* z, int n, int first, unsigned long long cut, float min_z) {
  double w = 0.0;
  for (int i = first; i < min(first + kDrawRun, n); ++i)
    if (kept(z[i], i, cut, min_z)) w += exp(static_cast<double>(z[i]));
  return w;
}

__global__ void draw_blocks_kernel(const SampleJob* jobs, int n) {
  const SampleJob& j = jobs[blockIdx.y];
  if (j.greedy) return;
  __shared__ double w[kDrawThreads];
  w[threadIdx.x] = run_weight(j.z, n, blockIdx.x * kSampleChunk + threadIdx.x * kDrawRun, j.state->cut, j.min_z);
  __syncthreads();
  for (int half = kDrawThreads / 2; half > 0; half /= 2) {  // fixed tree: the same sum every run
    if (threadIdx.x < half) w[threadIdx.x] += w[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) j.partial[blockIdx.x] = w[0];
}

// Index of the first of `count` weights at which cum + the weights so far exceed target, else of
// the last positive one (rounding), else -1; *before = cum + the weights ahead of it.
__device__ int crossing(const double* weight, int count, double target, double cum, double* before) {
  int pick = -1;
  for (int k = 0; k < count; ++k) {
    if (weight[k] > 0.0) {
      pick = k;
      *before = cum;
      if (target < cum + weight[k]) break;
    }
    cum += weight[k];
  }
  return pick;
}

// One block a row: the block, then the thread run, then the token where the CDF crosses u · total.
__global__ void draw_find_kernel(const SampleJob* jobs, int n, int blocks) {
  const SampleJob& j = jobs[blockIdx.y];
  if (j.greedy) return;
  __shared__ double w[kDrawThreads];
  __shared__ int block;
  __shared__ double target, before;
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int b = 0; b < blocks; ++b) total += j.partial[b];
    target = j.u * total;
    before = 0.0;
    block = crossing(j.partial, blocks, target, 0.0, &before);
    if (block < 0) post_token(j.post, -1);  // nothing kept
  }
  __syncthreads();
  if (block < 0) return;
  const unsigned long long cut = j.state->cut;
  const int first = block * kSampleChunk;
  w[threadIdx.x] = run_weight(j.z, n, first + threadIdx.x * kDrawRun, cut, j.min_z);
  __syncthreads();
  if (threadIdx.x != 0) return;
  double cum = before;
  const int run = crossing(w, kDrawThreads, target, before, &cum);
  int pick = -1;
  if (run >= 0) {
    for (int i = first + run * kDrawRun; i < min(first + (run + 1) * kDrawRun, n); ++i) {
      if (!kept(j.z[i], i, cut, j.min_z)) continue;
      pick = i;
      cum += exp(static_cast<double>(j.z[i]));
      if (target < cum) break;
    }
  }
  post_token(j.post, pick);
}

template <SelectBy kBy>
void radix_select(const SampleJob* jobs, int rows, int n, cudaStream_t s) {
  const int blocks = sample_blocks(n);
  for (int pass = 0; pass < 8; ++pass) {
    select_hist_kernel<kBy><<<dim3(blocks, rows), 256, 0, s>>>(jobs, n, pass);
    PETREL_LAUNCHED("sampler select histogram");
    select_find_kernel<kBy><<<dim3(1, rows), 256, 0, s>>>(jobs, blocks, pass);
    PETREL_LAUNCHED("sampler select digit");
  }
}

}  // namespace

void argmax(const float* logits, int n, float* scratch, int* out, TokenPost post, cudaStream_t s) {
  const int blocks = std::min(kArgmaxBlocks, div_up(n, 1024));
  const ArgmaxCandidates cand = argmax_candidates(scratch);
  launch_pdl(argmax_blocks_kernel, blocks, 256, 0, s, logits, n, cand.v, cand.i);
  PETREL_LAUNCHED("argmax blocks");
  argmax_final(scratch, blocks, out, post, s);
}

void argmax_final(float* scratch, int count, int* out, TokenPost post, cudaStream_t s) {
  const ArgmaxCandidates cand = argmax_candidates(scratch);
  launch_pdl(argmax_final_kernel, 1, 256, 0, s, cand.v, cand.i, count, out, post);
  PETREL_LAUNCHED("argmax");
}

TokenMailbox::TokenMailbox() {
  PETREL_CUDA(cudaHostAlloc(&host_, sizeof(*host_), cudaHostAllocMapped));
  *host_ = 0;  // sequence numbers start at 1
  PETREL_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
  PETREL_CUDA(cudaHostAlloc(&host_seq_, sizeof(*host_seq_), cudaHostAllocMapped));
  *host_seq_ = 0;
  PETREL_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_seq_), host_seq_, 0));
}

TokenMailbox::~TokenMailbox() {
  cudaFreeHost(host_);
  cudaFreeHost(host_seq_);
}

TokenPost TokenMailbox::next() { return {device_, ++seq_}; }

void TokenMailbox::advance() { *static_cast<volatile unsigned int*>(host_seq_) = ++seq_; }

TokenPost TokenMailbox::current(bool recorded) const {
  return recorded ? TokenPost{device_, 0, device_seq_} : TokenPost{device_, seq_};
}

int32_t TokenMailbox::wait(cudaStream_t s) const {
  constexpr unsigned kSpinsPerQuery = 1024;  // tens of microseconds; a step takes a millisecond or more
  const volatile unsigned long long* word = host_;
  const auto posted = [&](unsigned long long w) { return static_cast<unsigned int>(w >> 32) == seq_; };
  for (unsigned spin = 1;; ++spin) {
    const unsigned long long w = *word;
    if (posted(w)) return static_cast<int32_t>(static_cast<uint32_t>(w));
    if (spin % kSpinsPerQuery == 0) {
      const cudaError_t e = cudaStreamQuery(s);
      // An idle stream's writes are all visible: the next read finds the post, or it was lost.
      if (e == cudaSuccess) check(posted(*word), "CUDA token readback: the stream ended without posting");
      else if (e != cudaErrorNotReady) check_cuda(e, "the kernels before a token readback");
    }
#if defined(__x86_64__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
}

void apply_count_deltas(PenaltyCounts counts, const CountDelta* deltas, int n, cudaStream_t s) {
  if (n == 0) return;
  count_deltas_kernel<<<div_up(n, 256), 256, 0, s>>>(counts, deltas, n);
  PETREL_LAUNCHED("sampler counts");
}

void sample_rows(const SampleJob* jobs, const SampleBatch& b, int n, cudaStream_t s) {
  if (b.rows == 0) return;
  if (b.adjust) {
    penalise_kernel<<<dim3(div_up(n, 1024), b.rows), 256, 0, s>>>(jobs, n);
    PETREL_LAUNCHED("sampler penalties");
  }
  if (b.max_bias > 0) {
    bias_kernel<<<dim3(div_up(b.max_bias, 256), b.rows), 256, 0, s>>>(jobs);
    PETREL_LAUNCHED("sampler logit bias");
  }
  const int blocks = std::min(kArgmaxBlocks, div_up(n, 1024));
  sample_argmax_blocks_kernel<<<dim3(blocks, b.rows), 256, 0, s>>>(jobs, n);
  PETREL_LAUNCHED("sampler argmax blocks");
  sample_argmax_final_kernel<<<dim3(1, b.rows), 256, 0, s>>>(jobs, n, blocks);
  PETREL_LAUNCHED("sampler argmax");
  if (!b.sampled) return;
  relative_logits_kernel<<<dim3(div_up(n, 1024), b.rows), 256, 0, s>>>(jobs, n);
  PETREL_LAUNCHED("sampler relative logits");
  if (b.top_k) radix_select<SelectBy::Count>(jobs, b.rows, n, s);
  if (b.top_p) radix_select<SelectBy::Weight>(jobs, b.rows, n, s);
  const int draw_blocks = sample_blocks(n);
  draw_blocks_kernel<<<dim3(draw_blocks, b.rows), kDrawThreads, 0, s>>>(jobs, n);
  PETREL_LAUNCHED("sampler draw blocks");
  draw_find_kernel<<<dim3(1, b.rows), kDrawThreads, 0, s>>>(jobs, n, draw_blocks);
  PETREL_LAUNCHED("sampler draw");
}

}  // namespace petrel::cuda
