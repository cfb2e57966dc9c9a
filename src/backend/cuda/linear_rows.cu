// y = x · Wᵀ for a batched decode step's 9 to 64 token rows on tensor cores, each weight read once:
// the weights are the mma's A operand (16 rows a warp, 4-bit codes dequantised in registers, no
// shared-memory weight tile, no block barrier per k-tile) and the token rows its B operand, staged
// in shared memory. The grouped form runs a step's routed experts over moe_plan's tiles (an
// expert's rows, up to 64 a tile): gate and up together with SiLU·mul, then down.
//
// Fragment order. A lane of an m16n8k16 mma holds k columns {2t, 2t+1, 2t+8, 2t+9} (t = lane % 4)
// of A and of B alike, so one bijection of k applied to both leaves the product unchanged. Per
// iteration of KI physical columns lane t loads 16 consecutive bytes of each of its rows (32 4-bit
// codes, or 8 bf16: columns [t·KI/4, (t+1)·KI/4)) and mma step s takes its values 4s..4s+3.
// Staging writes the activations in that order, so ldmatrix reads B fragments as if k were natural.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mma.cuh"

namespace petrel::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockRows = 16 * kWarps;  // weight rows a block
constexpr int kSmemBudget = 96 * 1024;                                       // staged activations

struct RowsArgs {
  DeviceMatrix w[2];  // one matrix, or gate and up
  const void* x;
  int64_t x_stride;
  int x_elem;
  int T;                    // dense: token rows
  const int* row_token;     // grouped: each tile row's token (-1: none); null when dense
  const int* tile_expert;   // grouped: each tile's stack entry (-1: skipped)
  bool x_by_tile_row;       // grouped: x holds a row per tile row (down) rather than per token
  GemvOut y;                // dense: a row per token; grouped: a row per tile row
  int kc;                   // columns staged at once
};

template <WFormat F>
struct Format {
  static constexpr int KI = F == WFormat::Q4 ? 128 : 32;  // physical columns an iteration covers
  static constexpr int kSteps = KI / 16;                  // mma k-steps an iteration
};

// Iteration i's 16 bytes of row `row` for lane t, with the row's group scale and bias (4-bit).
template <WFormat F>
struct Slice {
  uint4 v;
  __nv_bfloat162 s, b;
  __device__ void load(const DeviceMatrix& w, int row, int i, int t) {
    constexpr int KI = Format<F>::KI;
    const int K = w.cols;
    if constexpr (F == WFormat::Q4) {
      v = reinterpret_cast<const uint4*>(w.w)[int64_t(row) * (K / 32) + i * (KI / 32) + t];
      const int64_t gi = int64_t(row) * (K / w.group) + (i * KI + t * (KI / 4)) / w.group;
      s = __bfloat162bfloat162(w.scales[gi]);
      b = __bfloat162bfloat162(w.biases[gi]);
    } else {
      v = reinterpret_cast<const uint4*>(w.w)[int64_t(row) * (K / 8) + i * (KI / 8) + t];
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
  }
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    a[s][0] = dl[2 * s];
    a[s][1] = dh[2 * s];
    a[s][2] = dl[2 * s + 1];
    a[s][3] = dh[2 * s + 1];
  }
}

// Iteration i's slices of rows lo and hi of each matrix into one ring slot (none past the end).
template <WFormat F, int NM>
__device__ __forceinline__ void load_slot(Slice<F> (&slot)[NM][2], const DeviceMatrix* w, int lo, int hi, int i,
                                          int n_it, int t) {
  if (i >= n_it) return;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    slot[m][0].load(w[m], lo, i, t);
    slot[m][1].load(w[m], hi, i, t);
  }
}

// Columns [k0, k0 + kn) of the tile's first `rows` rows (the rest zero) into xs in fragment order.
template <int KI>
__device__ void stage(bf16* xs, int pitch, const RowsArgs& a, const int* src, int rows, int padded, int k0, int kn) {
  const int quads = kn / 4;
  for (int q = threadIdx.x; q < padded * quads; q += kThreads) {
    const int r = q / quads, p = (q % quads) * 4;
    float v[4] = {0, 0, 0, 0};
    if (r < rows) {
      const int64_t at = int64_t(src[r]) * a.x_stride + k0 + p;
      if (a.x_elem == 2) {
        const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const bf16*>(a.x) + at);
        const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
        const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
        v[0] = f0.x, v[1] = f0.y, v[2] = f1.x, v[3] = f1.y;
      } else {
        const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + at);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
      }
    }
    const int base = p / KI * KI, in = p % KI, t = in / (KI / 4), s = in % (KI / 4) / 4;
    uint32_t* row = reinterpret_cast<uint32_t*>(xs + int64_t(r) * pitch + base + 16 * s + 2 * t);
    row[0] = pack_bf16(v[0], v[1]);
    row[4] = pack_bf16(v[2], v[3]);  // 8 columns on
  }
}

