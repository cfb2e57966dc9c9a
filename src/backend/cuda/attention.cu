// Causal GQA attention over a bf16 KV cache, split-K over the context (flash-decoding style):
// each block reduces one key range of one KV head for all the query heads that share it, with an
// online softmax (on tensor cores for head_dim 64-256, on CUDA cores for 32); a second kernel
// merges the ranges. Decode and the shapes the tensor-core prefill kernel (attention_prefill.cu)
// does not cover.
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/norm_rope.cuh"

#include <type_traits>

namespace petrel::cuda {
namespace {

constexpr int kMaxSplits = 64;  // key ranges the combine kernel merges
constexpr int kTileKeys = 32;   // keys a block stages at a time: one per lane when scoring
constexpr int kMinRangeKeys = 8;  // a short context's keys spread over ranges of this many (latency)
constexpr int kShortAttentionKeys = kCudaShortAttentionKeys;  // attention_short's contexts, at most

// grid (T): row t at *pos0 + t of kc, vc; with rows.pos, at rows.pos[t] of its own caches.
__global__ void kv_append_kernel(const bf16* k, const bf16* v, int64_t stride, int width, bf16* kc, bf16* vc,
                                 const int* pos0, KvRows rows) {
  pdl_enter();
  const int t = blockIdx.x;
  if (rows.pos) {
    kc = rows.k[t];
    vc = rows.v[t];
  }
  const int64_t dst = int64_t(rows.pos ? rows.pos[t] : *pos0 + t) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    kc[dst + i] = k[t * stride + i];
    vc[dst + i] = v[t * stride + i];
  }
}

// Keys query row t attends to (causal: keys 0..its position).
__device__ __forceinline__ int keys_of_row(int t, const int* pos0, const KvRows& rows) {
  return (rows.pos ? rows.pos[t] : *pos0 + t) + 1;
}

// Keys per range of a context of n keys over at most `splits` ranges: at least kMinRangeKeys, so
// that short contexts use few ranges (those past the last key are left empty and never merged).
__device__ __forceinline__ int keys_per_split(int n_keys, int splits) {
  return max(kMinRangeKeys, (n_keys + splits - 1) / splits);
}

// PER bf16 values at p (this lane's slice of a row: lane·PER..) as floats.
template <int PER>
__device__ __forceinline__ void load_slice(const bf16* p, float (&out)[PER]) {
  if constexpr (PER % 2 == 0) {
#pragma unroll
    for (int i = 0; i < PER; i += 2) {
      const float2 f = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(p)[i / 2]);
      out[i] = f.x;
      out[i + 1] = f.y;
    }
  } else {
    out[0] = __bfloat162float(p[0]);
  }
}

// One round of reduce_scatter32: a lane keeps the half of v[0..2·O) its lane bit O picks (the
// upper half moved down) plus the same half from the lane O away.
template <int O>
__device__ __forceinline__ void reduce_scatter_round(float (&v)[kTileKeys], int lane) {
  const bool upper = lane & O;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = upper ? v[i] : v[i + O], keep = upper ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
  if constexpr (O > 1) reduce_scatter_round<O / 2>(v, lane);
}

// Sums v[j] over the warp's lanes for all 32 j at once, lane j keeping the sum of v[j]: a
// reduce-scatter of 31 shuffles instead of 32 sums of 5.
__device__ __forceinline__ float reduce_scatter32(float (&v)[kTileKeys], int lane) {
  reduce_scatter_round<kTileKeys / 2>(v, lane);
  return v[0];
}

// Whole block, the PDL wait included: the copies of a range's first two tiles. With `settled`, the
// keys before first_new go out before the wait (issue(tile, limit): cp.async of the keys before
// limit) and the chunk's own keys after it by plain loads (copy_rest(tile, from)); else all after.
template <typename Issue, typename CopyRest>
__device__ __forceinline__ void fetch_first_tiles(bool settled, int first_new, int end, Issue issue,
                                                  CopyRest copy_rest) {
  if (settled) {
    issue(0, first_new);
    issue(1, first_new);
    pdl_wait();
    copy_rest(0, first_new);
    copy_rest(1, first_new);
  } else {
    pdl_wait();
    issue(0, end);
    issue(1, end);
  }
}

