// Quantized checkpoints: methods petrel cannot read are refused by name before any tensor is read,
// and a malformed fine-grained FP8, GPTQ or AWQ checkpoint is an error naming the file, tensor or field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "open_error.h"
#include "test_util.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using test::open_error;

const char* kSupported =
    "(supported: unquantized F32/F16/BF16 weights, MLX affine 4/8-bit (config field 'quantization'), fine-grained "
    "FP8 (quant_method \"fp8\": e4m3 weights with block scales), GPTQ 4/8-bit and AWQ gemm 4-bit (quant_method "
    "\"gptq\", \"awq\"), and GGUF files)";

// A copy of a fixture checkpoint that a test may break.
struct Copy {
  test::TempDir dir;
  explicit Copy(const std::string& fixture = "qwen35moe-vlm-fp8") {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::fixture_model(fixture) + "/" + f, dir.str(f));
  }
  std::string weights() const { return dir.str("model.safetensors"); }
  std::string config_path() const { return dir.str("config.json"); }
  // The error of opening the copy after `edit` changed its config.json.
  template <class Edit>
  std::string config_error(Edit edit) const {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(config_path()));
    edit(cfg);
    std::ofstream(config_path()) << cfg.dump();
    return open_error(dir.str());
  }
  // The error of opening the copy after `edit` changed its tensors.
  template <class Edit>
  std::string tensor_error(Edit edit) const {
    auto tensors = test::read_all(weights());
    edit(tensors);
    test::write_safetensors(weights(), tensors);
    return open_error(dir.str());
  }
};

const std::string kQkv = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";
const std::string kKProj = "model.language_model.layers.1.self_attn.k_proj.weight";

// ------------------------------------------------------------------------------- other methods

TEST(QuantLoader, OtherMethodsAreRefusedByName) {
  for (const char* method : {"bitsandbytes", "compressed-tensors", "hqq", "GPTQ"}) {
    Copy ck("qwen3-dense-f32");
    const std::string msg = ck.config_error([&](nlohmann::json& c) {
      c["quantization_config"] = {{"quant_method", method}, {"bits", 4}, {"group_size", 128}};
    });
    EXPECT_EQ(msg, ck.config_path() + ": quantization_config.quant_method is \"" + method +
                       "\": petrel cannot read weights quantized this way " + kSupported);
  }
}

TEST(QuantLoader, MethodThatIsNoStringIsNamed) {
  Copy ck("qwen3-dense-f32");
  const std::string msg = ck.config_error([](nlohmann::json& c) { c["quantization_config"] = {{"quant_method", 3}}; });
  EXPECT_EQ(msg, ck.config_path() + ": quantization_config.quant_method is 3; expected a string " + kSupported);
}

TEST(QuantLoader, PackedTensorsOfOtherMethodsAreRefusedWithoutAConfig) {
  // Older GPTQ folders declare the method in quantize_config.json only; the tensors still say it.
  const std::string name = "model.layers.0.self_attn.k_proj.";
  Copy ck("qwen3-dense-f32");
  std::string msg = ck.tensor_error([&](auto& t) { t[name + "qweight"] = {"I32", {16, 64}, std::vector<uint8_t>(4096)}; });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + name + "qweight' holds GPTQ or AWQ-quantized weights, but config.json "
                 "has no quantization_config with quant_method \"gptq\" or \"awq\" giving their bits and group_size");
  Copy ck2("qwen3moe-gptq4");  // a declared GPTQ model still refuses bitsandbytes parts
  msg = ck2.tensor_error([&](auto& t) { t[name + "absmax"] = {"F32", {4}, std::vector<uint8_t>(16)}; });
  EXPECT_EQ(msg, ck2.weights() + ": tensor '" + name + "absmax' holds bitsandbytes-quantized weights, which petrel "
                 "cannot read " + kSupported);
}

TEST(QuantLoader, MlxCopyWithoutMethodStillLoads) {
  Copy ck("mlx-qwen35moe-4bit");  // MLX writes "quantization" and the same object as "quantization_config"
  EXPECT_EQ(ck.config_error([](nlohmann::json&) {}), "");
}

