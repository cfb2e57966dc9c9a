// `petrel tokenize`, `detokenize` and `template` as a person runs them: output and exit status.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_util.h"
#include "tokenizer_test_util.h"

namespace petrel {
namespace {

using Result = test::CliResult;
Result run(const std::string& args) { return test::run_petrel(args); }

std::string qwen3_arg() { return test::qwen3_dir().string(); }

TEST(TokenizerCli, TokenizeAndDetokenize) {
  PETREL_REQUIRE_QWEN3();
  EXPECT_EQ(run("tokenize " + qwen3_arg() + " --text 'Hello world<|im_end|>'").out, "9707,1879,151645\n");
  EXPECT_EQ(run("tokenize " + qwen3_arg() + " --text 'Hello world<|im_end|>' --json").out, "[9707, 1879, 151645]\n");
  EXPECT_EQ(run("detokenize " + qwen3_arg() + " --ids 9707,1879,151645").out, "Hello world<|im_end|>\n");
  EXPECT_EQ(run("detokenize " + qwen3_arg() + " --ids 9707,1879,151645 --skip-special").out, "Hello world\n");
  const Result bad = run("detokenize " + qwen3_arg() + " --ids 9707,99999999");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.out.find("token id 99999999 is not in the vocabulary"), std::string::npos) << bad.out;
}

TEST(TokenizerCli, FolderAsModelFlag) {
  const std::string tiny = test::tiny_model_dir();
  const Result positional = run("tokenize " + tiny + " --text 'Reverse the word petrel.'");
  ASSERT_EQ(positional.status, 0) << positional.out;
  EXPECT_EQ(run("tokenize -m " + tiny + " --text 'Reverse the word petrel.'").out, positional.out);
  const std::string ids = positional.out.substr(0, positional.out.find('\n'));
  EXPECT_EQ(run("detokenize --model " + tiny + " --ids " + ids).out, "Reverse the word petrel.\n");
}

TEST(TokenizerCli, EmptyTextHasNoIds) {
  const Result r = run("tokenize " + test::tiny_model_dir() + " --text ''");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "\n");
  EXPECT_EQ(run("tokenize " + test::tiny_model_dir() + " --text '' --json").out, "[]\n");
  const Result neither = run("tokenize " + test::tiny_model_dir());
  EXPECT_EQ(neither.status, 1);
  EXPECT_EQ(neither.out, "error: tokenize: give exactly one of --text and --file\n");
}

TEST(TokenizerCli, FileDashReadsStdin) {
  const std::string tiny = test::tiny_model_dir();
  test::TempDir dir;
  std::ofstream(dir.str("text.txt")) << "What is 48213 + 9377?\nReverse the word petrel.";
  const Result from_file = run("tokenize " + tiny + " --file " + dir.str("text.txt"));
  ASSERT_EQ(from_file.status, 0) << from_file.out;
  EXPECT_GT(from_file.out.size(), 1u);
  EXPECT_EQ(test::run_petrel("tokenize " + tiny + " --file -", "2>&1 < " + dir.str("text.txt")).out, from_file.out);
  EXPECT_EQ(test::run_petrel("tokenize " + tiny + " --file -", "2>&1 < /dev/null").out, "\n");
}

TEST(TokenizerCli, AFolderWithoutTokenizerJsonSaysWhatItHolds) {
  test::TempDir dir;
  std::ofstream(dir.str("config.json")) << "{}";
  const Result r = run("tokenize " + dir.str() + " --text hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "error: " + dir.str() + " has no tokenizer.json (expected a folder containing tokenizer.json); "
                   "it holds config.json\n");
  const Result file = run("detokenize " + dir.str("config.json") + " --ids 1");
  EXPECT_EQ(file.out, "error: " + dir.str("config.json") + " is a file; expected a folder containing tokenizer.json\n");
}

TEST(TokenizerCli, BenchReportsThroughput) {
  PETREL_REQUIRE_QWEN3();
  const Result r = run("tokenize " + qwen3_arg() + " --text 'Some text to measure.' --bench --runs 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("MB/s"), std::string::npos) << r.out;
}

TEST(TokenizerCli, TemplateRendersLikeTransformers) {
  PETREL_REQUIRE_QWEN3();
  const auto conversations = test::read_json(test::tokenizer_fixtures() / "conversations.json");
  const auto goldens = test::read_json(test::tokenizer_fixtures() / "render_goldens.json");
  for (const auto& conv : conversations) {
    if (conv["name"] != "tools_full_exchange" && conv["name"] != "thinking_off") continue;
    const auto path = std::filesystem::temp_directory_path() / ("petrel_cli_" + conv["name"].get<std::string>() + ".json");
    nlohmann::ordered_json doc = {{"messages", conv["messages"]}};
    if (conv.contains("tools")) doc["tools"] = conv["tools"];
    std::ofstream(path) << doc.dump();
    std::string args = "template " + qwen3_arg() + " --messages " + path.string();
    if (conv["add_generation_prompt"].get<bool>()) args += " --add-generation-prompt";
    if (conv.contains("kwargs") && conv["kwargs"].contains("enable_thinking")) args += " --no-think";
    const Result r = run(args);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out, goldens["qwen3/" + conv["name"].get<std::string>()]["text"].get<std::string>());
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace petrel