// grid (T, Hkv, splits), a warp per query head of the KV head (Hq / Hkv warps). Partial record of
// query head h, range `split`: [m, l, acc[D]] (unnormalised accumulator; element lane·PER + i
// from lane's i). Query t is at *pos0 + t of kc, vc; with rows.pos (a batched step), at
// rows.pos[t] of its own caches. The block copies its range's keys and values tile by tile into
// shared memory (two tiles in flight, cp.async), so every K/V byte is read once for all the
// heads sharing it; a warp scores a tile's 32 keys at once (lane j ends with key j's score) and
// folds them into its online softmax. With `settled` (no kernel that may still run writes the
// keys before the chunk's own: inside a recorded decode step) the first two tiles' older keys
// are copied before the PDL wait, only the chunk's new keys after it.
template <int PER>  // D / 32 elements per lane
__global__ void attention_partial_kernel(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, int Hq,
                                         int Hkv, const int* pos0, KvRows rows, bool settled, float* partial) {
  constexpr int D = PER * 32, row_bytes = D * 2, row_chunks = row_bytes / 16;
  constexpr int tile_bytes = kTileKeys * row_bytes;  // of keys or of values
  extern __shared__ uint4 kv_tiles[];                 // [2 stages][keys, values][kTileKeys][D] bf16
  pdl_launch_dependents();
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = kvh * (Hq / Hkv) + warp;
  if (rows.pos) {
    kc = rows.k[t];
    vc = rows.v[t];
  }
  // Positions are staged by the host before the step: readable before the wait.
  const int first_new = rows.pos ? rows.pos[t] : *pos0;  // keys from here on are the chunk's own
  const int n_keys = keys_of_row(t, pos0, rows), per = keys_per_split(n_keys, splits);
  const int begin = split * per, end = min(n_keys, begin + per);
  if (begin >= end) return;  // past the context: the combine reads the ranges in use only
  const int64_t kv_stride = int64_t(Hkv) * D;
  char* smem = reinterpret_cast<char*>(kv_tiles);
  // Chunk r of the tile's keys (values from r = n·row_chunks on): its source and place in the stage.
  auto chunk = [&](int tile, int n, int r, const bf16** src) {
    const int values = r >= n * row_chunks, i = r - values * n * row_chunks;
    *src = (values ? vc : kc) + (begin + tile * kTileKeys + i / row_chunks) * kv_stride + int64_t(kvh) * D +
           (i % row_chunks) * 8;
    return smem + (tile % 2) * 2 * tile_bytes + values * tile_bytes + i * 16;
  };
  // Whole block: keys (and values) [s0, min(s0 + kTileKeys, end, limit)) of `tile` into stage
  // tile % 2, one copy group (empty past the range, which keeps the wait count fixed).
  auto issue = [&](int tile, int limit) {
    const int s0 = begin + tile * kTileKeys, n = min(kTileKeys, end - s0), m = min(n, limit - s0);
    for (int i = threadIdx.x; m > 0 && i < n * row_chunks * 2; i += blockDim.x) {
      const int key = (i % (n * row_chunks)) / row_chunks;
      const bf16* src;
      char* dst = chunk(tile, n, i, &src);
      if (key < m) cp_async16(smem_addr(dst), src, true);
    }
    cp_async_commit();
  };
  // Whole block: the keys of `tile` from `from` on by plain loads (seen after the next barrier).
  auto copy_rest = [&](int tile, int from) {
    const int s0 = begin + tile * kTileKeys, n = min(kTileKeys, end - s0);
    for (int i = threadIdx.x; n > 0 && i < n * row_chunks * 2; i += blockDim.x) {
      const int key = (i % (n * row_chunks)) / row_chunks;
      const bf16* src;
      char* dst = chunk(tile, n, i, &src);
      if (s0 + key >= from) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    }
  };
  fetch_first_tiles(settled, first_new, end, issue, copy_rest);
  const int tiles = div_up(end - begin, kTileKeys);
  const float scale = rsqrtf(float(D));
  float qv[PER], acc[PER];
  load_slice<PER>(q + t * q_stride + int64_t(h) * D + lane * PER, qv);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    qv[i] *= scale;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int tile = 0; tile < tiles; ++tile) {
    cp_async_wait<1>();
    __syncthreads();  // the tile's copies (every thread's) have landed
    const bf16* ks = reinterpret_cast<const bf16*>(smem + (tile % 2) * 2 * tile_bytes);
    const bf16* vs = ks + kTileKeys * D;
    const int n = min(kTileKeys, end - begin - tile * kTileKeys);
    float part[kTileKeys];
#pragma unroll
    for (int j = 0; j < kTileKeys; ++j) {  // keys in groups of 8, up to the tile's last (shared memory reads)
      part[j] = 0.0f;
      if (j / 8 * 8 >= n) continue;
      float kv[PER];
      load_slice<PER>(ks + j * D + lane * PER, kv);
#pragma unroll
      for (int i = 0; i < PER; ++i) part[j] += qv[i] * kv[i];
    }
    float score = reduce_scatter32(part, lane);
    if (lane >= n) score = -INFINITY;  // past the range: the slots hold stale or no keys
    const float m_new = fmaxf(m, warp_max(score));
    const float corr = __expf(m - m_new), p = lane < n ? __expf(score - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[i] *= corr;
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      float vv[PER];
      load_slice<PER>(vs + j * D + lane * PER, vv);
#pragma unroll
      for (int i = 0; i < PER; ++i) acc[i] += pj * vv[i];
    }
    m = m_new;
    __syncthreads();  // every warp is done with the stage: the tile two on may take it
    issue(tile + 2, end);
  }
  float* rec = partial + ((int64_t(t) * Hq + h) * splits + split) * (D + 2);
  if (lane == 0) {
    rec[0] = m;
    rec[1] = l;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) rec[2 + lane * PER + i] = acc[i];
}

// ---- The same records on tensor cores (head_dim 64, 128, 256; up to 16 query heads a KV head) ----

constexpr int kMmaKeys = 64;   // keys a tile holds
constexpr int kMmaWarps = 4;   // each scores the whole tile and accumulates a quarter of the dims

// Whole block: rows [0, copy_to) of a tile (row r: key s0 + r of one KV head) into the swizzled
// [kMmaKeys][D] key and value tiles at sK and sV by cp.async, rows from zero_from on zero-filled
// (past the range: P·V must meet zeros, not stale values); rows between are left to the caller.
template <int D>
__device__ void issue_kv_rows(uint32_t sK, uint32_t sV, const bf16* kh, const bf16* vh, int64_t stride, int s0,
                              int copy_to, int zero_from) {
  constexpr int chunks = D / 8;
  for (int i = threadIdx.x; i < kMmaKeys * chunks; i += blockDim.x) {
    const int r = i / chunks, c = 8 * (i % chunks);
    const bool copy = r < copy_to;
    if (!copy && r < zero_from) continue;
    cp_async16(sK + swz<D>(r, c), copy ? kh + (s0 + r) * stride + c : kh, copy);
    cp_async16(sV + swz<D>(r, c), copy ? vh + (s0 + r) * stride + c : vh, copy);
  }
}

