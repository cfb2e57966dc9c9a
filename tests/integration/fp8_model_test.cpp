// The fine-grained FP8 fixture (qwen35moe-vlm-fp8: e4m3 weights, 128x128 block scales, partial
// edge blocks, one tensor per expert, VLM names) on the CPU backend, against the logits of its
// dequantized weights (reference.json says how they were made), and a greedy continuation where
// the reference has one.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../unit/checkpoint_logits.h"
#include "core/fp8.h"
#include "core/npy.h"
#include "model/fp8_quantize.h"

namespace petrel {
namespace {

const char* kFixture = "qwen35moe-vlm-fp8";

nlohmann::json reference() {
  return nlohmann::json::parse(std::ifstream(test::fixture_model(kFixture) + "/reference.json"));
}

TEST(Fp8Model, LoadsAsBlockScaledFp8WithUnconvertedModulesDense) {
  const auto ck = Checkpoint::open(test::fixture_model(kFixture));
  EXPECT_EQ(ck->info().format_name, "hf-fp8");
  for (const std::string& s : ck->info().skipped)
    EXPECT_EQ(s.find("scale_inv"), std::string::npos) << s << " was not used";
  const ModelWeights& w = ck->weights();
  const LayerWeights& gdn = w.layers[0];
  const LayerWeights& attn = w.layers[1];
  for (const Matrix* m : {&gdn.gdn.qkv, &gdn.gdn.z, &gdn.gdn.a, &gdn.gdn.out, &attn.attn.q, &attn.attn.gate,
                          &attn.attn.o, &gdn.ffn.experts[5].down, &gdn.ffn.shared.up}) {
    EXPECT_EQ(m->format, MatrixFormat::Fp8) << m->name;
    EXPECT_EQ(m->fp8.block_rows, 128);
    EXPECT_EQ(m->fp8.block_cols, 128);
  }
  // modules_to_not_convert (routers, the shared-expert gate, lm_head) and the embedding stay bf16.
  for (const Matrix* m : {&gdn.ffn.router, &gdn.ffn.shared_gate, &w.lm_head, &w.embed}) {
    EXPECT_EQ(m->format, MatrixFormat::Dense) << m->name;
    EXPECT_EQ(m->dtype, DType::BF16) << m->name;
  }
}

TEST(Fp8Model, LogitsMatchTheDequantizedReferenceAtEveryPosition) {
  const auto ck = Checkpoint::open(test::fixture_model(kFixture));
  const std::vector<int32_t> prompt = reference()["prompt_ids"].get<std::vector<int32_t>>();
  const NpyArray want = read_npy_f32(test::fixture_model(kFixture) + "/logits.npy");
  ASSERT_EQ(want.shape, (std::vector<int64_t>{int64_t(prompt.size()), ck->config().vocab}));
  test::expect_logits_within(want.data, test::prompt_logits(*ck, prompt), 1e-4f);
}

TEST(Fp8Model, StaysCloseToTheBf16ModelItWasMadeFrom) {
  // Quantization moves the logits, but a decoding error (a wrong block's scale, a wrong code
  // table) moves them far more than e4m3 rounding does. This tiny random model is ill-conditioned
  // at a few positions (cosine ~0.75 there), so the bound is on the bulk.
  const auto ck = Checkpoint::open(test::fixture_model(kFixture));
  const std::vector<int32_t> prompt = reference()["prompt_ids"].get<std::vector<int32_t>>();
  const NpyArray bf16 = read_npy_f32(test::fixture_model("qwen35moe-vlm-fused") + "/logits.npy");
  const std::vector<float> got = test::prompt_logits(*ck, prompt);
  const int V = ck->config().vocab;
  std::vector<double> cosines = test::row_cosines(bf16.data, got, int(prompt.size()), V);
  std::sort(cosines.begin(), cosines.end());
  EXPECT_GT(cosines[cosines.size() / 2], 0.99) << "median cosine";
  EXPECT_GT(cosines[cosines.size() / 10], 0.9) << "10th percentile";
}

TEST(Fp8Model, QuantizingTheBf16ModelAtLoadGivesTheFp8Checkpoint) {
  // --quantize fp8 of the bf16 fixture the FP8 one was made from computes what that checkpoint does:
  // the same blocks (q_proj quantized whole, then split into query and gate rows), codes and scales.
  const auto bf16 = Checkpoint::open(test::fixture_model("qwen35moe-vlm-fused"));
  const Fp8Copy copy(bf16->weights());
  EXPECT_EQ(copy.weights().layers[1].attn.q.format, MatrixFormat::Fp8);
  EXPECT_EQ(copy.weights().layers[1].ffn.router.format, MatrixFormat::Dense);
  const std::vector<int32_t> prompt = reference()["prompt_ids"].get<std::vector<int32_t>>();
  CpuBackend backend{CpuOptions{1}};
  Model model(bf16->config(), copy.weights(), backend, ForwardOptions{});
  auto seq = model.new_sequence(int(prompt.size()));
  std::vector<float> got(prompt.size() * size_t(bf16->config().vocab));
  model.forward(prompt.data(), int(prompt.size()), *seq, nullptr, got.data());
  const auto fp8 = Checkpoint::open(test::fixture_model(kFixture));
  test::expect_logits_within(test::prompt_logits(*fp8, prompt), got, 0.0f);  // bit for bit
}

TEST(Fp8Model, GreedyContinuationMatchesWhereTheReferenceHasOne) {
  const nlohmann::json ref = reference();
  if (!ref.contains("greedy_ids")) GTEST_SKIP() << "reference.json has no greedy continuation";
  const auto ck = Checkpoint::open(test::fixture_model(kFixture));
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> greedy = ref["greedy_ids"].get<std::vector<int32_t>>();
  CpuBackend backend{CpuOptions{1}};
  Model model(ck->config(), ck->weights(), backend, ForwardOptions{});
  auto seq = model.new_sequence(int(prompt.size() + greedy.size()));
  const int V = ck->config().vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  model.forward(prompt.data(), int(prompt.size()), *seq, logits.data());
  std::vector<int32_t> got;
  for (size_t i = 0; i < greedy.size(); ++i) {
    int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    got.push_back(next);
    model.forward(&next, 1, *seq, logits.data());
  }
  EXPECT_EQ(got, greedy);
}

// transformers' own layout of fused experts: gate_up_proj [E, 2I, H] codes with a scale grid per
// expert in gate_up_proj_scale_inv. Blocks of 24 x 40 split the 64-row slab at rows 24 and 48, so
// one block holds gate and up rows, and the 64 columns end in a partial block.
TEST(Fp8Model, FusedExpertStacksReadEachSlabsScales) {
  constexpr int kBr = 24, kBc = 40;
  const std::string src = test::fixture_model("qwen35moe-vlm-fused");
  auto fp8 = test::read_all(src + "/model.safetensors");
  auto plain = fp8;  // the same weights dequantized, as F32
  int stacks = 0;
  for (auto& [name, t] : fp8) {
    if (!name.ends_with("mlp.experts.gate_up_proj") && !name.ends_with("mlp.experts.down_proj")) continue;
    ++stacks;
    const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2], gr = (R + kBr - 1) / kBr, gc = (C + kBc - 1) / kBc;
    std::vector<float> w(size_t(E * R * C)), deq(w.size()), scales(size_t(E * gr * gc));
    std::vector<uint8_t> codes(w.size());
    convert_to_f32(t.bytes.data(), DType::BF16, w.size(), w.data());
    for (int64_t e = 0; e < E; ++e) {
      quantize_fp8_blocks(w.data() + e * R * C, R, C, kBr, kBc, codes.data() + e * R * C, scales.data() + e * gr * gc);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = (e * R + r) * C + c;
          deq[size_t(i)] = kE4m3Values[codes[size_t(i)]] * scales[size_t((e * gr + r / kBr) * gc + c / kBc)];
        }
    }
    auto bytes = [](const auto& v) {
      const auto* p = reinterpret_cast<const uint8_t*>(v.data());
      return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
    };
    plain[name] = {"F32", t.shape, bytes(deq)};
    fp8[name + "_scale_inv"] = {"F32", {E, gr, gc}, bytes(scales)};
    t = {"F8_E4M3", t.shape, codes};
  }
  ASSERT_EQ(stacks, 8);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  test::TempDir a, b;
  std::ofstream(a.str("config.json")) << cfg.dump();
  test::write_safetensors(a.str("model.safetensors"), plain);
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {kBr, kBc}}};
  std::ofstream(b.str("config.json")) << cfg.dump();
  test::write_safetensors(b.str("model.safetensors"), fp8);
  const std::vector<int32_t> prompt = reference()["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = Checkpoint::open(a.str()), got = Checkpoint::open(b.str());
  EXPECT_EQ(got->weights().layers[0].ffn.experts[3].up.format, MatrixFormat::Fp8);
  test::expect_logits_within(test::prompt_logits(*want, prompt), test::prompt_logits(*got, prompt), 0.0f);
}

TEST(Fp8Model, CommandLineQuantizesOnTheCpu) {
  const nlohmann::json ref = reference();
  std::string ids;
  for (int32_t id : ref["prompt_ids"].get<std::vector<int32_t>>()) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  test::TempDir tmp;
  const std::string bf16 = test::fixture_model("qwen35moe-vlm-fused");
  const auto run = test::run_petrel("dump-logits " + bf16 + " --device cpu --quantize fp8 --prompt-ids " + ids +
                                    " --out " + tmp.str("logits.npy"));
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("hf-bf16 quantized to fp8"), std::string::npos) << run.out;
  test::expect_logits_within(read_npy_f32(test::fixture_model(kFixture) + "/logits.npy").data,
                             read_npy_f32(tmp.str("logits.npy")).data, 1e-4f);
  const auto other =
      test::run_petrel("dump-logits " + bf16 + " --device cpu --quantize int8 --prompt-ids 1 --out x.npy");
  EXPECT_NE(other.out.find("--quantize 'int8' is not supported (expected none, int4 or fp8)"), std::string::npos)
      << other.out;
}

}  // namespace
}  // namespace petrel
