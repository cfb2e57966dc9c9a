// Host-side launchers of the CUDA kernels, one section per op family (one .cu file each).
// Activations are bf16 [rows, cols] with a row stride; fp32 where stated.
#pragma once
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace petrel::cuda {

// ---- linear.cu: y = x · Wᵀ ---------------------------------------------------------------------
// Up to kGemvMaxTokens rows use the GEMV kernel (weights streamed once, all rows at a time); more
// rows use the tensor-core GEMM. `x_elem` and `y_elem` are 2 (bf16) or 4 (fp32).
constexpr int kGemvMaxTokens = 8;
void linear(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int T, void* y, int64_t y_stride,
            int y_elem, cudaStream_t s);
// Rounds fp32 activations [T, n] to bf16 rows (the prefill GEMM's asynchronous copies want bf16).
void round_to_bf16(const float* x, int64_t x_stride, int T, int n, bf16* out, int64_t out_stride, cudaStream_t s);
// Where a linear writes: element type 2 (bf16) or 4 (fp32); with `add`, the result (rounded to
// bf16, as the unfused path stores it) is added to what y holds: the residual stream's update.
struct GemvOut {
  void* y = nullptr;
  int64_t stride = 0;
  int elem = 2;
  bool add = false;
};
// An RMSNorm the decode kernels apply to their input rows while staging them (w null: none):
// x·w is staged and each row's rsqrt(mean(x²) + eps) scales the dot products, so the normed rows
// are never written. Needs rows a multiple of 256 wide (norm_stageable).
struct StageNorm {
  const float* w = nullptr;
  float eps = 0.0f;
};
constexpr int kNormWarpCols = 256;  // a warp's 32 lanes x 8 values: one row's part of a staged norm
inline bool norm_stageable(int64_t cols, int64_t x_stride) { return cols % kNormWarpCols == 0 && x_stride % 8 == 0; }
// Up to kMax matrices sharing one input, for one decode GEMV launch (block ranges set at launch).
// The router's sums beside a one-token output projection. The router is linear in its normed
// input, and the norm's rsqrt is one scalar, so logits·rms = Σ_i cols[i]·h_new[i] where cols holds
// the router's rows times the norm's weights, transposed ([H][ld] bf16: the products carry 8-bit
// mantissas, as the bf16 logits of the reference implementation do; column E the shared-expert
// gate's). A block that owns rows [r0, r1) of h adds its share to sums[0..n) in 2^-32 fixed point:
// integer atomics make the total independent of the order blocks arrive in. The experts read the
// sums (TopK::sums) and the MoE's down kernel clears them for the next layer.
struct RouteSums {
  const bf16* cols = nullptr;
  int ld = 0, n = 0;
  unsigned long long* sums = nullptr;
  int smem_at = 0;  // set at launch: where a block's rows of cols sit in its shared memory
};
constexpr float kRouteFixedOne = 4294967296.0f;  // 2^32: one unit of the sums' fixed point
// The first stage of an argmax over a one-token GEMV's fp32 output row, left by the GEMV: block b's
// best (value, row) at v[b], i[b], as argmax's first stage orders them (argmax_final reduces them).
struct ArgmaxCandidates {
  float* v = nullptr;
  int* i = nullptr;
  int smem_at = 0;  // set at launch: where a block keeps its rows' values in its shared memory
};
struct GemvSegments {
  static constexpr int kMax = 4;
  DeviceMatrix w[kMax];
  GemvOut out[kMax];
  int first_block[kMax + 1] = {};
  int rows_per_block[kMax] = {};  // where a block takes one contiguous range of rows
  int n = 0;
  int leave = 0;  // multiprocessors left free, where the next kernel's blocks start early
  RouteSums route;  // one token, one matrix: the router's sums beside it (linear_add_route)
  ArgmaxCandidates argmax;  // one token, one matrix: argmax candidates of its rows (linear_argmax)
  int warm_blocks = 0;  // one register-held row: blocks [0, warm_blocks) start early and run their code once first
  void add(const DeviceMatrix& m, const GemvOut& o) {
    w[n] = m;
    out[n] = o;
    ++n;
  }
};
// outs[i] = x · ws[i]ᵀ: a layer's projections of one input, in as few launches as their formats allow.
void linear_many(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride, int x_elem,
                 int T, cudaStream_t s);
// True when the staged decode GEMV takes all of ws for T rows (and, with `norm`, stages a norm).
bool gemv_stageable(const DeviceMatrix* const* ws, int n, int T, int64_t x_stride, bool norm);
// linear_many through the staged decode GEMV alone (gemv_stageable must hold), with
// rms_norm(x)·norm.w as its input where norm.w is set, added to outs[i] where outs[i].add. The
// last launch leaves `leave` multiprocessors free: the next kernel's blocks start there early
// (PDL) and can fetch what no earlier kernel writes while it runs.
void linear_many_staged(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride,
                        int x_elem, int T, StageNorm norm, cudaStream_t s, int leave = 0);
// True where one token's output projection w (input stride x_stride) can carry the router's sums
// of `route` (linear_add_route).
bool gemv_route_fits(const DeviceMatrix& w, int64_t x_stride, const RouteSums& route);
// h += x · wᵀ for one token, h fp32 (out.add), and the router's sums of the new h beside it.
// The blocks that start beside the kernel before it (all but its mixer_blocks multiprocessors; 0:
// none) run their code once while they wait, so that it is cached when x arrives.
void linear_add_route(const DeviceMatrix& w, const GemvOut& out, const void* x, int64_t x_stride, int x_elem,
                      const RouteSums& route, int mixer_blocks, cudaStream_t s);
// rms_norm(x)·norm.w · wᵀ for one token into an fp32 row (an LM head), each block also leaving the
// argmax candidate of its rows in cand (a block per multiprocessor at most): returns how many
// candidates, 0 where the one-token async GEMV does not take w (nothing launched then).
int linear_argmax(const DeviceMatrix& w, const GemvOut& out, const void* x, int64_t x_stride, int x_elem,
                  StageNorm norm, const ArgmaxCandidates& cand, cudaStream_t s);
// Grouped GEMM over expert segments: row p of A is x[row_token[p]] (or row p of x when row_token is
// null; rows with token -1 are zero), tile i of kGemmTileM rows uses stack entry tile_expert[i]
// (tiles with -1 are skipped). y has max_rows rows.
constexpr int kGemmTileM = 64;
void grouped_linear(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, const int* row_token,
                    const int* tile_expert, int max_rows, bf16* y, int64_t y_stride, cudaStream_t s);

// ---- linear_rows.cu: a batched decode step's rows on tensor cores, each weight read once ---------
// Up to kRowsMaxTokens rows (one moe_plan tile) of 4-bit (groups a multiple of 32, width a multiple
// of 512) or bf16 (width a multiple of 128) weights: linear() takes this path for the rows the staged
// GEMV does not take (more than 4). An added output (the residual) must be fp32.
// One launch takes up to kRowsMaxSegments matrices that share a format and a width
// (linear_rows_share), each into its own output: a layer's input projections, for instance.
constexpr int kRowsMaxTokens = kGemmTileM;
constexpr int kRowsMaxSegments = 4;
bool linear_rows_fits(const DeviceMatrix& w);
bool linear_rows_share(const DeviceMatrix& a, const DeviceMatrix& b);
void linear_rows(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride, int x_elem,
                 int T, cudaStream_t s);
// The routed experts of T rows over moe_plan's tiles (up to 64 rows of one expert each): act[tile
// row] = silu(gate·x[token])·(up·x[token]) (bf16), then y[tile row] = down·act[tile row] (bf16).
// A tile reads its expert's weights once, so this beats the grouped GEMM while experts get few
// rows: up to kRowsPerExpert on average (T·top_k <= kRowsPerExpert·n_experts), a prompt piece
// mixed into a decode step included.
constexpr int kRowsPerExpert = 16;
inline bool expert_rows_suit(int T, int top_k, int n_experts) {
  return int64_t(T) * top_k <= int64_t(kRowsPerExpert) * n_experts;
}
// The shared expert riding in expert_rows' launches: moe_plan gives it the first tiles, marked
// with entry `entry` (the routed experts' count), and those tiles read these matrices. Its own
// launches (gate and up, SiLU·mul, down) would each pay a launch's whole latency chain for a few
// microseconds of weights. None when `gate` is null.
struct RidingExpert {
  const DeviceMatrix *gate = nullptr, *up = nullptr, *down = nullptr;
  int entry = -1;
};
// True where the shared expert can ride with these routed experts: same formats and shapes.
bool expert_rows_carry(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                       const RidingExpert& shared);
void expert_rows(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const RidingExpert& shared,
                 const void* x, int64_t x_stride, int x_elem, int T, const int* row_token, const int* tile_expert,
                 int tiles, bf16* act, int64_t act_stride, bf16* y, int64_t y_stride, cudaStream_t s);

// ---- norm_rope.cu --------------------------------------------------------------------------------
// The residual stream (embedding output, norm input, add target) may be fp32 (elem 4) or bf16 (2).
// ids may be mapped pinned host memory. With pos.from set, *pos.from is also copied to *pos.to.
struct PosCopy {
  const int* from = nullptr;
  int* to = nullptr;
};
void embed(const DeviceMatrix& table, const int* ids, int T, void* out, int64_t out_stride, int out_elem,
           cudaStream_t s, PosCopy pos = {});
void rms_norm(const void* x, int64_t x_stride, int x_elem, const float* w, int T, int n, float eps, void* out,
              int64_t out_stride, int out_elem, cudaStream_t s);
void add_inplace(void* h, int64_t h_stride, int h_elem, const bf16* a, int64_t a_stride, int T, int n, cudaStream_t s);
// Per-head RMSNorm then NeoX RoPE on the first `rotary` dims of q [T, Hq·D] and k [T, Hkv·D] in
// one launch; row t at position *pos0 + t.
void qk_norm_rope(bf16* q, int64_t q_stride, int Hq, const float* q_w, bf16* k, int64_t k_stride, int Hkv,
                  const float* k_w, int T, int D, float eps, int rotary, float theta, const int* pos0, cudaStream_t s);
// The same with row t at position pos[t] (a batched decode step: one token of each of T sequences).
void qk_norm_rope_rows(bf16* q, int64_t q_stride, int Hq, const float* q_w, bf16* k, int64_t k_stride, int Hkv,
                       const float* k_w, int T, int D, float eps, int rotary, float theta, const int* pos,
                       cudaStream_t s);
void silu_mul(const bf16* g, const bf16* u, int64_t stride, int T, int n, bf16* out, int64_t out_stride,
              cudaStream_t s);

// ---- attention.cu --------------------------------------------------------------------------------
// Writes k, v of T tokens into the caches at rows *pos0 .. *pos0+T-1.
void kv_append(const bf16* k, const bf16* v, int64_t stride, int T, int width, bf16* kc, bf16* vc,
               const int* pos0, cudaStream_t s);
// Causal GQA attention of T queries at positions *pos0+t over cache rows [0, *pos0+t]. Prefill
// chunks take attention_prefill where it applies; otherwise split-K over up to `splits` key
// ranges, partials (m, l, acc[D]) in `partial` (T·Hq·splits·(D+2) floats). keys_settled: no kernel
// that may still run writes cache rows before *pos0 (true inside a recorded decode step, as for
// deltanet_decode's states), so they are fetched before the PDL wait.
void attention(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
               const int* pos0, bool keys_settled, int splits, float* partial, const bf16* gate, int64_t gate_stride,
               bf16* out, int64_t out_stride, cudaStream_t s);

// The caches and positions of a batched decode step's rows: query row r (one token of its own
// sequence) writes its k, v at row pos[r] of the caches k[r], v[r] and attends over rows [0, pos[r]].
struct KvRows {
  bf16* const* k = nullptr;
  bf16* const* v = nullptr;
  const int* pos = nullptr;
};
void kv_append_rows(const bf16* k, const bf16* v, int64_t stride, int B, int width, const KvRows& rows,
                    cudaStream_t s);
// The split-K attention of B query rows, each over its own cache (rows as for kv_append_rows).
void attention_rows(const bf16* q, int64_t q_stride, int B, const KvRows& rows, int Hq, int Hkv, int D, int splits,
                    float* partial, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                    cudaStream_t s);
// A step's new keys and values (q and k already normed and rotated) for the split-K kernels to
// append themselves: the block whose key range ends with a row's new key writes it to the cache
// and into its own key tile. Every query row adds exactly one key (one token, or a batched step's
// rows).
struct NewKv {
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  int64_t stride = 0;  // of k and v rows
};
// True where the split-K kernels append the new keys themselves (NewKv) for this shape.
bool attention_appends(const bf16* q, int64_t q_stride, int Hq, int Hkv, int D);
// kv_append (or kv_append_rows) and the split-K attention in one, for one new key a row (T = 1 at
// *pos0, or rows.pos set).
void attention_appending(const bf16* q, int64_t q_stride, int T, const NewKv& fresh, const bf16* kc, const bf16* vc,
                         int Hq, int Hkv, int D, const int* pos0, const KvRows& rows, bool keys_settled, int splits,
                         float* partial, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                         cudaStream_t s);

// One token's q/k norm + RoPE, cache append and attention in one launch, for contexts of up to
// kCudaShortAttentionKeys keys (cuda_backend.h; the new one included), where the split-K path's
// three kernels cost more than the work: q, k, v, gate are the raw projections of one row (k and v
// of Hkv heads).
struct ShortAttention {
  const bf16 *q, *k, *v, *gate;  // gate may be null
  const float *q_norm, *k_norm;
  float eps, theta;
  int rotary, Hq, Hkv;
  bf16 *kc, *vc;      // the caches, [capacity][Hkv·D]
  const int* pos0;    // the token's position (= the older keys); read before the PDL wait
  bool settled;       // no kernel that may still run writes the older keys: they go out before the wait
  bf16* out;          // [Hq·D]
  // attention_cluster with several clusters a KV head: attention_cluster_records records, every
  // bit set before the first launch (each launch leaves them so).
  unsigned long long* records = nullptr;
};
// True where attention_short takes a context of n_keys keys for this shape.
bool attention_short_fits(int n_keys, int Hq, int Hkv, int D);
void attention_short(const ShortAttention& a, int D, cudaStream_t s);
// The same one launch for longer contexts: a cluster of kClusterAttentionBlocks blocks per KV
// head, each a key range, merged in distributed shared memory (Hopper; up to 8 query heads a KV
// head); past kCudaClusterAttentionKeys up to kCudaWideClusterAttentionKeys keys several clusters
// a KV head, merged by the last (the new key's) from the others' records in global memory.
// attention_cluster_width gives the clusters a KV head for n_keys keys (0 where this launch does
// not take them).
constexpr int kClusterAttentionBlocks = 16;
constexpr int kClusterAttentionMaxWidth = 4;  // clusters a KV head at most
int attention_cluster_width(int n_keys, int Hq, int Hkv, int D);
void attention_cluster(const ShortAttention& a, int D, int width, cudaStream_t s);
// A 64-bit record of each of 8 query heads' D dims for each KV head and cluster but the last.
constexpr int64_t attention_cluster_records(int Hkv, int D) { return int64_t(kClusterAttentionMaxWidth - 1) * Hkv * 8 * D; }

// ---- attention_prefill.cu --------------------------------------------------------------------------
// The same attention on tensor cores (FlashAttention-2 style) for chunks of at least
// kPrefillMinQueries queries, D 64, 128 or 256 and a 16-byte aligned q (base and row stride);
// returns false, launching nothing, for any other shape.
constexpr int kPrefillMinQueries = 16;
bool attention_prefill(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
                       const int* pos0, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                       cudaStream_t s);

// ---- deltanet.cu ---------------------------------------------------------------------------------
struct DeltaNetShape {
  int Hk, Hv, dk, dv, K;
};
// conv + SiLU over qkv [T, C] continuing conv_state [K-1, C] (updated) -> u [T, C] fp32.
void causal_conv_silu(const bf16* x, int64_t x_stride, int T, int C, int K, const float* w, float* conv_state,
                      float* u, cudaStream_t s);
// Splits u into L2-normed q (scaled), k [T, Hk, dk] and v [T, Hv, dv]; beta, g [T, Hv] from b, a.
// b and a are fp32 [T, Hv] (the decay is sensitive to their rounding).
void deltanet_prepare(const DeltaNetShape& d, const float* u, int T, const float* b, int64_t b_stride, const float* a,
                      int64_t a_stride, const float* A_log, const float* dt_bias, float* q, float* k, float* v,
                      float* beta, float* g, cudaStream_t s);
// The delta rule token by token (for one token where deltanet_decode does not take the shape). Key
// head dims 16, 32, 64 or 128, as for the chunked form.
void delta_rule_recurrent(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                          const float* beta, const float* g, float* state, float* out, cudaStream_t s);
// Prefill: chunks of 64 tokens in WY form. chunk_prepare computes every chunk's W, U, masked Q·Kᵀ
// and decays in parallel into `scratch` (delta_rule_chunked_scratch floats); chunk_state then
// walks the chunks once, carrying the state and writing out.
int64_t delta_rule_chunked_scratch(const DeltaNetShape& d, int T);
void delta_rule_chunk_prepare(const DeltaNetShape& d, int T, const float* q, const float* k, const float* v,
                              const float* beta, const float* g, float* scratch, cudaStream_t s);
void delta_rule_chunk_state(const DeltaNetShape& d, int T, const float* q, const float* k, const float* scratch,
                            float* state, float* out, cudaStream_t s);
// A whole DeltaNet decode step (one token: conv, norms and gates, delta rule, gated RMSNorm) in
// one launch, a block per value head; false (nothing done) for shapes it does not cover.
// readers: [rows · Hk] zero-initialised counters, left at zero (the blocks of a key head count
// their reads of its q/k conv state so the last can shift it). states_settled: no kernel that may
// still run writes the states (true inside a recorded decode step: a layer's step runs once in it
// and a graph launch starts after all earlier work), so they load before the PDL wait.
bool deltanet_decode(const DeltaNetShape& d, const bf16* x, const float* conv_w, float* conv_state, const float* b,
                     const float* a, const float* A_log, const float* dt_bias, float* state, const float* norm_w,
                     const bf16* z, float eps, bf16* out, int* readers, bool states_settled, cudaStream_t s);
// Blocks of one token's deltanet_decode (a multiprocessor each): what a kernel before it leaves free.
int deltanet_decode_blocks(const DeltaNetShape& d);
// The rows of a batched decode step (one token of each of B sequences): row r reads x, b, a and z
// and writes out at r times their row strides, and continues the states conv_states[r] ([K-1, C])
// and states[r] ([Hv, dk, dv]). The default is one sequence whose states are passed directly.
struct DeltaNetRows {
  int B = 1;
  int64_t x_stride = 0, b_stride = 0, a_stride = 0, z_stride = 0, out_stride = 0;
  float* const* conv_states = nullptr;
  float* const* states = nullptr;
  bool states_settled = false;  // see deltanet_decode (one sequence only)
};
// deltanet_decode for the B rows of a batched step in one launch; false (nothing done) for the
// shapes deltanet_decode does not cover.
bool deltanet_decode_rows(const DeltaNetShape& d, const DeltaNetRows& rows, const bf16* x, const float* conv_w,
                          const float* b, const float* a, const float* A_log, const float* dt_bias,
                          const float* norm_w, const bf16* z, float eps, bf16* out, int* readers, cudaStream_t s);
// out = rmsnorm(o per value head)·w·silu(z), bf16.
void gated_rms_norm(const DeltaNetShape& d, const float* o, int T, const float* w, const bf16* z, int64_t z_stride,
                    float eps, bf16* out, int64_t out_stride, cudaStream_t s);

// ---- moe.cu --------------------------------------------------------------------------------------
// Router: fp32 logits [T, E] (scratch), softmax over E, top-k (renormalised if `renorm`) ->
// ids/weights [T, k]; and sigmoid(x · shared_gate) -> sgate [T] when shared_gate is given.
// done: [T] zero-initialised counters, left at zero (the router's last block per token runs its top-k).
// With norm.w set the router sees rms_norm(x)·norm.w (moe_norm_stageable must hold).
// With logits_only the staged router (one token) leaves the top-k to the experts (moe_experts_pick).
void moe_route(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const void* x, int64_t x_stride, int x_elem,
               int T, int E, int k, bool renorm, float* logits, int* ids, float* weights, float* sgate, int* done,
               StageNorm norm, bool logits_only, cudaStream_t s);
// What experts that pick their top-k themselves pick from (both null: ids are given): the router's
// logits, or its sums (RouteSums, E + 1 with the shared gate's), from which a shared-expert block
// (block (0, 0) where there is none) also derives the weights and the shared expert's gate (sgate)
// once it has the norm's rsqrt.
struct TopK {
  const float* logits = nullptr;
  unsigned long long* sums = nullptr;
  float* sgate = nullptr;  // with sums and a shared expert
  int E = 0;
  bool renorm = false;
  __host__ __device__ bool any() const { return logits || sums; }
};

// cols of RouteSums for a router, its shared-expert gate row (null: none) and the norm's weights.
void route_columns(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const float* norm, bf16* cols, int ld,
                   cudaStream_t s);
// True where one token's experts take the staged gate+up kernels, whose blocks then run the
// softmax + top-k themselves (sparing the router its last-block round trip).
bool moe_experts_pick(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                      const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k, int T);
// Decode path (few tokens): all selected experts (and the shared one) in one launch each for
// gate+up and for down; out = Σ w·expert + sgate·shared (added to out where out.add). With norm.w
// set the experts see rms_norm(x)·norm.w (moe_norm_stageable must hold). With pick.logits set
// (moe_experts_pick must hold) the gate+up blocks pick the top-k and write ids and weights.
void moe_decode(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                const DeviceMatrix* s_gate, const DeviceMatrix* s_up, const DeviceMatrix* s_down, const void* x,
                int64_t x_stride, int x_elem, int T, int k, int* ids, float* weights, const float* sgate,
                float* act, StageNorm norm, TopK pick, const GemvOut& out, cudaStream_t s);
// True when router and experts stage their input (router staged with its shared gate, experts
// staged), so that both can apply the block's norm themselves.
bool moe_norm_stageable(const DeviceMatrix& router, const DeviceMatrix* shared_gate, const DeviceMatrix& gate,
                        const DeviceMatrix& up, const DeviceMatrix& down, const DeviceMatrix* s_gate,
                        const DeviceMatrix* s_up, const DeviceMatrix* s_down, int k, int T, int64_t x_stride);
// Prefill path: builds per-expert row lists on the device (padded to kGemmTileM), returns nothing
// to the host. row_token [max_rows], slot_row [T·k], tile_expert [max_rows / kGemmTileM]. With
// `shared`, rows 0..T-1 (the first tiles, marked expert E) are the T tokens for the shared expert
// (RidingExpert), the routed experts' tiles after them.
void moe_plan(const int* ids, int T, int k, int E, bool shared, int max_rows, int* counts, int* row_token,
              int* slot_row, int* tile_expert, cudaStream_t s);
// The tiles moe_plan fills for T tokens' top-k picks among E experts: every routed tile has a row,
// and an expert of c rows fills ceil(c / kGemmTileM), so there are at most min(T·k, T·k / kGemmTileM +
// min(E, T·k)), plus the shared expert's. Launches over the tiles take this many, not the plan
// buffer's count (sized for the largest step), which would leave most of their blocks empty.
inline int moe_tiles(int T, int k, int E, bool shared) {
  const int n = T * k;
  return std::min(n, n / kGemmTileM + std::min(E, n)) + (shared ? (T + kGemmTileM - 1) / kGemmTileM : 0);
}
// out[t] = Σ_j weights[t,j]·y[slot_row[t·k+j]] (+ sgate[t]·shared[t]); with an fp32 `residual`,
// residual[t] += that sum rounded to bf16 instead (out is not written).
void moe_combine(const bf16* y, int64_t y_stride, const int* slot_row, const float* weights, int T, int k, int H,
                 const float* sgate, const bf16* shared, int64_t shared_stride, bf16* out, int64_t out_stride,
                 float* residual, int64_t residual_stride, cudaStream_t s);

// ---- sampling.cu ---------------------------------------------------------------------------------
// Where a final kernel posts its token for the host: (seq << 32) | token, one 8-byte store into
// mapped pinned memory that the host spins on (TokenMailbox); word null: nothing posted.
struct TokenPost {
  unsigned long long* word = nullptr;
  unsigned int seq = 0;
  const unsigned int* seq_at = nullptr;  // set: the number is read here (a recorded kernel's post)
};
// The host end of a TokenPost: a copy and a stream sync per token cost more than the host spinning
// on the word's sequence number.
class TokenMailbox {
 public:
  TokenMailbox();
  ~TokenMailbox();
  TokenMailbox(const TokenMailbox&) = delete;
  TokenMailbox& operator=(const TokenMailbox&) = delete;
  // The post of the next token: a fresh sequence number.
  TokenPost next();
  // A fresh sequence number, also written to mapped memory, where the post current(true) gives (a
  // kernel recorded once in a graph, replayed every step) reads it.
  void advance();
  // recorded: the post whose kernel reads the number advance() staged; else the number by value.
  TokenPost current(bool recorded) const;
  // Spins until the token of the last next() or advance() is posted. A stream error (its kernel
  // then never posts) throws: the stream is queried every so often while spinning.
  int32_t wait(cudaStream_t s) const;

 private:
  unsigned long long *host_ = nullptr, *device_ = nullptr;
  unsigned int *host_seq_ = nullptr, *device_seq_ = nullptr;  // mapped: advance()'s number
  unsigned int seq_ = 0;
};

// Index of the largest of n fp32 logits (lowest index on ties) -> *out where out is set, and posted.
// scratch: 2·kArgmaxCandidates floats of device memory for the per-block candidates.
constexpr int kArgmaxBlocks = 128;
constexpr int kArgmaxCandidates = 256;  // the first stage's blocks, or an LM head's (linear_argmax)
void argmax(const float* logits, int n, float* scratch, int* out, TokenPost post, cudaStream_t s);
// Where the per-block candidates sit in argmax's scratch.
__host__ __device__ inline ArgmaxCandidates argmax_candidates(float* scratch) {
  return {scratch, reinterpret_cast<int*>(scratch + kArgmaxCandidates)};
}
// argmax's last stage alone, over the `count` candidates a GEMV left in scratch (linear_argmax).
void argmax_final(float* scratch, int count, int* out, TokenPost post, cudaStream_t s);

// The device sampler (semantics: the CPU Sampler), over a batch of rows in one set of launches:
// each row's parameters and scratch are a SampleJob in a device table, and every kernel takes the
// table with one grid row (blockIdx.y) per job, so a step's draws cost the launches of one.
// Penalty history: per token id, its occurrences in the window and among generated tokens in it.
struct PenaltyCounts {
  int* in_window = nullptr;
  int* generated = nullptr;
};
// One change of the history: token's counts move by `window` and `generated` (+1 on arrival, -1
// when it leaves a penalty_last_n window).
struct CountDelta {
  int token, window, generated;
};
void apply_count_deltas(PenaltyCounts counts, const CountDelta* deltas, int n, cudaStream_t s);
struct PenaltyParams {
  float repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
};
// The kept set is every candidate (z > -inf) whose key - z, then the lower id - is >= `cut`; the
// filters only raise the cut. Zero-filled = everything kept.
struct SelectState {
  unsigned long long cut, prefix, remaining;
  int done;
};
constexpr int kSampleChunk = 2048;  // tokens per block in the selection and draw kernels
inline int sample_blocks(int n) { return div_up(n, kSampleChunk); }

// One row's draw. The steps, each over every job that needs it:
//  1. adjusted = logits, penalised where `penalties` (by counts and pp), then the sparse logit bias
//     (bias_ids unique) added, then -inf for each token `allowed` (a bit per token, as
//     grammar::Matcher::mask) leaves out; skipped when none applies (scores then points at logits);
//  2. top = argmax of scores (lowest id on ties); greedy rows post it and end here (-1 when a mask
//     allows no token);
//  3. z[i] = (scores[i] - scores[top]) · inv_t: the log of each token's weight relative to the top
//     one (0 for tokens level with a top of +inf: relative_logit in generate/sampler.cpp);
//  4. top-k (top_k > 0), then top-p (top_p < 1): each raises the cut by radix selection (top-k to
//     the k-th largest kept key; top-p to the key where the kept weight summed from the largest
//     down first reaches top_p of the kept total, the crossing token kept);
//  5. posts the kept token (key >= cut and z >= min_z) at which the weights exp(z), summed in id
//     order, first exceed u · their total (the last kept token if rounding leaves none; -1 when
//     nothing is kept).
struct SampleJob {
  const float* logits = nullptr;
  const float* scores = nullptr;  // adjusted, or logits when nothing adjusts them
  float* adjusted = nullptr;      // n floats
  float* z = nullptr;             // n floats
  PenaltyCounts counts;
  PenaltyParams pp;
  int penalties = 0;
  const int* bias_ids = nullptr;
  const float* bias = nullptr;
  int n_bias = 0;
  const uint32_t* allowed = nullptr;
  float* argmax_scratch = nullptr;  // 2·kArgmaxCandidates floats
  int* top = nullptr;
  int greedy = 1;
  int top_k = 0;
  float inv_t = 1.0f, top_p = 1.0f, min_z = 0.0f;
  double u = 0.0;
  SelectState* state = nullptr;
  unsigned long long* hist = nullptr;  // 256·sample_blocks(n) u64
  double* partial = nullptr;           // sample_blocks(n) doubles
  TokenPost post;
};
// What the launches of a batch depend on: the rows, and which steps any of them needs.
struct SampleBatch {
  int rows = 0;
  int max_bias = 0;
  bool adjust = false, sampled = false, top_k = false, top_p = false;
};
// Runs the steps above for the `batch.rows` jobs at `jobs` (device memory), n logits each.
void sample_rows(const SampleJob* jobs, const SampleBatch& batch, int n, cudaStream_t s);

// ---- weights.cu ----------------------------------------------------------------------------------
// MLX-scheme affine quantisation of a bf16 [rows, cols] matrix on the device.
void quantize_affine(const bf16* w, int rows, int cols, int bits, int group, uint32_t* q, bf16* scales,
                     bf16* biases, cudaStream_t s);
// Fills n bf16 values with uniform noise in [-scale, scale] (synthetic benchmark weights).
void fill_random_bf16(bf16* p, int64_t n, float scale, uint64_t seed, cudaStream_t s);
// Fills n words with random bits, each word ANDed with `mask` (0xF7F7F7F7: FP8 codes that are never NaN).
void fill_random_u32(uint32_t* p, int64_t n, uint64_t seed, cudaStream_t s, uint32_t mask = ~0u);

}  // namespace petrel::cuda