// grid (T, Hkv, splits), kMmaWarps warps: attention_partial_kernel's records, the Hq / Hkv query
// heads of a KV head as the rows of one m16n8k16 tile (Q·Kᵀ and P·V on tensor cores, P rounded to
// bf16 as in the prefill kernel). Every warp scores the whole key tile (the rows are few) and
// accumulates its quarter of the head dimensions; keys and values stream through two shared-memory
// stages of kMmaKeys keys, the older keys before the PDL wait where `settled`.
template <int D>
__global__ void __launch_bounds__(32 * kMmaWarps)
    attention_partial_mma_kernel(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc, int Hq, int Hkv,
                                 const int* pos0, KvRows rows, bool settled, float* partial, NewKv fresh_kv) {
  constexpr int NT = D / 8 / kMmaWarps, chunks = D / 8;  // a warp's 8-dim output fragments
  constexpr uint32_t tile_bytes = kMmaKeys * D * 2;
  extern __shared__ __align__(16) unsigned char smem[];  // Q [16][D], then 2 stages of K, V [kMmaKeys][D]
  const uint32_t sQ = smem_addr(smem);
  auto sK = [&](int tile) { return sQ + 16 * D * 2 + uint32_t(tile % 2) * 2 * tile_bytes; };
  pdl_launch_dependents();
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, G = Hq / Hkv;
  if (rows.pos) {
    kc = rows.k[t];
    vc = rows.v[t];
  }
  const int first_new = rows.pos ? rows.pos[t] : *pos0;  // staged by the host: readable before the wait
  const int n_keys = keys_of_row(t, pos0, rows), per = keys_per_split(n_keys, splits);
  const int begin = split * per, end = min(n_keys, begin + per);
  if (begin >= end) return;
  const int64_t kv_stride = int64_t(Hkv) * D;
  const bf16 *kh = kc + int64_t(kvh) * D, *vh = vc + int64_t(kvh) * D;
  auto keys_in = [&](int tile) { return max(0, min(kMmaKeys, end - begin - tile * kMmaKeys)); };
  auto issue = [&](int tile, int limit) {  // keys before `limit` (one copy group, empty past the range)
    const int s0 = begin + tile * kMmaKeys, n = keys_in(tile);
    if (n > 0) issue_kv_rows<D>(sK(tile), sK(tile) + tile_bytes, kh, vh, kv_stride, s0, max(0, min(n, limit - s0)), n);
    cp_async_commit();
  };
  auto copy_rest = [&](int tile, int from) {  // keys from `from` on, by plain loads
    const int s0 = begin + tile * kMmaKeys, n = keys_in(tile);
    for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
      const int r = i / chunks, c = 8 * (i % chunks);
      if (s0 + r < from) continue;
      unsigned char* k_at = smem + (sK(tile) - sQ) + swz<D>(r, c);
      *reinterpret_cast<uint4*>(k_at) = *reinterpret_cast<const uint4*>(kh + (s0 + r) * kv_stride + c);
      *reinterpret_cast<uint4*>(k_at + tile_bytes) = *reinterpret_cast<const uint4*>(vh + (s0 + r) * kv_stride + c);
    }
  };
  // With fresh_kv the new key (first_new, the row's last) is not in the cache yet: no copy reads
  // it, and the range ending with it appends it and places it in its tile itself.
  const bool fresh = fresh_kv.k != nullptr, appends = fresh && end == n_keys;
  const int tiles = div_up(end - begin, kMmaKeys), last_tile = tiles - 1;
  const int copy_limit = fresh ? first_new : end;
  uint4 nk = make_uint4(0, 0, 0, 0), nv = nk;  // warp 0 of the appending range: chunk `lane` of the new key, value
  fetch_first_tiles(settled, first_new, copy_limit, issue, [&](int tile, int from) {
    if (!fresh) copy_rest(tile, from);
  });
  auto place_new = [&](int tile) {  // warp 0: the new key and value into their row of the tile's stage
    unsigned char* kt = smem + (sK(tile) - sQ);
    const int r = first_new - begin - tile * kMmaKeys;
    if (lane < chunks) {
      *reinterpret_cast<uint4*>(kt + swz<D>(r, 8 * lane)) = nk;
      *reinterpret_cast<uint4*>(kt + tile_bytes + swz<D>(r, 8 * lane)) = nv;
    }
  };
  if (appends && warp == 0) {
    const int64_t src = t * fresh_kv.stride + int64_t(kvh) * D + 8 * lane, at = first_new * kv_stride + 8 * lane;
    if (lane < chunks) {
      nk = *reinterpret_cast<const uint4*>(fresh_kv.k + src);
      nv = *reinterpret_cast<const uint4*>(fresh_kv.v + src);
      *reinterpret_cast<uint4*>(const_cast<bf16*>(kh) + at) = nk;
      *reinterpret_cast<uint4*>(const_cast<bf16*>(vh) + at) = nv;
    }
    if (last_tile < 2) place_new(last_tile);
  }
  for (int i = threadIdx.x; i < 16 * chunks; i += blockDim.x) {  // Q: the group's heads, then zero rows
    const int r = i / chunks, c = 8 * (i % chunks);
    const uint4 v = r < G ? *reinterpret_cast<const uint4*>(q + t * q_stride + int64_t(kvh * G + r) * D + c)
                          : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(smem + swz<D>(r, c)) = v;
  }
  const float scale = rsqrtf(float(D)), scale_log2 = scale * 1.44269504088896341f;
  float o[NT][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int tile = 0; tile < tiles; ++tile) {
    cp_async_wait<1>();
    __syncthreads();  // the tile (and Q, the plain copies) in shared memory
    const int n = keys_in(tile);
    float s[kMmaKeys / 8][4];
    scores<D, kMmaKeys>(sQ, sK(tile), 0, lane, s);
    mask_keys_from<kMmaKeys>(s, n, lane);
    online_softmax<kMmaKeys, NT>(s, m, l, o, scale_log2);
    accumulate_pv<D, kMmaKeys, NT>(s, sK(tile) + tile_bytes, lane, warp * 8 * NT, o);
    __syncthreads();  // every warp is done with the stage: the tile two on may take it
    issue(tile + 2, copy_limit);
    if (appends && warp == 0 && tile + 2 == last_tile) place_new(last_tile);
  }
  // Rows g and g + 8 (g = lane / 4) are heads kvh·G + g and kvh·G + g + 8 where below G; a quad
  // holds each row's sum in parts.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = lane / 4 + 8 * half;
    float sum = l[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (row >= G) continue;
    float* rec = partial + ((int64_t(t) * Hq + kvh * G + row) * splits + split) * (D + 2);
    if (warp == 0 && lane % 4 == 0) {
      rec[0] = m[half] * scale;  // the natural-log maximum the combine expects
      rec[1] = sum;
    }
#pragma unroll
    for (int b = 0; b < NT; ++b)
#pragma unroll
      for (int e = 0; e < 2; ++e) rec[2 + warp * 8 * NT + 8 * b + 2 * (lane % 4) + e] = o[b][2 * half + e];
  }
}

// The merge of `used` key ranges' records (m, l, then D elements) for element i of a head: the
// weighted sum of the ranges' elements over the sum of their weights l·exp(m - max m). Latency
// decides the combine's time, so each form issues its loads together.

// Up to kFewRanges (a short context): each thread loads every range's (m, l) and weighs them itself.
constexpr int kFewRanges = 16;
template <int D>
__device__ __forceinline__ float merge_few_ranges(const float* base, int used, int i) {
  float m[kFewRanges], l[kFewRanges], a[kFewRanges];
#pragma unroll
  for (int u = 0; u < kFewRanges; ++u) {
    const float* rec = base + u * (D + 2);
    const bool in = u < used;
    m[u] = in ? rec[0] : -INFINITY;
    l[u] = in ? rec[1] : 0.0f;
    a[u] = in ? rec[2 + i] : 0.0f;
  }
  float M = -INFINITY;
#pragma unroll
  for (int u = 0; u < kFewRanges; ++u) M = fmaxf(M, m[u]);
  float L = 0.0f, acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kFewRanges; ++u) {
    const float c = u < used ? __expf(m[u] - M) : 0.0f;
    L += l[u] * c;
    acc += a[u] * c;
  }
  return acc / L;
}

// Up to kMaxSplits (a long context): one round trip where groups of kFewRanges took four. Each
// thread loads its element of every range; lane r of each warp ranges r and r + 32's (m, l), from
// which the warp finds the maximum, each range's weight and their sum without a barrier.
static_assert(kMaxSplits <= 64, "merge_many_ranges: two ranges a lane");
template <int D>
__device__ __forceinline__ float merge_many_ranges(const float* base, int used, int i) {
  const int lane = i % 32;
  float a[kMaxSplits];
#pragma unroll
  for (int u = 0; u < kMaxSplits; ++u) a[u] = u < used ? base[u * (D + 2) + 2 + i] : 0.0f;
  float m[2], l[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = lane + 32 * j;
    m[j] = r < used ? base[r * (D + 2)] : -INFINITY;
    l[j] = r < used ? base[r * (D + 2) + 1] : 0.0f;
  }
  const float M = warp_max(fmaxf(m[0], m[1]));
  float c[2];  // the weight exp(m - M) of lane r's ranges (0 past the ranges in use)
#pragma unroll
  for (int j = 0; j < 2; ++j) c[j] = lane + 32 * j < used ? __expf(m[j] - M) : 0.0f;
  const float L = warp_sum(l[0] * c[0] + l[1] * c[1]);
  float acc = 0.0f;
#pragma unroll
  for (int u = 0; u < kMaxSplits; ++u)
    if (u < used) acc += a[u] * __shfl_sync(0xffffffffu, c[u / 32], u % 32);
  return acc / L;
}

