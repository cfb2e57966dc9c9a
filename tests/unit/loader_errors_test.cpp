// Loader errors name the file / tensor / field and say what was expected and what was found.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "open_error.h"
#include "test_util.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A copy of a small fixture checkpoint that a test may break.
struct BrokenCheckpoint {
  TempDir dir;
  explicit BrokenCheckpoint(const std::string& fixture = "qwen3-dense-f32") {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::fixture_model(fixture) + "/" + f, dir.str(f));
  }
  std::string weights() const { return dir.str("model.safetensors"); }
  std::string config_path() const { return dir.str("config.json"); }
  nlohmann::json config() const { return nlohmann::json::parse(std::ifstream(config_path())); }
  void write_config(const nlohmann::json& cfg) const { std::ofstream(config_path()) << cfg.dump(); }
  // Replaces the weights with a file of `header` (JSON text) and `data_bytes` zero bytes.
  void write_raw_weights(const std::string& header, size_t data_bytes) const {
    std::ofstream out(weights(), std::ios::binary);
    const uint64_t len = header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(data_bytes, '\0');
  }
};

using test::open_error;

// ----------------------------------------------------------------------------- the folder itself

TEST(LoaderErrors, FileGivenForTheFolderIsNamedWithItsFolder) {
  BrokenCheckpoint ck;
  EXPECT_EQ(open_error(ck.weights()), ck.weights() + " is a file; expected a checkpoint folder containing config.json "
                                                     "and *.safetensors (the folder it is in: " + ck.dir.path.string() + ")");
  std::ofstream(ck.dir.str("notes.txt")) << "x";
  EXPECT_EQ(open_error(ck.dir.str("notes.txt")),
            ck.dir.str("notes.txt") + " is a file; expected a checkpoint folder containing config.json and *.safetensors");
}

TEST(LoaderErrors, HubModelIdSaysHowToDownloadIt) {
  ASSERT_FALSE(fs::exists("Qwen"));
  EXPECT_EQ(open_error("Qwen/Qwen3.5-35B-A3B"),
            "Qwen/Qwen3.5-35B-A3B is not a local folder; it looks like a Hugging Face model id, and petrel reads local "
            "folders only: download it with `hf download Qwen/Qwen3.5-35B-A3B --local-dir models/Qwen3.5-35B-A3B` and "
            "pass models/Qwen3.5-35B-A3B");
}

TEST(LoaderErrors, MissingFolderIsNamed) {
  TempDir dir;  // its name has a slash but its first part exists: a mistyped path, not a model id
  const std::string missing = dir.str("Qwen3.5-35B-A3B");
  EXPECT_EQ(open_error(missing),
            missing + ": no such folder (expected a checkpoint folder containing config.json and *.safetensors)");
}

TEST(LoaderErrors, FolderWithoutConfigListsWhatItHolds) {
  TempDir dir;
  EXPECT_EQ(open_error(dir.str()), dir.str() + " has no config.json (expected a checkpoint folder containing "
                                               "config.json and *.safetensors); it is empty");
  fs::create_directory(dir.path / "snapshots");
  for (const char* f : {"README.md", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "tokenizer.json", "vocab.json", "merges.txt", "LICENSE"})
    std::ofstream(dir.str(f)) << "x";
  EXPECT_EQ(open_error(dir.str()), dir.str() + " has no config.json (expected a checkpoint folder containing "
                                               "config.json and *.safetensors); it holds LICENSE, README.md, "
                                               "merges.txt, model-00001-of-00002.safetensors, "
                                               "model-00002-of-00002.safetensors, snapshots/ (and 2 more)");
}

// ---------------------------------------------------------------------------------- tensors

TEST(LoaderErrors, MissingTensorIsNamed) {
  BrokenCheckpoint ck;
  auto tensors = test::read_all(ck.weights());
  ASSERT_EQ(tensors.erase("model.layers.1.self_attn.k_proj.weight"), 1u);
  test::write_safetensors(ck.weights(), tensors);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("missing tensor 'model.layers.1.self_attn.k_proj.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer 1 attention k_proj"), std::string::npos) << msg;
}

