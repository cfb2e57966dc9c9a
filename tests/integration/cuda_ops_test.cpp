// Every op of the CUDA backend against the CPU reference, at the real Qwen3.5-35B-A3B dimensions,
// on fresh random inputs, with outputs poisoned (NaN) before each run. Skipped, with a message,
// where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "../unit/test_util.h"
#include "cuda_real_shape.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "generate/sampler.h"
#include "runtime/forward.h"
#include "model/synthetic.h"

namespace petrel {
namespace {

using test::RandomWeights;

// Random weights of the real shapes (experts included).
struct RealShapeModel : RandomWeights {
  RealShapeModel() {
    c = synthetic_config("qwen3.5-35b-a3b");  // every per-layer dimension of the released model
    c.vocab = 4096;
    c.n_layers = 2;
    c.layer_kinds = {LayerKind::DeltaNet, LayerKind::FullAttention};
    c.layer_is_moe = {true, true};
    const int64_t H = c.hidden;
    w.embed = dense("embed", c.vocab, H);
    w.lm_head = affine("lm_head", c.vocab, H);
    w.final_norm = vec(H, 0.8f, 1.2f);
    // Layer 2 sits outside the two-layer forward pass, for op tests alone: an MoE block all in
    // 4-bit with an 8-bit router and shared gate, as --weights int4 and MLX 4-bit checkpoints store it.
    w.layers.resize(3);
    for (int i = 0; i < 3; ++i) {
      LayerWeights& L = w.layers[i];
      L.kind = c.layer_kinds[std::min(i, 1)];
      L.input_norm = vec(H, 0.8f, 1.2f);
      L.post_norm = vec(H, 0.8f, 1.2f);
      L.ffn.moe = true;
      // A trained router separates its top-8 clearly; a unit-gain random one puts 256 experts within
      // bf16 noise of each other and every position would flip experts between backends.
      // Layer 1's router 8-bit, as --weights int4 stores it (the staged 8-bit router with its shared gate).
      L.ffn.router = i == 0 ? dense("router", c.n_experts, H, 8.0f) : affine("router", c.n_experts, H, 8, 64, 8.0f);
      for (int e = 0; e < c.n_experts; ++e) {
        // Layer 0 experts bf16, layer 1 experts 4-bit: both formats through both MoE paths.
        auto make = [&](const char* n, int64_t r, int64_t cc) { return i == 0 ? dense(n, r, cc) : affine(n, r, cc); };
        L.ffn.experts.push_back({make("gate", 512, H), make("up", 512, H), make("down", H, 512)});
      }
      L.ffn.has_shared = true;
      L.ffn.shared = i == 2 ? MlpWeights{affine("sgate", 512, H), affine("sup", 512, H), affine("sdown", H, 512)}
                            : MlpWeights{dense("sgate", 512, H), dense("sup", 512, H), dense("sdown", H, 512)};
      // Layer 1's shared-expert gate 8-bit, as --weights int4 stores it: a one-row 8-bit GEMM.
      L.ffn.shared_gate = i == 0 ? dense("shared_expert_gate", 1, H) : affine("shared_expert_gate", 1, H, 8);
    }
    DeltaNetWeights& G = w.layers[0].gdn;
    G.qkv = dense("qkv", c.gdn_conv_channels(), H);
    G.z = dense("z", c.gdn_value_dim(), H);
    G.b = dense("b", c.lin_v_heads, H);
    G.a = dense("a", c.lin_v_heads, H);
    G.out = dense("out", H, c.gdn_value_dim());
    G.conv = vec(size_t(c.gdn_conv_channels()) * 4, -0.5f, 0.5f);
    G.A_log = vec(c.lin_v_heads, 0.0f, 2.7f);
    G.dt_bias = vec(c.lin_v_heads, -1.0f, 1.0f);
    G.norm = vec(c.lin_v_dim, 0.8f, 1.2f);
    AttentionWeights& A = w.layers[1].attn;
    A.q = dense("q", 4096, H);
    A.gate = dense("gate", 4096, H);
    A.k = affine("k", 512, H, 4, 16);  // groups of 16: the GEMM decodes these element-wise
    A.v = dense("v", 512, H);
    A.o = affine("o", H, 4096);
    A.q_norm = vec(256, 0.8f, 1.2f);
    A.k_norm = vec(256, 0.8f, 1.2f);
  }
};

RealShapeModel& model() {
  static RealShapeModel m;
  return m;
}

// One attention layer (dense MLP) of Qwen3-30B-A3B's attention shape: head_dim 128, 32 query heads,
// 4 KV heads, no output gate; the rest small.
struct Qwen3AttentionModel : RandomWeights {
  // kv_heads > 0 narrows the KV heads (qwen3-30b-a3b has 32 query heads over 4).
  explicit Qwen3AttentionModel(int kv_heads = 0) {
    c = synthetic_config("qwen3-30b-a3b");
    if (kv_heads > 0) c.n_kv_heads = kv_heads;
    c.vocab = 256;
    c.hidden = 512;
    c.n_layers = 1;
    c.layer_kinds = {LayerKind::FullAttention};
    c.layer_is_moe = {false};
    c.n_experts = c.top_k = c.moe_intermediate = 0;
    c.intermediate = 256;
    const int64_t H = c.hidden, q = int64_t(c.n_heads) * c.head_dim, kv = int64_t(c.n_kv_heads) * c.head_dim;
    w.embed = dense("embed", c.vocab, H);
    w.lm_head = dense("lm_head", c.vocab, H);
    w.final_norm = vec(H, 0.8f, 1.2f);
    w.layers.resize(1);
    LayerWeights& L = w.layers[0];
    L.kind = LayerKind::FullAttention;
    L.input_norm = vec(H, 0.8f, 1.2f);
    L.post_norm = vec(H, 0.8f, 1.2f);
    L.ffn.dense = {dense("gate", c.intermediate, H), dense("up", c.intermediate, H), dense("down", H, c.intermediate)};
    L.attn.q = dense("q", q, H);
    L.attn.k = dense("k", kv, H);
    L.attn.v = dense("v", kv, H);
    L.attn.o = dense("o", H, q);
    L.attn.q_norm = vec(c.head_dim, 0.8f, 1.2f);
    L.attn.k_norm = vec(c.head_dim, 0.8f, 1.2f);
  }
};

// Both backends prepared with the same weights, for chunks of up to 1024 tokens.
struct Pair {
  const RandomWeights& m;
  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
  explicit Pair(const RandomWeights& model) : m(model) {
    CudaOptions o;
    o.progress = false;
    gpu = make_cuda_backend(o);
    cpu.prepare(m.c, m.w);
    gpu->prepare(m.c, m.w);
    cpu.reserve(1024);
    gpu->reserve(1024);
  }
};

Pair& pair() {
  static Pair p(model());
  return p;
}

Pair& qwen3_pair() {
  static Qwen3AttentionModel m;
  static Pair p(m);
  return p;
}

std::vector<float> random_input(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed ^ std::random_device{}());  // fresh inputs every run
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |gpu - cpu| / max |cpu|, NaN-safe (a NaN makes the error infinite).
double rel_error(const Tensor& cpu, const Tensor& gpu, Pair& p = pair()) {
  std::vector<float> a(size_t(cpu.rows * cpu.cols)), b(a.size());
  p.cpu.to_host(cpu, a.data());
  p.gpu->to_host(gpu, b.data());
  return test::max_rel_error(a, b);
}

// The same values on both backends; GPU copies are bf16, so the CPU gets the bf16-rounded values.
struct Input {
  Tensor cpu, gpu;
  std::vector<float> host;
  Input(int64_t rows, int64_t cols, uint64_t seed, float scale = 1.0f, bool fp32 = false, Pair& p = pair()) {
    host = random_input(size_t(rows * cols), seed, scale);
    if (!fp32)
      for (auto& x : host) x = bf16_to_f32(f32_to_bf16(x));
    cpu = p.cpu.alloc(rows, cols, fp32);
    gpu = p.gpu->alloc(rows, cols, fp32);
    p.cpu.from_host(host.data(), cpu);
    p.gpu->from_host(host.data(), gpu);
  }
};

struct Output {
  Tensor cpu, gpu;
  Pair* p;
  Output(int64_t rows, int64_t cols, bool fp32 = false, Pair& pr = pair()) : p(&pr) {
    cpu = p->cpu.alloc(rows, cols, fp32);
    gpu = p->gpu->alloc(rows, cols, fp32);
    std::vector<float> nan(size_t(rows * cols), NAN);  // poison: an op that skips a value fails
    p->cpu.from_host(nan.data(), cpu);
    p->gpu->from_host(nan.data(), gpu);
  }
  double rel_error() { return petrel::rel_error(cpu, gpu, *p); }
};

// bf16 activations carry ~3 significant digits; each tolerance below allows a few roundings of
// the output plus bf16 inputs accumulated in fp32.
constexpr double kLinearTol = 1e-2;     // one bf16 rounding of the output
constexpr double kNormTol = 1e-2;
constexpr double kAttentionTol = 2e-2;  // q, k rounded after norm and after RoPE
constexpr double kDeltaNetTol = 3e-2;   // conv input bf16, output after gated norm
constexpr double kMoeTol = 3e-2;        // intermediate activations rounded to bf16

// Stages token ids and positions; the embedding op consumes them, as in the forward pass.
void stage(const std::vector<int32_t>& ids, const SequenceState& cpu_seq, const SequenceState& gpu_seq,
           Pair& p = pair()) {
  const int T = int(ids.size());
  p.cpu.begin_forward(ids.data(), T, cpu_seq);
  p.gpu->begin_forward(ids.data(), T, gpu_seq);
  Tensor ec = p.cpu.alloc(T, p.m.c.hidden), eg = p.gpu->alloc(T, p.m.c.hidden);
  p.cpu.embed(p.m.w.embed, ec);
  p.gpu->embed(p.m.w.embed, eg);
}

class CudaLinear : public ::testing::TestWithParam<int> {};

TEST_P(CudaLinear, Bf16AndInt4MatchCpu) {
  REQUIRE_GPU();
  const int T = GetParam();
  const RealShapeModel& m = model();
  for (const Matrix* w : {&m.w.layers[0].gdn.qkv, &m.w.layers[1].attn.o, &m.w.lm_head, &m.w.layers[1].attn.k,
                          &m.w.layers[1].ffn.shared_gate}) {
    Input x(T, w->cols, 1);
    Output y(T, w->rows, w == &m.w.lm_head);
    pair().cpu.linear(x.cpu, *w, y.cpu);
    pair().gpu->linear(x.gpu, *w, y.gpu);
    EXPECT_LT(y.rel_error(), kLinearTol) << w->name << " T=" << T;
  }
}

// The GEMM with fp32 activations (converted while staged) and fp32 outputs, bf16 and 4-bit weights.
TEST(CudaOps, LinearFp32InAndOutAtPrefillMatchesCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  for (int T : {20, 300})
    for (const Matrix* w : {&m.w.layers[0].gdn.qkv, &m.w.layers[1].attn.o}) {
      Input x(T, w->cols, 3 + T, 1.0f, /*fp32=*/true);
      Output y(T, w->rows, /*fp32=*/true);
      pair().cpu.linear(x.cpu, *w, y.cpu);
      pair().gpu->linear(x.gpu, *w, y.gpu);
      EXPECT_LT(y.rel_error(), kLinearTol) << w->name << " T=" << T;
    }
}

// 4-bit GEMV activations travel as fp16, scaled down by a power of two when large: inputs far
// beyond fp16's comfortable range (|x| ~ 3e4) must come out as accurate as ordinary ones.
TEST(CudaOps, LinearWithLargeActivationsMatchesCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  const Matrix& w = m.w.layers[1].attn.o;  // 4-bit
  for (bool fp32_input : {false, true}) {
    Input x(2, w.cols, 7, 30000.0f, fp32_input);
    Output y(2, w.rows);
    pair().cpu.linear(x.cpu, w, y.cpu);
    pair().gpu->linear(x.gpu, w, y.gpu);
    EXPECT_LT(y.rel_error(), kLinearTol) << "fp32 input " << fp32_input;
  }
}

// A layer's input projections in one launch (decode, and a batched step's rows: neighbours of one
// format and width share a launch, split K over all of them) or one GEMM each (prefill), outputs of
// both element types and weights of both formats, against the CPU computing them one by one.
TEST(CudaOps, LinearManyMatchesCpu) {
  REQUIRE_GPU();
  const ModelWeights& w = model().w;
  const DeltaNetWeights& G = w.layers[0].gdn;
  const AttentionWeights& A = w.layers[1].attn;
  const MlpWeights& S = w.layers[2].ffn.shared;
  const std::vector<std::vector<const Matrix*>> lists = {
      {&G.qkv, &G.z, &G.b, &G.a}, {&A.q, &A.k, &A.v, &A.gate}, {&G.b, &w.lm_head, &G.a}, {&S.gate, &S.up}};
  for (int T : {1, 3, 9, 20, 40}) {
    Input x(T, model().c.hidden, 11 + T);
    for (const auto& ws : lists) {
      if (T >= 9 && ws[1] == &w.lm_head) continue;  // the CPU LM head at many tokens adds nothing but time
      std::vector<Output> outs;
      outs.reserve(ws.size());
      std::vector<Tensor> cpu, gpu;
      for (const Matrix* m : ws) {
        outs.emplace_back(T, m->rows, /*fp32=*/m == &G.b || m == &G.a || m == &w.lm_head);
        cpu.push_back(outs.back().cpu);
        gpu.push_back(outs.back().gpu);
      }
      OpList on_cpu, on_gpu;
      for (size_t i = 0; i < ws.size(); ++i) {
        on_cpu.push_back(op::Linear{x.cpu, ws[i], cpu[i]});
        on_gpu.push_back(op::Linear{x.gpu, ws[i], gpu[i]});
      }
      pair().cpu.run(on_cpu);
      pair().gpu->run(on_gpu);
      for (size_t i = 0; i < ws.size(); ++i) EXPECT_LT(outs[i].rel_error(), kLinearTol) << ws[i]->name << " T=" << T;
    }
  }
}

// T=1..3 take the decode GEMV (weights copied into shared memory; T=1 with its activations in
// registers: bf16 qkv 8 chunks a lane, 4-bit o 4, the LM head 2, the 8-bit gate 4), 5 the general
// one, 9..64 the batched step's tensor-core path (linear_rows: two, four and eight n8 fragments;
// the 8-bit gate keeps the GEMM), 129 and up the tensor-core GEMM: 64-row tiles, or 128-row ones
// where those alone fill the GPU (qkv from T=300, the 4-bit LM head at 600); 129, 300 and 600 end
// inside a tile.
INSTANTIATE_TEST_SUITE_P(Tokens, CudaLinear, ::testing::Values(1, 2, 3, 5, 9, 16, 30, 37, 64, 129, 130, 300, 600));

TEST(CudaOps, EmbedRmsNormAddMatchCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  auto cs = pair().cpu.new_sequence(64);
  auto gs = pair().gpu->new_sequence(64);
  const std::vector<int32_t> ids = {3, 4000, 17, 0, 999};
  pair().cpu.begin_forward(ids.data(), 5, *cs);
  pair().gpu->begin_forward(ids.data(), 5, *gs);
  Output e(5, m.c.hidden);
  pair().cpu.embed(m.w.embed, e.cpu);
  pair().gpu->embed(m.w.embed, e.gpu);
  EXPECT_EQ(e.rel_error(), 0.0) << "embedding rows are copied exactly";
  for (bool fp32_residual : {false, true}) {  // the forward pass keeps the residual stream in fp32
    Input x(9, m.c.hidden, 2, 3.0f, fp32_residual);
    Output n(9, m.c.hidden);
    pair().cpu.rms_norm(x.cpu, m.w.final_norm, 1e-6f, n.cpu);
    pair().gpu->rms_norm(x.gpu, m.w.final_norm, 1e-6f, n.gpu);
    EXPECT_LT(n.rel_error(), kNormTol) << "fp32 input " << fp32_residual;
    pair().cpu.add(x.cpu, n.cpu);
    pair().gpu->add(x.gpu, n.gpu);
    EXPECT_LT(rel_error(x.cpu, x.gpu), kNormTol) << "fp32 residual " << fp32_residual;
  }
}

// What an op added to the residual stream h (Input, fp32) on each backend, compared:
// max |Δgpu - Δcpu| / max |Δcpu| (NaN-safe).
double update_error(const Input& h) {
  std::vector<float> a(h.host.size()), b(a.size());
  pair().cpu.to_host(h.cpu, a.data());
  pair().gpu->to_host(h.gpu, b.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double dc = double(a[i]) - h.host[i], dg = double(b[i]) - h.host[i];
    if (!(std::fabs(dg - dc) <= 1e30)) return INFINITY;
    num = std::max(num, std::fabs(dg - dc));
    den = std::max(den, std::fabs(dc));
  }
  return num / std::max(den, 1e-30);
}

// A layer's input norm meeting its projections (and the final norm the LM head): T <= 4 folds the
// norm into the staged GEMV (x is not written), 6 runs the norm then the projections.
TEST(CudaOps, NormFoldedIntoProjectionsMatchesCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  const DeltaNetWeights& G = m.w.layers[0].gdn;
  const AttentionWeights& A = m.w.layers[1].attn;
  const std::vector<std::vector<const Matrix*>> lists = {{&G.qkv, &G.z, &G.b, &G.a}, {&A.q, &A.k, &A.v, &A.gate},
                                                         {&m.w.lm_head}};
  const std::vector<const std::vector<float>*> norms = {&m.w.layers[0].input_norm, &m.w.layers[1].input_norm,
                                                        &m.w.final_norm};
  for (int T : {1, 2, 4, 6}) {
    for (size_t l = 0; l < lists.size(); ++l) {
      const auto& ws = lists[l];
      Input h(T, m.c.hidden, 70 + T + l, 3.0f, /*fp32=*/true);
      Output x(T, m.c.hidden, /*fp32=*/true);
      std::vector<Output> outs;
      outs.reserve(ws.size());
      std::vector<Tensor> cpu, gpu;
      for (const Matrix* w : ws) {
        outs.emplace_back(T, w->rows, /*fp32=*/w == &G.b || w == &G.a || w == &m.w.lm_head);
        cpu.push_back(outs.back().cpu);
        gpu.push_back(outs.back().gpu);
      }
      OpList on_cpu = {op::RmsNorm{h.cpu, norms[l], 1e-6f, x.cpu}};
      OpList on_gpu = {op::RmsNorm{h.gpu, norms[l], 1e-6f, x.gpu}};
      for (size_t i = 0; i < ws.size(); ++i) {
        on_cpu.push_back(op::Linear{x.cpu, ws[i], cpu[i]});
        on_gpu.push_back(op::Linear{x.gpu, ws[i], gpu[i]});
      }
      pair().cpu.run(on_cpu);
      pair().gpu->run(on_gpu);
      for (size_t i = 0; i < ws.size(); ++i) EXPECT_LT(outs[i].rel_error(), kLinearTol) << ws[i]->name << " T=" << T;
    }
  }
}

// Output projections adding to the residual stream: T <= 4 add inside the staged GEMV, 6 and 40
// run the projection then the add.
TEST(CudaOps, LinearAddMatchesCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  for (const Matrix* w : {&m.w.layers[0].gdn.out, &m.w.layers[1].attn.o}) {
    for (int T : {1, 3, 6, 40}) {
      Input x(T, w->cols, 110 + T), h(T, m.c.hidden, 120 + T, 3.0f, /*fp32=*/true);
      Output scratch(T, m.c.hidden);
      pair().cpu.run({op::Linear{x.cpu, w, scratch.cpu}, op::Add{h.cpu, scratch.cpu}});
      pair().gpu->run({op::Linear{x.gpu, w, scratch.gpu}, op::Add{h.gpu, scratch.gpu}});
      EXPECT_LT(update_error(h), kLinearTol) << w->name << " T=" << T;
    }
  }
}

// Chunks of `chunks` tokens in turn through attention layer `layer` of p's model (the output gate
// where the model has one), each against the CPU.
void attention_chunks_on(Pair& p, int layer, const std::vector<int>& chunks, SequenceState& cs, SequenceState& gs) {
  const ModelConfig& c = p.m.c;
  const AttentionWeights& A = p.m.w.layers[layer].attn;
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  for (int T : chunks) {
    std::vector<int32_t> ids(T, 1);
    stage(ids, cs, gs, p);
    Input q(T, q_width, 10 + T, 1.0f, false, p), k(T, kv_width, 20 + T, 1.0f, false, p);
    Input v(T, kv_width, 30 + T, 1.0f, false, p), g(T, q_width, 40 + T, 1.0f, false, p);
    p.cpu.qk_norm_rope(q.cpu, k.cpu, A);
    p.gpu->qk_norm_rope(q.gpu, k.gpu, A);
    Output out(T, q_width, false, p);
    p.cpu.attention(q.cpu, k.cpu, v.cpu, c.attn_output_gate ? &g.cpu : nullptr, layer, cs, out.cpu);
    p.gpu->attention(q.gpu, k.gpu, v.gpu, c.attn_output_gate ? &g.gpu : nullptr, layer, gs, out.gpu);
    EXPECT_LT(out.rel_error(), kAttentionTol) << "head_dim " << c.head_dim << ", T=" << T << " at position "
                                              << cs.n_past;
    cs.n_past += T;
    gs.n_past += T;
  }
}

void attention_chunks(Pair& p, int layer, const std::vector<int>& chunks) {
  auto cs = p.cpu.new_sequence(1024);
  auto gs = p.gpu->new_sequence(1024);
  attention_chunks_on(p, layer, chunks, *cs, *gs);
}

// Prefill chunks (T >= 16 take the tensor-core kernel): one that is not a multiple of the 64-query
// tile, one starting past the first (chunked prefill), a longer one; then decode steps (split-K)
// over the whole cache, and a chunk below the tensor-core threshold.
const std::vector<int> kAttentionChunks = {150, 77, 700, 1, 1, 9};

TEST(CudaOps, AttentionPrefillThenDecodeMatchesCpu) {
  REQUIRE_GPU();
  attention_chunks(pair(), 1, kAttentionChunks);
}

// head_dim 128, 8 query heads per KV head, no output gate.
TEST(CudaOps, AttentionPrefillThenDecodeHeadDim128MatchesCpu) {
  REQUIRE_GPU();
  attention_chunks(qwen3_pair(), 0, kAttentionChunks);
}

// Decode steps through qk_norm_rope_attention (raw q and k) from `prefill` keys (prefill chunks of
// up to 1024 through the ops apart) to `last_keys`, each against the CPU: up to
// kCudaShortAttentionKeys keys the one-block-a-head launch, then up to kCudaClusterAttentionKeys
// the one-cluster launch, up to kCudaWideClusterAttentionKeys several clusters a KV head, past it
// the split-K ops; the one-launch paths append their own keys, which the later steps read.
void fused_attention_steps(Pair& p, int layer, int prefill, int last_keys) {
  const ModelConfig& c = p.m.c;
  const AttentionWeights& A = p.m.w.layers[layer].attn;
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  const int capacity = std::max(1024, last_keys + 8);
  auto cs = p.cpu.new_sequence(capacity);
  auto gs = p.gpu->new_sequence(capacity);
  std::vector<int> chunks;
  for (int done = 0; done < prefill; done += chunks.back()) chunks.push_back(std::min(1024, prefill - done));
  attention_chunks_on(p, layer, chunks, *cs, *gs);
  for (int n = prefill + 1; n <= last_keys; ++n) {
    stage({1}, *cs, *gs, p);
    Input q(1, q_width, 50 + n, 1.0f, false, p), k(1, kv_width, 60 + n, 1.0f, false, p);
    Input v(1, kv_width, 70 + n, 1.0f, false, p), g(1, q_width, 80 + n, 1.0f, false, p);
    Output out(1, q_width, false, p);
    const bool gated = c.attn_output_gate;
    p.cpu.run({op::QkNormRope{q.cpu, k.cpu, &A},
               op::Attention{q.cpu, k.cpu, v.cpu, gated ? g.cpu : Tensor{}, layer, {cs.get()}, out.cpu}});
    p.gpu->run({op::QkNormRope{q.gpu, k.gpu, &A},
                op::Attention{q.gpu, k.gpu, v.gpu, gated ? g.gpu : Tensor{}, layer, {gs.get()}, out.gpu}});
    ASSERT_LT(out.rel_error(), kAttentionTol) << "head_dim " << c.head_dim << ", " << n << " keys";
    cs->n_past += 1;
    gs->n_past += 1;
  }
}

// From an empty cache; across the short bound; inside the one-cluster range (the appended key in
// the second tile of its range); across its bound into several clusters a KV head; inside that
// range; across its bound into the split-K ops.
void fused_attention_contexts(Pair& p, int layer) {
  fused_attention_steps(p, layer, 0, 40);
  fused_attention_steps(p, layer, kCudaShortAttentionKeys - 28, kCudaShortAttentionKeys + 12);
  fused_attention_steps(p, layer, 1500, 1510);
  fused_attention_steps(p, layer, kCudaClusterAttentionKeys - 3, kCudaClusterAttentionKeys + 3);
  fused_attention_steps(p, layer, 4090, 4100);
  fused_attention_steps(p, layer, kCudaWideClusterAttentionKeys - 3, kCudaWideClusterAttentionKeys + 3);
}

TEST(CudaOps, FusedAttentionStepsMatchCpu) {
  REQUIRE_GPU();
  fused_attention_contexts(pair(), 1);
}

// head_dim 128, 8 query heads per KV head, no output gate.
TEST(CudaOps, FusedAttentionStepsHeadDim128MatchCpu) {
  REQUIRE_GPU();
  fused_attention_contexts(qwen3_pair(), 0);
}

// 16 query heads a KV head (as Qwen3-235B-A22B's 64 over 4): the mma tile's rows 8-15 are heads.
// Prefill chunks, then decode steps on the split-K path (past the short bound), against the CPU.
TEST(CudaOps, AttentionSixteenQueryHeadsAKvHeadMatchesCpu) {
  REQUIRE_GPU();
  static const Qwen3AttentionModel m(2);
  static Pair p(m);
  fused_attention_steps(p, 0, 0, 20);
  fused_attention_steps(p, 0, 300, 310);
}

// Runs the DeltaNet op on both backends; chunked for T > 1, recurrent for T = 1.
double deltanet_step(SequenceState& cs, SequenceState& gs, int T, uint64_t seed) {
  const RealShapeModel& m = model();
  const DeltaNetWeights& G = m.w.layers[0].gdn;
  Input qkv(T, m.c.gdn_conv_channels(), seed), z(T, m.c.gdn_value_dim(), seed + 1);
  Input b(T, m.c.lin_v_heads, seed + 2, 1.0f, true), a(T, m.c.lin_v_heads, seed + 3, 1.0f, true);
  Output out(T, m.c.gdn_value_dim());
  pair().cpu.deltanet(qkv.cpu, z.cpu, b.cpu, a.cpu, G, 0, cs, out.cpu);
  pair().gpu->deltanet(qkv.gpu, z.gpu, b.gpu, a.gpu, G, 0, gs, out.gpu);
  cs.n_past += T;
  gs.n_past += T;
  return out.rel_error();
}

TEST(CudaOps, DeltaNetChunkedAndRecurrentMatchCpu) {
  REQUIRE_GPU();
  auto cs = pair().cpu.new_sequence(512);
  auto gs = pair().gpu->new_sequence(512);
  for (int T : {130, 1, 1, 64, 1, 250})  // state carried across chunked and recurrent calls
    EXPECT_LT(deltanet_step(*cs, *gs, T, 100 + T + cs->n_past), kDeltaNetTol) << "T=" << T;
}

TEST(CudaOps, DeltaNetChunkedEqualsRecurrentOnGpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  const DeltaNetWeights& G = m.w.layers[0].gdn;
  Backend& gpu = *pair().gpu;
  const int T = 100;
  auto one = gpu.new_sequence(T), many = gpu.new_sequence(T);
  Input qkv(T, m.c.gdn_conv_channels(), 7), z(T, m.c.gdn_value_dim(), 8), b(T, m.c.lin_v_heads, 9, 1.0f, true),
      a(T, m.c.lin_v_heads, 10, 1.0f, true);
  Output whole(T, m.c.gdn_value_dim()), steps(T, m.c.gdn_value_dim());
  gpu.deltanet(qkv.gpu, z.gpu, b.gpu, a.gpu, G, 0, *one, whole.gpu);
  for (int t = 0; t < T; ++t)
    gpu.deltanet(qkv.gpu.rows_view(t, 1), z.gpu.rows_view(t, 1), b.gpu.rows_view(t, 1), a.gpu.rows_view(t, 1), G, 0,
                 *many, steps.gpu.rows_view(t, 1));
  std::vector<float> x(size_t(T) * m.c.gdn_value_dim()), y(x.size());
  gpu.to_host(whole.gpu, x.data());
  gpu.to_host(steps.gpu, y.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, double(std::fabs(x[i] - y[i])));
    den = std::max(den, double(std::fabs(y[i])));
  }
  EXPECT_LT(num / den, 1e-2) << "fp32 state; outputs differ by bf16 rounding of the gated norm only";
  EXPECT_TRUE(std::isfinite(num));
}

// A GPU copy of an Input's values (ops that write their input need one per run).
Tensor gpu_copy(const Input& in) {
  Tensor t = pair().gpu->alloc(in.gpu.rows, in.gpu.cols, in.gpu.elem_size == 4);
  pair().gpu->from_host(in.host.data(), t);
  return t;
}

std::vector<float> gpu_values(const Tensor& t) {
  std::vector<float> v(size_t(t.rows * t.cols));
  pair().gpu->to_host(t, v.data());
  return v;
}

// A lone decode step's attention appends its key and value itself (no kv_append launch): two such
// steps give, bit for bit, what a two-token chunk gives (kv_append, then the same key ranges), after
// 300 keys and after 12,300, where the range holding the new key spans four tiles (the key is
// placed in a stage refilled inside the loop); the second step reads the key the first appended.
TEST(CudaOps, DecodeStepsAppendingTheirKeysMatchAChunk) {
  REQUIRE_GPU();
  Pair& p = pair();
  const ModelConfig& c = p.m.c;
  const int layer = 1;
  const AttentionWeights& A = p.m.w.layers[layer].attn;
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  for (int context : {300, 12300}) {
    auto steps = p.gpu->new_sequence(context + 8), chunk = p.gpu->new_sequence(context + 8);
    // T tokens of `s` through qk_norm_rope and attention; q and k get the raw projections again
    // (the norm rewrites them).
    auto run = [&](SequenceState& s, int T, Input& q, Input& k, Input& v, Input& g, Tensor out) {
      std::vector<int32_t> ids(size_t(T), 1);
      p.gpu->begin_forward(ids.data(), T, s);
      p.gpu->embed(p.m.w.embed, p.gpu->alloc(T, c.hidden));
      p.gpu->from_host(q.host.data(), q.gpu);
      p.gpu->from_host(k.host.data(), k.gpu);
      p.gpu->qk_norm_rope(q.gpu, k.gpu, A);
      p.gpu->attention(q.gpu, k.gpu, v.gpu, &g.gpu, layer, s, out);
      s.n_past += T;
    };
    for (int done = 0; done < context;) {  // the same prefix in both
      const int T = std::min(1024, context - done);
      Input q(T, q_width, 300 + done), k(T, kv_width, 310 + done), v(T, kv_width, 320 + done);
      Input g(T, q_width, 330 + done);
      Output out(T, q_width);
      run(*steps, T, q, k, v, g, out.gpu);
      run(*chunk, T, q, k, v, g, out.gpu);
      done += T;
    }
    Input q(2, q_width, 340), k(2, kv_width, 350), v(2, kv_width, 360), g(2, q_width, 370);
    Output both(2, q_width), one(2, q_width);
    run(*chunk, 2, q, k, v, g, both.gpu);
    for (int r = 0; r < 2; ++r) {
      Input qr(1, q_width, 0), kr(1, kv_width, 0), vr(1, kv_width, 0), gr(1, q_width, 0);
      qr.host.assign(q.host.begin() + r * q_width, q.host.begin() + (r + 1) * q_width);
      kr.host.assign(k.host.begin() + r * kv_width, k.host.begin() + (r + 1) * kv_width);
      p.gpu->from_host(v.host.data() + r * kv_width, vr.gpu);
      p.gpu->from_host(g.host.data() + r * q_width, gr.gpu);
      run(*steps, 1, qr, kr, vr, gr, one.gpu.rows_view(r, 1));
    }
    const std::vector<float> a = gpu_values(one.gpu), b = gpu_values(both.gpu);
    EXPECT_EQ(a, b) << "after " << context << " keys";
    EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float x) { return std::isfinite(x); }));
  }
}

