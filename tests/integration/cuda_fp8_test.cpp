// Fine-grained FP8 matrices (e4m3 codes, one fp32 scale per 128x128 block) on the CUDA backend
// against the CPU reference, which decodes them exactly: the device keeps the codes and block
// scales (WFormat::F8) and every kernel family reads them (decode GEMV, the rows kernel, the GEMM,
// the expert kernels). Random weights at the Qwen3.5-35B-A3B layer dimensions quantized as FP8
// releases are made, experts both as tensors of their own and as slabs of one stacked tensor, the
// attention's q and gate as row gathers of one tensor; fresh inputs each run, outputs poisoned.
// Skipped, with a message, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cuda_real_shape.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/npy.h"
#include "model/fp8_quantize.h"
#include "model/synthetic.h"
#include "runtime/forward.h"

namespace petrel {
namespace {

constexpr int kBlock = 128;

// Random weights with FP8 matrices beside: uniform ±sqrt(3/cols) weights quantized block by block
// (quantize_fp8_blocks: the arithmetic of transformers' fine-grained FP8 quantizer).
struct Fp8Weights : test::RandomWeights {
  std::deque<std::vector<uint8_t>> code_buffers;
  std::deque<std::vector<float>> scale_buffers;
  std::deque<std::vector<int32_t>> row_maps;

