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
__global__ void argmax_blocks_kernel(const float* logits, int n, float* cand_v, int* cand_i) {
  pdl_enter();
  float v = -INFINITY;
  int idx = n;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) keep_better(v, idx, logits[i], i);
  block_argmax(v, idx);
  if (threadIdx.x == 0) {
    cand_v[blockIdx.x] = v;
    cand_i[blockIdx.x] = idx;
  }
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
  float v = -INFINITY;
  int idx = 0x7fffffff;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) keep_better(v, idx, cand_v[b], cand_i[b]);
  block_argmax(v, idx);
  if (threadIdx.x != 0) return;
  if (out) *out = idx;
  if (post.word) post_token(post, idx);
}


// ---- device sampler ------------------------------------------------------------------------------
// Rounding matches the CPU Sampler: explicit _rn intrinsics keep nvcc from fusing into FMAs.

__global__ void count_deltas_kernel(PenaltyCounts c, const CountDelta* d, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(&c.in_window[d[i].token], d[i].window);  // a token may appear in several deltas
  atomicAdd(&c.generated[d[i].token], d[i].generated);
}

__global__ void penalise_kernel(const float* logits, int n, PenaltyCounts c, bool penalties, PenaltyParams p,
                                float* out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float l = logits[i];
    if (penalties && c.in_window[i] > 0) {
      if (p.repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, p.repetition) : __fmul_rn(l, p.repetition);
      const int g = c.generated[i];
      if (g > 0) l = __fsub_rn(l, __fadd_rn(p.presence, __fmul_rn(p.frequency, float(g))));
    }
    out[i] = l;
  }
}

__global__ void bias_kernel(const int* ids, const float* bias, int n_bias, float* adjusted) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n_bias) adjusted[ids[j]] = __fadd_rn(adjusted[ids[j]], bias[j]);
}

