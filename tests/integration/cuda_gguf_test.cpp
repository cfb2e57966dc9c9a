// GGUF block matrices on the CUDA backend against the CPU reference: every block type with an
// affine form (Q4_0 .. Q6_K) goes up as its own codes, scales and biases, IQ4_NL and IQ4_XS as
// their codes and scales read through the 16 levels, and each projection, an MoE block mixing
// types as llama.cpp's Q4_K_M does (4-bit gate/up, 6-bit down), one all IQ4, and a whole model
// must agree with the CPU, which decodes the blocks as gguf-py does. Random valid blocks at
// the Qwen3.5-35B-A3B layer dimensions, fresh inputs each run, outputs poisoned. Skipped, with a
// message, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>

#include "cuda_real_shape.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "model/synthetic.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

// f16 bits of a positive float below 65504 (truncated; subnormal under 2^-14, as the small
// scales of 6-bit blocks are): the block scales written below.
uint16_t f16_bits(float x) {
  if (x < 0x1p-14f) return uint16_t(x * 0x1p24f);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((((u >> 23) & 0xff) - 112) << 10 | (u & 0x7fffff) >> 13);
}

// Where each type keeps its f16 scale d and (second field) min or dmin, and the d (and min) that
// make its weights span about ±`range` with the codes' full spread.
struct BlockScales {
  int d_at, m_at;  // byte offsets in the block; m_at -1: none
  float d, m;      // multiples of range
};

BlockScales block_scales(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: return {0, -1, 1.0f / 8, 0};
    case GgmlType::Q4_1: return {0, 2, 2.0f / 15, 0};  // m (the bias) negated below
    case GgmlType::Q5_0: return {0, -1, 1.0f / 16, 0};
    case GgmlType::Q5_1: return {0, 2, 2.0f / 31, 0};
    case GgmlType::Q8_0: return {0, -1, 1.0f / 127, 0};
    case GgmlType::Q2_K: return {80, 82, 2.0f / 45, 1.0f / 15};
    case GgmlType::Q3_K: return {108, -1, 1.0f / 128, 0};
    case GgmlType::Q4_K: return {0, 2, 2.0f / (63 * 15), 1.0f / 63};
    case GgmlType::Q5_K: return {0, 2, 2.0f / (63 * 31), 1.0f / 63};
    case GgmlType::Q6_K: return {208, -1, 1.0f / (128 * 32), 0};
    case GgmlType::IQ4_NL: return {0, -1, 1.0f / 127, 0};
    case GgmlType::IQ4_XS: return {0, -1, 1.0f / (127 * 32), 0};  // times a sub-scale of -32..31
    default: ADD_FAILURE() << "no block scales for " << ggml_type_name(t); return {};
  }
}

// Random weights with GGUF block matrices beside: random codes, scales spanning the range of a
// uniform ±sqrt(3/cols) weight.
struct GgufWeights : test::RandomWeights {
  std::deque<std::vector<uint8_t>> block_buffers;

  Matrix blocks(const std::string& name, GgmlType t, int64_t rows, int64_t cols) {
    const GgmlTypeInfo& info = ggml_type_info(t);
    block_buffers.emplace_back(size_t(rows * ggml_row_bytes(t, cols)));
    std::vector<uint8_t>& b = block_buffers.back();
    for (auto& v : b) v = uint8_t(rng());
    const float range = std::sqrt(3.0f / float(cols));
    const BlockScales s = block_scales(t);
    std::uniform_real_distribution<float> jitter(0.5f, 1.0f);
    for (size_t at = 0; at < b.size(); at += size_t(info.bytes)) {
      const uint16_t d = f16_bits(s.d * range * jitter(rng));
      std::memcpy(&b[at + size_t(s.d_at)], &d, 2);
      if (s.m_at < 0) continue;
      // Q4_1 / Q5_1 add m; the K-quants subtract dmin·m.
      const float m = s.m > 0 ? s.m * range * jitter(rng) : range * jitter(rng);
      const uint16_t mb = f16_bits(m) | (s.m > 0 ? 0 : 0x8000);
      std::memcpy(&b[at + size_t(s.m_at)], &mb, 2);
    }
    Matrix m;
    m.name = name + " (" + ggml_type_name(t) + ")";
    m.rows = rows;
    m.cols = cols;
    m.format = MatrixFormat::Gguf;
    m.ggml = t;
    m.data = b.data();
    return m;
  }
};

