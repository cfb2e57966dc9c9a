// y = x · Wᵀ for a batched decode step's 5 to 64 token rows on tensor cores, each weight read once
// (a dense launch takes up to kRowsMaxSegments matrices of one format and width over the same rows,
// one after another in its row blocks: a layer's input projections cost one launch):
// the weights are the mma's A operand (16 rows a warp, 4-/8-bit, FP8 or IQ4 codes dequantised in registers, no
// shared-memory weight tile, no block barrier per k-tile) and the token rows its B operand, staged
// in shared memory. The grouped form runs a step's routed experts over moe_plan's tiles (an
// expert's rows, up to 64 a tile): gate and up together with SiLU·mul, then down.
//
// Split K. A dense matrix of few row blocks (the 512-row shared expert, a 2048-row output
// projection) would leave most multiprocessors idle, so its K is split over grid.z until about two
// blocks run per multiprocessor: each block writes its partial sums to a slice of a workspace, and
// the last of a row block's blocks to arrive adds the slices in split order (deterministic) and
// stores the output.
//
// Fragment order. A lane of an m16n8k16 mma holds k columns {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4)
// of A and of B alike, so one bijection of k applied to both leaves the product unchanged. Per
// iteration of KI physical columns lane t loads 16 consecutive bytes of each of its rows (32 4-bit
// codes, 16 8-bit ones or 8 bf16: columns [t·KI/4, (t+1)·KI/4)) and mma step s takes its values
// 4s..4s+3.
// Staging writes the activations in that order, so ldmatrix reads B fragments as if k were natural.
#include <algorithm>
#include <string>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

namespace petrel::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockRows = 16 * kWarps;  // weight rows a block
constexpr int kSmemBudget = 96 * 1024;                                       // staged activations
constexpr int kMaxSplits = 16;

struct RowsArgs {
  DeviceMatrix w[2];       // grouped: one matrix, or gate and up
  DeviceMatrix shared[2];  // grouped: the same of the shared expert, for tiles of entry shared_entry
  int shared_entry;        // -1: no shared expert rides
  // Dense: segment s is matrix seg_w[s] into seg_y[s], its row blocks from seg_block0[s] on and
  // its rows from seg_row0[s] on in the split-K workspace (the last entries: the totals).
  DeviceMatrix seg_w[kRowsMaxSegments];
  GemvOut seg_y[kRowsMaxSegments];
  int seg_block0[kRowsMaxSegments + 1];
  int seg_row0[kRowsMaxSegments + 1];
  int n_segs;
  const void* x;
  int64_t x_stride;
  int x_elem;
  int T;                    // dense: token rows
  const int* row_token;     // grouped: each tile row's token (-1: none); null when dense
  const int* tile_expert;   // grouped: each tile's stack entry (-1: skipped)
  bool x_by_tile_row;       // grouped: x holds a row per tile row (down) rather than per token
  GemvOut y;                // grouped: a row per tile row
  int kc;                   // columns staged at once
  int split_its;            // iterations a split of K covers (all of K when grid.z is 1)
  float* partials;          // split K: [split][token row][weight row] partial sums
  unsigned* arrivals;       // split K: blocks of each row block done so far (left at zero)
};

template <WFormat F>
struct Format {
  static constexpr int kPerChunk = F == WFormat::Q4 || F == WFormat::I4 ? 32 : F == WFormat::BF16 ? 8 : 16;  // in 16 bytes
  static constexpr int KI = 4 * kPerChunk;  // physical columns an iteration covers
  static constexpr int kSteps = KI / 16;    // mma k-steps an iteration
};

// Iteration i's 16 bytes of row `row` for lane t, with their group's scale and bias (quantised:
// a lane's 32 4-bit or 16 8-bit codes lie in one group).
template <WFormat F>
struct Slice {
  uint4 v;
  __nv_bfloat162 s, b;
  __device__ void load(const DeviceMatrix& w, int row, int i, int t) {
    constexpr int KI = Format<F>::KI, per = Format<F>::kPerChunk;
    const int K = w.cols;
    v = reinterpret_cast<const uint4*>(w.w)[int64_t(row) * (K / per) + i * 4 + t];
    if constexpr (F != WFormat::BF16) {
      const int64_t gi = int64_t(row) * (K / w.group) + (i * KI + t * per) / w.group;
      s = __bfloat162bfloat162(w.scales[gi]);
      b = __bfloat162bfloat162(w.biases[gi]);
    }
  }
};