// grid (T, Hq), a thread per head dimension: merges the ranges in use, normalises, applies the
// sigmoid output gate. The form is uniform over the block (`used` is the row's).
template <int PER>
__global__ void __launch_bounds__(32 * PER)
    attention_combine_kernel(const float* partial, int Hq, int splits, const int* pos0, KvRows rows, const bf16* gate,
                             int64_t gate_stride, bf16* out, int64_t out_stride) {
  pdl_enter();
  constexpr int D = PER * 32;
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const int n_keys = keys_of_row(t, pos0, rows), used = div_up(n_keys, keys_per_split(n_keys, splits));
  const float* base = partial + (int64_t(t) * Hq + h) * splits * (D + 2);
  const int64_t col = int64_t(h) * D + i;
  const float g = gate ? sigmoidf_(__bfloat162float(gate[t * gate_stride + col])) : 1.0f;
  const float o = used <= kFewRanges ? merge_few_ranges<D>(base, used, i) : merge_many_ranges<D>(base, used, i);
  out[t * out_stride + col] = __float2bfloat16(o * g);
}

template <int PER>
void launch(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, const int* pos0,
            const KvRows& rows, bool settled, int splits, float* partial, const NewKv& fresh, const bf16* gate,
            int64_t gate_stride, bf16* out, int64_t out_stride, cudaStream_t s) {
  // Two stages of keys and values; a grid of one wave also takes more than half a multiprocessor's
  // shared memory: its blocks, launched early (PDL), would otherwise pack three to each of the
  // first multiprocessors to free up, where their dot products queue behind each other.
  constexpr int D = PER * 32;
  const size_t one_wave = int64_t(T) * Hkv * splits <= sm_count() ? kOneBlockPerSmSmem : 0;
  const bool aligned = reinterpret_cast<uintptr_t>(q) % 16 == 0 && q_stride % 8 == 0;
  bool on_tensor_cores = false;
  if constexpr (D >= 64) {
    on_tensor_cores = Hq / Hkv <= 16 && aligned;
    if (on_tensor_cores) {
      const size_t smem = std::max<size_t>((16 + 2 * 2 * kMmaKeys) * D * sizeof(bf16), one_wave);
      allow_dynamic_smem<attention_partial_mma_kernel<D>>(smem);
      launch_pdl(attention_partial_mma_kernel<D>, dim3(T, Hkv, splits), 32 * kMmaWarps, smem, s, q, q_stride, kc, vc,
                 Hq, Hkv, pos0, rows, settled, partial, fresh);
    }
  }
  check(on_tensor_cores || !fresh.k, "CUDA attention: appending needs the tensor-core kernel (attention_appends)");
  if (!on_tensor_cores) {
    const size_t smem = std::max<size_t>(2 * 2 * size_t(kTileKeys) * D * sizeof(bf16), one_wave);
    allow_dynamic_smem<attention_partial_kernel<PER>>(smem);
    launch_pdl(attention_partial_kernel<PER>, dim3(T, Hkv, splits), 32 * (Hq / Hkv), smem, s, q, q_stride, kc, vc, Hq,
               Hkv, pos0, rows, settled, partial);
  }
  PETREL_LAUNCHED("attention_partial");
  launch_pdl(attention_combine_kernel<PER>, dim3(T, Hq), 32 * PER, 0, s, partial, Hq, splits, pos0, rows, gate,
             gate_stride, out, out_stride);
  PETREL_LAUNCHED("attention_combine");
}

// ---- Short contexts: q/k norm + RoPE, the append and the attention of one token in one launch ----

// grid (Hq), a block of D threads per query head, one token at *pos0 with n = *pos0 + 1 <=
// kShortAttentionKeys keys. Where the split-K path runs three kernels (qk_norm_rope, the partial
// ranges, the combine) and two boundaries of ~1.2 us each for a few dozen keys, this block holds its
// KV head's older keys and values in shared memory (copied before the PDL wait where `settled`),
// normalises and rotates its q and the new k (warps 0 and 1, norm_rope_head: qk_norm_rope's bits),
// scores a key a thread and sums the values a dimension a thread. The first block of each KV head
// writes the new key and value to the cache; the others use their own copy of them.
template <int PER>  // D / 32
__global__ void __launch_bounds__(32 * PER) attention_short_kernel(ShortAttention a) {
  constexpr int D = 32 * PER, kWarps = PER, row_pieces = D * 2 / 16;
  constexpr int kPitch = D + 8;  // keys' row pitch: a thread per key reads 16 bytes of each row at once
  extern __shared__ __align__(16) unsigned char kv_smem[];
  bf16* ks = reinterpret_cast<bf16*>(kv_smem);  // [kShortAttentionKeys][kPitch] keys
  bf16* vs = ks + kShortAttentionKeys * kPitch;  // [kShortAttentionKeys][D] values
  __shared__ __align__(16) float q_head[D];
  __shared__ float k_head[D], weight[kShortAttentionKeys], part[2][kWarps];
  pdl_launch_dependents();
  const int h = blockIdx.x, group = a.Hq / a.Hkv, kvh = h / group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int pos = *a.pos0, n = pos + 1;  // staged by the host before the step: readable before the wait
  const int64_t kv_width = int64_t(a.Hkv) * D;
  const bf16* kc = a.kc + int64_t(kvh) * D;
  const bf16* vc = a.vc + int64_t(kvh) * D;
  auto copy_older = [&]() {  // keys and values 0..pos-1 of the KV head
    for (int i = tid; i < pos * row_pieces; i += blockDim.x) {
      const int row = i / row_pieces, piece = i % row_pieces;
      cp_async16(smem_addr(ks + row * kPitch + piece * 8), kc + row * kv_width + piece * 8, true);
      cp_async16(smem_addr(vs + row * D + piece * 8), vc + row * kv_width + piece * 8, true);
    }
    cp_async_commit();
  };
  if (a.settled) copy_older();
  pdl_wait();
  if (!a.settled) copy_older();
  const float position = float(pos);
  if (warp == 0) norm_rope_head(a.q + int64_t(h) * D, a.q_norm, D, a.eps, a.rotary, a.theta, position, q_head);
  if (warp == 1) norm_rope_head(a.k + int64_t(kvh) * D, a.k_norm, D, a.eps, a.rotary, a.theta, position, k_head);
  const bf16 v_new = a.v[int64_t(kvh) * D + tid];
  const float gate = a.gate ? sigmoidf_(__bfloat162float(a.gate[int64_t(h) * D + tid])) : 1.0f;
  cp_async_wait<0>();
  __syncthreads();  // q and the new k normed and rotated, the older keys landed
  const bf16 k_new = __float2bfloat16(k_head[tid]);  // already a bf16 value: exact
  ks[pos * kPitch + tid] = k_new;
  vs[pos * D + tid] = v_new;
  if (h % group == 0) {
    a.kc[int64_t(pos) * kv_width + int64_t(kvh) * D + tid] = k_new;
    a.vc[int64_t(pos) * kv_width + int64_t(kvh) * D + tid] = v_new;
  }
  __syncthreads();  // the new key's row is in place
  float score = -INFINITY;
  if (tid < n) {
    float dot[4] = {};  // four chains: the loads and FMAs overlap
    const uint4* krow = reinterpret_cast<const uint4*>(ks + tid * kPitch);
    const float4* q4 = reinterpret_cast<const float4*>(q_head);
#pragma unroll 4
    for (int c = 0; c < D / 8; ++c) {
      const uint4 raw = krow[c];
      const float4 qa = q4[2 * c], qb = q4[2 * c + 1];
      const float2 k0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
      const float2 k1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
      const float2 k2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.z));
      const float2 k3 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.w));
      float& d = dot[c % 4];
      d = fmaf(qa.x, k0.x, d);
      d = fmaf(qa.y, k0.y, d);
      d = fmaf(qa.z, k1.x, d);
      d = fmaf(qa.w, k1.y, d);
      d = fmaf(qb.x, k2.x, d);
      d = fmaf(qb.y, k2.y, d);
      d = fmaf(qb.z, k3.x, d);
      d = fmaf(qb.w, k3.y, d);
    }
    score = ((dot[0] + dot[1]) + (dot[2] + dot[3])) * rsqrtf(float(D));
  }
  const float top_w = warp_max(score);
  if (lane == 0) part[0][warp] = top_w;
  __syncthreads();
  float top = part[0][0];
  for (int w = 1; w < kWarps; ++w) top = fmaxf(top, part[0][w]);
  const float e = tid < n ? __expf(score - top) : 0.0f;
  if (tid < kShortAttentionKeys) weight[tid] = e;
  const float sum_w = warp_sum(e);
  if (lane == 0) part[1][warp] = sum_w;
  __syncthreads();  // the weights and the warps' sums are in place
  float sum = 0.0f;
  for (int w = 0; w < kWarps; ++w) sum += part[1][w];
  float acc[4] = {};
  int i = 0;
  for (; i + 4 <= n; i += 4)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = fmaf(weight[i + j], __bfloat162float(vs[(i + j) * D + tid]), acc[j]);
  for (; i < n; ++i) acc[0] = fmaf(weight[i], __bfloat162float(vs[i * D + tid]), acc[0]);
  const float o = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  a.out[int64_t(h) * D + tid] = __float2bfloat16(o / sum * gate);
}

