// generation_config.json gives the sampler its defaults: do_sample, temperature, top-k/p, min-p,
// repetition penalty, eos ids (plus the tokenizer's eos_token), max_new_tokens; bad fields are named.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "generate/generation_config.h"
#include "test_util.h"

namespace petrel {
namespace {

void write(const test::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir.str(name)) << text;
}

std::optional<int32_t> no_tokenizer(const std::string&) { return std::nullopt; }

TEST(GenerationDefaults, QwenStyleConfigSetsSampling) {
  test::TempDir dir;
  write(dir, "generation_config.json",
        R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0,
            "repetition_penalty": 1.05, "eos_token_id": [151645, 151643], "pad_token_id": 151643})");
  const GenerationDefaults d = load_generation_defaults(dir.path, no_tokenizer);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.95f);
  EXPECT_FLOAT_EQ(d.sampling.repetition_penalty, 1.05f);
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_FALSE(d.max_new_tokens);
}

TEST(GenerationDefaults, WithoutDoSampleOrWithoutAFileItIsGreedy) {
  test::TempDir dir;
  EXPECT_TRUE(load_generation_defaults(dir.path, no_tokenizer).sampling.greedy());
  write(dir, "generation_config.json", R"({"temperature": 0.7, "eos_token_id": 2, "max_new_tokens": 64})");
  const GenerationDefaults d = load_generation_defaults(dir.path, no_tokenizer);
  EXPECT_TRUE(d.sampling.greedy()) << "Hugging Face generate() is greedy unless do_sample is true";
  EXPECT_EQ(d.eos_ids, std::vector<int32_t>{2});
  EXPECT_EQ(d.max_new_tokens, 64);
}

TEST(GenerationDefaults, AddsTheTokenizersEosTokenOnce) {
  test::TempDir dir;
  write(dir, "generation_config.json", R"({"do_sample": true, "eos_token_id": 151643})");
  write(dir, "tokenizer_config.json", R"({"eos_token": "<|im_end|>"})");
  const auto lookup = [](const std::string& t) -> std::optional<int32_t> {
    return t == "<|im_end|>" ? std::optional<int32_t>(151645) : std::nullopt;
  };
  EXPECT_EQ(load_generation_defaults(dir.path, lookup).eos_ids, (std::vector<int32_t>{151643, 151645}));
  write(dir, "tokenizer_config.json", R"({"eos_token": {"content": "<|im_end|>"}})");
  write(dir, "generation_config.json", R"({"eos_token_id": [151645]})");
  EXPECT_EQ(load_generation_defaults(dir.path, lookup).eos_ids, (std::vector<int32_t>{151645}));
}

TEST(GenerationDefaults, BadFieldsAreNamed) {
  test::TempDir dir;
  const auto message = [&](const std::string& json) {
    write(dir, "generation_config.json", json);
    try {
      load_generation_defaults(dir.path, no_tokenizer);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(R"({"temperature": "hot"})").find("field 'temperature' must be a number, found \"hot\""),
            std::string::npos);
  EXPECT_NE(message(R"({"top_k": 2.5})").find("field 'top_k' must be an integer"), std::string::npos);
  EXPECT_NE(message(R"({"eos_token_id": ["x"]})").find("'eos_token_id' must be an integer or a list of integers"),
            std::string::npos);
  EXPECT_NE(message(R"({"do_sample": 1})").find("'do_sample' must be true or false"), std::string::npos);
  EXPECT_NE(message("{oops").find("generation_config.json: malformed JSON"), std::string::npos);
}

}  // namespace
}  // namespace petrel
