// GGUF files that llama.cpp's own converter wrote from the safetensors fixtures
// (tools/gguf/make_converter_fixtures.py, run where torch and transformers are installed) give
// the safetensors run's logits within 1e-4 of the largest logit, and F16 files HF's greedy
// continuation: F16 and BF16 files of the bf16 fixtures, a lossless conversion (the script says why
// no quantized type is compared this way). A file that is absent skips its test, saying how to make it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint_logits.h"
#include "io/checkpoint.h"
#include "io/model_tokenizer.h"
#include "test_util.h"

namespace petrel {
namespace {

struct Case {
  std::string fixture, type;
};

std::string gguf_path(const Case& c) {
  return (std::filesystem::path(PETREL_FIXTURES_DIR) / "gguf" / "models" / (c.fixture + "-" + c.type + ".gguf"))
      .string();
}

// HF's greedy continuation of a fixture's reference prompt (reference.json).
std::vector<int32_t> reference_greedy(const std::string& fixture) {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(test::fixture_model(fixture) + "/reference.json"));
  return j["greedy_ids"].get<std::vector<int32_t>>();
}

// As many greedy tokens after `prompt` as `like` holds, on the CPU backend.
std::vector<int32_t> greedy_continuation(const Checkpoint& ck, const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& like) {
  CpuBackend backend{CpuOptions{1}};
  Model model(ck.config(), ck.weights(), backend, ForwardOptions{});
  auto seq = model.new_sequence(int(prompt.size() + like.size()));
  std::vector<int32_t> out{model.forward_greedy(prompt.data(), int(prompt.size()), *seq)};
  while (out.size() < like.size()) out.push_back(model.forward_greedy(&out.back(), 1, *seq));
  return out;
}

class GgufConverterFixture : public ::testing::TestWithParam<Case> {};

TEST_P(GgufConverterFixture, GivesTheSafetensorsLogits) {
  const Case& c = GetParam();
  const std::string path = gguf_path(c);
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " is absent: run tools/gguf/make_converter_fixtures.py where torch and transformers are "
                            "installed to write it";
  const auto hf = Checkpoint::open(test::fixture_model(c.fixture));
  const auto gg = Checkpoint::open(path);
  ASSERT_EQ(gg->config().vocab, hf->config().vocab);
  const std::vector<int32_t> prompt = test::reference_prompt(c.fixture);
  const std::vector<float> want = test::prompt_logits(*hf, prompt), got = test::prompt_logits(*gg, prompt);
  const size_t V = size_t(hf->config().vocab);
  for (size_t pos = 0; pos < prompt.size(); ++pos) {
    double scale = 0, worst = 0;
    for (size_t i = pos * V; i < (pos + 1) * V; ++i) {
      scale = std::max(scale, std::fabs(double(want[i])));
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    }
    EXPECT_LE(worst, 1e-4 * scale) << "position " << pos << ": max |logit| " << scale;
  }
  if (c.type == "F16") EXPECT_EQ(greedy_continuation(*gg, prompt, reference_greedy(c.fixture)), reference_greedy(c.fixture));
  // The file's byte-level vocabulary (one token per byte) reads too.
  EXPECT_EQ(load_tokenizer(path).encode("petrel"), (std::vector<uint32_t>{'p', 'e', 't', 'r', 'e', 'l'}));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& fixture : test::kFixtureModels)
    // MLX, FP8, GPTQ and AWQ folders are not the converter's input, an f32 fixture does not convert
    // losslessly, and llama.cpp's qwen3moe has no dense layers, which the qwen3moe fixture holds
    // (mlp_only_layers).
    if (fixture.rfind("mlx-", 0) != 0 && !fixture.ends_with("-f32") && !fixture.ends_with("-fp8") &&
        fixture.find("gptq") == std::string::npos && fixture.find("awq") == std::string::npos &&
        fixture != "qwen3moe")
      for (const char* type : {"F16", "BF16"}) out.push_back({fixture, type});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufConverterFixture, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return test::param_name(info.param.fixture + "_" + info.param.type); });

// A quantized file and its copy with every quantized tensor dequantized to F32 by gguf-py
// (tools/gguf/make_dequantized_copies.py) give the same logits: Petrel's quantized path equals
// llama.cpp's dequantization over whole models. (Against the safetensors run the weights' rounding
// moves these small random models' logits by more than a bound that would catch a reading error.)
class GgufQuantizedFixture : public ::testing::TestWithParam<Case> {};

TEST_P(GgufQuantizedFixture, GivesItsDequantizedCopysLogits) {
  const Case& c = GetParam();
  const std::string path = gguf_path(c), copy = gguf_path({c.fixture, c.type + "-as-F32"});
  for (const std::string& p : {path, copy})
    if (!std::filesystem::exists(p))
      GTEST_SKIP() << p << " is absent: run tools/gguf/make_converter_fixtures.py and "
                            "tools/gguf/make_dequantized_copies.py to write it";
  const std::vector<int32_t> prompt = test::reference_prompt(c.fixture);
  test::expect_logits_within(test::prompt_logits(*Checkpoint::open(copy), prompt),
                             test::prompt_logits(*Checkpoint::open(path), prompt), 1e-5f);
}

// One fixture of each converter class whose transforms touch quantized blocks (Qwen3.5's value-head
// column reorder, Qwen3-Next's in-projection split); the F32 copies are large for a fixture.
INSTANTIATE_TEST_SUITE_P(Gguf, GgufQuantizedFixture,
                         ::testing::Values(Case{"qwen35moe-text-per-expert", "Q8_0"}, Case{"qwen3next-sharded", "Q8_0"}),
                         [](const auto& info) { return test::param_name(info.param.fixture + "_" + info.param.type); });

}  // namespace
}  // namespace petrel