// ---- Longer contexts: the same one launch over a cluster of blocks per KV head ----

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ int cluster_rank() {
  int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// Two floats to `p` (8-byte aligned, this block's shared memory) in block `rank` of the cluster.
__device__ __forceinline__ void cluster_store2(float* p, int rank, float x, float y) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(remote), "f"(x), "f"(y) : "memory");
}
#endif

constexpr int kScorePitch = 2 * kMmaKeys + 8;  // floats a row of two tiles' shared scores (spreads the banks)
constexpr int kClusterWarps = 8;  // a cluster block's warps: each scores an eighth of a tile's keys
constexpr int kClusterKeys = kCudaClusterAttentionKeys;  // one cluster a KV head up to here
constexpr int kWideClusterKeys = kCudaWideClusterAttentionKeys;  // several, beyond, up to here
constexpr int kMaxClusterWidth = kClusterAttentionMaxWidth;
constexpr int kClusterMaxGroup = 8;  // query heads a KV head: the records keep the mma's rows 0-7

// For C > 1 clusters a KV head, a cluster's merge of output j of block r's slice travels as one
// 64-bit record: (log of its weight, top + ln L; its normalised output, acc / L). A record with
// every bit set is empty; the 64-bit store lands whole, so a reader needs no flag or fence.
constexpr unsigned long long kNoClusterRecord = ~0ull;
template <int D>
__device__ __forceinline__ unsigned long long* cluster_record(const ShortAttention& a, int kvh, int r, int c, int j) {
  constexpr int slice = kClusterMaxGroup * D / kClusterAttentionBlocks;
  return a.records + ((int64_t(kvh) * kClusterAttentionBlocks + r) * (kMaxClusterWidth - 1) + c) * slice + j;
}
__device__ __forceinline__ void store_cluster_record(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void put_cluster_record(unsigned long long* p, float top, float L, float acc) {
  float lw = top + __logf(L);  // an empty cluster (top = -inf, L = 0): -inf, weight 0
  if (isnan(lw)) lw = __int_as_float(0x7fffffff);  // a NaN never reads as the empty record
  store_cluster_record(p, uint64_t(__float_as_uint(L > 0.0f ? acc / L : 0.0f)) << 32 | __float_as_uint(lw));
}
__device__ __forceinline__ unsigned long long get_cluster_record(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The last cluster of a KV head (its last range holds the new key: as a rule the last to finish)
// folds the other C - 1 clusters' records of its output j into (top, L, acc), waiting for any not
// yet written (every cluster of the grid is resident: attention_cluster_width), and empties them
// for the next launch. One round trip where a count after a fence took three.
template <int D>
__device__ __forceinline__ void merge_cluster_records(const ShortAttention& a, int kvh, int r, int C, int j,
                                                      float& top, float& L, float& acc) {
  unsigned long long got[kMaxClusterWidth - 1];
#pragma unroll
  for (int c = 0; c < kMaxClusterWidth - 1; ++c)  // every record's load at once
    if (c < C - 1) got[c] = get_cluster_record(cluster_record<D>(a, kvh, r, c, j));
#pragma unroll
  for (int c = 0; c < kMaxClusterWidth - 1; ++c) {
    if (c >= C - 1) continue;
    while (got[c] == kNoClusterRecord) got[c] = get_cluster_record(cluster_record<D>(a, kvh, r, c, j));
    store_cluster_record(cluster_record<D>(a, kvh, r, c, j), kNoClusterRecord);
  }
  float T = top;
#pragma unroll
  for (int c = 0; c < kMaxClusterWidth - 1; ++c)
    if (c < C - 1) T = fmaxf(T, __uint_as_float(uint32_t(got[c])));
  const float w = __expf(top - T);
  L *= w;
  acc *= w;
#pragma unroll
  for (int c = 0; c < kMaxClusterWidth - 1; ++c) {
    if (c >= C - 1) continue;
    const float wc = __expf(__uint_as_float(uint32_t(got[c])) - T);  // an empty cluster: exp(-inf) = 0
    L += wc;
    acc += wc * __uint_as_float(uint32_t(got[c] >> 32));
  }
}

// grid (kClusterAttentionBlocks, C, Hkv) in clusters of kClusterAttentionBlocks blocks, one token
// at *pos0. Cluster c of KV head kvh's C; its block r takes key range 16c + r of the 16C ranges
// for all the head's queries on tensor cores (its older keys copied before the PDL wait
// where `settled`), after normalising and rotating the group's q (and, in the block of the last
// range, the new k, which it appends) with norm_rope_head from one round trip of loads. Each warp
// scores its eighth of a tile's keys; the scores meet in shared memory, and every warp then sums
// its eighth of the dims. A range of two tiles (both copied from the start) is one such pass over
// their 128 keys: one chain of scores, exchange and softmax where two in turn cost ~2 us more.
// Each range's record is pushed into the blocks that merge it (block r merges outputs
// [r·slice, (r+1)·slice) of the head's G·D), then gated: qk_norm_rope, the partial kernel and the
// combine in one launch. With C > 1 the first C - 1 clusters leave their merges of each slice in
// a.records, and the last cluster (the new key's) folds them into its own.
template <int D>
__global__ void __launch_bounds__(32 * kClusterWarps) attention_cluster_kernel(ShortAttention a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int NT = D / 8 / kClusterWarps, chunks = D / 8, kBlocks = kClusterAttentionBlocks;
  constexpr int KW = kMmaKeys / kClusterWarps;                 // keys a warp scores
  constexpr int slice = kClusterMaxGroup * D / kBlocks;        // outputs a block merges
  constexpr uint32_t tile_bytes = kMmaKeys * D * 2;
  extern __shared__ __align__(16) unsigned char smem[];  // Q [16][D], then 2 stages of K, V [kMmaKeys][D]
  __shared__ __align__(16) bf16 raw[kClusterMaxGroup + 2][D];  // the group's q heads, then k and v, as projected
  __shared__ float norm_w[2][D];                               // q and k norm weights
  __shared__ float normed[kClusterWarps][D];                   // each warp's head from norm_rope_head
  __shared__ __align__(16) bf16 k_new[D];                      // the new key, normed and rotated
  __shared__ __align__(16) float sS[16 * kScorePitch];         // one or two tiles' scores, shared by the warps
  __shared__ float ml[kBlocks][kClusterMaxGroup][2];           // each range's (max, sum) of each head
  __shared__ __align__(16) float inbox[kBlocks][slice];        // each range's outputs this block merges
  __shared__ float rope_sn[D / 2], rope_cs[D / 2];             // the rotation at pos, built before the wait
  const uint32_t sQ = smem_addr(smem);
  auto sK = [&](int tile) { return sQ + 16 * D * 2 + uint32_t(tile % 2) * 2 * tile_bytes; };
  pdl_launch_dependents();
  cluster_arrive();  // paired with the wait before the first store into another block
  const int r = cluster_rank(), C = gridDim.y, kvh = blockIdx.z, G = a.Hq / a.Hkv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int pos = *a.pos0, n_keys = pos + 1;  // staged by the host: readable before the wait
  const int per = div_up(n_keys, kBlocks * C), range = blockIdx.y * kBlocks + r;
  const int begin = min(n_keys, range * per), end = min(n_keys, begin + per);
  const int64_t kv_stride = int64_t(a.Hkv) * D;
  const bf16 *kh = a.kc + int64_t(kvh) * D, *vh = a.vc + int64_t(kvh) * D;
  auto keys_in = [&](int tile) { return max(0, min(kMmaKeys, end - begin - tile * kMmaKeys)); };
  auto issue = [&](int tile) {  // the tile's older keys (one copy group, empty past the range)
    const int s0 = begin + tile * kMmaKeys, n = keys_in(tile);
    if (n > 0) issue_kv_rows<D>(sK(tile), sK(tile) + tile_bytes, kh, vh, kv_stride, s0, max(0, min(n, pos - s0)), n);
    cp_async_commit();
  };
  // The new key (pos, the last) is not in the cache yet: no copy reads it; the last range's block
  // appends it and places it in its tile.
  const bool appends = end == n_keys && begin < end;
  const int tiles = div_up(end - begin, kMmaKeys), last_tile = tiles - 1;
  if (a.settled) {
    issue(0);
    issue(1);
  }
  float w_ahead[2];  // the norm weights (never written by a kernel): loaded before the wait
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int e = threadIdx.x + i * blockDim.x;
    w_ahead[i] = e < 2 * D ? (e < D ? a.q_norm[e] : a.k_norm[e - D]) : 0.0f;
  }
  for (int i = threadIdx.x; i < (16 - G) * chunks; i += blockDim.x)  // Q's rows past the group: zero
    *reinterpret_cast<uint4*>(smem + swz<D>(G + i / chunks, 8 * (i % chunks))) = make_uint4(0, 0, 0, 0);
  rope_table(a.rotary, a.theta, float(pos), rope_sn, rope_cs);
  pdl_wait();
  if (!a.settled) {
    issue(0);
    issue(1);
  }
  // The group's q heads (contiguous) and the new k and v in one round trip: every load (at most
  // two a thread) goes out before any store. Then each warp's heads.
  const int items = G + (appends ? 1 : 0), loads = G + (appends ? 2 : 0);
  static_assert((kClusterMaxGroup + 2) * chunks <= 2 * 32 * kClusterWarps, "two loads a thread");
  uint4 got[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = threadIdx.x + u * blockDim.x, item = i / chunks, c = i % chunks;
    if (i >= loads * chunks) continue;
    const bf16* src = item < G ? a.q + int64_t(kvh * G + item) * D : (item == G ? a.k : a.v) + int64_t(kvh) * D;
    got[u] = reinterpret_cast<const uint4*>(src)[c];
  }
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < loads * chunks) reinterpret_cast<uint4*>(raw[i / chunks])[i % chunks] = got[u];
  }
  const uint4* v_new = reinterpret_cast<const uint4*>(raw[G + 1]);  // the appending block's new value
  const int gate_j = threadIdx.x, gate_idx = r * slice + gate_j;  // this thread's merged output, if any
  const bool merges = gate_j < slice && gate_idx < G * D;
  const float gate = merges && a.gate ? sigmoidf_(__bfloat162float(a.gate[int64_t(kvh) * G * D + gate_idx])) : 1.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int e = threadIdx.x + i * blockDim.x;
    if (e < 2 * D) norm_w[e / D][e % D] = w_ahead[i];
  }
  __syncthreads();  // the raw heads and the weights in shared memory
  const auto table = [&](int j, float& sn, float& cs) {
    sn = rope_sn[j];
    cs = rope_cs[j];
  };
  for (int item = warp; item < items; item += kClusterWarps) {
    const bool is_k = item == G;
    norm_rope_head_by(raw[item], norm_w[is_k ? 1 : 0], D, a.eps, a.rotary, table, normed[warp]);
    for (int c = lane; c < chunks; c += 32) {
      uint4 v;
      bf16* b = reinterpret_cast<bf16*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) b[i] = __float2bfloat16(normed[warp][8 * c + i]);
      if (is_k) reinterpret_cast<uint4*>(k_new)[c] = v;
      else *reinterpret_cast<uint4*>(smem + swz<D>(item, 8 * c)) = v;
    }
    __syncwarp();  // normed[warp] is read before the warp's next head overwrites it
  }
  __syncthreads();  // Q and the new key in shared memory
  auto place_new = [&](int tile) {  // warp 0: the new key and value into their row of the tile's stage
    unsigned char* kt = smem + (sK(tile) - sQ);
    const int row = pos - begin - tile * kMmaKeys;
    for (int c = lane; c < chunks; c += 32) {
      *reinterpret_cast<uint4*>(kt + swz<D>(row, 8 * c)) = reinterpret_cast<const uint4*>(k_new)[c];
      *reinterpret_cast<uint4*>(kt + tile_bytes + swz<D>(row, 8 * c)) = v_new[c];
    }
  };
  if (appends && warp == 0) {
    for (int c = lane; c < chunks; c += 32) {
      const int64_t at = int64_t(pos) * kv_stride + 8 * c;
      *reinterpret_cast<uint4*>(a.kc + int64_t(kvh) * D + at) = reinterpret_cast<const uint4*>(k_new)[c];
      *reinterpret_cast<uint4*>(a.vc + int64_t(kvh) * D + at) = v_new[c];
    }
    if (last_tile < 2) place_new(last_tile);
  }
  const float scale = rsqrtf(float(D)), scale_log2 = scale * 1.44269504088896341f;
  float o[NT][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  if (tiles == 2) {  // both stages were in flight from the start: one pass over their keys (one chain, not two)
    cp_async_wait<0>();
    __syncthreads();  // both tiles (and the new key's row) in shared memory
    float mine[2][4], s[2 * kMmaKeys / 8][4];
    const uint32_t at = uint32_t(KW * warp) * D * 2, sKs[2] = {sK(0) + at, sK(1) + at};
    scores_pair<D>(sQ, sKs, lane, mine);
    share_scores<2 * kMmaKeys, 2 * KW, KW, kMmaKeys, false>(sS, mine, warp, lane, s);
    mask_keys_from<kMmaKeys>(s + kMmaKeys / 8, keys_in(1), lane);
    online_softmax<2 * kMmaKeys, NT, false>(s, m, l, o, scale_log2);
    accumulate_pv<D, kMmaKeys, NT>(s, sK(0) + tile_bytes, lane, warp * 8 * NT, o);
    accumulate_pv<D, kMmaKeys, NT>(s + kMmaKeys / 8, sK(1) + tile_bytes, lane, warp * 8 * NT, o);
  }
  for (int tile = 0; tiles != 2 && tile < tiles; ++tile) {  // other ranges: a tile at a time
    cp_async_wait<1>();
    __syncthreads();  // the tile (and the new key's row) in shared memory
    const int n = keys_in(tile);
    float mine[KW / 8][4], s[kMmaKeys / 8][4];
    scores<D, KW>(sQ, sK(tile) + uint32_t(KW * warp) * D * 2, 0, lane, mine);
    share_scores<kMmaKeys, KW, KW, 8, false>(sS, mine, warp, lane, s);
    mask_keys_from<kMmaKeys>(s, n, lane);
    online_softmax<kMmaKeys, NT, false>(s, m, l, o, scale_log2);
    accumulate_pv<D, kMmaKeys, NT>(s, sK(tile) + tile_bytes, lane, warp * 8 * NT, o);
    __syncthreads();  // every warp is done with the stage and the scores: the tile two on may take it
    issue(tile + 2);
    if (appends && warp == 0 && tile + 2 == last_tile) place_new(last_tile);
  }
  // This range's record of head g (rows g + 8 are padding): its outputs into the blocks that
  // merge them, (m in natural log, l) into both blocks of the head.
  const int g = lane / 4;
  float sum = l[0];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  cluster_wait();  // every block of the cluster has started: its shared memory may be written
  if (g < G) {
#pragma unroll
    for (int b = 0; b < NT; ++b) {
      const int idx = g * D + warp * 8 * NT + 8 * b + 2 * (lane % 4);
      cluster_store2(&inbox[r][idx % slice], idx / slice, o[b][0], o[b][1]);
    }
    if (warp == 0 && lane % 4 == 0)
      for (int owner = g * D / slice; owner <= (g * D + D - 1) / slice; ++owner)
        cluster_store2(ml[r][g], owner, m[0] * scale, sum);
  }
  cluster_sync();  // every range's record in the blocks that merge it
  float top = -INFINITY, L = 0.0f, acc = 0.0f;
  if (merges) {
    const int gh = gate_idx / D;
#pragma unroll
    for (int u = 0; u < kBlocks; ++u) top = fmaxf(top, ml[u][gh][0]);
#pragma unroll
    for (int u = 0; u < kBlocks; ++u) {
      const float w = __expf(ml[u][gh][0] - top);  // an empty range: exp(-inf) = 0
      L += ml[u][gh][1] * w;
      acc += inbox[u][gate_j] * w;
    }
  }
  if (C > 1 && merges) {
    if (int(blockIdx.y) < C - 1) return put_cluster_record(cluster_record<D>(a, kvh, r, blockIdx.y, gate_j), top, L, acc);
    merge_cluster_records<D>(a, kvh, r, C, gate_j, top, L, acc);
  }
  if (merges) a.out[int64_t(kvh) * G * D + gate_idx] = __float2bfloat16(acc / L * gate);
#else
  __trap();  // never launched from this build (attention_cluster_width asks pdl_supported())
#endif
}