// Fills the DeltaNet (layer 0) and attention (layer 1) states of `st` with a prompt of T random tokens.
void gpu_prefill(SequenceState& st, int T, uint64_t seed) {
  const RealShapeModel& m = model();
  const ModelConfig& c = m.c;
  Backend& gpu = *pair().gpu;
  const std::vector<int32_t> ids(size_t(T), 1);
  gpu.begin_forward(ids.data(), T, st);
  gpu.embed(m.w.embed, gpu.alloc(T, c.hidden));
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  Input q(T, q_width, seed), k(T, kv_width, seed + 1), v(T, kv_width, seed + 2), g(T, q_width, seed + 3);
  Tensor attn = gpu.alloc(T, q_width);
  gpu.qk_norm_rope(q.gpu, k.gpu, m.w.layers[1].attn);
  gpu.attention(q.gpu, k.gpu, v.gpu, &g.gpu, 1, st, attn);
  Input qkv(T, c.gdn_conv_channels(), seed + 4), z(T, c.gdn_value_dim(), seed + 5);
  Input b(T, c.lin_v_heads, seed + 6, 1.0f, true), a(T, c.lin_v_heads, seed + 7, 1.0f, true);
  gpu.deltanet(qkv.gpu, z.gpu, b.gpu, a.gpu, m.w.layers[0].gdn, 0, st, gpu.alloc(T, c.gdn_value_dim()));
  st.n_past += T;
}

