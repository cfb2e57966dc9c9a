// Loader errors name the file / tensor / field and say what was expected and what was found.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "test_util.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A copy of a small fixture checkpoint that a test may break.
struct BrokenCheckpoint {
  TempDir dir;
  BrokenCheckpoint() {
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::fixture_model("qwen3-dense-f32") + "/" + f, dir.str(f));
  }
  std::string weights() const { return dir.str("model.safetensors"); }
};

std::string open_error(const std::string& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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
  tensors.at("model.norm.weight").dtype = "F8_E4M3";
  tensors.at("model.norm.weight").bytes.resize(64);
  test::write_safetensors(ck.weights(), tensors);
  const std::string msg = open_error(ck.dir.str());
  EXPECT_NE(msg.find("tensor 'model.norm.weight': unsupported dtype \"F8_E4M3\""), std::string::npos) << msg;
}

}  // namespace
}  // namespace petrel