// The split-K kernels for head_dim D.
void split_k(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
             const int* pos0, const KvRows& rows, bool settled, int splits, float* partial, const NewKv& fresh,
             const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride, cudaStream_t s) {
  if (splits < 1 || splits > kMaxSplits)  // messages built only on failure: this runs every layer
    throw Error("CUDA attention: " + std::to_string(splits) + " key ranges (1..64)");
  if (Hq % Hkv != 0 || Hq / Hkv > 32)
    throw Error("CUDA attention: " + std::to_string(Hq) + " query heads over " + std::to_string(Hkv) +
                " KV heads (a whole group of at most 32 each)");
  auto run = [&](auto per) {
    launch<decltype(per)::value>(q, q_stride, T, kc, vc, Hq, Hkv, pos0, rows, settled, splits, partial, fresh, gate,
                                 gate_stride, out, out_stride, s);
  };
  switch (D) {
    case 32: return run(std::integral_constant<int, 1>{});
    case 64: return run(std::integral_constant<int, 2>{});
    case 128: return run(std::integral_constant<int, 4>{});
    case 256: return run(std::integral_constant<int, 8>{});
  }
  throw Error("CUDA attention: head_dim " + std::to_string(D) + " is not supported (32, 64, 128 or 256)");
}

}  // namespace

