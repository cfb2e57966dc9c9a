// The synthetic benchmark shapes carry the draft head their released checkpoints ship, shaped as the
// loader maps a real one, so `petrel bench --synthetic ... --speculative mtp` runs the real head.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace petrel