// A batched decode step's per-sequence ops (qk_norm_rope, attention, DeltaNet: one launch each for
// all rows, states through the step's pointer table) against the same rows run one sequence at a
// time: six sequences at different positions, batched in an order other than the one they were
// created in, over two steps (the second reads the states the first wrote). The same kernel code
// and key splits run per row, so the results are bit-identical.
TEST(CudaOps, BatchedDecodeOpsEqualOneSequenceAtATime) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  const ModelConfig& c = m.c;
  Backend& gpu = *pair().gpu;
  constexpr int B = 6;
  const int prompts[B] = {5, 40, 1, 130, 17, 64};
  std::vector<std::unique_ptr<SequenceState>> batched, alone;  // allocated in turn: states interleave
  for (int s = 0; s < B; ++s) {
    batched.push_back(gpu.new_sequence(256));
    alone.push_back(gpu.new_sequence(256));
    gpu_prefill(*batched.back(), prompts[s], 200 + 10 * s);
    alone.back()->copy_from(*batched.back());
  }
  const int64_t q_width = int64_t(c.n_heads) * c.head_dim, kv_width = int64_t(c.n_kv_heads) * c.head_dim;
  for (const std::vector<int>& order : {std::vector<int>{3, 0, 5, 1, 4, 2}, std::vector<int>{1, 4, 2, 5, 0, 3}}) {
    Input q(B, q_width, 1), k(B, kv_width, 2), v(B, kv_width, 3), g(B, q_width, 4);
    Input qkv(B, c.gdn_conv_channels(), 5), z(B, c.gdn_value_dim(), 6);
    Input b(B, c.lin_v_heads, 7, 1.0f, true), a(B, c.lin_v_heads, 8, 1.0f, true);
    const Tensor q1 = gpu_copy(q), k1 = gpu_copy(k);
    Output attn(B, q_width), attn1(B, q_width), gdn(B, c.gdn_value_dim()), gdn1(B, c.gdn_value_dim());
    const std::vector<int32_t> ids(B, 1);
    std::vector<SequenceState*> states;
    for (int s : order) states.push_back(batched[size_t(s)].get());
    gpu.begin_batch(ids.data(), states.data(), B);
    gpu.embed(m.w.embed, gpu.alloc(B, c.hidden));
    gpu.qk_norm_rope(q.gpu, k.gpu, m.w.layers[1].attn);
    gpu.attention_batch(q.gpu, k.gpu, v.gpu, &g.gpu, 1, states.data(), attn.gpu);
    gpu.deltanet_batch(qkv.gpu, z.gpu, b.gpu, a.gpu, m.w.layers[0].gdn, 0, states.data(), gdn.gpu);
    for (int r = 0; r < B; ++r) {
      SequenceState& st = *alone[size_t(order[size_t(r)])];
      gpu.begin_forward(ids.data(), 1, st);
      gpu.embed(m.w.embed, gpu.alloc(1, c.hidden));
      const Tensor g_row = g.gpu.rows_view(r, 1);
      gpu.qk_norm_rope(q1.rows_view(r, 1), k1.rows_view(r, 1), m.w.layers[1].attn);
      gpu.attention(q1.rows_view(r, 1), k1.rows_view(r, 1), v.gpu.rows_view(r, 1), &g_row, 1, st,
                    attn1.gpu.rows_view(r, 1));
      gpu.deltanet(qkv.gpu.rows_view(r, 1), z.gpu.rows_view(r, 1), b.gpu.rows_view(r, 1), a.gpu.rows_view(r, 1),
                   m.w.layers[0].gdn, 0, st, gdn1.gpu.rows_view(r, 1));
    }
    for (int s = 0; s < B; ++s) {
      batched[size_t(s)]->n_past += 1;
      alone[size_t(s)]->n_past += 1;
    }
    EXPECT_EQ(gpu_values(q.gpu), gpu_values(q1)) << "q after norm and RoPE";
    EXPECT_EQ(gpu_values(k.gpu), gpu_values(k1)) << "k after norm and RoPE";
    EXPECT_EQ(gpu_values(attn.gpu), gpu_values(attn1.gpu)) << "attention";
    EXPECT_EQ(gpu_values(gdn.gpu), gpu_values(gdn1.gpu)) << "DeltaNet";
    const std::vector<float> out = gpu_values(gdn.gpu);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
  }
}