// ------------------------------------------------------------------------------- fp8 config fields

TEST(QuantLoader, MalformedBlockSizeIsNamed) {
  for (const char* bad : {"[128]", "[0, 128]", "[128, 128, 1]", "\"128\"", "[128.5, 128]"}) {
    Copy ck;
    const std::string msg = ck.config_error(
        [&](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = nlohmann::json::parse(bad); });
    EXPECT_EQ(msg, ck.config_path() + ": quantization_config.weight_block_size is " + nlohmann::json::parse(bad).dump() +
                       "; expected [rows, cols] of two integers in [1, 65536], such as [128, 128]");
  }
}

TEST(QuantLoader, OtherFp8FormatsAreNamed) {
  Copy ck;
  EXPECT_EQ(ck.config_error([](nlohmann::json& c) { c["quantization_config"]["fmt"] = "e5m2"; }),
            ck.config_path() + ": quantization_config.fmt is \"e5m2\"; petrel reads \"e4m3\" only");
  Copy ck2;
  EXPECT_EQ(ck2.config_error([](nlohmann::json& c) { c["quantization_config"]["activation_scheme"] = "static"; }),
            ck2.config_path() + ": quantization_config.activation_scheme is \"static\"; petrel reads \"dynamic\" only");
}

TEST(QuantLoader, ModulesToNotConvertMustBeAList) {
  Copy ck;
  EXPECT_EQ(ck.config_error([](nlohmann::json& c) { c["quantization_config"]["modules_to_not_convert"] = "lm_head"; }),
            ck.config_path() + ": quantization_config.modules_to_not_convert is \"lm_head\"; expected a list of "
                               "module names");
}

// ------------------------------------------------------------------------------- fp8 tensors

TEST(QuantLoader, Fp8CodesWithoutFp8ConfigAreNamed) {
  Copy ck;
  const std::string msg = ck.config_error([](nlohmann::json& c) { c.erase("quantization_config"); });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kQkv + "' (layer 0 gated deltanet in_proj_qkv) holds F8_E4M3 codes, "
                 "but " + ck.config_path() + " has no quantization_config with quant_method \"fp8\" giving their "
                 "weight_block_size");
}

TEST(QuantLoader, MissingScalesAreNamed) {
  Copy ck;
  const std::string msg = ck.tensor_error([](auto& t) { ASSERT_EQ(t.erase(kKProj + "_scale_inv"), 1u); });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kKProj + "' (layer 1 attention k_proj) holds F8_E4M3 codes, but its "
                 "block scales '" + kKProj + "_scale_inv' are missing");
}

TEST(QuantLoader, ScalesOfAnotherBlockSizeAreNamed) {
  Copy ck;  // the file has [128, 128] blocks: in_proj_qkv [160, 64] has a [2, 1] grid, not [5, 2]
  const std::string msg = ck.config_error([](nlohmann::json& c) { c["quantization_config"]["weight_block_size"] = {32, 32}; });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kQkv + "_scale_inv' (layer 0 gated deltanet in_proj_qkv block scales) "
                 "has shape [2, 1], expected [5, 2]: one scale per 32x32 block (weight_block_size) of the [160, 64] "
                 "weight");
}

TEST(QuantLoader, ScalesOfWrongShapeOrTypeAreNamed) {
  Copy ck;
  std::string msg = ck.tensor_error([](auto& t) { t.at(kKProj + "_scale_inv").shape = {1}; });
  EXPECT_NE(msg.find("tensor '" + kKProj + "_scale_inv' (layer 1 attention k_proj block scales) has shape [1], "
                     "expected [1, 1]"), std::string::npos) << msg;
  Copy ck2;
  msg = ck2.tensor_error([](auto& t) { t.at(kKProj + "_scale_inv").dtype = "I32"; });
  EXPECT_EQ(msg, ck2.weights() + ": tensor '" + kKProj + "_scale_inv' (layer 1 attention k_proj block scales) has "
                 "dtype I32, expected F32, BF16 or F16");
}