void kv_append(const bf16* k, const bf16* v, int64_t stride, int T, int width, bf16* kc, bf16* vc, const int* pos0,
               cudaStream_t s) {
  launch_pdl(kv_append_kernel, T, 256, 0, s, k, v, stride, width, kc, vc, pos0, KvRows{});
  PETREL_LAUNCHED("kv_append");
}

void kv_append_rows(const bf16* k, const bf16* v, int64_t stride, int B, int width, const KvRows& rows,
                    cudaStream_t s) {
  check(rows.k && rows.v && rows.pos, "CUDA kv_append_rows: needs cache tables and positions");
  launch_pdl(kv_append_kernel, B, 256, 0, s, k, v, stride, width, nullptr, nullptr, nullptr, rows);
  PETREL_LAUNCHED("kv_append");
}

void attention(const bf16* q, int64_t q_stride, int T, const bf16* kc, const bf16* vc, int Hq, int Hkv, int D,
               const int* pos0, bool keys_settled, int splits, float* partial, const bf16* gate, int64_t gate_stride,
               bf16* out, int64_t out_stride, cudaStream_t s) {
  if (attention_prefill(q, q_stride, T, kc, vc, Hq, Hkv, D, pos0, gate, gate_stride, out, out_stride, s)) return;
  split_k(q, q_stride, T, kc, vc, Hq, Hkv, D, pos0, KvRows{}, keys_settled, splits, partial, NewKv{}, gate,
          gate_stride, out, out_stride, s);
}