class CudaMoe : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CudaMoe, RoutedAndSharedExpertsMatchCpu) {
  REQUIRE_GPU();
  const auto [layer, T] = GetParam();
  const RealShapeModel& m = model();
  Input x(T, m.c.hidden, 50 + T);
  Output out(T, m.c.hidden);
  pair().cpu.moe(x.cpu, m.w.layers[layer].ffn, out.cpu);
  pair().gpu->moe(x.gpu, m.w.layers[layer].ffn, out.gpu);
  EXPECT_LT(out.rel_error(), kMoeTol) << "layer " << layer << " T=" << T;
}

// The post-attention norm, the MoE block and the residual add: T = 1 and 3 stage the norm in the
// router and experts and add inside the down projection (x and scratch are not written), 70 and
// 400 run norm, MoE and add. The update to h is compared.
TEST_P(CudaMoe, NormFoldedAndAddedMatchesCpu) {
  REQUIRE_GPU();
  const auto [layer, T] = GetParam();
  const RealShapeModel& m = model();
  const LayerWeights& L = m.w.layers[layer];
  Input h(T, m.c.hidden, 130 + T, 3.0f, /*fp32=*/true);
  Output x(T, m.c.hidden, /*fp32=*/true), scratch(T, m.c.hidden);
  pair().cpu.run({op::RmsNorm{h.cpu, &L.post_norm, 1e-6f, x.cpu}, op::Moe{x.cpu, &L.ffn, scratch.cpu},
                  op::Add{h.cpu, scratch.cpu}});
  pair().gpu->run({op::RmsNorm{h.gpu, &L.post_norm, 1e-6f, x.gpu}, op::Moe{x.gpu, &L.ffn, scratch.gpu},
                   op::Add{h.gpu, scratch.gpu}});
  EXPECT_LT(update_error(h), kMoeTol) << "layer " << layer << " T=" << T;
}

