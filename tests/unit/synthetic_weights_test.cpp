// The synthetic benchmark shapes carry the draft head their released checkpoints ship, shaped as the
// loader maps a real one, so `petrel bench --synthetic ... --speculative mtp` runs the real head.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/synthetic.h"

namespace petrel {
namespace {

TEST(SyntheticWeights, HybridShapesHaveAOneLayerMtpHead) {
  for (const char* name : {"qwen3.5-35b-a3b", "qwen3-next-80b-a3b"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = synthetic_config(name);
    const auto w = synthetic_weights(c);
    ASSERT_EQ(c.mtp_layers, 1);
    const MtpWeights& M = w->mtp;
    EXPECT_EQ(M.fc.rows, c.hidden);
    EXPECT_EQ(M.fc.cols, 2 * c.hidden);
    for (const auto* v : {&M.embed_norm, &M.hidden_norm, &M.norm}) EXPECT_EQ(int(v->size()), c.hidden);
    ASSERT_EQ(M.layers.size(), 1u);
    const LayerWeights& L = M.layers[0];
    EXPECT_EQ(L.kind, LayerKind::FullAttention);
    EXPECT_TRUE(L.attn.q.valid() && L.attn.gate.valid() && L.attn.o.valid());
    EXPECT_EQ(int(L.attn.q_norm.size()), c.head_dim);
    EXPECT_TRUE(L.ffn.moe);
    EXPECT_EQ(int(L.ffn.experts.size()), c.n_experts);
    EXPECT_TRUE(L.ffn.has_shared);
    EXPECT_EQ(L.ffn.router.rows, c.n_experts);
    EXPECT_EQ(L.attn.q.name, "mtp.layers.0.q");
  }
}

TEST(SyntheticWeights, Qwen3MoeHasNoHead) {
  const ModelConfig c = synthetic_config("qwen3-30b-a3b");
  EXPECT_EQ(c.mtp_layers, 0);
  EXPECT_TRUE(synthetic_weights(c)->mtp.layers.empty());
}

// Every matrix of a released shape stored as a GGUF mix has the type llama.cpp's quantiser gives it,
// a form the device kernels read, and rows of whole blocks (K-quant blocks span 256 columns).
TEST(SyntheticWeights, GgufMixesTypeEveryMatrixAsLlamaCppDoes) {
  const ModelConfig c = synthetic_config("qwen3.5-35b-a3b");
  for (const char* mix : {"q4_0", "q4_k_m"}) {
    SCOPED_TRACE(mix);
    auto w = synthetic_weights(c);
    store_as_gguf_mix(*w, mix);
    const bool k = std::string(mix) == "q4_k_m";
    const GgmlType base = k ? GgmlType::Q4_K : GgmlType::Q4_0;
    EXPECT_EQ(w->embed.ggml, base);
    EXPECT_EQ(w->lm_head.ggml, GgmlType::Q6_K);
    // 40 layers: the first and last five and every third between (7, 10, ...) take Q6_K down.
    for (int i : {0, 4, 5, 6, 7, 10, 34, 35, 39}) {
      const bool more = k && (i < 5 || i >= 35 || (i - 5) % 3 == 2);
      const LayerWeights& L = w->layers[size_t(i)];
      EXPECT_EQ(L.ffn.experts[3].down.ggml, more ? GgmlType::Q6_K : base) << "layer " << i;
      EXPECT_EQ(L.ffn.experts[3].gate.ggml, base) << "layer " << i;
      EXPECT_EQ(L.ffn.router.format, MatrixFormat::Dense) << "layer " << i;
    }
    EXPECT_EQ(w->layers[3].attn.v.ggml, k ? GgmlType::Q6_K : base);
    auto whole_blocks = [&](const Matrix& m) {
      if (!m.valid() || m.format == MatrixFormat::Dense) return;
      EXPECT_EQ(m.format, MatrixFormat::Gguf) << m.name;
      EXPECT_GT(ggml_affine_form(m.ggml).bits, 0) << m.name;
      EXPECT_EQ(m.cols % ggml_type_info(m.ggml).block, 0) << m.name;
    };
    whole_blocks(w->embed);
    for (const LayerWeights& L : w->layers)
      for (const Matrix* m : {&L.attn.q, &L.attn.gate, &L.attn.k, &L.attn.v, &L.attn.o, &L.gdn.qkv, &L.gdn.z, &L.gdn.b,
                              &L.gdn.a, &L.gdn.out, &L.ffn.shared.gate, &L.ffn.shared.down, &L.ffn.experts[0].down})
        whole_blocks(*m);
  }
  auto w = synthetic_weights(c);
  EXPECT_THROW(store_as_gguf_mix(*w, "q3_k_s"), Error);
}

}  // namespace
}  // namespace petrel