// The A fragments of mma steps 2p and 2p+1 from the lane's slices of rows g and g+8.
template <WFormat F>
__device__ __forceinline__ void a_fragments(const Slice<F>& lo, const Slice<F>& hi, int p, uint32_t a[2][4]) {
  uint32_t dl[4] = {lo.v.x, lo.v.y, lo.v.z, lo.v.w}, dh[4] = {hi.v.x, hi.v.y, hi.v.z, hi.v.w};
  if constexpr (F == WFormat::Q4) {  // word p holds 8 codes: the bf16 pairs of both steps
    const uint32_t cl = dl[p], ch = dh[p];
    dequant_q4(cl, lo.s, lo.b, dl);
    dequant_q4(ch, hi.s, hi.b, dh);
  } else if constexpr (F == WFormat::I4) {  // as 4-bit codes, under the group's scale (WFormat)
    const uint32_t cl = dl[p], ch = dh[p];
    dequant_i4(cl, __low2float(lo.s) + __low2float(lo.b), dl);
    dequant_i4(ch, __low2float(hi.s) + __low2float(hi.b), dh);
  } else if constexpr (F == WFormat::Q8) {  // words 2p and 2p + 1 hold 4 codes each: one step apiece
    const uint32_t cl[2] = {dl[2 * p], dl[2 * p + 1]}, ch[2] = {dh[2 * p], dh[2 * p + 1]};
    const float sl = __low2float(lo.s), bl = __low2float(lo.b), sh = __low2float(hi.s), bh = __low2float(hi.b);
    dequant_q8(cl[0], sl, bl, dl);
    dequant_q8(cl[1], sl, bl, dl + 2);
    dequant_q8(ch[0], sh, bh, dh);
    dequant_q8(ch[1], sh, bh, dh + 2);
  } else if constexpr (F == WFormat::F8) {  // as 8-bit codes, under the group's scale (WFormat)
    const uint32_t cl[2] = {dl[2 * p], dl[2 * p + 1]}, ch[2] = {dh[2 * p], dh[2 * p + 1]};
    const float sl = (__low2float(lo.s) + __low2float(lo.b)) * kE4m3Unscale;
    const float sh = (__low2float(hi.s) + __low2float(hi.b)) * kE4m3Unscale;
    dequant_f8(cl[0], sl, dl);
    dequant_f8(cl[1], sl, dl + 2);
    dequant_f8(ch[0], sh, dh);
    dequant_f8(ch[1], sh, dh + 2);
  }
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    a[s][0] = dl[2 * s];
    a[s][1] = dh[2 * s];
    a[s][2] = dl[2 * s + 1];
    a[s][3] = dh[2 * s + 1];
  }
}

// Iteration i's slices of rows lo and hi of each matrix into one ring slot (none unless `valid`).
template <WFormat F, int NM>
__device__ __forceinline__ void load_slot(Slice<F> (&slot)[NM][2], const DeviceMatrix* w, int lo, int hi, int i,
                                          bool valid, int t) {
  if (!valid) return;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    slot[m][0].load(w[m], lo, i, t);
    slot[m][1].load(w[m], hi, i, t);
  }
}

// Where 8 columns from p on land in xs's row `r` in fragment order: columns p..p+3 and p+4..p+7
// fall in mma steps s and s + 1 of one lane t, as words 0, 4, 8 and 12 from the returned one.
template <int KI>
__device__ __forceinline__ uint32_t* fragment_words(bf16* xs, int pitch, int r, int p) {
  const int base = p / KI * KI, in = p % KI, t = in / (KI / 4), s = in % (KI / 4) / 4;
  return reinterpret_cast<uint32_t*>(xs + int64_t(r) * pitch + base + 16 * s + 2 * t);
}