// A mixer's output projection and the MoE block after it: at T = 1 the router's sums ride on the
// projection (integer atomics) and the experts pick from them (layer 2: 4-bit experts behind the
// 4-bit attention output projection); twice in a row, since the down kernel must leave the sums
// cleared for the next use. The ops run apart at T = 3, for layer 0 (a bf16 projection too wide for
// the shared-memory GEMV) and layer 1 (the general expert kernels).
TEST_P(CudaMoe, ProjectionThenMoeMatchesCpu) {
  REQUIRE_GPU();
  const auto [layer, T] = GetParam();
  if (T > 3) GTEST_SKIP() << "decode sizes only (T = " << T << ")";
  const RealShapeModel& m = model();
  const LayerWeights& L = m.w.layers[layer];
  const Matrix& w = layer == 0 ? L.gdn.out : m.w.layers[1].attn.o;
  for (int run = 0; run < 2; ++run) {
    Input y(T, w.cols, 140 + T + run), h(T, m.c.hidden, 150 + T + run, 3.0f, /*fp32=*/true);
    Output mix(T, m.c.hidden), x(T, m.c.hidden, /*fp32=*/true), ffn(T, m.c.hidden);
    Backend* cpu = &pair().cpu;
    for (auto [be, yt, ht, mt, xt, ft] : {std::tuple{cpu, y.cpu, h.cpu, mix.cpu, x.cpu, ffn.cpu},
                                          {pair().gpu.get(), y.gpu, h.gpu, mix.gpu, x.gpu, ffn.gpu}})
      be->run({op::Linear{yt, &w, mt}, op::Add{ht, mt}, op::RmsNorm{ht, &L.post_norm, 1e-6f, xt},
               op::Moe{xt, &L.ffn, ft}, op::Add{ht, ft}});
    EXPECT_LT(update_error(h), kMoeTol) << "layer " << layer << " T=" << T << " run " << run;
  }
}