TEST(QuantLoader, NonFiniteScaleIsNamed) {
  Copy ck;
  const std::string msg = ck.tensor_error([](auto& t) {
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(t.at(kKProj + "_scale_inv").bytes.data(), &inf, 4);
  });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kKProj + "_scale_inv' (layer 1 attention k_proj block scales): scale 0 "
                 "is inf, expected a finite number");
}

TEST(QuantLoader, NanCodeIsNamedWithItsPlace) {
  for (uint8_t nan : {uint8_t(0x7f), uint8_t(0xff)}) {
    Copy ck;
    const std::string msg = ck.tensor_error([&](auto& t) { t.at(kKProj).bytes.at(70) = nan; });
    EXPECT_EQ(msg, ck.weights() + ": tensor '" + kKProj + "' (layer 1 attention k_proj): weight 70 (row 1, column 6) "
                   "is an e4m3 NaN code; the file is damaged");
  }
}

TEST(QuantLoader, Fp8NormIsNamed) {
  Copy ck;
  const std::string norm = "model.language_model.norm.weight";
  const std::string msg = ck.tensor_error([&](auto& t) {
    t.at(norm).dtype = "F8_E4M3";
    t.at(norm).bytes.resize(64);
  });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + norm + "' (final norm) has dtype F8_E4M3, expected a float type");
}

// ------------------------------------------------------------------------------- gptq / awq

const std::string kGptqK = "model.layers.0.self_attn.k_proj";  // [64, 64], groups of 32
const std::string kGptqQ = "model.layers.0.self_attn.q_proj";  // [128, 64]: read first

TEST(QuantLoader, UnsupportedGptqAndAwqVariantsAreNamed) {
  const struct { const char* fixture; const char* field; nlohmann::json value; const char* reads; } kCases[] = {
      {"qwen3moe-gptq4", "bits", 3, "4 or 8 bits"},
      {"qwen3moe-gptq4", "bits", "4", "4 or 8 bits"},
      {"qwen3moe-gptq4", "group_size", 0, "a group size of at least 1, or -1 (one group per row)"},
      {"qwen3moe-gptq4", "checkpoint_format", "marlin", "\"gptq\" or \"gptq_v2\""},
      {"qwen3moe-awq4", "bits", 8, "4 bits"},
      {"qwen3moe-awq4", "version", "gemv", "\"gemm\" only"},
      {"qwen3moe-awq4", "zero_point", false, "true only"},
  };
  for (const auto& c : kCases) {
    Copy ck(c.fixture);
    const std::string msg = ck.config_error([&](nlohmann::json& cfg) { cfg["quantization_config"][c.field] = c.value; });
    EXPECT_EQ(msg, ck.config_path() + ": quantization_config." + c.field + " is " + c.value.dump() + "; petrel reads " +
                       c.reads);
  }
  Copy ck("qwen3moe-gptq8v2");
  EXPECT_EQ(ck.config_error([](nlohmann::json& c) { c["quantization_config"].erase("bits"); }),
            ck.config_path() + ": quantization_config.bits is missing; expected 4 or 8 bits");
  Copy awq("qwen3moe-awq4");  // AutoAWQ's capitals
  EXPECT_EQ(awq.config_error([](nlohmann::json& c) { c["quantization_config"]["version"] = "GEMM"; }), "");
}

TEST(QuantLoader, GptqGroupsAreJudgedByGIdxNotByDescAct) {
  Copy ck("qwen3moe-gptq4");  // desc_act with static groups stores g_idx = i / group_size
  EXPECT_EQ(ck.config_error([](nlohmann::json& c) { c["quantization_config"]["desc_act"] = true; }), "");
  Copy ck2("qwen3moe-gptq4");  // files without g_idx group runs of features
  EXPECT_EQ(ck2.tensor_error([](auto& t) { ASSERT_EQ(t.erase(kGptqK + ".g_idx"), 1u); }), "");
}

TEST(QuantLoader, ScatteredActOrderGroupsAreRefused) {
  Copy ck("qwen3moe-gptq4");
  const std::string msg = ck.tensor_error([](auto& t) {
    std::vector<uint8_t>& g = t.at(kGptqK + ".g_idx").bytes;  // features 0 and 40 trade groups
    std::swap_ranges(g.begin(), g.begin() + 4, g.begin() + 160);
  });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kGptqK + ".g_idx' (layer 0 attention k_proj g_idx): input feature 0 is "
                 "in group 1, expected 0 (feature / group_size 32): act-order (desc_act) groups that are not runs of "
                 "consecutive features cannot be read");
}