// Columns [k0, k0 + kn) of the tile's first `rows` rows (the rest zero) into xs in fragment order.
// The rows come from L2, so the staging is a chain of round trips unless many loads are in flight:
// bf16 rows go by asynchronous 4-byte copies, all issued before the first lands; fp32 rows (rounded
// on the way) by a thread's 8 columns at a time, kUnroll of them in flight.
template <int KI>
__device__ void stage(bf16* xs, int pitch, const RowsArgs& a, const int* src, int rows, int padded, int k0, int kn) {
  constexpr int kUnroll = 4;
  const int octs = kn / 8, total = padded * octs;
  if (a.x_elem == 2) {
    for (int q = threadIdx.x; q < total; q += kThreads) {
      const int r = q / octs, p = (q % octs) * 8;
      uint32_t* row = fragment_words<KI>(xs, pitch, r, p);
      if (r >= rows) {
        row[0] = row[4] = row[8] = row[12] = 0;
        continue;
      }
      const bf16* x = static_cast<const bf16*>(a.x) + int64_t(src[r]) * a.x_stride + k0 + p;
#pragma unroll
      for (int j = 0; j < 4; ++j) cp_async4(smem_addr(row + 4 * j), x + 2 * j);
    }
    cp_async_commit();  // wait_group waits on committed groups only
    cp_async_wait<0>();
    return;
  }
  for (int q0 = threadIdx.x; q0 < total; q0 += kUnroll * kThreads) {
    uint4 raw[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * kThreads, r = q / octs;
      raw[u][0] = raw[u][1] = make_uint4(0, 0, 0, 0);
      if (q >= total || r >= rows) continue;
      const int64_t at = int64_t(src[r]) * a.x_stride + k0 + (q % octs) * 8;
      raw[u][0] = *reinterpret_cast<const uint4*>(static_cast<const float*>(a.x) + at);
      raw[u][1] = *reinterpret_cast<const uint4*>(static_cast<const float*>(a.x) + at + 4);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * kThreads, r = q / octs, p = (q % octs) * 8;
      if (q >= total) break;
      uint32_t packed[4];
      const float* f = reinterpret_cast<const float*>(raw[u]);
      for (int j = 0; j < 4; ++j) packed[j] = pack_bf16(f[2 * j], f[2 * j + 1]);
      uint32_t* row = fragment_words<KI>(xs, pitch, r, p);
      row[0] = packed[0];
      row[4] = packed[1];  // 8 columns on
      row[8] = packed[2];  // the next mma step
      row[12] = packed[3];
    }
  }
}

// v[seg] by constant indices: a parameter array indexed at run time would be copied to local memory.
template <class T, int N>
__device__ __forceinline__ T by_segment(const T (&v)[N], int seg) {
  T out = v[0];
#pragma unroll
  for (int s = 1; s < N; ++s)
    if (s == seg) out = v[s];
  return out;
}

// A dense launch's segment of this block (0 in a grouped one).
__device__ __forceinline__ int segment_of(const RowsArgs& a) {
  int seg = 0;
#pragma unroll
  for (int s = 1; s < kRowsMaxSegments; ++s)
    if (!a.tile_expert && s < a.n_segs && int(blockIdx.x) >= a.seg_block0[s]) seg = s;
  return seg;
}

// Split K (dense only): writes this block's partial sums and, in the last block of its row block to
// arrive, replaces acc with the sum of every split's in split order. False in the other blocks.
// Rows are the workspace's (all segments'): this thread's from f_lo, those below f_end real.
template <int NF>
__device__ bool sum_splits(const RowsArgs& a, float (&acc)[NF][4], int nf, int rows, int f_lo, int f_end, int t,
                           bool& last) {
  const int N = a.seg_row0[a.n_segs];
  const size_t slice = size_t(a.T) * N;
  float* mine = a.partials + blockIdx.z * slice;
#pragma unroll
  for (int n = 0; n < NF; ++n) {
    if (n >= nf) break;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 8 * n + 2 * t + c % 2, f = f_lo + 8 * (c / 2);
      if (r < rows && f < f_end) mine[size_t(r) * N + f] = acc[n][c];
    }
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.arrivals[blockIdx.x], 1u) == gridDim.z - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  // kAhead splits' partials of all this thread's outputs are loaded before any is added, so their
  // L2 latencies overlap (one split at a time made the sum a chain of 16 x NF x 4 latencies).
  constexpr int kAhead = 16 / NF;  // 64 loads in flight
  float sum[NF][4] = {};
  for (unsigned z0 = 0; z0 < gridDim.z; z0 += kAhead) {
    float v[kAhead][NF][4];
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
#pragma unroll
      for (int n = 0; n < NF; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int r = 8 * n + 2 * t + c % 2, f = f_lo + 8 * (c / 2);
          const bool in = z0 + u < gridDim.z && n < nf && r < rows && f < f_end;
          v[u][n][c] = in ? __ldcg(a.partials + (z0 + u) * slice + size_t(r) * N + f) : 0.0f;
        }
#pragma unroll
    for (int u = 0; u < kAhead; ++u)
#pragma unroll
      for (int n = 0; n < NF; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) sum[n][c] += v[u][n][c];  // in split order
  }