// T = 1 and 3 use the decode path (one launch for all experts), 12 and 64 the batched step's
// tensor-core experts over the device-built tiles (expert_rows), 70 and 400 the device-planned
// grouped GEMM (400: 3200 assignments, so experts span several 64-row tiles); layer 0 has bf16 experts
// (the staged kernels, gate+up from registers), layer 1 4-bit ones beside a bf16 shared expert
// (the general kernels), layer 2 4-bit ones throughout (the staged kernels, at T = 1 gate+up
// from shared memory).
INSTANTIATE_TEST_SUITE_P(Paths, CudaMoe,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(1, 3, 12, 64, 70, 400)));

TEST(CudaOps, DenseMlpMatchesCpu) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  for (int T : {1, 40}) {
    Input x(T, m.c.hidden, 60 + T);
    Output out(T, m.c.hidden);
    pair().cpu.mlp(x.cpu, m.w.layers[0].ffn.shared, out.cpu);
    pair().gpu->mlp(x.gpu, m.w.layers[0].ffn.shared, out.gpu);
    EXPECT_LT(out.rel_error(), kMoeTol) << "T=" << T;
  }
}

// The whole forward pass at the real dimensions (one DeltaNet and one gated-attention layer, 256
// experts): logits cosine >= 0.999 at every position, prefill in chunks and decode with graphs.
TEST(CudaModel, RealShapeLogitsMatchCpuAtEveryPosition) {
  REQUIRE_GPU();
  test::expect_real_shape_agreement(test::real_shape_cosines(model().c, model().w), "real-shape model");
}