TEST(LoaderErrors, WrongShapeNamesFoundAndExpected) {
  BrokenCheckpoint ck;
  auto tensors = test::read_all(ck.weights());
  auto& t = tensors.at("model.layers.0.mlp.up_proj.weight");
  ASSERT_EQ(t.shape.size(), 2u);
  std::swap(t.shape[0], t.shape[1]);
  test::write_safetensors(ck.weights(), tensors);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has shape [64, 96], expected [96, 64]"), std::string::npos) << msg;
}

TEST(LoaderErrors, TruncatedFileIsReported) {
  BrokenCheckpoint ck;
  fs::resize_file(ck.weights(), fs::file_size(ck.weights()) - 1000);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights()), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of bounds"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(LoaderErrors, TinyFileIsReported) {
  BrokenCheckpoint ck;
  fs::resize_file(ck.weights(), 5);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("truncated file: 5 bytes"), std::string::npos) << msg;
}

TEST(LoaderErrors, MalformedHeaderIsReported) {
  BrokenCheckpoint ck;
  {
    std::fstream f(ck.weights(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("!!", 2);  // breaks the JSON header
  }
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": malformed header"), std::string::npos) << msg;
}

TEST(LoaderErrors, HeaderLengthBeyondFileIsReported) {
  BrokenCheckpoint ck;
  {
    std::fstream f(ck.weights(), std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("header length 1099511627776 exceeds the file size"), std::string::npos) << msg;
}

TEST(LoaderErrors, UnknownArchitectureIsNamed) {
  BrokenCheckpoint ck;
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(ck.dir.str("config.json")));
  cfg["model_type"] = "llama4";
  std::ofstream(ck.dir.str("config.json")) << cfg.dump();
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("config.json: unknown architecture: model_type 'llama4'"), std::string::npos) << msg;
}

TEST(LoaderErrors, MissingConfigFieldIsNamed) {
  BrokenCheckpoint ck;
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(ck.dir.str("config.json")));
  cfg.erase("hidden_size");
  std::ofstream(ck.dir.str("config.json")) << cfg.dump();
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("field 'hidden_size' is missing"), std::string::npos) << msg;
}

TEST(LoaderErrors, UnsupportedDtypeIsNamed) {
  BrokenCheckpoint ck;
  auto tensors = test::read_all(ck.weights());
  tensors.at("model.norm.weight").dtype = "F8_E5M2";
  tensors.at("model.norm.weight").bytes.resize(64);
  test::write_safetensors(ck.weights(), tensors);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("tensor 'model.norm.weight': unsupported dtype \"F8_E5M2\""), std::string::npos) << msg;
}

// ------------------------------------------------------------------- safetensors headers (fuzz finds)

TEST(LoaderErrors, ShapeWhoseByteSizeOverflowsIsNamed) {
  // 2^62 x 4 f32 elements wrap to 0 bytes in 64 bits; the header must not pass as an empty tensor.
  BrokenCheckpoint ck;
  ck.write_raw_weights(R"({"model.norm.weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": tensor 'model.norm.weight': shape [4611686018427387904, 4] of F32 is too large"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, OverlappingTensorsAreNamed) {
  BrokenCheckpoint ck;
  ck.write_raw_weights(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": tensor 'b' overlaps tensor 'a'"), std::string::npos) << msg;
}

TEST(LoaderErrors, NegativeDimIsNamed) {
  BrokenCheckpoint ck;
  ck.write_raw_weights(R"({"a":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": tensor 'a': shape [-1,4] has a dim that is not a non-negative integer"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, DataOffsetsOfWrongTypeAreNamed) {
  BrokenCheckpoint ck;
  ck.write_raw_weights(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": tensor 'a': data_offsets must be two non-negative integers, found [-4,0]"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, HeaderThatIsNotAnObjectIsNamed) {
  BrokenCheckpoint ck;
  ck.write_raw_weights("[1,2]", 0);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": malformed header: expected a JSON object, found array"), std::string::npos) << msg;
}