__global__ void relative_logits_kernel(const float* adjusted, const int* top, int n, float inv_t, float* z) {
  const int k = *top;
  const float t = k < n ? adjusted[k] : NAN;  // argmax finds no index when every logit is NaN
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    z[i] = adjusted[i] == t && t > -INFINITY ? 0.0f : __fmul_rn(__fsub_rn(adjusted[i], t), inv_t);  // as relative_logit (sampler.cpp)
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

// One radix pass: per block, a histogram (count or weight) of the 8-bit digit at `pass` (most
// significant first) of the kept keys whose higher digits equal the prefix chosen so far.
template <SelectBy kBy>
__global__ void select_hist_kernel(const float* z, int n, const SelectState* st, int pass,
                                   unsigned long long* hist) {
  __shared__ unsigned long long h[256];
  h[threadIdx.x] = 0;  // blockDim.x == 256
  __syncthreads();
  const SelectState s = *st;
  if (pass == 0 || !s.done) {  // pass 0's finder (re)sets done
    const int shift = 56 - 8 * pass;
    const unsigned long long fixed = pass == 0 ? 0ull : ~0ull << (shift + 8);  // digits already chosen
    const int first = blockIdx.x * kSampleChunk;
    for (int j = threadIdx.x; j < kSampleChunk; j += blockDim.x) {
      const int i = first + j;
      if (i >= n) break;
      const float zi = z[i];
      const unsigned long long key = sort_key(zi, i);
      if (key == 0 || key < s.cut || (key & fixed) != (s.prefix & fixed)) continue;
      atomicAdd(&h[(key >> shift) & 255], kBy == SelectBy::Count ? 1ull : fixed_weight(zi));
    }
  }
  __syncthreads();
  hist[blockIdx.x * 256 + threadIdx.x] = h[threadIdx.x];
}

// One radix pass, continued on one block: sums the block histograms, picks the digit whose bucket
// holds the target (counting from the largest keys down), and after the last pass moves the cut
// to the key found. Pass 0 sets the target: k tokens, or ceil(top_p · kept weight).
__global__ void select_find_kernel(const unsigned long long* hist, int blocks, SelectState* st, int pass,
                                   SelectBy by, int k, float top_p) {
  __shared__ unsigned long long total[256];
  unsigned long long t = 0;
  for (int b = 0; b < blocks; ++b) t += hist[b * 256 + threadIdx.x];
  total[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x != 0) return;
  SelectState s = *st;
  if (pass == 0) {
    unsigned long long all = 0;
    for (int d = 0; d < 256; ++d) all += total[d];
    unsigned long long target = static_cast<unsigned long long>(k);
    if (by == SelectBy::Weight) {
      const unsigned long long w = __double2ull_ru(static_cast<double>(top_p) * static_cast<double>(all));
      target = w < all ? w : all;
    }
    s.prefix = 0;
    s.remaining = target;
    s.done = target == 0 || target > all;  // fewer candidates than k (or none): the cut stays
  }
  if (s.done) {
    *st = s;
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
  *st = s;
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

__global__ void draw_blocks_kernel(const float* z, int n, const SelectState* st, float min_z, double* partial) {
  __shared__ double w[kDrawThreads];
  w[threadIdx.x] = run_weight(z, n, blockIdx.x * kSampleChunk + threadIdx.x * kDrawRun, st->cut, min_z);
  __syncthreads();
  for (int half = kDrawThreads / 2; half > 0; half /= 2) {  // fixed tree: the same sum every run
    if (threadIdx.x < half) w[threadIdx.x] += w[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = w[0];
}

// Index of the first of `count` weights at which cum + the weights so far exceed target, else of
// the last positive one (rounding), else -1; *before = cum + the weights ahead of it.
__device__ int crossing(const double* weight, int count, double target, double cum, double* before) {
  int pick = -1;
  for (int j = 0; j < count; ++j) {
    if (weight[j] > 0.0) {
      pick = j;
      *before = cum;
      if (target < cum + weight[j]) break;
    }
    cum += weight[j];
  }
  return pick;
}

// One block: the block, then the thread run, then the token where the CDF crosses u · total.
__global__ void draw_find_kernel(const float* z, int n, const SelectState* st, float min_z, double u,
                                 const double* partial, int blocks, TokenPost post) {
  __shared__ double w[kDrawThreads];
  __shared__ int block;
  __shared__ double target, before;
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int b = 0; b < blocks; ++b) total += partial[b];
    target = u * total;
    before = 0.0;
    block = crossing(partial, blocks, target, 0.0, &before);
    if (block < 0) post_token(post, -1);  // nothing kept
  }
  __syncthreads();
  if (block < 0) return;
  const unsigned long long cut = st->cut;
  const int first = block * kSampleChunk;
  w[threadIdx.x] = run_weight(z, n, first + threadIdx.x * kDrawRun, cut, min_z);
  __syncthreads();
  if (threadIdx.x != 0) return;
  double cum = before;
  const int run = crossing(w, kDrawThreads, target, before, &cum);
  int pick = -1;
  if (run >= 0) {
    for (int i = first + run * kDrawRun; i < min(first + (run + 1) * kDrawRun, n); ++i) {
      if (!kept(z[i], i, cut, min_z)) continue;
      pick = i;
      cum += exp(static_cast<double>(z[i]));
      if (target < cum) break;
    }
  }
  post_token(post, pick);
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

void adjust_logits(const float* logits, int n, const PenaltyCounts* counts, PenaltyParams p, const int* bias_ids,
                   const float* bias, int n_bias, float* adjusted, cudaStream_t s) {
  penalise_kernel<<<div_up(n, 1024), 256, 0, s>>>(logits, n, counts ? *counts : PenaltyCounts{}, counts != nullptr,
                                                   p, adjusted);
  PETREL_LAUNCHED("sampler penalties");
  if (n_bias == 0) return;
  bias_kernel<<<div_up(n_bias, 256), 256, 0, s>>>(bias_ids, bias, n_bias, adjusted);
  PETREL_LAUNCHED("sampler logit bias");
}

void relative_logits(const float* adjusted, const int* top, int n, float inv_t, float* z, cudaStream_t s) {
  relative_logits_kernel<<<div_up(n, 1024), 256, 0, s>>>(adjusted, top, n, inv_t, z);
  PETREL_LAUNCHED("sampler relative logits");
}

namespace {

void radix_select(const float* z, int n, SelectBy by, int k, float top_p, SelectState* st, unsigned long long* hist,
            cudaStream_t s) {
  const int blocks = sample_blocks(n);
  for (int pass = 0; pass < 8; ++pass) {
    if (by == SelectBy::Count) select_hist_kernel<SelectBy::Count><<<blocks, 256, 0, s>>>(z, n, st, pass, hist);
    else select_hist_kernel<SelectBy::Weight><<<blocks, 256, 0, s>>>(z, n, st, pass, hist);
    PETREL_LAUNCHED("sampler select histogram");
    select_find_kernel<<<1, 256, 0, s>>>(hist, blocks, st, pass, by, k, top_p);
    PETREL_LAUNCHED("sampler select digit");
  }
}

}  // namespace

void select_top_k(const float* z, int n, int k, SelectState* st, unsigned long long* hist, cudaStream_t s) {
  radix_select(z, n, SelectBy::Count, k, 1.0f, st, hist, s);
}

void select_top_p(const float* z, int n, float top_p, SelectState* st, unsigned long long* hist, cudaStream_t s) {
  radix_select(z, n, SelectBy::Weight, 0, top_p, st, hist, s);
}

void draw_token(const float* z, int n, const SelectState* st, float min_z, double u, double* partial, TokenPost post,
                cudaStream_t s) {
  const int blocks = sample_blocks(n);
  draw_blocks_kernel<<<blocks, kDrawThreads, 0, s>>>(z, n, st, min_z, partial);
  PETREL_LAUNCHED("sampler draw blocks");
  draw_find_kernel<<<1, kDrawThreads, 0, s>>>(z, n, st, min_z, u, partial, blocks, post);
  PETREL_LAUNCHED("sampler draw");
}

}  // namespace petrel::cuda