// A CUDA backend on 4-bit weights.
std::unique_ptr<Backend> int4_backend() {
  CudaOptions o;
  o.progress = false;
  o.weights = DeviceWeights::Int4;
  return make_cuda_backend(o);
}

// n token ids drawn fresh each run.
std::vector<int32_t> random_prompt(int n, int vocab) {
  std::mt19937 rng(std::random_device{}());
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = int32_t(rng() % uint32_t(vocab));
  return ids;
}

// Recorded decode steps on either side of kCudaShortAttentionKeys: the short context's graph until
// the bound, the cluster launch's past it, on a one-layer dense attention model (no router to
// flip): every step's logits against the CPU's.
TEST(CudaModel, DecodeAcrossTheShortAttentionBoundMatchesCpu) {
  REQUIRE_GPU();
  static const Qwen3AttentionModel m;
  CpuBackend cpu_backend;
  CudaOptions o;
  o.progress = false;
  auto gpu_backend = make_cuda_backend(o);
  Model cpu(m.c, m.w, cpu_backend), gpu(m.c, m.w, *gpu_backend);
  const std::vector<int32_t> ids = random_prompt(kCudaShortAttentionKeys - 6, m.c.vocab);
  const int steps = 12, V = m.c.vocab;
  auto cs = cpu.new_sequence(int(ids.size()) + steps), gs = gpu.new_sequence(int(ids.size()) + steps);
  std::vector<float> a(size_t(steps) * V), b(size_t(steps) * V, NAN);
  cpu.forward(ids.data(), int(ids.size()), *cs, nullptr);
  gpu.forward(ids.data(), int(ids.size()), *gs, nullptr);
  for (int i = 0; i < steps; ++i) {
    cpu.forward(&ids[size_t(i)], 1, *cs, a.data() + size_t(i) * V);
    gpu.forward(&ids[size_t(i)], 1, *gs, b.data() + size_t(i) * V);
  }
  const std::vector<double> cosines = test::row_cosines(a, b, steps, V);
  for (int i = 0; i < steps; ++i)
    EXPECT_GE(cosines[size_t(i)], 0.999) << "decode step at " << int(ids.size()) + i + 1 << " keys";
}