TEST(LoaderErrors, DeeplyNestedHeaderIsAnErrorNotAStackOverflow) {
  BrokenCheckpoint ck;
  ck.write_raw_weights(R"({"a":{"dtype":)" + std::string(200000, '[') + std::string(200000, ']') + "}}", 0);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": malformed header: JSON nests deeper than 64 levels"), std::string::npos) << msg;
}

// ------------------------------------------------------------------------------ config.json fields

// The error of opening `ck` after `edit` changed its config.json.
template <class Edit>
std::string config_error(const BrokenCheckpoint& ck, Edit edit) {
  nlohmann::json cfg = ck.config();
  edit(cfg);
  ck.write_config(cfg);
  return open_error(ck.dir.str());
}

TEST(LoaderErrors, ZeroKeyValueHeadsIsNamed) {
  BrokenCheckpoint ck;  // was a division by zero (num_attention_heads % num_key_value_heads)
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["num_key_value_heads"] = 0; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'num_key_value_heads' must be an integer in [1, 4096], found 0"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, ZeroAttentionHeadsIsNamed) {
  BrokenCheckpoint ck;  // was a division by zero (hidden_size / num_attention_heads)
  const std::string msg = config_error(ck, [](nlohmann::json& c) {
    c.erase("head_dim");
    c["num_attention_heads"] = 0;
  });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'num_attention_heads' must be an integer in [1, 4096], found 0"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, ZeroHeadDimFromDefaultIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) {
    c.erase("head_dim");
    c["num_attention_heads"] = 128;  // hidden_size 64 / 128 heads
    c["num_key_value_heads"] = 128;
  });
  EXPECT_NE(msg.find(ck.config_path() + ": head_dim is missing and hidden_size 64 / num_attention_heads 128 gives 0"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, AbsurdLayerCountIsNamed) {
  BrokenCheckpoint ck;  // was a 10^12-entry allocation (or a truncated int)
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["num_hidden_layers"] = 1000000000000; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'num_hidden_layers' must be an integer in [1, 4096], found 1000000000000"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, ZeroHiddenSizeIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["hidden_size"] = 0; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'hidden_size' must be an integer in [1, 65536], found 0"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, HugeUnsignedVocabIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["vocab_size"] = 18446744073709551615ull; });
  EXPECT_NE(msg.find("field 'vocab_size' must be an integer in [1, 16777216], found 18446744073709551615"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, FieldOfWrongTypeIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["intermediate_size"] = "96"; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'intermediate_size' must be an integer in [1, 1048576], found \"96\""),
            std::string::npos) << msg;
}

TEST(LoaderErrors, RopeTypeOfWrongTypeIsNamed) {
  BrokenCheckpoint ck;  // was an uncaught nlohmann type_error
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["rope_parameters"]["rope_type"] = 5; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'rope_parameters.rope_type' must be a string, found 5"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, RopeScalingOfWrongTypeIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["rope_scaling"] = {{"type", {1, 2}}}; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'rope_scaling.type' must be a string, found [1,2]"), std::string::npos)
      << msg;
}

TEST(LoaderErrors, AbsurdPartialRotaryFactorIsNamed) {
  BrokenCheckpoint ck;  // was an undefined float-to-int conversion
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["partial_rotary_factor"] = 1e30; });
  EXPECT_NE(msg.find(ck.config_path() + ": partial_rotary_factor must be in (0, 1]"), std::string::npos) << msg;
}

TEST(LoaderErrors, NonPositiveRmsEpsIsNamed) {
  BrokenCheckpoint ck;
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["rms_norm_eps"] = -1; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'rms_norm_eps' must be in (0, 1)"), std::string::npos) << msg;
}

TEST(LoaderErrors, ConfigThatIsNotAnObjectIsNamed) {
  BrokenCheckpoint ck;
  std::ofstream(ck.config_path()) << "[64]";
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.config_path() + ": expected a JSON object"), std::string::npos) << msg;
}

TEST(LoaderErrors, DeeplyNestedConfigIsAnErrorNotAStackOverflow) {
  BrokenCheckpoint ck;
  std::ofstream(ck.config_path()) << R"({"hidden_size":)" << std::string(200000, '[') << std::string(200000, ']') << "}";
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.config_path() + ": JSON nests deeper than 64 levels"), std::string::npos) << msg;
}