#pragma unroll
  for (int n = 0; n < NF; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[n][c] = sum[n][c];
  if (threadIdx.x == 0) a.arrivals[blockIdx.x] = 0;  // ready for the next launch
  return true;
}

// grid (ceil(N / kBlockRows), tiles, K splits), kThreads: a warp owns 16 weight rows (of each matrix) for all
// of its tile's token rows and the whole of K, its next PF - 1 iterations' weights in flight.
template <WFormat F, int NF, bool kPair>
__global__ void __launch_bounds__(kThreads) linear_rows_kernel(const RowsArgs a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw);
  __shared__ int src[kGemmTileM], n_rows;
  __shared__ bool last;
  constexpr int KI = Format<F>::KI, NM = kPair ? 2 : 1, PF = kPair ? 2 : 4;
  const int tile = blockIdx.y;
  // Launched early (PDL): a grouped launch reads moe_plan's tiles, so it waits at once; a dense one
  // reads nothing an earlier kernel writes until its first staging, so its first weights are in
  // flight while the kernel before it ends.
  const bool grouped = a.tile_expert != nullptr;
  if (grouped) pdl_wait();
  int e = 0;
  if (grouped && (e = a.tile_expert[tile]) < 0) return;
  const int seg = segment_of(a);
  DeviceMatrix w[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m)
    w[m] = !grouped ? by_segment(a.seg_w, seg) : e == a.shared_entry ? a.shared[m] : a.w[m].entry(e);
  const int row_block = int(blockIdx.x) - (grouped ? 0 : by_segment(a.seg_block0, seg));
  if (threadIdx.x == 0) n_rows = 0;
  __syncthreads();
  if (threadIdx.x < kGemmTileM) {
    const int r = tile * kGemmTileM + threadIdx.x;
    const int token = a.row_token ? a.row_token[r] : (r < a.T ? r : -1);
    src[threadIdx.x] = a.x_by_tile_row ? r : token;
    if (token >= 0) atomicMax(&n_rows, threadIdx.x + 1);
  }
  __syncthreads();
  const int rows = n_rows, nf = (rows + 7) / 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int N = w[0].rows, K = w[0].cols, f0 = row_block * kBlockRows + warp * 16;
  const int row_lo = min(f0 + g, N - 1), row_hi = min(f0 + g + 8, N - 1);
  const int pitch = a.kc + 8, chunk_its = a.kc / KI;
  // This block's iterations of K: [i_begin, i_begin + n_its).
  const int i_begin = blockIdx.z * a.split_its, n_its = min(K / KI - i_begin, a.split_its);

  Slice<F> ring[PF][NM][2];
  float acc[NM][NF][4] = {};