// A 7-token random prompt, then `steps` greedy decode steps (recorded and replayed; the last one
// timed op by op on the first backend), on two models of the real shapes side by side; the
// prefill's and each step's logits must be the same bits. Returns the op names of the timed step.
std::vector<std::string> expect_same_bits(Model& first, Backend& first_backend, Model& second, int steps) {
  const RealShapeModel& m = model();
  const std::vector<int32_t> ids = random_prompt(7, m.c.vocab);
  const int V = m.c.vocab;
  auto fs = first.new_sequence(int(ids.size()) + steps), ss = second.new_sequence(int(ids.size()) + steps);
  std::vector<float> a(V), b(V);
  std::vector<std::string> timed_ops;
  for (int step = -1; step < steps; ++step) {  // -1: the prefill
    const int32_t next = int32_t(std::max_element(b.begin(), b.end()) - b.begin());
    std::fill(a.begin(), a.end(), std::nanf(""));  // a logit left unwritten differs from the other run's
    std::fill(b.begin(), b.end(), INFINITY);
    const bool timed = step == steps - 1;
    if (timed) first_backend.time_ops(true);
    if (step < 0) {
      first.forward(ids.data(), int(ids.size()), *fs, a.data());
      second.forward(ids.data(), int(ids.size()), *ss, b.data());
    } else {
      first.forward(&next, 1, *fs, a.data());
      second.forward(&next, 1, *ss, b.data());
    }
    if (timed) {
      for (const auto& [name, us] : first_backend.take_op_times()) timed_ops.push_back(name);
      first_backend.time_ops(false);
    }
    double diff = 0.0;
    for (int i = 0; i < V; ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * V), 0)
        << (step < 0 ? std::string("prefill") : "step " + std::to_string(step)) << ": max |diff| " << diff;
  }
  return timed_ops;
}

// Two runs of the same prompt on the same weights give the same bits: a run-to-run difference
// anywhere (an order-dependent float sum, a race) grows through the routers' top-k choices.
TEST(CudaModel, DecodeGivesTheSameBitsEveryRun) {
  REQUIRE_GPU();
  const RealShapeModel& m = model();
  auto first_backend = int4_backend(), second_backend = int4_backend();
  Model first(m.c, m.w, *first_backend), second(m.c, m.w, *second_backend);
  expect_same_bits(first, *first_backend, second, 24);
}

// A model of no layers (a token's logits: its embedding row through the final norm and the LM
// head), fresh random weights every run. Its 4-bit LM head of the released width holds one fresh
// row at every row of `tied` (neighbours in a block and rows of other blocks) and another at the
// last two rows only. Embedding row 0 points at the first (x = its codes less their mean: its
// copies' logits stand ~45 standard deviations above the rest), row 1 at the second; row 2 is zero
// (every logit 0), row 3 NaN (every logit NaN), rows 4-7 noise.
struct TiedHeadModel : RandomWeights {
  std::vector<int> tied, last;  // the planted rows, lowest first
  explicit TiedHeadModel(int vocab) {
    rng.seed(std::random_device{}());
    c = synthetic_config("qwen3.5-35b-a3b");
    c.vocab = vocab;
    c.n_layers = 0;
    c.layer_kinds.clear();
    c.layer_is_moe.clear();
    const int64_t H = c.hidden, words = H / 8;  // a row's 4-bit codes, 8 to a word
    tied = {vocab / 3, vocab / 3 + 1, vocab / 3 + 16, vocab / 2, vocab - 5};
    last = {vocab - 2, vocab - 1};
    w.lm_head = affine("lm_head", vocab, H);
    uint32_t* codes = word_buffers.back().data();
    const auto plant = [&](const std::vector<int>& rows) {
      std::vector<uint32_t> row(static_cast<size_t>(words));
      for (auto& v : row) v = uint32_t(rng());
      for (int r : rows) std::copy(row.begin(), row.end(), codes + r * words);
      return row;
    };
    const std::vector<uint32_t> a = plant(tied), b = plant(last);
    w.final_norm.assign(size_t(H), 1.0f);
    w.embed = dense("embed", 8, H);
    uint16_t* e = bf16_buffers.back().data();
    const auto aim = [&](int t, const std::vector<uint32_t>& row) {
      for (int64_t j = 0; j < H; ++j) e[t * H + j] = f32_to_bf16(float((row[j / 8] >> (4 * (j % 8))) & 15u) - 7.5f);
    };
    aim(0, a);
    aim(1, b);
    std::fill_n(e + 2 * H, H, f32_to_bf16(0.0f));
    std::fill_n(e + 3 * H, H, f32_to_bf16(NAN));
  }
};

// A greedy step's LM head leaves an argmax candidate a block and the argmax's last stage reduces
// them: the token must be the CPU's argmax of the logits the step wrote (the lowest of tied rows;
// a NaN never wins, and all NaN give the vocabulary size, as the two-kernel argmax does), for a
// prefill's last row and recorded decode steps, on the released vocabulary (a block streams ~1,900
// rows through its ring) and a short one (a block's tiles all in flight at once).
TEST(CudaModel, LmHeadArgmaxCandidatesGiveTheCpuArgmax) {
  REQUIRE_GPU();
  for (int vocab : {248320, 5000}) {
    const TiedHeadModel m(vocab);
    CudaOptions o;
    o.progress = false;
    auto backend = make_cuda_backend(o);
    Model model(m.c, m.w, *backend);
    const std::vector<std::vector<int32_t>> steps = {{5, 0}, {0}, {1}, {2}, {3}, {4}, {1}, {6}, {7}, {0}, {5}};
    auto st = model.new_sequence(16);
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool timed = i + 1 == steps.size();  // the last step op by op, to see which argmax ran
      if (timed) backend->time_ops(true);
      const Tensor out = model.forward_device(steps[i].data(), int(steps[i].size()), *st, KeepLogits::Last);
      const int32_t token = backend->greedy_token();
      backend->to_host(out, logits.data());
      const int32_t id = steps[i].back();
      const std::string where = "vocab " + std::to_string(vocab) + ", step " + std::to_string(i) + " (token " +
                                std::to_string(id) + ")";
      if (timed) {
        bool folded = false;
        for (const auto& [name, seconds] : backend->take_op_times()) folded |= name == "argmax (last stage)";
        backend->time_ops(false);
        EXPECT_TRUE(folded) << where << ": the LM head left no argmax candidates";
      }
      if (id == 3) {
        EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); })) << where;
        EXPECT_EQ(token, vocab) << where;
        continue;
      }
      EXPECT_EQ(token, argmax(logits.data(), vocab)) << where;
      if (id == 2) {
        EXPECT_EQ(token, 0) << where << ": every logit 0";
      }
      const std::vector<int>* planted = id == 0 ? &m.tied : id == 1 ? &m.last : nullptr;
      if (!planted) continue;
      EXPECT_EQ(token, planted->front()) << where;
      for (int r : *planted) EXPECT_EQ(logits[r], logits[planted->front()]) << where << ": row " << r << " is no tie";
    }
  }
}

}  // namespace
}  // namespace petrel