TEST(QuantLoader, MissingGptqAndAwqTensorsAreNamed) {
  for (const char* fixture : {"qwen3moe-gptq4", "qwen3moe-awq4"}) {
    for (const auto& [part, role] : {std::pair{"qzeros", " zero points"}, std::pair{"scales", " scales"},
                                     std::pair{"qweight", ""}}) {
      Copy ck(fixture);
      const std::string name = kGptqK + "." + part;
      const std::string msg = ck.tensor_error([&](auto& t) { ASSERT_EQ(t.erase(name), 1u); });
      EXPECT_EQ(msg, "checkpoint " + ck.dir.str() + ": missing tensor '" + name + "' (layer 0 attention k_proj" + role +
                         ")");
    }
  }
}

TEST(QuantLoader, GptqAndAwqShapesAndTypesAreChecked) {
  Copy ck("qwen3moe-gptq4");
  std::string msg = ck.tensor_error([](auto& t) { t.at(kGptqK + ".qweight").shape = {64, 8}; });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kGptqK + ".qweight' (layer 0 attention k_proj (GPTQ 4-bit, group 32)) "
                 "has shape [64, 8], expected [8, 64]");
  Copy awq("qwen3moe-awq4");  // AWQ packs the other way
  msg = awq.tensor_error([](auto& t) { t.at(kGptqK + ".qweight").shape = {8, 64}; });
  EXPECT_EQ(msg, awq.weights() + ": tensor '" + kGptqK + ".qweight' (layer 0 attention k_proj (AWQ 4-bit, group 32)) "
                 "has shape [8, 64], expected [64, 8]");
  Copy ck2("qwen3moe-gptq4");  // tensors made for groups of 32 read as groups of 64
  msg = ck2.config_error([](nlohmann::json& c) { c["quantization_config"]["group_size"] = 64; });
  EXPECT_EQ(msg, ck2.weights() + ": tensor '" + kGptqQ + ".qzeros' (layer 0 attention q_proj zero points (GPTQ "
                 "4-bit, group 64)) has shape [2, 16], expected [1, 16]");
  Copy ck3("qwen3moe-gptq4");
  msg = ck3.config_error([](nlohmann::json& c) { c["quantization_config"]["group_size"] = 48; });
  EXPECT_EQ(msg, ck3.weights() + ": tensor '" + kGptqQ + ".qweight' (layer 0 attention q_proj): input dim 64 is not a "
                 "multiple of group_size 48");
  Copy ck4("qwen3moe-gptq4");
  msg = ck4.tensor_error([](auto& t) { t.at(kGptqK + ".qzeros").dtype = "F32"; });
  EXPECT_EQ(msg, ck4.weights() + ": tensor '" + kGptqK + ".qzeros' (layer 0 attention k_proj) has dtype F32, expected "
                 "I32");
  Copy ck5("qwen3moe-awq4");
  msg = ck5.tensor_error([](auto& t) {
    t.at(kGptqK + ".scales").dtype = "I32";
    t.at(kGptqK + ".scales").shape = {2, 32};
  });
  EXPECT_EQ(msg, ck5.weights() + ": tensor '" + kGptqK + ".scales' (layer 0 attention k_proj scales) has dtype I32, "
                 "expected F16, BF16 or F32");
}

TEST(QuantLoader, OneGroupPerRowIsGroupSizeMinusOne) {
  Copy ck("qwen3moe-gptq4");  // -1 reads a [64, 64] matrix as one group of 64 per row
  const std::string msg = ck.config_error([](nlohmann::json& c) { c["quantization_config"]["group_size"] = -1; });
  EXPECT_EQ(msg, ck.weights() + ": tensor '" + kGptqQ + ".qzeros' (layer 0 attention q_proj zero points (GPTQ "
                 "4-bit, group 64)) has shape [2, 16], expected [1, 16]");
}

}  // namespace
}  // namespace petrel