#pragma unroll
  for (int p = 0; p < PF - 1; ++p) load_slot<F, NM>(ring[p], w, row_lo, row_hi, i_begin + p, p < n_its, t);
  if (!grouped) pdl_wait();
  for (int i0 = 0; i0 < n_its; i0 += PF) {
#pragma unroll
    for (int p = 0; p < PF; ++p) {
      const int i = i0 + p;
      if (i >= n_its) break;
      if (i % chunk_its == 0) {
        __syncthreads();
        stage<KI>(xs, pitch, a, src, rows, nf * 8, (i_begin + i) * KI, min(a.kc, (n_its - i) * KI));
        __syncthreads();
      }
      // The slot refilled here was computed one iteration ago (slots are compile-time indices).
      load_slot<F, NM>(ring[(p + PF - 1) % PF], w, row_lo, row_hi, i_begin + i + PF - 1, i + PF - 1 < n_its, t);
      const int col0 = (i % chunk_its) * KI;
#pragma unroll
      for (int sp = 0; sp < Format<F>::kSteps / 2; ++sp) {
        uint32_t af[NM][2][4];
#pragma unroll
        for (int m = 0; m < NM; ++m) a_fragments<F>(ring[p][m][0], ring[p][m][1], sp, af[m]);
#pragma unroll
        for (int n = 0; n < NF; ++n) {
          if (n >= nf) break;
          uint32_t b[4];
          ldmatrix_x4(b, smem_addr(xs + (n * 8 + lane % 8) * pitch + col0 + 32 * sp + 8 * (lane / 8)));
#pragma unroll
          for (int m = 0; m < NM; ++m) {
            mma_bf16(acc[m][n], af[m][0], b[0], b[1]);
            mma_bf16(acc[m][n], af[m][1], b[2], b[3]);
          }
        }
      }
    }
  }

  pdl_launch_dependents();  // once every block is past its weights, the next kernel may load its own

  // Accumulator c of fragment n: weight row f0 + g (+8 for c >= 2), token row 8n + 2t + c % 2.
  // The segment again rather than a register held through the loop (the kernel is at its limit).
  const int seg_end = segment_of(a), row0 = by_segment(a.seg_row0, seg_end);
  if (gridDim.z > 1 && !sum_splits<NF>(a, acc[0], nf, rows, row0 + f0 + g, row0 + N, t, last)) return;
  const GemvOut y_out = a.tile_expert ? a.y : by_segment(a.seg_y, seg_end);
#pragma unroll
  for (int n = 0; n < NF; ++n) {
    if (n >= nf) break;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 8 * n + 2 * t + c % 2, f = f0 + g + 8 * (c / 2);
      if (r >= rows || f >= N) continue;
      float v = acc[0][n][c];
      if constexpr (kPair) {  // rounded as the unfused path stores gate and up
        const float gv = __bfloat162float(__float2bfloat16(v));
        v = siluf_(gv) * __bfloat162float(__float2bfloat16(acc[NM - 1][n][c]));
      }
      const int64_t out_row = a.row_token ? int64_t(tile) * kGemmTileM + r : src[r];
      const int64_t at = out_row * y_out.stride + f;
      if (y_out.add) {
        float* y = static_cast<float*>(y_out.y) + at;
        *y += __bfloat162float(__float2bfloat16(v));
      } else {
        store_act(y_out.y, y_out.elem, at, v);
      }
    }
  }
}

// Columns staged at once: the most a multiple of KI·PF allows within the budget, at most the K
// columns one split covers.
template <WFormat F>
int staged_columns(int K, int nf_max, bool pair) {
  const int step = Format<F>::KI * (pair ? 2 : 4);
  const int fit = (kSmemBudget / (nf_max * 8 * 2) - 8) / step * step;
  return std::min(K, std::max(step, fit));
}

// Splits of K for a dense matrix of `row_blocks` blocks: about two blocks a multiprocessor.
int k_splits(int row_blocks, int n_its) {
  return std::clamp(std::min(div_up(2 * sm_count(), row_blocks), n_its), 1, kMaxSplits);
}

// The split-K workspace, allocated once at its largest size so that recorded graphs may keep its
// address: a split launch has fewer than 2·SMs row blocks, and splits·rows <= (2·SMs + row_blocks)·64.
// Its counters start at zero and every launch leaves them there. One stream at a time uses it.
struct SplitWorkspace {
  float* partials = nullptr;
  unsigned* arrivals = nullptr;
  size_t floats = 0;
  int counters = 0;
};

