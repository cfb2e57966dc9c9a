// GGUF checkpoints of the hybrid architectures (qwen35moe, qwen35, qwen3next): the safetensors
// fixtures converted here as llama.cpp's converter converts them (gguf_hybrid_convert.h) open
// into the same config and give the safetensors run's logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "checkpoint_logits.h"
#include "gguf_hybrid_convert.h"
#include "io/checkpoint.h"
#include "open_error.h"
#include "test_util.h"

namespace petrel {
namespace {

using test::TempDir;

// claimed_mtp_layers > 0: the metadata claims that many head layers whatever the tensors hold.
void convert(const std::string& fixture, const std::string& path, int claimed_mtp_layers = 0) {
  test::hybrid::convert(test::fixture_model(fixture), path, claimed_mtp_layers);
}

class GgufHybrid : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufHybrid, GivesTheSafetensorsLogits) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert(GetParam(), path);
  const auto hf = Checkpoint::open(test::fixture_model(GetParam()));
  const auto gg = Checkpoint::open(path);
  const ModelConfig &a = hf->config(), &b = gg->config();
  EXPECT_EQ(b.arch, a.arch);
  EXPECT_EQ(b.n_layers, a.n_layers);
  EXPECT_EQ(b.layer_kinds, a.layer_kinds);
  EXPECT_EQ(b.layer_is_moe, a.layer_is_moe);
  EXPECT_EQ(b.attn_output_gate, a.attn_output_gate);
  EXPECT_EQ(b.rotary_dim, a.rotary_dim);
  EXPECT_EQ(b.lin_k_heads, a.lin_k_heads);
  EXPECT_EQ(b.lin_v_heads, a.lin_v_heads);
  EXPECT_EQ(b.lin_k_dim, a.lin_k_dim);
  EXPECT_EQ(b.lin_v_dim, a.lin_v_dim);
  EXPECT_EQ(b.conv_kernel, a.conv_kernel);
  EXPECT_EQ(b.shared_intermediate, a.shared_intermediate);
  // config.json's intermediate_size of an all-MoE model is unused; the converter writes it anyway.
  if (std::count(a.layer_is_moe.begin(), a.layer_is_moe.end(), false) > 0) EXPECT_EQ(b.intermediate, a.intermediate);
  EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);
  EXPECT_EQ(gg->info().parameters, hf->info().parameters);
  for (size_t i = 0; i < a.layer_kinds.size(); ++i) {
    const LayerWeights &la = hf->weights().layers[i], &lb = gg->weights().layers[i];
    EXPECT_EQ(lb.input_norm, la.input_norm) << i;
    EXPECT_EQ(lb.post_norm, la.post_norm) << i;
    if (la.kind != LayerKind::DeltaNet) continue;
    EXPECT_EQ(lb.gdn.conv, la.gdn.conv) << i;
    EXPECT_EQ(lb.gdn.dt_bias, la.gdn.dt_bias) << i;
    EXPECT_EQ(lb.gdn.norm, la.gdn.norm) << i;
    for (size_t h = 0; h < la.gdn.A_log.size(); ++h) EXPECT_NEAR(lb.gdn.A_log[h], la.gdn.A_log[h], 1e-6) << i;
  }

  const std::vector<int32_t> prompt = test::reference_prompt(GetParam());
  test::expect_logits_within(test::prompt_logits(*hf, prompt), test::prompt_logits(*gg, prompt), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufHybrid,
                         ::testing::Values("qwen35moe-vlm-fused", "qwen35moe-text-per-expert", "qwen35-dense",
                                           "qwen3next-sharded", "qwen35moe-mtp"),
                         [](const auto& info) { return test::param_name(info.param); });

// The head's logits after the trunk's prompt (row t: h_t and prompt token t+1), as
// speculative_mtp_test computes them.
std::vector<float> mtp_logits(const Checkpoint& ck, const std::vector<int32_t>& ids) {
  CpuBackend backend{CpuOptions{1}};
  Model model(ck.config(), ck.weights(), backend, ForwardOptions{});
  const int T = int(ids.size());
  auto st = model.new_sequence(T);
  model.forward(ids.data(), T, *st, nullptr);
  auto mtp = model.new_mtp_sequence(T);
  std::vector<float> logits(size_t(T - 1) * size_t(ck.config().vocab));
  model.mtp_forward(ids.data() + 1, T - 1, /*from_trunk=*/true, *mtp, logits.data());
  return logits;
}

// Qwen3.5's multi-token prediction head, as _Qwen35MtpMixin writes it (an extra block with
// nextn.* tensors), loads into the same head: the same norms and the same draft logits.
TEST(GgufHybridMtp, LoadsTheHeadAsTheSafetensorsDo) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35moe-mtp", path);
  const auto hf = Checkpoint::open(test::fixture_model("qwen35moe-mtp"));
  const auto gg = Checkpoint::open(path);
  ASSERT_EQ(gg->config().mtp_layers, 1);
  EXPECT_EQ(gg->config().n_layers, hf->config().n_layers);
  const MtpWeights &a = hf->weights().mtp, &b = gg->weights().mtp;
  ASSERT_EQ(b.layers.size(), 1u);
  EXPECT_EQ(b.embed_norm, a.embed_norm);
  EXPECT_EQ(b.hidden_norm, a.hidden_norm);
  EXPECT_EQ(b.norm, a.norm);
  EXPECT_EQ(b.layers[0].input_norm, a.layers[0].input_norm);
  for (const std::string& name : gg->info().skipped) EXPECT_EQ(name.find("nextn"), std::string::npos) << name;
  const std::vector<int32_t> prompt = test::reference_prompt("qwen35moe-mtp");
  test::expect_logits_within(mtp_logits(*hf, prompt), mtp_logits(*gg, prompt), 1e-5f);
}

TEST(GgufHybridMtp, DeeperHeadsAreRefusedByName) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35moe-mtp", path, /*claimed_mtp_layers=*/2);
  const std::string msg = test::open_error(path);
  EXPECT_NE(msg.find(path + ": metadata key 'qwen35moe.nextn_predict_layers' is 2: multi-token prediction heads of "
                            "more than one layer are not supported"),
            std::string::npos)
      << msg;
}

TEST(GgufHybridErrors, PositiveSsmAIsNamed) {
  TempDir dir;
  const std::string path = dir.str("model.gguf");
  convert("qwen35-dense", path);
  // Flip layer 0's ssm_a to +exp(A_log): a file whose A was stored without the converter's sign.
  size_t at = 0;
  {
    const GgufFile file(path);
    for (const auto& t : file.tensors())
      if (t.name == "blk.0.ssm_a") at = file.data_offset() + t.offset;
  }
  ASSERT_NE(at, 0u);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  float v;
  f.seekg(std::streamoff(at));
  f.read(reinterpret_cast<char*>(&v), 4);
  v = -v;
  f.seekp(std::streamoff(at));
  f.write(reinterpret_cast<const char*>(&v), 4);
  f.close();
  const std::string msg = test::open_error(path);
  EXPECT_NE(msg.find(path + ": tensor 'blk.0.ssm_a' holds "), std::string::npos) << msg;
  EXPECT_NE(msg.find("for value head 0, expected -exp(A_log) < 0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace petrel