// Qwen3.5-35B-A3B's layer dimensions with 32 experts: a DeltaNet and an attention layer, every
// matrix a GGUF block type (all ten affine ones and both IQ4 ones between them).
struct GgufModel : GgufWeights {
  GgufModel() {
    c = synthetic_config("qwen3.5-35b-a3b");
    c.vocab = 4096;
    c.n_layers = 2;
    c.n_experts = 32;
    c.layer_kinds = {LayerKind::DeltaNet, LayerKind::FullAttention};
    c.layer_is_moe = {true, true};
    const int64_t H = c.hidden, I = c.moe_intermediate, Q = int64_t(c.n_heads) * c.head_dim,
                  KV = int64_t(c.n_kv_heads) * c.head_dim;
    w.embed = blocks("embed", GgmlType::Q4_K, c.vocab, H);
    w.lm_head = blocks("lm_head", GgmlType::Q6_K, c.vocab, H);
    w.final_norm = vec(H, 0.8f, 1.2f);
    w.layers.resize(2);
    for (int i = 0; i < 2; ++i) {
      LayerWeights& L = w.layers[i];
      L.kind = c.layer_kinds[i];
      L.input_norm = vec(H, 0.8f, 1.2f);
      L.post_norm = vec(H, 0.8f, 1.2f);
      L.ffn.moe = true;
      L.ffn.router = dense("router", c.n_experts, H, 8.0f);  // a clear top-k (cuda_ops_test says why)
      // Layer 0 as Q4_K_M stores experts (4-bit gate/up, 6-bit down: two formats in one block),
      // layer 1 all IQ4 (one device format: the staged expert kernels).
      const GgmlType gate_up = i == 0 ? GgmlType::Q4_K : GgmlType::IQ4_XS;
      const GgmlType down = i == 0 ? GgmlType::Q6_K : GgmlType::IQ4_XS;
      for (int e = 0; e < c.n_experts; ++e)
        L.ffn.experts.push_back({blocks("gate", gate_up, I, H), blocks("up", gate_up, I, H),
                                 blocks("down", down, H, I)});
      const GgmlType shared = i == 0 ? GgmlType::Q8_0 : GgmlType::IQ4_NL;  // IQ4_NL: IQ4_XS's device layout
      L.ffn.has_shared = true;
      L.ffn.shared = {blocks("sgate", shared, I, H), blocks("sup", shared, I, H), blocks("sdown", shared, H, I)};
      L.ffn.shared_gate = dense("shared_expert_gate", 1, H, 1.0f);
    }
    DeltaNetWeights& G = w.layers[0].gdn;
    G.qkv = blocks("qkv", GgmlType::Q4_0, c.gdn_conv_channels(), H);
    G.z = blocks("z", GgmlType::Q5_K, c.gdn_value_dim(), H);
    G.b = blocks("b", GgmlType::Q8_0, c.lin_v_heads, H);
    G.a = blocks("a", GgmlType::IQ4_NL, c.lin_v_heads, H);
    G.out = blocks("out", GgmlType::Q2_K, H, c.gdn_value_dim());
    G.conv = vec(size_t(c.gdn_conv_channels()) * 4, -0.5f, 0.5f);
    G.A_log = vec(c.lin_v_heads, 0.0f, 2.7f);
    G.dt_bias = vec(c.lin_v_heads, -1.0f, 1.0f);
    G.norm = vec(c.lin_v_dim, 0.8f, 1.2f);
    AttentionWeights& A = w.layers[1].attn;
    A.q = blocks("q", GgmlType::Q5_0, Q, H);
    A.gate = blocks("gate", GgmlType::Q5_1, Q, H);
    A.k = blocks("k", GgmlType::Q3_K, KV, H);
    A.v = blocks("v", GgmlType::Q4_1, KV, H);
    A.o = blocks("o", GgmlType::Q6_K, H, Q);
    A.q_norm = vec(c.head_dim, 0.8f, 1.2f);
    A.k_norm = vec(c.head_dim, 0.8f, 1.2f);
  }
};

GgufModel& model() {
  static GgufModel m;
  return m;
}

test::BackendPair& pair() {
  static test::BackendPair p(model().c, model().w);
  return p;
}

// The device keeps each group's scale and bias in bf16 (2^-9 relative), then the output rounds
// to bf16 once: the projections' tolerance of cuda_ops_test, and its MoE one.
constexpr double kLinearTol = 1e-2;
constexpr double kMoeTol = 3e-2;

class CudaGgufLinear : public ::testing::TestWithParam<int> {};

// One token (GEMV), a few (the rows kernel), many (the GEMM): every matrix, every type.
TEST_P(CudaGgufLinear, EveryBlockTypeMatchesCpu) {
  REQUIRE_GPU();
  const int T = GetParam();
  const ModelWeights& w = model().w;
  const DeltaNetWeights& G = w.layers[0].gdn;
  const AttentionWeights& A = w.layers[1].attn;
  const MlpWeights& S0 = w.layers[0].ffn.shared;
  const MlpWeights& S1 = w.layers[1].ffn.shared;
  for (const Matrix* m : {&w.lm_head, &G.qkv, &G.z, &G.b, &G.a, &G.out, &A.q, &A.gate, &A.k, &A.v, &A.o, &S0.gate,
                          &S0.down, &S1.up, &S1.down}) {
    test::PairIo io(pair(), T, m->cols, m->rows);
    io.p.cpu.linear(io.cx, *m, io.cy);
    io.p.gpu->linear(io.gx, *m, io.gy);
    EXPECT_LT(io.rel_error(), kLinearTol) << m->name << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaGgufLinear, ::testing::Values(1, 3, 8, 16, 64, 300));

class CudaGgufMoe : public ::testing::TestWithParam<int> {};

// Routed plus shared experts of both layers: mixed Q4_K/Q6_K experts and all-IQ4 ones.
TEST_P(CudaGgufMoe, MixedAndUniformExpertTypesMatchCpu) {
  REQUIRE_GPU();
  const int T = GetParam();
  for (int layer = 0; layer < 2; ++layer) {
    const int64_t H = model().c.hidden;
    test::PairIo io(pair(), T, H, H);
    io.p.cpu.moe(io.cx, model().w.layers[size_t(layer)].ffn, io.cy);
    io.p.gpu->moe(io.gx, model().w.layers[size_t(layer)].ffn, io.gy);
    EXPECT_LT(io.rel_error(), kMoeTol) << "layer " << layer << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaGgufMoe, ::testing::Values(1, 2, 9, 64, 200));

// The whole model, prefill then decode steps, held to the bounds of the bf16/4-bit real-shape
// model in cuda_ops_test.
TEST(CudaGguf, ModelLogitsMatchCpu) {
  REQUIRE_GPU();
  test::expect_real_shape_agreement(test::real_shape_cosines(model().c, model().w), "GGUF model");
}

}  // namespace
}  // namespace petrel