const SplitWorkspace& split_workspace(size_t floats, int counters, cudaStream_t s) {
  static SplitWorkspace ws;
  if (!ws.partials) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    PETREL_CUDA(cudaStreamIsCapturing(s, &capturing));
    check(capturing == cudaStreamCaptureStatusNone,
          "CUDA linear_rows: the split-K workspace is allocated on first use, which must not be inside a graph "
          "capture; run a split shape once before capturing");
    ws.counters = 2 * sm_count();
    ws.floats = size_t(4 * sm_count()) * kBlockRows * kRowsMaxTokens;
    PETREL_CUDA(cudaMalloc(&ws.partials, ws.floats * sizeof(float)));
    PETREL_CUDA(cudaMalloc(&ws.arrivals, size_t(ws.counters) * sizeof(unsigned)));
    PETREL_CUDA(cudaMemset(ws.arrivals, 0, size_t(ws.counters) * sizeof(unsigned)));
  }
  check(floats <= ws.floats && counters <= ws.counters,
        "CUDA linear_rows: a split needs " + std::to_string(floats) + " partial sums and " + std::to_string(counters) +
            " counters, the workspace holds " + std::to_string(ws.floats) + " and " + std::to_string(ws.counters));
  return ws;
}

// The launch's first matrix: its format and width are every matrix's.
const DeviceMatrix& first_matrix(const RowsArgs& a) { return a.tile_expert ? a.w[0] : a.seg_w[0]; }

template <WFormat F, int NF, bool kPair>
void launch(const RowsArgs& args, int tiles, cudaStream_t s) {
  RowsArgs a = args;
  constexpr int KI = Format<F>::KI;
  const int n_its = first_matrix(a).cols / KI;
  const int row_blocks = a.tile_expert ? div_up(a.w[0].rows, kBlockRows) : a.seg_block0[a.n_segs];
  a.split_its = div_up(n_its, a.tile_expert ? 1 : k_splits(row_blocks, n_its));
  const int splits = div_up(n_its, a.split_its);
  if (splits > 1) {
    const size_t floats = size_t(splits) * size_t(a.T) * size_t(a.seg_row0[a.n_segs]);
    const SplitWorkspace& ws = split_workspace(floats, row_blocks, s);
    a.partials = ws.partials;
    a.arrivals = ws.arrivals;
  }
  a.kc = staged_columns<F>(a.split_its * KI, NF, kPair);
  const size_t smem = size_t(NF) * 8 * (a.kc + 8) * 2;
  const auto kernel = linear_rows_kernel<F, NF, kPair>;
  static bool configured = false;  // one attribute call per instantiation
  if (!configured) {
    PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBudget + 1024));
    configured = true;
  }
  launch_pdl(kernel, dim3(row_blocks, tiles, splits), dim3(kThreads), smem, s, a);
}

// The instantiation for the tile's most rows (16, 32 or 64: two, four or eight n8 fragments).
template <WFormat F, bool kPair>
void launch_rows(const RowsArgs& a, int max_rows, int tiles, cudaStream_t s) {
  if (max_rows <= 16) launch<F, 2, kPair>(a, tiles, s);
  else if (max_rows <= 32) launch<F, 4, kPair>(a, tiles, s);
  else launch<F, 8, kPair>(a, tiles, s);
}

template <bool kPair>
void launch_rows(const RowsArgs& a, int max_rows, int tiles, cudaStream_t s) {
  const WFormat f = first_matrix(a).format;
  if (f == WFormat::Q4) launch_rows<WFormat::Q4, kPair>(a, max_rows, tiles, s);
  else if (f == WFormat::Q8) launch_rows<WFormat::Q8, kPair>(a, max_rows, tiles, s);
  else if (f == WFormat::F8) launch_rows<WFormat::F8, kPair>(a, max_rows, tiles, s);
  else if (f == WFormat::I4) launch_rows<WFormat::I4, kPair>(a, max_rows, tiles, s);
  else launch_rows<WFormat::BF16, kPair>(a, max_rows, tiles, s);
}

}  // namespace

