// GPTQ and AWQ fixtures (tools/quant4_fixture.py from qwen3moe, group 32, and from the hybrid
// qwen35moe-text-per-expert, group 16: one tensor set per expert, unquantized routers, embeddings
// and lm_head in f16) on the CPU backend, against the logits of their weights dequantized by the
// tool into a plain f32 checkpoint.
#include <gtest/gtest.h>

#include <span>

#include "../unit/checkpoint_logits.h"
#include "core/npy.h"

namespace petrel {
namespace {

struct Variant {
  const char* fixture;
  const char* format_name;
  int bits;
};

const Variant kVariants[] = {
    {"qwen3moe-gptq4", "gptq 4-bit, group 32", 4},      // asymmetric, zero points stored less 1
    {"qwen3moe-gptq8v2", "gptq 8-bit, group 32", 8},    // symmetric, checkpoint_format gptq_v2
    {"qwen3moe-awq4", "awq 4-bit, group 32", 4},        // gemm, interleaved nibbles
    {"qwen35moe-gptq4sym", "gptq 4-bit, group 16", 4},  // symmetric v1, as Qwen's -GPTQ-Int4
};

TEST(GptqAwqModel, LoadsAsAffineWithUnquantizedModulesDense) {
  for (const Variant& v : std::span(kVariants, 3)) {
    SCOPED_TRACE(v.fixture);
    const auto ck = Checkpoint::open(test::fixture_model(v.fixture));
    EXPECT_EQ(ck->info().format_name, v.format_name);
    EXPECT_TRUE(ck->info().skipped.empty()) << ck->info().skipped.front() << " was not used";
    const ModelWeights& w = ck->weights();
    const LayerWeights& dense = w.layers[0];
    const LayerWeights& moe = w.layers[1];
    for (const Matrix* m : {&dense.attn.q, &dense.attn.k, &dense.attn.v, &dense.attn.o, &dense.ffn.dense.gate,
                            &dense.ffn.dense.down, &moe.ffn.experts[0].gate, &moe.ffn.experts[5].down}) {
      EXPECT_EQ(m->format, MatrixFormat::Affine) << m->name;
      EXPECT_EQ(m->bits, v.bits) << m->name;
      EXPECT_EQ(m->group, 32) << m->name;
    }
    for (const Matrix* m : {&moe.ffn.router, &w.lm_head, &w.embed}) {
      EXPECT_EQ(m->format, MatrixFormat::Dense) << m->name;
      EXPECT_EQ(m->dtype, DType::F16) << m->name;
    }
  }
}

TEST(GptqAwqModel, HybridLoadsAsAffineWithRowMapsAndTinyHeadsDense) {
  const auto ck = Checkpoint::open(test::fixture_model("qwen35moe-gptq4sym"));
  EXPECT_TRUE(ck->info().skipped.empty()) << ck->info().skipped.front() << " was not used";
  const LayerWeights& gdn = ck->weights().layers[0];
  const LayerWeights& attn = ck->weights().layers[1];
  // q_proj's [query | gate] rows are gathered from one repacked matrix.
  EXPECT_TRUE(attn.attn.q.row_map && attn.attn.gate.row_map);
  for (const Matrix* m : {&gdn.gdn.qkv, &gdn.gdn.z, &gdn.gdn.out, &attn.attn.q, &attn.attn.gate, &attn.attn.o,
                          &gdn.ffn.experts[3].up, &gdn.ffn.shared.down}) {
    EXPECT_EQ(m->format, MatrixFormat::Affine) << m->name;
    EXPECT_EQ(m->group, 16) << m->name;
  }
  for (const Matrix* m : {&gdn.gdn.a, &gdn.gdn.b, &gdn.ffn.router, &gdn.ffn.shared_gate}) {
    EXPECT_EQ(m->format, MatrixFormat::Dense) << m->name;
    EXPECT_EQ(m->dtype, DType::F16) << m->name;
  }
}

TEST(GptqAwqModel, RepackingIsPartOfTheLoadProgress) {
  std::vector<std::pair<size_t, size_t>> calls;  // (done, total)
  const auto ck = Checkpoint::open(test::fixture_model("qwen3moe-awq4"),
                                   [&](size_t done, size_t total) { calls.emplace_back(done, total); });
  size_t bytes = 0;  // every tensor of the file, each counted once
  for (const auto& f : ck->files())
    for (const auto& [name, t] : f->tensors()) bytes += t.nbytes;
  ASSERT_FALSE(calls.empty());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, bytes);
    if (i > 0) EXPECT_GE(calls[i].first, calls[i - 1].first);
  }
  EXPECT_EQ(calls.back().first, bytes);
}

TEST(GptqAwqModel, LogitsMatchTheDequantizedReferenceAtEveryPosition) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.fixture);
    const auto ck = Checkpoint::open(test::fixture_model(v.fixture));
    const std::vector<int32_t> prompt = test::reference_prompt(v.fixture);
    const NpyArray want = read_npy_f32(test::fixture_model(v.fixture) + "/logits.npy");
    ASSERT_EQ(want.shape, (std::vector<int64_t>{int64_t(prompt.size()), ck->config().vocab}));
    test::expect_logits_within(want.data, test::prompt_logits(*ck, prompt), 1e-5f);
  }
}

}  // namespace
}  // namespace petrel