  // A stored [slabs·rows, cols] tensor of `slabs` slabs, each with its own scale grid (a stacked
  // expert tensor; one slab: a plain matrix). Returns slab 0's view; slab(m, s) gives the others.
  Matrix tensor(const std::string& name, int64_t rows, int64_t cols, int slabs = 1) {
    const float range = std::sqrt(3.0f / float(cols));
    std::uniform_real_distribution<float> u(-range, range);
    const int64_t grid = ((rows + kBlock - 1) / kBlock) * ((cols + kBlock - 1) / kBlock);
    code_buffers.emplace_back(size_t(slabs * rows * cols));
    scale_buffers.emplace_back(size_t(slabs * grid));
    std::vector<float> w(size_t(rows * cols));
    for (int s = 0; s < slabs; ++s) {
      for (auto& v : w) v = u(rng);
      quantize_fp8_blocks(w.data(), rows, cols, kBlock, kBlock, code_buffers.back().data() + s * rows * cols,
                          scale_buffers.back().data() + s * grid);
    }
    Matrix m;
    m.name = name + " (fp8)";
    m.rows = rows;
    m.cols = cols;
    m.format = MatrixFormat::Fp8;
    m.dtype = DType::F32;
    m.data = code_buffers.back().data();
    m.scales = scale_buffers.back().data();
    m.fp8 = Fp8Blocks{kBlock, kBlock, rows, 0};
    return m;
  }
  static Matrix slab(const Matrix& first, int s) { return first.slice_rows(int64_t(s) * first.rows, first.rows); }
  // Rows [head·D, head·D + D) of every even (odd) head block of a [2·heads·D, cols] tensor: the q
  // and gate halves of an interleaved q_proj.
  Matrix heads(const Matrix& t, int heads, int D, int which) {
    row_maps.emplace_back();
    for (int h = 0; h < heads; ++h)
      for (int d = 0; d < D; ++d) row_maps.back().push_back(int32_t((2 * h + which) * D + d));
    Matrix m = t;
    m.rows = int64_t(heads) * D;
    m.row_map = std::make_shared<const std::vector<int32_t>>(row_maps.back());
    return m;
  }
};

// Qwen3.5-35B-A3B's layer dimensions with 32 experts: a DeltaNet and an attention layer, every
// matrix an FP8 release quantizes in FP8 (embedding, LM head, routers and shared gates bf16).
struct Fp8Model : Fp8Weights {
  Fp8Model() {
    c = synthetic_config("qwen3.5-35b-a3b");
    c.vocab = 4096;
    c.n_layers = 2;
    c.n_experts = 32;
    c.layer_kinds = {LayerKind::DeltaNet, LayerKind::FullAttention};
    c.layer_is_moe = {true, true};
    const int64_t H = c.hidden, I = c.moe_intermediate, KV = int64_t(c.n_kv_heads) * c.head_dim;
    w.embed = dense("embed", c.vocab, H);
    w.lm_head = dense("lm_head", c.vocab, H);
    w.final_norm = vec(H, 0.8f, 1.2f);
    w.layers.resize(2);
    for (int i = 0; i < 2; ++i) {
      LayerWeights& L = w.layers[i];
      L.kind = c.layer_kinds[i];
      L.input_norm = vec(H, 0.8f, 1.2f);
      L.post_norm = vec(H, 0.8f, 1.2f);
      L.ffn.moe = true;
      L.ffn.router = dense("router", c.n_experts, H, 8.0f);  // a clear top-k (cuda_ops_test says why)
      // Layer 0's experts are tensors of their own (Qwen's FP8 releases), layer 1's slabs of
      // stacked gate, up and down tensors.
      const Matrix gate = tensor("experts.gate", I, H, i == 1 ? c.n_experts : 1);
      const Matrix up = tensor("experts.up", I, H, i == 1 ? c.n_experts : 1);
      const Matrix down = tensor("experts.down", H, I, i == 1 ? c.n_experts : 1);
      for (int e = 0; e < c.n_experts; ++e)
        L.ffn.experts.push_back(i == 1 ? MlpWeights{slab(gate, e), slab(up, e), slab(down, e)}
                                       : MlpWeights{tensor("gate", I, H), tensor("up", I, H), tensor("down", H, I)});
      L.ffn.has_shared = true;
      L.ffn.shared = {tensor("sgate", I, H), tensor("sup", I, H), tensor("sdown", H, I)};
      L.ffn.shared_gate = dense("shared_expert_gate", 1, H, 1.0f);
    }
    DeltaNetWeights& G = w.layers[0].gdn;
    G.qkv = tensor("qkv", c.gdn_conv_channels(), H);
    G.z = tensor("z", c.gdn_value_dim(), H);
    G.b = tensor("b", c.lin_v_heads, H);
    G.a = tensor("a", c.lin_v_heads, H);
    G.out = tensor("out", H, c.gdn_value_dim());
    G.conv = vec(size_t(c.gdn_conv_channels()) * 4, -0.5f, 0.5f);
    G.A_log = vec(c.lin_v_heads, 0.0f, 2.7f);
    G.dt_bias = vec(c.lin_v_heads, -1.0f, 1.0f);
    G.norm = vec(c.lin_v_dim, 0.8f, 1.2f);
    AttentionWeights& A = w.layers[1].attn;
    const Matrix q_proj = tensor("q_proj", 2 * int64_t(c.n_heads) * c.head_dim, H);
    A.q = heads(q_proj, c.n_heads, c.head_dim, 0);
    A.gate = heads(q_proj, c.n_heads, c.head_dim, 1);
    A.k = tensor("k", KV, H);
    A.v = tensor("v", KV, H);
    A.o = tensor("o", H, int64_t(c.n_heads) * c.head_dim);
    A.q_norm = vec(c.head_dim, 0.8f, 1.2f);
    A.k_norm = vec(c.head_dim, 0.8f, 1.2f);
  }
};

Fp8Model& model() {
  static Fp8Model m;
  return m;
}

test::BackendPair& pair() {
  static test::BackendPair p(model().c, model().w);
  return p;
}

// The decode GEMV multiplies exact code values by the scale in fp32; the rows kernel and the GEMM
// round each weight to bf16 for the tensor cores, and outputs round to bf16 once: the projections'
// tolerance of cuda_ops_test, and its MoE one.
constexpr double kLinearTol = 1e-2;
constexpr double kMoeTol = 3e-2;

class CudaFp8Linear : public ::testing::TestWithParam<int> {};

// One token (GEMV), a few (the rows kernel), many (the GEMM): every FP8 matrix, row gathers included.
TEST_P(CudaFp8Linear, EveryProjectionMatchesCpu) {
  REQUIRE_GPU();
  const int T = GetParam();
  const ModelWeights& w = model().w;
  const DeltaNetWeights& G = w.layers[0].gdn;
  const AttentionWeights& A = w.layers[1].attn;
  const MlpWeights& S = w.layers[0].ffn.shared;
  for (const Matrix* m : {&G.qkv, &G.z, &G.b, &G.out, &A.q, &A.gate, &A.k, &A.v, &A.o, &S.gate, &S.down}) {
    test::PairIo io(pair(), T, m->cols, m->rows);
    io.p.cpu.linear(io.cx, *m, io.cy);
    io.p.gpu->linear(io.gx, *m, io.gy);
    EXPECT_LT(io.rel_error(), kLinearTol) << m->name << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, CudaFp8Linear, ::testing::Values(1, 3, 8, 16, 64, 300));

class CudaFp8Moe : public ::testing::TestWithParam<int> {};

// Routed plus shared experts of both layers: experts of their own and slabs of stacked tensors.
TEST_P(CudaFp8Moe, ExpertsOfOwnAndStackedTensorsMatchCpu) {
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

INSTANTIATE_TEST_SUITE_P(Tokens, CudaFp8Moe, ::testing::Values(1, 2, 9, 64, 200));

// The whole model, prefill then decode steps, held to the bounds of the bf16/4-bit real-shape
// model in cuda_ops_test.
TEST(CudaFp8, ModelLogitsMatchCpu) {
  REQUIRE_GPU();
  test::expect_real_shape_agreement(test::real_shape_cosines(model().c, model().w), "FP8 model");
}

// `--quantize fp8` on the GPU computes what the CPU's does: the bf16 fixture quantized at load,
// logits of its reference prompt compared position by position.
TEST(CudaFp8, CommandLineQuantizesOnTheGpu) {
  REQUIRE_GPU();
  const std::string bf16 = test::fixture_model("qwen35moe-vlm-fused");
  test::TempDir tmp;
  const auto prompt = nlohmann::json::parse(std::ifstream(bf16 + "/reference.json"))["prompt_ids"];
  std::string ids;
  for (int id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  for (const char* device : {"cpu", "cuda"}) {
    const auto run = test::run_petrel(std::string("dump-logits ") + bf16 + " --device " + device +
                                      " --quantize fp8 --prompt-ids " + ids + " --out " + tmp.str(device));
    ASSERT_EQ(run.status, 0) << run.out;
  }
  const std::vector<float> cpu = read_npy_f32(tmp.str("cpu")).data, gpu = read_npy_f32(tmp.str("cuda")).data;
  ASSERT_EQ(cpu.size(), gpu.size());
  const int T = int(prompt.size()), V = int(cpu.size()) / T;
  // The fixture bounds of cuda_model_test: the tiny random fixtures amplify bf16 noise at a few
  // positions (docs/cuda-backend.md, Precision).
  std::vector<double> cosines = test::row_cosines(cpu, gpu, T, V);
  std::sort(cosines.begin(), cosines.end());
  const auto below = std::count_if(cosines.begin(), cosines.end(), [](double c) { return c < 0.999; });
  EXPECT_GE(cosines[cosines.size() / 2], 0.9999);
  EXPECT_LE(below, T * 15 / 100);
  EXPECT_GE(cosines[0], 0.8);
}

// A synthetic model stored as FP8 (bench --weights fp8) uploads random codes that are never NaN.
TEST(CudaFp8, SyntheticFp8ModelGivesFiniteLogits) {
  REQUIRE_GPU();
  ModelConfig c = synthetic_config("qwen3.5-35b-a3b");
  c.n_layers = 4;
  c.layer_kinds.resize(4);
  c.layer_is_moe.resize(4);
  auto w = synthetic_weights(c);
  store_as_fp8(*w);
  CudaOptions o;
  o.progress = false;
  auto gpu = make_cuda_backend(o);
  Model model(c, *w, *gpu, ForwardOptions{});
  std::vector<int32_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[size_t(i)] = (i * 7919) % c.vocab;
  std::vector<float> logits(size_t(c.vocab));
  auto seq = model.new_sequence(65);
  model.forward(ids.data(), int(ids.size()), *seq, logits.data());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace petrel