void attention_rows(const bf16* q, int64_t q_stride, int B, const KvRows& rows, int Hq, int Hkv, int D, int splits,
                    float* partial, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                    cudaStream_t s) {
  check(rows.k && rows.v && rows.pos, "CUDA attention_rows: needs cache tables and positions");
  split_k(q, q_stride, B, nullptr, nullptr, Hq, Hkv, D, nullptr, rows, /*settled=*/false, splits, partial, NewKv{},
          gate, gate_stride, out, out_stride, s);
}

bool attention_appends(const bf16* q, int64_t q_stride, int Hq, int Hkv, int D) {
  return (D == 64 || D == 128 || D == 256) && Hkv > 0 && Hq % Hkv == 0 && Hq / Hkv <= 16 &&
         reinterpret_cast<uintptr_t>(q) % 16 == 0 && q_stride % 8 == 0;
}

void attention_appending(const bf16* q, int64_t q_stride, int T, const NewKv& fresh, const bf16* kc, const bf16* vc,
                         int Hq, int Hkv, int D, const int* pos0, const KvRows& rows, bool keys_settled, int splits,
                         float* partial, const bf16* gate, int64_t gate_stride, bf16* out, int64_t out_stride,
                         cudaStream_t s) {
  check(fresh.k && fresh.v && fresh.stride % 8 == 0 && (T == 1 || rows.pos) && attention_appends(q, q_stride, Hq, Hkv, D),
        "CUDA attention_appending: one new key a row and a shape attention_appends accepts");
  split_k(q, q_stride, T, kc, vc, Hq, Hkv, D, pos0, rows, keys_settled, splits, partial, fresh, gate, gate_stride, out,
          out_stride, s);
}

bool attention_short_fits(int n_keys, int Hq, int Hkv, int D) {
  return n_keys >= 1 && n_keys <= kShortAttentionKeys && (D == 128 || D == 256) && Hkv > 0 && Hq % Hkv == 0;
}

void attention_short(const ShortAttention& a, int D, cudaStream_t s) {
  const size_t smem = size_t(kShortAttentionKeys) * (2 * D + 8) * sizeof(bf16);  // keys (padded), values
  if (D == 128) {
    allow_dynamic_smem<attention_short_kernel<4>>(smem);
    launch_pdl(attention_short_kernel<4>, a.Hq, D, smem, s, a);
  } else if (D == 256) {
    allow_dynamic_smem<attention_short_kernel<8>>(smem);
    launch_pdl(attention_short_kernel<8>, a.Hq, D, smem, s, a);
  } else {
    throw Error("CUDA attention_short: head_dim " + std::to_string(D) + " is not supported (128 or 256)");
  }
  PETREL_LAUNCHED("attention_short");
}

namespace {

// attention_cluster_kernel<D>'s launch shape; its attributes are set once, before the first use.
template <int D>
cudaLaunchConfig_t cluster_config(int C, int Hkv, cudaStream_t s, cudaLaunchAttribute attr[2]) {
  constexpr size_t smem = (16 + 2 * 2 * kMmaKeys) * D * sizeof(bf16);
  static const bool allowed = [] {
    PETREL_CUDA(cudaFuncSetAttribute(attention_cluster_kernel<D>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    PETREL_CUDA(cudaFuncSetAttribute(attention_cluster_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)allowed;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterAttentionBlocks;
  attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kClusterAttentionBlocks, C, Hkv);
  cfg.blockDim = 32 * kClusterWarps;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cfg;
}

// Clusters of attention_cluster_kernel<D> the device holds at once (0 where it cannot launch one).
// Asked only where pdl_supported(): the sm_90a binary is loaded, not the portable PTX whose
// kernel body is a trap.
template <int D>
int resident_clusters() {
  static const int clusters = [] {
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = cluster_config<D>(1, 1, nullptr, attr);
    cfg.numAttrs = 1;  // the cluster shape alone
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, attention_cluster_kernel<D>, &cfg) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return clusters;
}

}  // namespace

int attention_cluster_width(int n_keys, int Hq, int Hkv, int D) {
  if (n_keys <= kShortAttentionKeys || n_keys > kWideClusterKeys || (D != 128 && D != 256) || Hkv <= 0 ||
      Hq % Hkv != 0 || Hq / Hkv > kClusterMaxGroup || !pdl_supported())
    return 0;
  const int fit = (D == 128 ? resident_clusters<128>() : resident_clusters<256>()) / Hkv;
  if (n_keys <= kClusterKeys) return fit >= 1 ? 1 : 0;
  return fit >= 2 ? std::min(fit, kMaxClusterWidth) : 0;
}

void attention_cluster(const ShortAttention& a, int D, int width, cudaStream_t s) {
  check(width == 1 || (width <= kMaxClusterWidth && a.records),
        "CUDA attention_cluster: several clusters a KV head need their records (attention_cluster_records)");
  cudaLaunchAttribute attr[2];
  if (D == 128) {
    const cudaLaunchConfig_t cfg = cluster_config<128>(width, a.Hkv, s, attr);
    PETREL_CUDA(cudaLaunchKernelEx(&cfg, attention_cluster_kernel<128>, a));
  } else if (D == 256) {
    const cudaLaunchConfig_t cfg = cluster_config<256>(width, a.Hkv, s, attr);
    PETREL_CUDA(cudaLaunchKernelEx(&cfg, attention_cluster_kernel<256>, a));
  } else {
    throw Error("CUDA attention_cluster: head_dim " + std::to_string(D) + " is not supported (128 or 256)");
  }
  PETREL_LAUNCHED("attention_cluster");
}

}  // namespace petrel::cuda