// grid (ceil(N / kBlockRows), tiles), kThreads: a warp owns 16 weight rows (of each matrix) for all
// of its tile's token rows and the whole of K, its next PF - 1 iterations' weights in flight.
template <WFormat F, int NF, bool kPair>
__global__ void __launch_bounds__(kThreads) linear_rows_kernel(const RowsArgs a) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw);
  __shared__ int src[kGemmTileM], n_rows;
  constexpr int KI = Format<F>::KI, NM = kPair ? 2 : 1, PF = kPair ? 2 : 4;
  const int tile = blockIdx.y;
  int e = 0;
  if (a.tile_expert && (e = a.tile_expert[tile]) < 0) return;
  DeviceMatrix w[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) w[m] = a.tile_expert ? a.w[m].entry(e) : a.w[m];
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
  const int N = w[0].rows, K = w[0].cols, f0 = blockIdx.x * kBlockRows + warp * 16;
  const int row_lo = min(f0 + g, N - 1), row_hi = min(f0 + g + 8, N - 1);
  const int pitch = a.kc + 8, n_it = K / KI, chunk_its = a.kc / KI;

  Slice<F> ring[PF][NM][2];
  float acc[NM][NF][4] = {};
#pragma unroll
  for (int p = 0; p < PF - 1; ++p) load_slot<F, NM>(ring[p], w, row_lo, row_hi, p, n_it, t);
  for (int i0 = 0; i0 < n_it; i0 += PF) {
#pragma unroll
    for (int p = 0; p < PF; ++p) {
      const int i = i0 + p;
      if (i % chunk_its == 0) {
        __syncthreads();
        stage<KI>(xs, pitch, a, src, rows, nf * 8, i * KI, min(a.kc, K - i * KI));
        __syncthreads();
      }
      // The slot refilled here was computed one iteration ago (slots are compile-time indices).
      load_slot<F, NM>(ring[(p + PF - 1) % PF], w, row_lo, row_hi, i + PF - 1, n_it, t);
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

  // Accumulator c of fragment n: weight row f0 + g (+8 for c >= 2), token row 8n + 2t + c % 2.
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
      const int64_t at = out_row * a.y.stride + f;
      if (a.y.add) {
        float* y = static_cast<float*>(a.y.y) + at;
        *y += __bfloat162float(__float2bfloat16(v));
      } else {
        store_act(a.y.y, a.y.elem, at, v);
      }
    }
  }
}

// Columns staged at once: the most a multiple of KI·PF allows within the budget, at most K.
template <WFormat F>
int staged_columns(int K, int nf_max, bool pair) {
  const int step = Format<F>::KI * (pair ? 2 : 4);
  const int fit = (kSmemBudget / (nf_max * 8 * 2) - 8) / step * step;
  return std::min(K, std::max(step, fit));
}

template <WFormat F, int NF, bool kPair>
void launch(const RowsArgs& args, int tiles, cudaStream_t s) {
  RowsArgs a = args;
  a.kc = staged_columns<F>(a.w[0].cols, NF, kPair);
  const size_t smem = size_t(NF) * 8 * (a.kc + 8) * 2;
  const auto kernel = linear_rows_kernel<F, NF, kPair>;
  static bool configured = false;  // one attribute call per instantiation
  if (!configured) {
    PETREL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBudget + 1024));
    configured = true;
  }
  kernel<<<dim3(div_up(a.w[0].rows, kBlockRows), tiles), kThreads, smem, s>>>(a);
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
  if (a.w[0].format == WFormat::Q4) launch_rows<WFormat::Q4, kPair>(a, max_rows, tiles, s);
  else launch_rows<WFormat::BF16, kPair>(a, max_rows, tiles, s);
}

}  // namespace

bool linear_rows_fits(const DeviceMatrix& w) {
  if (w.format == WFormat::Q4)
    return w.group % 32 == 0 && w.cols % w.group == 0 && w.cols % 512 == 0 && w.w_stride % 4 == 0;
  return w.format == WFormat::BF16 && w.cols % 128 == 0 && w.w_stride % 8 == 0;
}

void linear_rows(const DeviceMatrix& w, const void* x, int64_t x_stride, int x_elem, int T, const GemvOut& y,
                 cudaStream_t s) {
  check(T >= 1 && T <= kRowsMaxTokens && linear_rows_fits(w) && x_stride % 8 == 0,
        "CUDA linear_rows: takes 1.." + std::to_string(kRowsMaxTokens) + " rows of 4-bit or bf16 weights");
  check(!y.add || y.elem == 4, "CUDA linear_rows: an added output must be fp32");
  RowsArgs a{};
  a.w[0] = w;
  a.x = x;
  a.x_stride = x_stride;
  a.x_elem = x_elem;
  a.T = T;
  a.y = y;
  launch_rows<false>(a, T, 1, s);
  PETREL_LAUNCHED("linear_rows");
}

void expert_rows(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, const void* x,
                 int64_t x_stride, int x_elem, int T, const int* row_token, const int* tile_expert, int tiles, bf16* act,
                 int64_t act_stride, bf16* y, int64_t y_stride, cudaStream_t s) {
  check(T >= 1 && T <= kRowsMaxTokens && gate.format == up.format && linear_rows_fits(gate) && linear_rows_fits(up) &&
            linear_rows_fits(down) && x_stride % 8 == 0 && act_stride % 8 == 0,
        "CUDA expert_rows: takes 1.." + std::to_string(kRowsMaxTokens) + " rows of 4-bit or bf16 experts");
  RowsArgs a{};
  a.w[0] = gate;
  a.w[1] = up;
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
  d.x = act;
  d.x_stride = act_stride;
  d.x_elem = 2;
  d.x_by_tile_row = true;
  d.y = {y, y_stride, 2, false};
  launch_rows<false>(d, T, tiles, s);
  PETREL_LAUNCHED("expert_rows (down)");
}

}  // namespace petrel::cuda