TEST(LoaderErrors, ZeroLinearKeyHeadsIsNamed) {
  BrokenCheckpoint ck("qwen35-dense");  // was a division by zero (value heads % key heads)
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["text_config"]["linear_num_key_heads"] = 0; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'text_config.linear_num_key_heads' must be an integer in [1, 4096]"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, MlpOnlyLayersOfWrongTypeAreNamed) {
  BrokenCheckpoint ck("qwen3moe");  // was an uncaught nlohmann type_error
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["mlp_only_layers"] = {"1"}; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'mlp_only_layers' must hold layer indices, found \"1\""),
            std::string::npos) << msg;
}

TEST(LoaderErrors, TopKAboveExpertCountIsNamed) {
  BrokenCheckpoint ck("qwen3moe");
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["num_experts_per_tok"] = 1000; });
  EXPECT_NE(msg.find(ck.config_path() + ": field 'num_experts_per_tok' must be an integer in [1, "), std::string::npos)
      << msg;
}

// ---------------------------------------------------------------------------- MLX quantization

TEST(LoaderErrors, QuantizationBitsOfWrongTypeAreNamed) {
  BrokenCheckpoint ck("mlx-qwen35moe-4bit");  // was an uncaught nlohmann type_error
  const std::string msg = config_error(ck, [](nlohmann::json& c) { c["quantization"]["bits"] = "4"; });
  EXPECT_NE(msg.find(ck.config_path() + ": quantization: field 'bits' must be an integer in [1, 65536], found \"4\""),
            std::string::npos) << msg;
}

TEST(LoaderErrors, ZeroGroupSizeIsNamed) {
  BrokenCheckpoint ck("mlx-qwen35moe-4bit");  // was a division by zero (input dim % group_size)
  const std::string msg = config_error(ck, [](nlohmann::json& c) {
    c["quantization"]["language_model.model.layers.0.mlp.gate"]["group_size"] = 0;
  });
  EXPECT_NE(msg.find(ck.config_path() + ": quantization.language_model.model.layers.0.mlp.gate: field 'group_size' "
                                        "must be an integer in [1, 65536], found 0"),
            std::string::npos) << msg;
}

TEST(LoaderErrors, PackedRowsShorterThanAWordAreNamed) {
  // 4 columns of 4-bit codes are half a u32 word: the header's [rows, 0] codes tensor was accepted
  // and dequantizing a row read the next row's scales.
  BrokenCheckpoint ck;
  nlohmann::json cfg = ck.config();
  cfg["hidden_size"] = 4;
  cfg["quantization"] = {{"bits", 4}, {"group_size", 4}};
  ck.write_config(cfg);
  std::map<std::string, test::RawTensor> tensors;
  tensors["model.embed_tokens.weight"] = {"U32", {256, 0}, {}};
  tensors["model.embed_tokens.scales"] = {"BF16", {256, 1}, std::vector<uint8_t>(512)};
  tensors["model.embed_tokens.biases"] = {"BF16", {256, 1}, std::vector<uint8_t>(512)};
  test::write_safetensors(ck.weights(), tensors);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find(ck.weights() + ": tensor 'model.embed_tokens.weight': input dim 4 of 4-bit codes does not fill "
                                    "whole 32-bit words"),
            std::string::npos) << msg;
}

// ----------------------------------------------------------------------------------- shard index

TEST(LoaderErrors, IndexEntryThatIsNotAFileNameIsNamed) {
  BrokenCheckpoint ck;  // a number was an uncaught nlohmann type_error; a path could leave the folder
  for (const char* entry : {"3", R"("../model.safetensors")"}) {
    std::ofstream(ck.dir.str("model.safetensors.index.json"))
        << R"({"weight_map": {"model.norm.weight": )" << entry << "}}";
    const std::string msg = open_error(ck.dir.str());
    EXPECT_NE(msg.find(ck.dir.str("model.safetensors.index.json") + ": weight_map entry 'model.norm.weight' must name "
                                                                    "a file in " + ck.dir.str() + ", found " + entry),
              std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace petrel