bool linear_rows_fits(const DeviceMatrix& w) {
  if (w.format == WFormat::Q4 || w.format == WFormat::I4)
    return w.group % 32 == 0 && w.cols % w.group == 0 && w.cols % 512 == 0 && w.w_stride % 4 == 0;
  if (w.format == WFormat::Q8 || w.format == WFormat::F8)
    return w.group % 16 == 0 && w.cols % w.group == 0 && w.cols % 256 == 0 && w.w_stride % 4 == 0;
  return w.format == WFormat::BF16 && w.cols % 128 == 0 && w.w_stride % 8 == 0;
}

bool linear_rows_share(const DeviceMatrix& a, const DeviceMatrix& b) {
  return a.format == b.format && a.cols == b.cols && linear_rows_fits(a) && linear_rows_fits(b);
}

void linear_rows(const DeviceMatrix* const* ws, const GemvOut* outs, int n, const void* x, int64_t x_stride, int x_elem,
                 int T, cudaStream_t s) {
  check(T >= 1 && T <= kRowsMaxTokens && n >= 1 && n <= kRowsMaxSegments && x_stride % 8 == 0,
        "CUDA linear_rows: takes 1.." + std::to_string(kRowsMaxTokens) + " rows and 1.." +
            std::to_string(kRowsMaxSegments) + " matrices");
  RowsArgs a{};
  a.n_segs = n;
  for (int i = 0; i < n; ++i) {
    check(linear_rows_share(*ws[0], *ws[i]),
          "CUDA linear_rows: takes 4-bit, 8-bit, FP8, IQ4 or bf16 matrices of one format and width");
    check(!outs[i].add || outs[i].elem == 4, "CUDA linear_rows: an added output must be fp32");
    a.seg_w[i] = *ws[i];
    a.seg_y[i] = outs[i];
    a.seg_block0[i + 1] = a.seg_block0[i] + div_up(ws[i]->rows, kBlockRows);
    a.seg_row0[i + 1] = a.seg_row0[i] + ws[i]->rows;
  }
  a.x = x;
  a.x_stride = x_stride;
  a.x_elem = x_elem;
  a.T = T;
  launch_rows<false>(a, T, 1, s);
  PETREL_LAUNCHED("linear_rows");
}

bool expert_rows_carry(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                       const RidingExpert& shared) {
  const auto same = [](const DeviceMatrix& routed, const DeviceMatrix* s) {
    return s && s->rows == routed.rows && linear_rows_share(routed, *s);
  };
  return same(gate, shared.gate) && same(up, shared.up) && same(down, shared.down);
}

void expert_rows(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const RidingExpert& shared,
                 const void* x, int64_t x_stride, int x_elem, int T, const int* row_token, const int* tile_expert,
                 int tiles, bf16* act, int64_t act_stride, bf16* y, int64_t y_stride, cudaStream_t s) {
  check(T >= 1 && gate.format == up.format && linear_rows_fits(gate) && linear_rows_fits(up) &&
            linear_rows_fits(down) && x_stride % 8 == 0 && act_stride % 8 == 0,
        "CUDA expert_rows: takes 4-bit, 8-bit, FP8, IQ4 or bf16 experts");
  check(!shared.gate || (shared.entry >= gate.count && expert_rows_carry(gate, up, down, shared)),
        "CUDA expert_rows: a shared expert rides only in the routed experts' formats and shapes");
  RowsArgs a{};
  a.w[0] = gate;
  a.w[1] = up;
  a.shared_entry = shared.gate ? shared.entry : -1;
  if (shared.gate) {
    a.shared[0] = *shared.gate;
    a.shared[1] = *shared.up;
  }
  a.x = x;
  a.x_stride = x_stride;
  a.x_elem = x_elem;
  a.row_token = row_token;
  a.tile_expert = tile_expert;
  a.y = {act, act_stride, 2, false};
  launch_rows<true>(a, T, tiles, s);
  PETREL_LAUNCHED("expert_rows (gate+up)");
  RowsArgs d = a;
  d.w[0] = d.w[1] = down;
  if (shared.gate) d.shared[0] = d.shared[1] = *shared.down;
  d.x = act;
  d.x_stride = act_stride;
  d.x_elem = 2;
  d.x_by_tile_row = true;
  d.y = {y, y_stride, 2, false};
  launch_rows<false>(d, T, tiles, s);
  PETREL_LAUNCHED("expert_rows (down)");
}

}  // namespace petrel::cuda
